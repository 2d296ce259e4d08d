"""Replay driver (paper 5.1): the policy core driven by a logical clock.

Only session start times move; each session keeps its request order and recorded
idle gaps (the next request is issued ``idle_before_s`` after the previous one's first
token). One active request per session, ``in_flight`` requests overall (others wait
FIFO), requests stop after the first token. The 24-hour truncation filters which requests
exist (``workload.truncate``: recorded arrival within ``horizon_s``); every request that exists
is served, however long the replay then runs, so policies are compared on the same requests
(their ``request_set`` digests are equal). A request's life: admission -> reload
(``TransferCoordinator``, fluid exact time) -> prefill of the recomputed tokens on one
GPU at ``prefill_tokens_per_s`` (FIFO) -> first token. The core's ``begin_request``
runs at admission, ``finish_request`` at the first token. TTFT and transfer time are
measured from admission (submission to the server), as in the paper; the wait before it
(the client's backlog) is reported apart, as is the drain time (the last first token).

``ReplayRun`` holds one replay's state; its methods are the steps (issue, admit, transfer
done, compute done), ``loop`` runs them in time order and ``result`` sums them up.
``replay`` is the one call the CLI, the planner and the scripts use.
"""

from __future__ import annotations

import gc
import heapq
import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from sglang_saria.config import SariaConfig
from sglang_saria.mem_cache.coordinator import TransferCoordinator
from sglang_saria.model_specs import ModelSpec
from sglang_saria.replay.core import Actions, SariaCore, WriteHook
from sglang_saria.replay.metrics import RequestLog, summarize
from sglang_saria.replay.oracle import FutureNeeds, NeedsRecorder, OracleAdmission, request_id
from sglang_saria.replay.workload import Truncation, dense_keys, truncate
from sglang_saria.units import SECONDS_PER_DAY

if TYPE_CHECKING:
    from sglang_saria.replay.trace import TraceSession

logger = logging.getLogger(__name__)

HINT_MODES = ("none", "end", "next")
_ISSUE = 0
_COMPUTE_DONE = 1
_DIGEST_MASK = (1 << 64) - 1
_xxh3 = xxhash.xxh3_64_intdigest


@dataclass
class ReplaySettings:
    """Replay methodology knobs (defaults from DESIGN.md)."""

    window_s: float = 12 * 3600.0
    seed: int = 0
    in_flight: int = 4
    prefill_tokens_per_s: float = 6500.0
    horizon_s: float = 24 * 3600.0
    dwpd: float = 1.0
    oracle_max_passes: int = 6  # ``oracle``: passes before it stops short of a fixed point
    # the drives' write bandwidth; writes take it out of the GDS read budget while they drain
    # (a TLC NVMe drive writes at about half its read rate: half of the paper's 20 GB/s)
    ssd_write_gbps: float = 10.0
    # agents' hints the replay derives from the trace for policies that take them (``auto``): none, "end"
    # (each request names its session, whose end the agent knows) or "next" (also each request's next
    # arrival: clairvoyant)
    hints: str = "none"

    def validate(self) -> "ReplaySettings":
        if self.in_flight < 1:
            raise ValueError(f"in_flight={self.in_flight}: must be >= 1")
        if self.prefill_tokens_per_s <= 0:
            raise ValueError(f"prefill_tokens_per_s={self.prefill_tokens_per_s}: must be > 0")
        if self.horizon_s <= 0:
            raise ValueError(f"horizon_s={self.horizon_s}: must be > 0")
        if not self.ssd_write_gbps > 0:
            raise ValueError(f"ssd_write_gbps={self.ssd_write_gbps}: must be > 0")
        if self.hints not in HINT_MODES:
            raise ValueError(f"hints={self.hints!r}: must be one of {', '.join(HINT_MODES)}")
        if self.oracle_max_passes < 1:
            raise ValueError(f"oracle_max_passes={self.oracle_max_passes}: must be >= 1")
        return self


@dataclass
class ReplayResult:
    metrics: dict
    log: RequestLog
    core: SariaCore
    end_time_s: float
    block_events: int
    gpu_busy_s: float  # total modelled prefill time; near end_time_s means compute-bound (queues grow)
    interrupted: bool = False


