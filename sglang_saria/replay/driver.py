"""Replay driver (paper 5.1): the policy core driven by a logical clock.

Only session start times move; each session keeps its request order and recorded
idle gaps (the next request is issued ``idle_before_s`` after the previous one's first
token). One active request per session, ``in_flight`` requests overall (others wait
FIFO), requests stop after the first token. A request's life: admission -> reload
(``TransferCoordinator``, fluid exact time) -> prefill of the recomputed tokens on one
GPU at ``prefill_tokens_per_s`` (FIFO) -> first token. The core's ``begin_request``
runs at admission, ``finish_request`` at the first token. TTFT and transfer time are
measured from admission (submission to the server), as in the paper.
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

from sglang_saria.config import SariaConfig
from sglang_saria.mem_cache.coordinator import TransferCoordinator
from sglang_saria.mem_cache.core import SariaCore, WriteHook
from sglang_saria.model_specs import ModelSpec
from sglang_saria.replay.metrics import RequestLog, summarize
from sglang_saria.replay.workload import dense_keys
from sglang_saria.units import SECONDS_PER_DAY

if TYPE_CHECKING:
    from sglang_saria.replay.trace import TraceSession

logger = logging.getLogger(__name__)

_ISSUE = 0
_COMPUTE_DONE = 1


@dataclass
class ReplaySettings:
    """Replay methodology knobs (defaults from DESIGN.md)."""

    window_s: float = 12 * 3600.0
    seed: int = 0
    in_flight: int = 4
    prefill_tokens_per_s: float = 6500.0
    horizon_s: float = 24 * 3600.0
    dwpd: float = 1.0

    def validate(self) -> "ReplaySettings":
        if self.in_flight < 1:
            raise ValueError(f"in_flight={self.in_flight}: must be >= 1")
        if self.prefill_tokens_per_s <= 0:
            raise ValueError(f"prefill_tokens_per_s={self.prefill_tokens_per_s}: must be > 0")
        if self.horizon_s <= 0:
            raise ValueError(f"horizon_s={self.horizon_s}: must be > 0")
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
    admit_t: float
    computed_tokens: int
    achievable: int
    transfer_done_t: float = 0.0


@dataclass
class _State:
    heap: list = field(default_factory=list)
    seq: int = 0

    def push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))


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
    the core decides (diagnostics: ``scripts/fidelity.py --mechanism``). The core sees block
    keys renumbered by ``dense_keys`` (so do ``on_write`` and the returned core).
    """
    settings = (settings or ReplaySettings()).validate()
    if len(start_times) != len(sessions):
        raise ValueError(f"{len(start_times)} start times for {len(sessions)} sessions")
    block_keys, shared_keys, n_distinct = dense_keys(list(sessions))
    core = SariaCore(cfg, spec)
    core.on_write = on_write
    coord = TransferCoordinator(cfg.bandwidth, cfg.transfer.mode)
    bt = cfg.metadata.block_tokens
    stride = core.metadata.checkpoint_stride
    tps = settings.prefill_tokens_per_s
    log = RequestLog()
    st = _State()
    waiting: deque[tuple[int, int]] = deque()
    active: dict[int, _Active] = {}
    seen = np.zeros(n_distinct, dtype=bool)  # by dense key: in an earlier request's input
    # one int object per key: the core's dicts find a key by identity before comparing values
    key_objs = list(range(n_distinct))
    # per session, its last request's key objects: the next one mostly repeats them
    last: dict[int, list[int]] = {}
    in_flight = 0
    gpu_free = 0.0
    gpu_busy = 0.0
    end_t = 0.0
    block_events = 0
    next_rid = 0
    for sid, t0 in enumerate(start_times):
        if sessions[sid].requests:
            st.push(float(t0), _ISSUE, (sid, 0))

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(s.requests) for s in sessions), desc=label or cfg.admission.policy, unit="req", mininterval=0.5)

    def admit(sid: int, ridx: int, t: float) -> None:
        nonlocal in_flight, next_rid, block_events
        req = sessions[sid].requests[ridx]
        # a session's requests are admitted in order: its previous one's prefix has keys built, all seen
        shared = shared_keys[sid][ridx]
        rest = block_keys[sid][ridx][shared:]
        keys = last.get(sid, [])[:shared] + list(map(key_objs.__getitem__, rest.tolist()))
        last[sid] = keys
        first_new = seen[rest].tobytes().find(0)  # the first block no earlier request contained
        n_ach = len(keys) if first_new < 0 else shared + first_new
        if stride:
            n_ach -= n_ach % stride
        seen[rest] = True
        block_events += len(keys)
        plan, _ = core.begin_request(keys, t)
        d, s = core.plan_bytes(plan)
        computed = max(0, req.input_tokens - plan.n_blocks * bt)
        rid = next_rid
        next_rid += 1
        active[rid] = _Active(sid, ridx, keys, plan, t, computed, n_ach)
        in_flight += 1
        if d + s == 0:
            transfer_done(rid, t)
        else:
            for done_rid, t_done in coord.submit(rid, d, s, t):
                transfer_done(done_rid, t_done)

    def transfer_done(rid: int, t: float) -> None:
        nonlocal gpu_free, gpu_busy
        a = active[rid]
        a.transfer_done_t = t
        gpu_busy += a.computed_tokens / tps
        gpu_free = max(gpu_free, t) + a.computed_tokens / tps
        st.push(gpu_free, _COMPUTE_DONE, rid)

    def compute_done(rid: int, t: float) -> None:
        nonlocal in_flight, end_t
        a = active.pop(rid)
        core.finish_request(a.keys, a.plan, t)
        plan = a.plan
        log.add(plan.n_blocks, a.achievable, plan.uses_ssd, a.transfer_done_t - a.admit_t, t - a.admit_t,
                done_s=t, ssd_hit=plan.ssd_blocks, ssd_bytes_written=core.ssd.bytes_written)
        in_flight -= 1
        end_t = t
        reqs = sessions[a.sid].requests
        if a.ridx + 1 < len(reqs):
            st.push(t + reqs[a.ridx + 1].idle_before_s, _ISSUE, (a.sid, a.ridx + 1))
        while waiting and in_flight < settings.in_flight:
            wsid, wridx = waiting.popleft()
            admit(wsid, wridx, t)
        if bar is not None:
            bar.update(1)

    interrupted = False
    inf = math.inf
    # the replay makes no reference cycles; the collector's passes over every live node cost 3% at 350 sessions
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        while st.heap or coord.active:
            t_heap = st.heap[0][0] if st.heap else inf
            t_coord = coord.next_event_time() if coord.active else inf
            if t_coord <= t_heap:
                for rid, t_done in coord.advance(t_coord):
                    transfer_done(rid, t_done)
                continue
            t, _, kind, payload = heapq.heappop(st.heap)
            if kind == _ISSUE:
                sid, ridx = payload
                if t > settings.horizon_s:
                    continue  # 24 h truncation: the session issues nothing more
                if in_flight < settings.in_flight:
                    admit(sid, ridx, t)
                else:
                    waiting.append((sid, ridx))
            else:
                compute_done(payload, t)
    except KeyboardInterrupt:
        interrupted = True
        logger.warning("replay interrupted after %d requests; reporting partial results", len(log))
    finally:
        if gc_was_enabled:
            gc.enable()
        if bar is not None:
            bar.close()

    ssd = core.ssd
    kvb = spec.kv_bytes_per_token
    metrics = summarize(
        label or cfg.admission.policy,
        log,
        ssd_write_bytes=ssd.bytes_written,
        ssd_read_bytes=ssd.bytes_read,
        ssd_capacity_bytes=cfg.capacity.ssd_tokens * kvb,
        writes_never_read_frac=ssd.writes_never_read_frac,
        dram_evictions=core.stats.dram_evictions,
        days_replayed=min(end_t, settings.horizon_s) / SECONDS_PER_DAY,
        dwpd=settings.dwpd,
    )
    logger.info("%s: %d requests, GPU prefill busy %.0f s of %.0f s", metrics["policy"], len(log), gpu_busy, end_t)
    return ReplayResult(metrics, log, core, end_t, block_events, gpu_busy, interrupted)
