"""A device pool under SGLang's admission with direct reloads, step by step: the replay's model of
reload admission (`mem_cache/reload_admission.py`) and the reference its tests check the rule on.

What is modelled, per scheduler step, in this order (SGLang's, `Scheduler.event_loop` with
`check_hicache_events` before the admission loop):

1. arrivals join the waiting queue (first come, first served); a request with a stored prefix
   gets a deferred reload;
2. published tails whose hold passed its deadline are unlocked (evictable);
3. reloads whose reads took ``read_steps`` steps are published: their tail joins the cache,
   locked (held) until the request's prefill (``hold="prefill"``) or for one step
   (``hold="step"``, the behaviour before the rule);
4. deferred reloads claim device slots (evicting unlocked cache LRU first): under the rule
   (``claims="rule"``, `reload_admission.admits` in `claim_order`; one it holds back gives up,
   its request recomputing, when its read is slower than computing its tokens:
   `reload_admission.waiting_pays` with the modelled rates), the rule without that check
   (``claims="rule-wait"``), or whenever the pool allows (``claims="greedy"``);
5. SGLang's admission loop (`PrefillAdder.add_one_req`): in queue order, a request whose
   reload is still running is skipped, the first one that does not fit stops the loop; a
   request fits when ``uncached + max_new + page < free + evictable - reserve`` with its own
   tail locked; admitted, its uncached part is allocated and ``max_new`` reserved;
6. running requests decode one token each (from their reserve); a finished request's KV joins
   the cache unlocked.

Time: a reload's read takes ``read_steps`` steps (its rate ``stored / read_steps`` tokens per
step); with ``prefill_tps`` (tokens per step) a prefill batch of ``T`` tokens keeps the
scheduler busy ``ceil(T / prefill_tps)`` more steps (no step runs meanwhile; reads go on), so the
finish steps are latencies; without it prefill is free (tokens only).

Tokens only (no pages, no shared prefixes): each request's stored prefix is its own. A tail
evicted before its request is admitted is wasted (`DeviceRun.wasted`); a run whose requests
cannot all finish within ``max_steps`` is deadlocked (`DeviceRun.deadlocked`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from sglang_saria.mem_cache.reload_admission import (
    Holders,
    ReloadDemand,
    admission_need,
    claim_order,
    fits_alone,
    recomputing,
    waiting_pays,
)

CLAIMS = ("rule", "rule-wait", "greedy")
HOLDS = ("prefill", "step")


@dataclass(frozen=True)
class DeviceRequest:
    """One request: ``stored`` tokens of its prompt in the store (reloaded if it can be), then
    ``uncached`` tokens to compute, then ``max_new`` tokens decoded."""

    rid: str
    arrival: int
    stored: int
    uncached: int
    max_new: int


@dataclass
class _Entry:
    """Cached KV on the device: a published tail (``owner`` waiting for it) or a finished request's."""

    tokens: int
    owner: Optional[str] = None  # the request whose reload published it, until its admission
    locks: int = 0


@dataclass
class _Running:
    rid: str
    tokens: int  # KV it owns (locked)
    left: int  # tokens still to decode (its reserve)


@dataclass
class DeviceRun:
    """A finished simulation: per request, the step it was admitted and finished at and the
    stored tokens it was admitted with on the device; tokens reloaded then evicted unused."""

    admitted: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)
    reused: dict[str, int] = field(default_factory=dict)
    reloaded: int = 0
    wasted: int = 0
    refused: int = 0  # reloads that could not fit even in an empty pool
    gave_up: int = 0  # reloads held back whose read was slower than computing (`waiting_pays`)
    steps: int = 0
    deadlocked: bool = False


