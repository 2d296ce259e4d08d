"""Fleet replay: N saria nodes behind a router, on one logical clock.

Each node is a single-node replay (``driver.ReplayRun``): its own ``SariaCore`` (DRAM, SSD,
admission state), its own transfer coordinator and modelled GPU, the same code the single-node
replay and the server run. The nodes share the workload (sessions, request keys, the 24 h
truncation, the event queue): every request of the trace exists once and is served by exactly one
node, so a fleet of any size and routing is scored over the same requests as one node. A request is
routed when its client issues it (``routing.py``); it then queues at that node as on a single node.

Metrics: the fleet's record has the single-node keys (``metrics.RESULT_KEYS``) over all requests and
all drives (W/C against the fleet's total SSD capacity, i.e. the mean drive); ``per_node`` has one
record per node and ``fleet`` the per-drive DWPD (mean and busiest), load imbalance, how often a
session changed node, and the shared-tier estimate: for each request whose session moved, the
leading blocks its previous node still held (DRAM or SSD) beyond what the new node hit -- what a
tier shared by the nodes would have served instead of recomputing (an upper bound: no shared-tier
bandwidth or capacity is modelled, and nothing is replayed with it).
"""

from __future__ import annotations

import gc
import heapq
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sglang_saria.config import SariaConfig
from sglang_saria.model_specs import ModelSpec
from sglang_saria.replay.core import Actions
from sglang_saria.replay.driver import _DIGEST_MASK, _ISSUE, ReplayRun, ReplaySettings
from sglang_saria.replay.metrics import RequestLog, summarize
from sglang_saria.replay.oracle import OracleAdmission
from sglang_saria.replay.tiers import Tier
from sglang_saria.replay.routing import ROUTERS, CacheAwareConfig, Router, RoutingError, make_router
from sglang_saria.session_affinity import AffinityConfig
from sglang_saria.units import SECONDS_PER_DAY

if TYPE_CHECKING:
    from sglang_saria.replay.trace import TraceSession

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetSettings:
    """How many nodes and which router; every node gets the same ``SariaConfig`` and ``ReplaySettings``."""

    nodes: int = 1
    router: str = "cache_aware"
    seed: int = 0  # of the random router
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)
    session: AffinityConfig = field(default_factory=AffinityConfig)
    # worker deaths: (node, down_s, up_s): the router sends the node nothing from down_s until up_s (``session``
    # only). What the node already admitted or queued it still serves and its DRAM and SSD keep their
    # contents: the router's view of a death (a restarted worker's lost DRAM is not modelled)
    outages: tuple[tuple[int, float, float], ...] = ()

    def validate(self) -> "FleetSettings":
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise RoutingError(f"--nodes {self.nodes}: must be an integer >= 1")
        if self.router not in ROUTERS:
            raise RoutingError(f"--router {self.router!r}: choose one of {', '.join(ROUTERS)}")
        if self.outages and self.router != "session":
            raise RoutingError(f"--router {self.router}: worker deaths are modelled for the session router only")
        for node, down, up in self.outages:
            if not (isinstance(node, int) and 0 <= node < self.nodes and 0 <= down < up):
                raise RoutingError(f"outage {(node, down, up)}: needs a node in 0..{self.nodes - 1} and 0 <= down_s < up_s")
        return self

    def alive(self, t: float) -> list[bool]:
        """Which nodes the router may use at ``t``."""
        alive = [True] * self.nodes
        for node, down, up in self.outages:
            if down <= t < up:
                alive[node] = False
        if not any(alive):
            raise RoutingError(f"every node is down at {t:.0f} s: outages {self.outages}")
        return alive


@dataclass
class _Moves:
    """Sessions that changed node, and what their previous node still held (the shared-tier estimate)."""

    last_node: dict[int, int] = field(default_factory=dict)  # session -> node of its previous request
    pending: dict[tuple[int, int], int] = field(default_factory=dict)  # (sid, ridx) -> previous node, until done
    requests: int = 0
    recoverable_blocks: int = 0  # held by the previous node, missed by the new one