@dataclass
class _Active:
    sid: int
    ridx: int
    keys: list[int]
    plan: object
    issue_t: float  # the client sent it; it waited for a slot until admit_t
    admit_t: float
    computed_tokens: int
    achievable: int
    transfer_done_t: float = 0.0


@dataclass
class _Events:
    """Pending issues and compute completions by time; ties keep push order."""

    heap: list = field(default_factory=list)
    seq: int = 0

    def push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))


class _RequestKeys:
    """Each request's block keys as the core sees them, and how many of its blocks an ideal cache holds.

    Keys are renumbered by ``dense_keys``; one int object per key, since the core's dicts find a
    key by identity before comparing values. A session's next request reuses its previous one's
    key objects for the prefix they share.
    """

    def __init__(self, sessions: Sequence["TraceSession"], checkpoint_stride: int) -> None:
        self.block_keys, self.shared_keys, n_distinct = dense_keys(list(sessions))
        self.stride = checkpoint_stride
        self.seen = np.zeros(n_distinct, dtype=bool)  # by dense key: in an earlier request's input
        self.key_objs = list(range(n_distinct))
        self.last: dict[int, list[int]] = {}  # per session, its last request's key objects

    def build(self, sid: int, ridx: int) -> tuple[list[int], int]:
        """Request ``ridx`` of session ``sid``: its keys and achievable blocks; its keys become seen.

        A session's requests are built in order, so its previous one's prefix has keys built, all seen.
        """
        shared = self.shared_keys[sid][ridx]
        rest = self.block_keys[sid][ridx][shared:]
        keys = self.last.get(sid, [])[:shared] + list(map(self.key_objs.__getitem__, rest.tolist()))
        self.last[sid] = keys
        first_new = self.seen[rest].tobytes().find(0)  # the first block no earlier request contained
        achievable = len(keys) if first_new < 0 else shared + first_new
        if self.stride:
            achievable -= achievable % self.stride
        self.seen[rest] = True
        return keys, achievable


@dataclass
class ReplayWorkload:
    """What every node of one replay shares: the sessions, their request keys, the truncation and the
    event queue (issues and compute completions). One node's replay owns one; a fleet's nodes share it
    (``replay/fleet.py``), so the same requests exist, in the same key space, however they are routed."""

    sessions: Sequence["TraceSession"]
    keys: _RequestKeys
    truncation: Truncation
    events: _Events

    @classmethod
    def build(cls, sessions: Sequence["TraceSession"], start_times: Sequence[float], horizon_s: float,
              checkpoint_stride: int) -> "ReplayWorkload":
        """The workload with every kept session's first request queued at its start time."""
        w = cls(sessions, _RequestKeys(sessions, checkpoint_stride), truncate(sessions, start_times, horizon_s), _Events())
        for sid, t0 in enumerate(start_times):
            if w.truncation.kept[sid]:
                w.events.push(float(t0), _ISSUE, (sid, 0))
        return w