class DevicePool:
    """The model (module docstring). ``capacity``: device tokens; ``page``: SGLang's per-request
    overhead; ``hold_steps``: a published tail's deadline (None: until its prefill);
    ``read_steps``, ``prefill_tps``: the module docstring's time."""

    def __init__(self, capacity: int, *, claims: str = "rule", hold: str = "prefill", page: int = 16,
                 read_steps: int = 1, hold_steps: Optional[int] = None, prefill_tps: Optional[float] = None) -> None:
        if claims not in CLAIMS:
            raise ValueError(f"claims={claims!r}: expected one of {CLAIMS}")
        if hold not in HOLDS:
            raise ValueError(f"hold={hold!r}: expected one of {HOLDS}")
        self.capacity, self.claims, self.hold, self.page = capacity, claims, hold, page
        self.read_steps, self.hold_steps, self.prefill_tps = read_steps, hold_steps, prefill_tps
        self.busy_until = 0  # the step the scheduler's prefill forward ends at
        self.free = capacity
        self.cache: list[_Entry] = []  # LRU first
        self.holders = Holders()
        self.running: list[_Running] = []

    # ------------------------------------------------------------------ the pool
    def _evictable(self) -> int:
        return sum(e.tokens for e in self.cache if e.locks == 0)

    def _reserve(self) -> int:
        return sum(r.left for r in self.running)

    def room(self) -> int:
        return self.free + self._evictable() - self._reserve()

    def _alloc(self, tokens: int, run: DeviceRun) -> bool:
        for entry in list(self.cache):
            if self.free >= tokens:
                break
            if entry.locks == 0:
                self.cache.remove(entry)
                self.free += entry.tokens
                if entry.owner is not None:
                    run.wasted += entry.tokens
        if self.free < tokens:
            return False
        self.free -= tokens
        return True

    # ------------------------------------------------------------------ the run
    def run(self, requests: list[DeviceRequest], max_steps: int = 10_000) -> DeviceRun:
        run = DeviceRun()
        by_rid = {r.rid: r for r in requests}
        arrivals = sorted(requests, key=lambda r: (r.arrival, r.rid))
        waiting: list[str] = []
        deferred: list[str] = []
        reading: dict[str, int] = {}  # rid -> step its reload is published
        tails: dict[str, tuple[_Entry, Optional[int]]] = {}  # rid -> its held tail, the hold's deadline
        for step in range(max_steps):
            run.steps = step
            if step < self.busy_until:
                continue  # the prefill forward runs; reads go on in the worker
            while arrivals and arrivals[0].arrival <= step:
                req = arrivals.pop(0)
                waiting.append(req.rid)
                if req.stored:
                    deferred.append(req.rid)
            self._expire(tails, step)
            for rid in [rid for rid, due in reading.items() if due <= step]:
                del reading[rid]
                entry = _Entry(by_rid[rid].stored, owner=rid, locks=1)
                self.cache.append(entry)
                deadline = step + 1 if self.hold == "step" else (
                    None if self.hold_steps is None else step + self.hold_steps)
                tails[rid] = (entry, deadline)
            self._claim(by_rid, waiting, deferred, reading, step, run)
            self._admit(by_rid, waiting, set(deferred) | set(reading), tails, step, run)
            self._decode(step, run)
            if not (arrivals or waiting or self.running):
                return run
        run.deadlocked = True
        return run

    def _expire(self, tails: dict[str, tuple[_Entry, Optional[int]]], step: int) -> None:
        for rid, (entry, deadline) in list(tails.items()):
            if deadline is not None and step >= deadline and entry.locks:
                entry.locks -= 1
                self.holders.release(rid)

    def _demand(self, by_rid: dict[str, DeviceRequest], waiting: list[str], reloading: set[str], rid: str) -> ReloadDemand:
        """``rid``'s reload demand; ``ahead``: the requests before it in the queue that wait for no
        reload (neither reloading nor holding), as needing their whole prompt."""
        req, position = by_rid[rid], waiting.index(rid)
        need = admission_need(req.stored + req.uncached, req.stored, req.max_new, self.page)
        ahead = sum(admission_need(by_rid[r].stored + by_rid[r].uncached, 0, by_rid[r].max_new, self.page)
                    for r in waiting[:position] if r not in reloading and r not in self.holders)
        return ReloadDemand(rid, req.stored, need, position, ahead)

    def _claim(self, by_rid: dict[str, DeviceRequest], waiting: list[str], deferred: list[str],
               reading: dict[str, int], step: int, run: DeviceRun) -> None:
        reloading = set(deferred) | set(reading)
        demands = [self._demand(by_rid, waiting, reloading, rid) for rid in deferred]
        for demand in claim_order(demands):
            if not fits_alone(self.capacity, demand):
                deferred.remove(demand.rid)  # recomputed: its stored part is uncached now
                run.refused += 1
                continue
            if self.claims != "greedy":
                if not self.holders.admits(self.room(), demand):
                    if self.claims == "rule-wait" or waiting_pays(
                            demand.tokens, demand.tokens / self.read_steps, self.prefill_tps):
                        return
                    deferred.remove(demand.rid)  # recomputed, its need held until its admission
                    self.holders.hold(recomputing(demand))
                    run.gave_up += 1
                    continue
            elif self.free + self._evictable() < demand.tokens:
                return
            if not self._alloc(demand.tokens, run):
                return
            deferred.remove(demand.rid)
            reading[demand.rid] = step + self.read_steps
            run.reloaded += demand.tokens
            self.holders.hold(demand)

    def _admit(self, by_rid: dict[str, DeviceRequest], waiting: list[str], pending: set[str],
               tails: dict[str, tuple[_Entry, Optional[int]]], step: int, run: DeviceRun) -> None:
        for rid in list(waiting):
            if rid in pending:
                continue  # check_prefetch_progress: not yet
            req = by_rid[rid]
            entry = tails[rid][0] if rid in tails and tails[rid][0] in self.cache else None
            cached = req.stored if entry is not None else 0
            need = admission_need(req.stored + req.uncached, cached, req.max_new, self.page)
            if entry is not None:
                entry.locks += 1  # add_one_req locks the request's own prefix
            fits = need < self.room()
            if not fits:
                if entry is not None:
                    entry.locks -= 1
                return  # NO_TOKEN ends the loop
            compute = req.stored + req.uncached - cached
            assert self._alloc(compute, run), "admitted within free + evictable"
            waiting.remove(rid)
            tokens = compute
            if entry is not None:  # the request owns its tail now; its hold ends with the prefill
                self.cache.remove(entry)  # its slots move to the request, still allocated
                tokens += entry.tokens
            tails.pop(rid, None)
            self.holders.release(rid)
            self.running.append(_Running(rid, tokens, req.max_new))
            run.admitted[rid] = step
            run.reused[rid] = cached
            if self.prefill_tps:
                self.busy_until = max(self.busy_until, step + 1) + math.ceil(compute / self.prefill_tps)

    def _decode(self, step: int, run: DeviceRun) -> None:
        for r in list(self.running):
            if r.left:
                if not self._alloc(1, run):
                    continue  # SGLang would retract; the reserve makes this rare
                r.left -= 1
                r.tokens += 1
            if r.left == 0:
                self.running.remove(r)
                self.cache.append(_Entry(r.tokens))
                run.finished[r.rid] = step