class FleetNode(ReplayRun):
    """One node of a fleet: a ``ReplayRun`` that also scores, for a session that moved here, what its
    previous node still held, and charges each SSD write to the session whose block it is."""

    fleet: "FleetRun"

    def charge(self, acts: Actions, t: float) -> None:
        if acts.ssd_writes or acts.state_writes:
            self.fleet.charge_sessions(acts, self.core.ssd, self.core.ckpt_bytes)
        super().charge(acts, t)

    def compute_done(self, rid: int, t: float) -> None:
        a = self.active[rid]
        prev = self.fleet.moves.pending.pop((a.sid, a.ridx), None)
        if prev is not None and a.plan.n_blocks < a.achievable:  # else nothing to recover
            core = self.fleet.nodes[prev].core
            dram, ssd = core.dram, core.ssd
            held = 0
            for k in a.keys:
                if k not in dram and k not in ssd:
                    break
                held += 1
            stride = self.keys.stride
            if stride:
                held -= held % stride
            self.fleet.moves.recoverable_blocks += max(0, min(held, a.achievable) - a.plan.n_blocks)
        super().compute_done(rid, t)


@dataclass
class FleetResult:
    metrics: dict  # the fleet: single-node keys over all requests and drives
    per_node: list[dict]  # one single-node record per node, with ``dwpd``, ``prefill_tokens``
    fleet: dict  # nodes, router, per-drive DWPD, imbalance, moves, shared-tier estimate
    log: RequestLog
    end_time_s: float
    interrupted: bool = False


