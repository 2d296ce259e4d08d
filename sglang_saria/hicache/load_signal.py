"""The load signal of ``auto`` admission inside SGLang: seconds of prefill queued now.

``auto`` (``mem_cache/learned.py``) lowers the reuse odds a write needs while recomputing a block
would queue behind other work (``loadaware``, ``mem_cache/auto.py``: writes at the first DRAM
eviction then, at the second otherwise). The replay's signal is its modelled GPU's
backlog of prefill that will really be computed; here it is the same quantity, read once per
scheduler step from SGLang's ``SchedulerLoadInquirer`` (handed over by the plugin hook on
``Scheduler.init_load_inquirer``):

- **queued tokens**: 0 when the waiting queue is empty and no request is being chunked (O(1));
  otherwise the work left waiting behind the last prefill batch the scheduler formed (plugin
  hook after ``Scheduler.get_new_batch_prefill``; ``waiting_uncached_tokens``, one pass over the
  waiting queue): each waiting request's tokens less its matched prefix
  (``num_matched_prefix_tokens``: device and host, from its match at arrival or its last
  admission try) and less its storage span (SGLang's ``waiting_storage_span`` seam; with direct
  reload ``LoadSignalMixin.waiting_storage_span``: the pages saria's reload of it loads, in
  flight or published, or, for a request that follows another's reload, the pages that reload
  reads for it), plus the chunked request's rest past the chunk now running. Cached prefixes
  are not work: an agent prompt that is 90 % cached counts its 10 %. Read after the batch, so a
  request admitted at once is not load for the evictions its own admission causes (the replay
  reads its load when it admits a request, before that request's prefill is queued);
- **prefill rate**: the scheduler's own throughput, ``total_prefill_uncached_tokens`` over
  ``total_prefill_busy_us`` (cumulative counters it keeps for its load reports), smoothed over the
  last ``RATE_WINDOW_S`` seconds of prefill; ``admission.auto_prefill_tps`` until a prefill step
  has been measured (a guess is only needed before the first one).

``backlog_s = queued tokens / rate`` (``seconds_of``, the replay's conversion). The queued
tokens are the replay's quantity: a queued request's input tokens less the blocks its plan loads
from DRAM or SSD (``replay/driver.py``, ``_Active.computed_tokens``), for the same queue over the
same cached prefixes; ``tests/e2e/test_auto_load_signal.py`` checks it on a real server, prefixes
in memory and in the store alone. The server side was changed to make them equal: SGLang's own
``get_num_waiting_uncached_tokens`` (used before) does not read the waiting requests' matches
under its default ``fcfs`` policy with a Python tree core, but counts each one's whole length
times the recent cache miss rate (all of it when metrics have seen no hit yet), and it counts
pages saria's direct reload loads as uncached. What is left different, by design of the replay:

- the replay's GPU backlog also holds the rest of the prefill now running; the server's leaves
  out the batch just formed (at most one batch);
- SGLang always computes a prompt's last token (its match stops one token short, then at a page
  boundary): a prompt made of whole cached pages counts its last page here, 0 in the replay;
- the server counts a request's prefix as matched at arrival or its last admission try; the
  replay as it stood at the request's admission. A prefix evicted or cached while the request
  waits changes the work without changing the count until the request is matched again.

With several attention ranks the MAX over the ranks goes in
the rank agreement's per-step all-reduce (``RankAgreement.step``), so every rank's ``auto`` reads
the same value at the same step clock and decides the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from sglang_saria.hicache.metrics import SariaServingMetrics

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


def waiting_uncached_tokens(inquirer: Any, batch: Any = None) -> int:
    """Input tokens the scheduler will compute for the requests left waiting behind ``batch``
    (the prefill batch just formed, or None): per waiting request, its tokens less its matched
    prefix and its storage span; plus the chunked request's rest, less the chunk in ``batch``
    (its ``prefix_len`` does not count that chunk until the batch has run). O(waiting queue)."""
    span_of = inquirer.get_waiting_storage_span
    total = 0
    for req in inquirer.get_waiting_queue():
        seqlen, matched = req.seqlen, req.num_matched_prefix_tokens
        uncached = max(0, seqlen - matched)
        span = span_of(req.cache_request_handle) if span_of is not None else None
        if span is not None:
            uncached -= max(0, min(span[1], seqlen) - max(span[0], matched))
        total += uncached
    chunked = inquirer.get_chunked_req()
    if chunked is not None:
        running = chunked.extend_len if batch is not None and chunked in batch.reqs else 0
        total += max(0, chunked.seqlen - chunked.prefix_len - running)
    return total


class SchedulerLoad:
    """The scheduler's queued prefill, in seconds (``inquirer``: SGLang's ``SchedulerLoadInquirer``)."""

    def __init__(self, inquirer: Any) -> None:
        self.inquirer = inquirer
        self.rate = PrefillRate()
        self.queued_tokens = 0  # uncached input tokens left waiting behind the last prefill batch

    def queued(self) -> int:
        """Uncached tokens queued for prefill now: 0 on an empty queue, whatever the last count said."""
        q = self.inquirer
        if not q.get_waiting_queue() and q.get_chunked_req() is None:
            return 0
        return self.queued_tokens

    def backlog_s(self, fallback_tps: float) -> float:
        q = self.inquirer
        self.rate.update(q.get_total_prefill_uncached_tokens(), q.get_total_prefill_busy_us())
        return seconds_of(self.queued(), self.rate.tps(fallback_tps))


def seconds_of(tokens: float, tokens_per_s: float) -> float:
    """Prefill seconds of ``tokens`` at ``tokens_per_s``: the replay's conversion
    (``ReplayRun.transfer_done``: a request's computed tokens over ``prefill_tokens_per_s``)."""
    return tokens / tokens_per_s


class LoadSignalMixin:
    """`SariaRadixCache`'s load signal (uses its ``_policy()``, ``_agreement``, ``_direct``,
    ``_reloads`` and ``_published``): keeps the scheduler's load inquirer and feeds ``auto`` each
    step, before HiCache's events make decisions."""

    _scheduler_load: Optional[SchedulerLoad] = None
    _storage_spans: Optional[dict[str, tuple[int, int]]] = None  # by request id: ``note_storage_span``

    def read_scheduler_load(self, inquirer: Any) -> None:
        """Once at scheduler start (plugin hook after ``Scheduler.init_load_inquirer``)."""
        self._scheduler_load = SchedulerLoad(inquirer)

    def note_prefill_batch(self, batch: Any = None) -> None:
        """After each prefill batch the scheduler forms (plugin hook after
        ``Scheduler.get_new_batch_prefill``; ``batch``: the batch formed, or None): the uncached
        work left waiting behind it."""
        load = self._scheduler_load
        if load is None:
            return
        spans = self._storage_spans
        if spans:  # only waiting requests keep a span (admitted or aborted ones drop theirs)
            waiting = {req.rid for req in load.inquirer.get_waiting_queue()}
            self._storage_spans = {rid: span for rid, span in spans.items() if rid in waiting}
        load.queued_tokens = waiting_uncached_tokens(load.inquirer, batch)

    def note_storage_span(self, rid: str, start: int, end: int) -> None:
        """Request ``rid`` will have its prompt's tokens ``[start, end)`` without computing them,
        loaded by another request's reload (a follower, ``direct_reload/follow.py``) or matched on the device
        once that reload published them (``end`` 0: none known)."""
        if self._storage_spans is None:
            self._storage_spans = {}
        self._storage_spans[rid] = (start, end)

    def waiting_storage_span(self, request: Any) -> Optional[tuple[int, int]]:
        """SGLang's seam for a waiting request's expected storage hit (tokens ``[start, end)``),
        read by the load inquirer: with direct reload, the prompt span saria loads for it (its own
        reload: the plan's pages past the device match, in flight or published; a follower's:
        ``note_storage_span``); without, HiCache's."""
        if getattr(self, "_direct", None) is None:
            return super().waiting_storage_span(request)  # type: ignore[misc]
        rid = request.rid
        published = self._published.get(rid)  # type: ignore[attr-defined]
        if published is not None:
            return 0, published
        pending = self._reloads.by_rid.get(rid)  # type: ignore[attr-defined]
        if pending is not None:
            return pending.start, len(pending.key)
        return (self._storage_spans or {}).get(rid)

    def check_hicache_events(self) -> None:
        self._feed_load()
        super().check_hicache_events()  # type: ignore[misc]

    def _feed_load(self) -> None:
        load = self._scheduler_load
        if load is None:  # before the scheduler handed its load inquirer over
            return
        policy = self._policy()  # type: ignore[attr-defined]
        if policy is None or not policy.admission.reads_load:
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
        metrics = SariaServingMetrics.get()
        metrics.auto_queued(load.queued())
        metrics.auto_state(admission.state(), admission.decisions, admission.hints.counts)
