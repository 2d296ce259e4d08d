"""The load signal of ``auto`` admission inside SGLang: seconds of prefill queued now.

``auto`` (``mem_cache/auto.py``) writes a block at its first DRAM eviction while recomputing it
would queue behind other work, at its second otherwise. The replay's signal is its modelled GPU's
backlog of prefill that will really be computed; here it is the same quantity, read once per
scheduler step from SGLang's ``SchedulerLoadInquirer`` (handed over by the plugin hook on
``Scheduler.init_load_inquirer``):

- **queued tokens**: 0 when the waiting queue is empty and no request is being chunked (O(1));
  otherwise the work left waiting behind the last prefill batch the scheduler formed (plugin
  hook after ``Scheduler.get_new_batch_prefill``): ``get_num_waiting_uncached_tokens()``,
  SGLang's own estimate of the input tokens waiting for prefill compute, each waiting request's
  length less its matched prefix and its storage span, plus the chunked request's rest (cached
  prefixes are not work: an agent prompt that is 90 % cached counts its 10 %). Read after the
  batch, so a request admitted at once is not load for the evictions its own admission causes.
  One pass over the waiting queue per prefill batch, as SGLang's load reports make;
- **prefill rate**: the scheduler's own throughput, ``total_prefill_uncached_tokens`` over
  ``total_prefill_busy_us`` (cumulative counters it keeps for its load reports), smoothed over the
  last ``RATE_WINDOW_S`` seconds of prefill; ``admission.auto_prefill_tps`` until a prefill step
  has been measured (a guess is only needed before the first one).

``backlog_s = queued tokens / rate``. With several attention ranks the MAX over the ranks goes in
the rank agreement's per-step all-reduce (``RankAgreement.step``), so every rank's ``auto`` reads
the same value at the same step clock and decides the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from sglang_saria.hicache.metrics import SariaServingMetrics
from sglang_saria.mem_cache.auto import AutoAdmission

RATE_WINDOW_S = 60.0  # seconds of prefill busy time the measured rate is smoothed over


@dataclass
class PrefillRate:
    """Prefill tokens per second from the scheduler's cumulative counters, an exponentially
    weighted ratio (tokens and busy seconds decay alike, so long steps weigh as their time)."""

    window_s: float = RATE_WINDOW_S
    tokens: float = 0.0
    busy_s: float = 0.0
    _last: Optional[tuple[int, int]] = None

    def update(self, total_tokens: int, total_busy_us: int) -> None:
        last, self._last = self._last, (total_tokens, total_busy_us)
        if last is None:
            return
        d_tokens, d_s = total_tokens - last[0], (total_busy_us - last[1]) / 1e6
        if d_s > 0 and d_tokens >= 0:
            keep = math.exp(-d_s / self.window_s)
            self.tokens = self.tokens * keep + d_tokens
            self.busy_s = self.busy_s * keep + d_s

    def tps(self, fallback: float) -> float:
        return self.tokens / self.busy_s if self.tokens > 0 and self.busy_s > 0 else fallback


class SchedulerLoad:
    """The scheduler's queued prefill, in seconds (``inquirer``: SGLang's ``SchedulerLoadInquirer``)."""

    def __init__(self, inquirer: Any) -> None:
        self.inquirer = inquirer
        self.rate = PrefillRate()
        self.queued_tokens = 0  # uncached input tokens left waiting behind the last prefill batch

    def backlog_s(self, fallback_tps: float) -> float:
        q = self.inquirer
        self.rate.update(q.get_total_prefill_uncached_tokens(), q.get_total_prefill_busy_us())
        if not q.get_waiting_queue() and q.get_chunked_req() is None:
            return 0.0
        return self.queued_tokens / self.rate.tps(fallback_tps)


class LoadSignalMixin:
    """`SariaRadixCache`'s load signal (uses its ``_policy()`` and ``_agreement``): keeps the
    scheduler's load inquirer and feeds ``auto`` each step, before HiCache's events make decisions."""

    _scheduler_load: Optional[SchedulerLoad] = None

    def read_scheduler_load(self, inquirer: Any) -> None:
        """Once at scheduler start (plugin hook after ``Scheduler.init_load_inquirer``)."""
        self._scheduler_load = SchedulerLoad(inquirer)

    def note_prefill_batch(self) -> None:
        """After each prefill batch the scheduler forms (plugin hook after
        ``Scheduler.get_new_batch_prefill``): the uncached work left waiting behind it."""
        load = self._scheduler_load
        if load is not None:
            load.queued_tokens = load.inquirer.get_num_waiting_uncached_tokens()

    def check_hicache_events(self) -> None:
        self._feed_load()
        super().check_hicache_events()  # type: ignore[misc]

    def _feed_load(self) -> None:
        load = self._scheduler_load
        if load is None:  # before the scheduler handed its load inquirer over
            return
        policy = self._policy()  # type: ignore[attr-defined]
        if policy is None or not isinstance(policy.admission, AutoAdmission):
            return
        tps = policy.config.admission.auto_prefill_tps
        agreement = self._agreement  # type: ignore[attr-defined]
        if agreement is None:
            backlog_s = load.backlog_s(tps)
        else:  # agreed (MAX) in this step's all-reduce, which already ran; read from the next one on
            agreement.local_load = lambda: load.backlog_s(tps)
            backlog_s = agreement.load
        admission = policy.admission
        admission.on_load(backlog_s, policy.clock())
        SariaServingMetrics.get().auto_state(admission.state(), admission.decisions, admission.hints.counts)