class FleetRun:
    """N ``FleetNode``s over one workload, a router, and the loop that runs their events in time order."""

    def __init__(self, sessions: Sequence["TraceSession"], start_times: Sequence[float], cfg: SariaConfig,
                 spec: ModelSpec, settings: ReplaySettings, fleet: FleetSettings) -> None:
        self.fleet = fleet.validate()
        if cfg.admission.policy == OracleAdmission.name:
            raise RoutingError("--policy oracle: the clairvoyant bound is single-node only (no --nodes/--router)")
        self.cfg, self.spec, self.settings = cfg, spec, settings
        first = FleetNode(sessions, start_times, cfg, spec, settings, node=0)
        self.workload = first.workload
        self.nodes: list[FleetNode] = [first] + [
            FleetNode(sessions, start_times, cfg, spec, settings, workload=self.workload, node=i)
            for i in range(1, fleet.nodes)]
        for n in self.nodes:
            n.fleet = self
        self.router: Router = make_router(fleet.router, fleet.nodes, cfg.metadata.block_tokens, fleet.seed,
                                          fleet.cache_aware, fleet.session)
        self.moves = _Moves()
        self.routed = [0] * fleet.nodes
        self.decisions: list[tuple[float, int, int]] = []  # (time, session, node) of every routed request
        # the session each block key belongs to (its first sender; WEKA keys are scoped per session)
        owner = np.full(len(self.workload.keys.key_objs), -1, dtype=np.int64)
        for sid, chains in enumerate(self.workload.keys.block_keys):
            for chain in chains:
                mine = chain[owner[chain] < 0]
                owner[mine] = sid
        self.key_owner = owner
        self.session_writes = np.zeros(len(sessions), dtype=np.int64)  # SSD bytes written per session, any node

    def charge_sessions(self, acts: Actions, ssd: Tier, state_bytes: int) -> None:
        """Charges ``acts``' SSD writes to their blocks' sessions (a block written and evicted within the
        same call: an equal share of the bytes the resident ones leave; a state write: ``state_bytes``)."""
        keys = acts.ssd_writes
        sizes = [ssd.size_of(k)[1] if k in ssd else -1 for k in keys]
        gone = sizes.count(-1)
        states = acts.state_writes
        left = acts.ssd_write_bytes - state_bytes * len(states) - sum(x for x in sizes if x >= 0)
        rest = left // gone if gone else 0
        np.add.at(self.session_writes, self.key_owner[keys], [x if x >= 0 else rest for x in sizes])
        if states:
            np.add.at(self.session_writes, self.key_owner[states], state_bytes)

    def route(self, sid: int, ridx: int, t: float) -> None:
        """The client issues a request: the router picks its node, the node admits or queues it."""
        keys = self.workload.keys.block_keys[sid][ridx].tolist()
        tokens = self.workload.sessions[sid].requests[ridx].input_tokens
        nodes = self.nodes
        node = self.router.pick(keys, tokens, [n.in_flight + len(n.waiting) for n in nodes], t, sid,
                                 [n.core.ssd.bytes_written for n in nodes],
                                 self.fleet.alive(t) if self.fleet.outages else ())
        self.decisions.append((t, sid, node))
        moves = self.moves
        prev = moves.last_node.get(sid)
        if prev is not None and prev != node:
            moves.requests += 1
            moves.pending[sid, ridx] = prev
        moves.last_node[sid] = node
        self.routed[node] += 1
        nodes[node].issue(sid, ridx, t)

    def loop(self, bar=None) -> bool:
        """Every event in time order; a node's transfer ends first on ties (lowest node first), as on one
        node. True if Ctrl-C stopped it."""
        heap, nodes, route = self.workload.events.heap, self.nodes, self.route
        coords = [n.coord for n in nodes]
        heappop, inf = heapq.heappop, math.inf
        gc_was_enabled = gc.isenabled()
        gc.disable()  # as in ReplayRun.loop: no reference cycles, and the collector's passes cost time
        try:
            while True:
                t_coord, busy = inf, -1
                for i, c in enumerate(coords):
                    if c.active:
                        tc = c.next_event_time()
                        if tc < t_coord:
                            t_coord, busy = tc, i
                if not heap and busy < 0:
                    break
                t_heap = heap[0][0] if heap else inf
                if t_coord <= t_heap:
                    node = nodes[busy]
                    for rid, t_done in coords[busy].advance(t_coord):
                        node.transfer_done(rid, t_done)
                    continue
                t, _, kind, payload = heappop(heap)
                if kind == _ISSUE:
                    route(payload[0], payload[1], t)
                else:
                    nodes[kind - 1].compute_done(payload, t)
                    if bar is not None:
                        bar.update(1)
        except KeyboardInterrupt:
            logger.warning("fleet replay interrupted after %d requests; reporting partial results",
                           sum(len(n.log) for n in nodes))
            return True
        finally:
            if gc_was_enabled:
                gc.enable()
        return False

    def result(self, label: str, interrupted: bool = False) -> FleetResult:
        nodes, n = self.nodes, len(self.nodes)
        cap = self.cfg.capacity.ssd_tokens * self.spec.kv_bytes_per_token
        days = self.workload.truncation.span_s / SECONDS_PER_DAY
        per_node = []
        for node in nodes:
            m = node.result(label).metrics
            m["dwpd"] = m["ssd_write_bytes"] / cap / days if cap and days else 0.0
            m["prefill_tokens"] = round(node.gpu_busy * self.settings.prefill_tokens_per_s)
            per_node.append(m)
        log = nodes[0].log if n == 1 else merge_logs([node.log for node in nodes])
        written = sum(node.core.ssd.bytes_written for node in nodes)
        then_read = sum(node.core.ssd.bytes_written_then_read for node in nodes)
        end_t = max(node.end_t for node in nodes)
        metrics = summarize(
            label, log,
            ssd_write_bytes=written,
            ssd_read_bytes=sum(node.core.ssd.bytes_read for node in nodes),
            ssd_capacity_bytes=cap * n,
            writes_never_read_frac=1.0 - then_read / written if written else 0.0,
            dram_evictions=sum(node.core.stats.dram_evictions for node in nodes),
            days_replayed=days,
            dwpd=self.settings.dwpd,
            drain_s=end_t,
            request_set=f"{sum(node.served_digest for node in nodes) & _DIGEST_MASK:016x}",
            ssd_write_busy_s=sum(node.coord.write_busy_s for node in nodes) / n,
            promoted_bytes=sum(node.promoted_bytes for node in nodes),
        )
        return FleetResult(metrics, per_node, self.summary(metrics, per_node, days), log, end_t, interrupted)

    def summary(self, metrics: dict, per_node: list[dict], days: float) -> dict:
        """Per-drive DWPD, load imbalance, moves and the shared-tier estimate of one fleet replay."""
        dwpd = [m["dwpd"] for m in per_node]
        reqs = [m["requests"] for m in per_node]
        prefill = [m["prefill_tokens"] for m in per_node]
        bt = self.cfg.metadata.block_tokens
        rec = self.moves.recoverable_blocks
        ach = metrics["blocks_achievable"]
        return {
            "nodes": len(per_node),
            "router": self.fleet.router,
            "days": days,
            "dwpd_per_drive_mean": float(np.mean(dwpd)),
            "dwpd_per_drive_max": max(dwpd),
            "requests_max_over_mean": max_over_mean(reqs),
            "prefill_max_over_mean": max_over_mean(prefill),
            "prefill_tokens": sum(prefill),
            "session_writes_max_bytes": int(self.session_writes.max()) if len(self.session_writes) else 0,
            "moved_requests": self.moves.requests,
            "moved_frac": self.moves.requests / metrics["requests"] if metrics["requests"] else 0.0,
            "router_stats": dict(self.router.stats),
            "shared_tier": {
                "recoverable_blocks": rec,
                "char": (metrics["blocks_hit"] + rec) / ach if ach else 1.0,
                "prefill_tokens_saved": rec * bt,
                "read_bytes": rec * bt * self.spec.kv_bytes_per_token,
            },
        }