class ReplayRun:
    """One node's replay state and its steps: issue -> admit -> transfer done -> compute done.

    Each step is a method, so a test can drive one alone; ``loop`` runs them in time order. A fleet
    (``replay/fleet.py``) builds one per node over a shared ``ReplayWorkload`` and runs its own loop;
    ``node`` tags this node's compute completions in the shared event queue.
    """

    def __init__(self, sessions: Sequence["TraceSession"], start_times: Sequence[float], cfg: SariaConfig,
                 spec: ModelSpec, settings: ReplaySettings, on_write: WriteHook | None = None,
                 workload: ReplayWorkload | None = None, node: int = 0) -> None:
        self.settings = settings.validate()
        if len(start_times) != len(sessions):
            raise ValueError(f"{len(start_times)} start times for {len(sessions)} sessions")
        self.sessions, self.cfg, self.spec = sessions, cfg, spec
        self.core = SariaCore(cfg, spec)
        self.core.on_write = on_write
        admission = self.core.admission
        # the clairvoyant bound (replay/oracle.py): told which requests have begun, records what each wanted
        self.oracle = admission if isinstance(admission, OracleAdmission) else None
        self.needs = NeedsRecorder() if self.oracle is not None else None
        self.hints = admission.hints if settings.hints != "none" else None
        self.hinted_paths: dict[int, list[int]] = {}  # session -> keys of its last hinted request (``hint``)
        if workload is None:
            workload = ReplayWorkload.build(sessions, start_times, settings.horizon_s, self.core.metadata.checkpoint_stride)
        self.workload = workload
        self.keys, self.truncation, self.events = workload.keys, workload.truncation, workload.events
        self.compute_kind = _COMPUTE_DONE + node  # the event kind of this node's first tokens
        self.coord = TransferCoordinator(cfg.bandwidth, cfg.transfer.mode, settings.ssd_write_gbps)
        self.promoted_bytes = 0
        self.block_tokens = cfg.metadata.block_tokens
        self.log = RequestLog()
        self.waiting: deque[tuple[int, int, float]] = deque()  # (sid, ridx, issue t) while in_flight was full, FIFO
        self.active: dict[int, _Active] = {}
        self.in_flight = 0
        self.gpu_free = 0.0  # when the GPU finishes the prefills queued so far
        self.gpu_busy = 0.0
        self.end_t = 0.0
        self.block_events = 0
        self.next_rid = 0
        self.served_digest = 0  # order-free sum of the served requests' ids: equal sums, equal request sets

    def issue(self, sid: int, ridx: int, t: float) -> None:
        """The client sends a request: admitted if a slot is free, else it waits (FIFO)."""
        if self.in_flight < self.settings.in_flight:
            self.admit(sid, ridx, t, t)
        else:
            self.waiting.append((sid, ridx, t))

    def admit(self, sid: int, ridx: int, t: float, issue_t: float) -> None:
        """The core plans the reload; its transfer goes to the coordinator (none: done at once)."""
        keys, achievable = self.keys.build(sid, ridx)
        self.block_events += len(keys)
        core = self.core
        if self.oracle is not None:
            self.oracle.future.begun(request_id(sid, ridx))
        if self.hints is not None:
            self.hints.used(keys)
        core.admission.on_load(self.gpu_free - t if self.gpu_free > t else 0.0, t)
        plan, acts = core.begin_request(keys, t)
        if self.needs is not None:
            self.needs.record(request_id(sid, ridx), keys, plan.sources, achievable)
        d, s = core.plan_bytes(plan)
        computed = max(0, self.sessions[sid].requests[ridx].input_tokens - plan.n_blocks * self.block_tokens)
        rid = self.next_rid
        self.next_rid = rid + 1
        self.active[rid] = _Active(sid, ridx, keys, plan, issue_t, t, computed, achievable)
        self.in_flight += 1
        if acts.ssd_write_bytes:  # reuse-triggered writes (asynchronous)
            self.charge(acts, t)
        if d + s == 0:
            self.transfer_done(rid, t)
        else:
            for done_rid, t_done in self.coord.submit(rid, d, s, t):
                self.transfer_done(done_rid, t_done)

    def transfer_done(self, rid: int, t: float) -> None:
        """The reload ended: the recomputed tokens queue for prefill on the one GPU (FIFO)."""
        a = self.active[rid]
        a.transfer_done_t = t
        prefill_s = a.computed_tokens / self.settings.prefill_tokens_per_s
        self.gpu_busy += prefill_s
        self.gpu_free = max(self.gpu_free, t) + prefill_s
        self.events.push(self.gpu_free, self.compute_kind, rid)

    def compute_done(self, rid: int, t: float) -> None:
        """First token: the core finishes the request, the session's next one is scheduled, waiters admitted."""
        a = self.active.pop(rid)
        plan = a.plan
        core = self.core
        core.admission.on_load(self.gpu_free - t if self.gpu_free > t else 0.0, t)
        acts = core.finish_request(a.keys, plan, t)
        if acts.ssd_write_bytes or acts.promotion_bytes:
            self.charge(acts, t)
        self.log.add(plan.n_blocks, a.achievable, plan.uses_ssd, a.transfer_done_t - a.admit_t, t - a.admit_t,
                     done_s=t, ssd_hit=plan.ssd_blocks, ssd_bytes_written=self.core.ssd.bytes_written,
                     queue_s=a.admit_t - a.issue_t)
        if self.hints is not None:
            self.hint(a, t)
        self.served_digest += _xxh3(b"%d:%d" % (a.sid, a.ridx))
        self.in_flight -= 1
        self.end_t = t
        if a.ridx + 1 < self.truncation.kept[a.sid]:
            self.events.push(t + self.sessions[a.sid].requests[a.ridx + 1].idle_before_s, _ISSUE, (a.sid, a.ridx + 1))
        waiting = self.waiting
        while waiting and self.in_flight < self.settings.in_flight:
            wsid, wridx, issue_t = waiting.popleft()
            self.admit(wsid, wridx, t, issue_t)

    def hint(self, a: _Active, t: float) -> None:
        """What the agent would say after this request: its session ended (where the trace ends it, not where
        the horizon cuts it: the agent does not know the replay's horizon), or (clairvoyant) when it returns."""
        hints = self.hints
        hints.on_clock(t)
        previous = self.hinted_paths.pop(a.sid, None)
        if a.ridx + 1 >= len(self.sessions[a.sid].requests):
            hints.session_end(a.keys)
            self.core.ssd_order.demote(a.keys)
            return
        self.hinted_paths[a.sid] = a.keys
        if previous and previous[-1] not in a.keys:  # (keys are chained: the last one names the whole prefix)
            held = set(a.keys)  # every hinted request names its session: what it no longer holds is left behind
            hints.left_behind([k for k in previous if k not in held])
        if self.settings.hints == "next" and a.ridx + 1 < self.truncation.kept[a.sid]:
            hints.expect_return(a.keys, self.sessions[a.sid].requests[a.ridx + 1].idle_before_s)

    def charge(self, acts: Actions, t: float) -> None:
        """The core's writes and promotions take drive and DRAM bandwidth from ``t`` on (the coordinator's
        background streams); they count in the tiers at once, nothing waits for them."""
        self.promoted_bytes += acts.promotion_bytes
        for done_rid, t_done in self.coord.submit_background(acts.ssd_write_bytes, acts.promotion_bytes, t):
            self.transfer_done(done_rid, t_done)

    def loop(self, bar=None) -> bool:
        """Run every event in time order, transfer ends first on ties; True if Ctrl-C stopped it.

        Runs once per event: what it calls is bound to locals, which CPython reads faster than attributes.
        """
        heap, coord = self.events.heap, self.coord
        heappop, issue, transfer_done, compute_done = heapq.heappop, self.issue, self.transfer_done, self.compute_done
        inf = math.inf
        # the replay makes no reference cycles; the collector's passes over every live node cost 3% at 350 sessions
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            while heap or coord.active:
                t_heap = heap[0][0] if heap else inf
                t_coord = coord.next_event_time() if coord.active else inf
                if t_coord <= t_heap:
                    for rid, t_done in coord.advance(t_coord):
                        transfer_done(rid, t_done)
                    continue
                t, _, kind, payload = heappop(heap)
                if kind == _ISSUE:
                    issue(payload[0], payload[1], t)
                else:
                    compute_done(payload, t)
                    if bar is not None:
                        bar.update(1)
        except KeyboardInterrupt:
            logger.warning("replay interrupted after %d requests; reporting partial results", len(self.log))
            return True
        finally:
            if gc_was_enabled:
                gc.enable()
        return False

    def result(self, label: str | None = None, interrupted: bool = False) -> ReplayResult:
        """The metrics of what has run so far (all of it, unless interrupted)."""
        cfg, core, log = self.cfg, self.core, self.log
        ssd = core.ssd
        metrics = summarize(
            label or cfg.admission.policy,
            log,
            ssd_write_bytes=ssd.bytes_written,
            ssd_read_bytes=ssd.bytes_read,
            ssd_capacity_bytes=cfg.capacity.ssd_tokens * self.spec.kv_bytes_per_token,
            writes_never_read_frac=ssd.writes_never_read_frac,
            dram_evictions=core.stats.dram_evictions,
            days_replayed=self.truncation.span_s / SECONDS_PER_DAY,
            dwpd=self.settings.dwpd,
            drain_s=self.end_t,
            request_set=f"{self.served_digest & _DIGEST_MASK:016x}",
            ssd_write_busy_s=self.coord.write_busy_s,
            promoted_bytes=self.promoted_bytes,
        )
        logger.info("%s: %d requests, GPU prefill busy %.0f s of %.0f s", metrics["policy"], len(log), self.gpu_busy, self.end_t)
        return ReplayResult(metrics, log, core, self.end_t, self.block_events, self.gpu_busy, interrupted)