# before the rule, the naive hold, the rule waiting for memory, the rule weighing reads
MODES = (("greedy", "step"), ("greedy", "prefill"), ("rule-wait", "prefill"), ("rule", "prefill"))


def sessions_at_once(count: int, stored: int, uncached: int, max_new: int) -> list[DeviceRequest]:
    """``count`` sessions after a restart: each turn's history in the store, all arriving at once."""
    return [DeviceRequest(f"s{i}", 0, stored, uncached, max_new) for i in range(count)]


def compare(capacity: int, counts: list[int], stored: int, uncached: int, max_new: int,
            max_steps: int = 100_000, read_steps: int = 1, prefill_tps: Optional[float] = None) -> list[dict]:
    """One row per session count and mode (claims, hold): reloaded tokens reused and wasted,
    reloads given up, deadlock, the step the last request finished at."""
    rows = []
    for count in counts:
        requests = sessions_at_once(count, stored, uncached, max_new)
        for claims, hold in MODES:
            pool = DevicePool(capacity, claims=claims, hold=hold, read_steps=read_steps, prefill_tps=prefill_tps)
            run = pool.run(requests, max_steps)
            rows.append({"sessions": count, "claims": claims, "hold": hold, "stored": count * stored,
                         "reused": sum(run.reused.values()), "wasted": run.wasted, "gave_up": run.gave_up,
                         "deadlocked": run.deadlocked, "last_finish": max(run.finished.values(), default=None)})
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="direct reloads under SGLang's admission: claims and holds compared")
    parser.add_argument("--capacity", type=int, default=1280, help="device tokens (default: the demo's 1,280)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    parser.add_argument("--stored", type=int, default=480, help="stored history tokens per session")
    parser.add_argument("--uncached", type=int, default=228, help="new prompt tokens per session")
    parser.add_argument("--max-new", type=int, default=8)
    parser.add_argument("--read-steps", type=int, default=1, help="steps a reload's read takes")
    parser.add_argument("--prefill-tps", type=float, default=None,
                        help="prefill tokens per step (default: prefill takes no time)")
    args = parser.parse_args(argv)
    for name in ("capacity", "stored", "uncached", "max_new", "read_steps", "prefill_tps"):
        value = getattr(args, name)
        if value is not None and value < (1 if name != "stored" else 0):
            parser.error(f"--{name.replace('_', '-')}: {value}: must be positive")
    print(f"{'sessions':>8} {'claims':<9} {'hold':<8} {'stored':>7} {'reused':>7} {'wasted':>7} {'gave up':>7} "
          f"{'deadlock':>8} {'last done':>9}")
    for r in compare(args.capacity, args.sessions, args.stored, args.uncached, args.max_new,
                     read_steps=args.read_steps, prefill_tps=args.prefill_tps):
        print(f"{r['sessions']:>8} {r['claims']:<9} {r['hold']:<8} {r['stored']:>7} {r['reused']:>7} {r['wasted']:>7} "
              f"{r['gave_up']:>7} {str(r['deadlocked']):>8} {str(r['last_finish']):>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