def max_over_mean(values: Sequence[float]) -> float:
    mean = float(np.mean(values)) if len(values) else 0.0
    return max(values) / mean if mean else 1.0


def merge_logs(logs: list[RequestLog]) -> RequestLog:
    """The nodes' logs as one, in completion order; ``ssd_bytes_written`` becomes the fleet's running total."""
    out = RequestLog()
    done = np.concatenate([np.asarray(lg.done_s, dtype=np.float64) for lg in logs])
    order = np.argsort(done, kind="stable")
    for name in ("hit_blocks", "achievable_blocks", "used_ssd", "transfer_s", "ttft_s", "done_s", "ssd_hit_blocks", "queue_s"):
        merged = [v for lg in logs for v in getattr(lg, name)]
        setattr(out, name, [merged[i] for i in order])
    steps = np.concatenate([np.diff(np.asarray(lg.ssd_bytes_written, dtype=np.int64), prepend=0) for lg in logs])
    out.ssd_bytes_written = np.cumsum(steps[order]).tolist()
    return out


def fleet_replay(sessions: Sequence["TraceSession"], start_times: Sequence[float], cfg: SariaConfig, spec: ModelSpec,
                 settings: ReplaySettings | None = None, fleet: FleetSettings = FleetSettings(), progress: bool = False,
                 label: str | None = None) -> FleetResult:
    """Replay ``sessions`` on a fleet of ``fleet.nodes`` nodes behind ``fleet.router``, one policy on every node.

    Deterministic; with one node the ``metrics`` equal ``replay``'s for the same inputs. Ctrl-C returns
    the partial result with ``interrupted=True``.
    """
    settings = settings or ReplaySettings()
    label = label or cfg.admission.policy
    run = FleetRun(sessions, start_times, cfg, spec, settings, fleet)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=run.workload.truncation.requests, desc=f"{label} x{fleet.nodes} {fleet.router}",
                   unit="req", mininterval=0.5)
    try:
        interrupted = run.loop(bar)
    finally:
        if bar is not None:
            bar.close()
    return run.result(label, interrupted)


def format_nodes(metrics: dict, fleet: dict, per_node: list[dict]) -> str:
    """Per-node table and the fleet's imbalance line (a ``FleetResult``'s parts), for ``saria-replay --nodes``."""
    rows = [["node", "reqs", "prefill Mtok", "SSD W TB", "W/C", "DWPD", "CHAR", "TTFT s", "P90 s"]]
    for i, m in enumerate(per_node):
        rows.append([str(i), str(m["requests"]), f"{m['prefill_tokens'] / 1e6:.1f}", f"{m['ssd_write_bytes'] / 1e12:.2f}",
                     f"{m['ssd_writes_norm']:.2f}", f"{m['dwpd']:.2f}", f"{m['char']:.3f}", f"{m['ttft_mean_s']:.3f}",
                     f"{m['ttft_p90_s']:.3f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    f, st = fleet, fleet["shared_tier"]
    lines.append(f"{metrics['policy']} on {f['nodes']} nodes, {f['router']}: DWPD per drive mean {f['dwpd_per_drive_mean']:.2f}, "
                 f"max {f['dwpd_per_drive_max']:.2f}; requests max/mean {f['requests_max_over_mean']:.2f}, prefill tokens "
                 f"max/mean {f['prefill_max_over_mean']:.2f}; {f['moved_frac']:.1%} of requests changed node "
                 f"(a shared tier would serve {st['prefill_tokens_saved'] / 1e6:.1f}M of their prefill tokens: CHAR "
                 f"{metrics['char']:.3f} -> {st['char']:.3f})")
    return "\n".join(lines)