def replay(
    sessions: Sequence["TraceSession"],
    start_times: Sequence[float],
    cfg: SariaConfig,
    spec: ModelSpec,
    settings: ReplaySettings | None = None,
    progress: bool = False,
    label: str | None = None,
    on_write: WriteHook | None = None,
) -> ReplayResult:
    """Replay ``sessions`` (starting at ``start_times``) against one policy configuration.

    Deterministic: the same inputs give the same metrics. Ctrl-C stops the replay and
    returns the partial result with ``interrupted=True``. ``on_write`` sees every SSD write
    the core decides (diagnostics: ``saria-fidelity --mechanism``). The core sees block
    keys renumbered by ``dense_keys`` (so do ``on_write`` and the returned core).
    """
    settings = settings or ReplaySettings()
    if cfg.admission.policy == OracleAdmission.name:
        return _replay_oracle(sessions, start_times, cfg, spec, settings, progress, label)
    return _run(ReplayRun(sessions, start_times, cfg, spec, settings, on_write), progress, label or cfg.admission.policy)


def _run(run: ReplayRun, progress: bool, label: str) -> ReplayResult:
    """Loop one replay to its end (or Ctrl-C), with a progress bar if asked."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=run.truncation.requests, desc=label, unit="req", mininterval=0.5)
    try:
        interrupted = run.loop(bar)
    finally:
        if bar is not None:
            bar.close()
    return run.result(label, interrupted)


def _replay_oracle(sessions: Sequence["TraceSession"], start_times: Sequence[float], cfg: SariaConfig, spec: ModelSpec,
                   settings: ReplaySettings, progress: bool, label: str | None) -> ReplayResult:
    """``--policy oracle``: ``replay_oracle`` from a DRAM-only first pass, at most ``settings.oracle_max_passes``."""
    return replay_oracle(sessions, start_times, cfg, spec, settings, {}, None, settings.oracle_max_passes, progress,
                         label)[0]


def replay_oracle(sessions: Sequence["TraceSession"], start_times: Sequence[float], cfg: SariaConfig, spec: ModelSpec,
                  settings: ReplaySettings, needs: dict[int, set[int]], allowed: frozenset[int] | None,
                  max_passes: int, progress: bool = False, label: str | None = None
                  ) -> tuple[ReplayResult, dict[int, set[int]]]:
    """The clairvoyant bound by iteration (replay/oracle.py): each pass writes for what every earlier pass's
    requests wanted from below DRAM (``needs`` to start with, grown in place); with ``allowed``, only those
    blocks are wanted. The wants only grow and are finite, so a fixed point exists. The last pass is the
    result, with ``oracle_passes`` and ``oracle_fixed_point`` (False: stopped at ``max_passes`` with new
    wants left); returns it and the wants."""
    label = label or cfg.admission.policy
    added = -1
    for n in range(1, max_passes + 1):
        run = ReplayRun(sessions, start_times, cfg, spec, settings)
        run.oracle.future = FutureNeeds.of(needs)
        run.needs.allowed = allowed
        res = _run(run, progress, f"{label} pass {n}")
        if res.interrupted:
            break
        added = run.needs.merge_into(needs)
        logger.info("%s pass %d: CHAR %.3f, W/C %.2f, %d new (block, request) wants", label, n, res.metrics["char"],
                    res.metrics["ssd_writes_norm"], added)
        if added == 0:
            break
    res.metrics.update(policy=label, oracle_passes=n, oracle_fixed_point=added == 0)
    return res, needs
