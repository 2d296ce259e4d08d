"""Device-memory admission of direct reloads (paper 4.3): a reload's landed pages must still be on
the device when its request is admitted.

A direct reload claims device slots before its request is admitted, and its published tail is
held (locked) until the request's prefill. SGLang admits a waiting request only when its
uncached prompt part, its new tokens and one page fit in the free plus evictable device tokens
less the running requests' decode reserve (`PrefillAdder.add_one_req`: ``extend + max_new + page <
free + evictable - reserve``, the request's own prefix locked). Held tails are locked, so they
are neither free nor evictable: reloads that claim whenever the pool allows can lock so much
that none of their requests is admissible (a deadlock), and a tail released early is evicted by
the next claim before its request is admitted (the reload wasted).

**Rule.** A reload claims only if, after its claim (its path locked, its slots taken), the room
left covers, strictly, the admission need of every holder (a reload claimed, published or not,
whose request is not admitted yet), of every request ahead of it in SGLang's queue that waits for
no reload (``ahead``: SGLang's loop reaches them first, and the first that does not fit stops
it; each counted with its whole prompt, as its device prefix is unlocked, evictable room that a
claim may take), and its own::

    room - tokens > sum(need of holders) + ahead + need

**Invariant.** ``room > sum(need of holders) + ahead`` after every claim. Only three things lower
the room afterwards: another claim (which checks the rule itself), the admission of a request
that is no holder, and decode growth of running requests; both of the last end when those
requests finish, which needs no holder's memory (a holder's tail is locked, never taken from a
running request). So once the requests running at any moment have finished, the requests ahead
of the holders fit, then the holder first in SGLang's queue: neither holders nor the requests
ahead of them block each other (no deadlock by construction). Without ``ahead`` a request ahead
that no longer fits stops SGLang's loop before every holder behind it, until a hold's deadline
(30 s) unlocks a tail: a chain of such waits held agent turns for minutes. A request that joins
the queue ahead of a holder after its claim (a policy that reorders the queue) is the one case
left; each hold has a deadline, after which its tail is unlocked (evictable, its request
admitted with what is left), so no wait is unbounded. Device memory that reloads not yet claimed
lock (a follower's path, resumed on another reload's published pages) is outside the rule: a
reload held back for it waits behind them, so when the scheduler stalls the SGLang driver lets
the reloads behind it claim (`reload/pending.py::PendingReloads.start_deferred`), and gives up
those that lock a path when none of them fits either, or the first one when none locks a path
(`_break_hold_and_wait`).

**Order.** When the room is short, reloads claim in SGLang's queue order (the request admitted
first is the one whose reload is used first; a later one's held tail would wait behind it),
then by the prefill they save per device token they hold; a reload that cannot fit even in an
empty pool is refused at once (its request recomputes) rather than holding the line.

**Waiting pays only if reading is faster than computing** (`waiting_pays`). A reload the rule
holds back waits for memory its request would need just the same to recompute (a claim takes
``tokens`` now and ``need`` at admission; recomputing needs ``tokens + need`` at admission), so
both are admitted once the same memory is free; from then on the reload still has to read its
``tokens`` while the recomputing request computes them. Its request (and every request behind it
in the queue, which waits for its memory) is served sooner by recomputing when the read takes
longer than the prefill of those tokens; the reload then gives up. A reload that claims at once
reads while its request waits in the queue anyway and is kept. Rates are measured (`Throughput`:
reads from claim to publish, prefill from the scheduler's counters); while either is unknown the
reload waits, as without this check. A reload given up stays in the ledger (`recomputing`: no
tokens, its need grown by them) until its request's prefill: it is a request ahead of the reloads
behind it in the queue, and a reload claiming past it unseen could lock the memory it needs (the
invariant's one blind case, made by the rule itself).

Pure functions and a small ledger, no SGLang: the SGLang driver (`hicache/radix_cache.py`,
`reload/pending.py`) and the replay (`replay/device.py`) use the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class ReloadDemand:
    """What a reload asks of the device pool: ``tokens`` slots now (its SSD pages and the DRAM
    part loaded back), then ``need`` tokens at its request's admission (SGLang's ask: the prompt
    past the reloaded prefix, the new tokens, one page of alignment overhead)."""

    rid: str
    tokens: int
    need: int
    position: int  # in SGLang's waiting queue (arrival order where the queue is not known)
    ahead: int = 0  # summed need of the requests ahead of it in the queue that wait for no reload

    @property
    def value(self) -> float:
        """Prefill tokens saved per device token the reload holds until its admission."""
        return self.tokens / (self.tokens + self.need) if self.tokens + self.need else 0.0


def admission_need(prompt_tokens: int, cached_tokens: int, max_new_tokens: int, page_size: int) -> int:
    """SGLang's admission ask for a request whose first ``cached_tokens`` are on the device:
    its uncached prompt part, its new tokens (clipped as SGLang clips them) and one page."""
    return max(prompt_tokens - cached_tokens, 0) + max(max_new_tokens, 0) + page_size


def admits(room: int, held_need: int, demand: ReloadDemand) -> bool:
    """Whether ``demand`` may claim: ``room`` is free + evictable device tokens less the running
    requests' decode reserve, with the reload's path already locked; ``held_need`` the summed
    need of the holders. Strict, as SGLang's own check (``total < remaining``)."""
    return room - demand.tokens > held_need + demand.ahead + demand.need


def fits_alone(capacity: int, demand: ReloadDemand) -> bool:
    """Whether ``demand`` could claim at all: in an empty pool of ``capacity`` tokens."""
    return capacity - demand.tokens > demand.need


def waiting_pays(tokens: int, read_tps: Optional[float], prefill_tps: Optional[float]) -> bool:
    """Whether a reload of ``tokens`` the rule holds back should keep waiting (module docstring):
    its read, which starts only once the memory is free, is faster than computing its tokens.
    True while either rate is unknown."""
    if read_tps is None or prefill_tps is None or tokens <= 0:
        return True
    return tokens / read_tps < tokens / prefill_tps


def recomputing(demand: ReloadDemand) -> ReloadDemand:
    """A reload given up: its request computes the tokens it would have read."""
    return ReloadDemand(demand.rid, 0, demand.need + demand.tokens, demand.position, demand.ahead)


@dataclass
class Throughput:
    """Tokens per second of one kind of work (reloads' reads, prefill batches): each
    observation's rate weighted by its tokens, older ones decaying by ``exp(-tokens /
    window_tokens)`` of the newer work. Token weights keep a few tiny observations (a one-token
    warm-up prefill, whose fixed cost swamps it) from deciding what a large one costs."""

    window_tokens: float = 20_000.0
    tokens: float = 0.0
    weighted_tps: float = 0.0  # sum of tokens x rate, decayed with ``tokens``

    def add(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        keep = math.exp(-tokens / self.window_tokens)
        self.tokens = self.tokens * keep + tokens
        self.weighted_tps = self.weighted_tps * keep + tokens * (tokens / seconds)

    def tps(self) -> Optional[float]:
        return self.weighted_tps / self.tokens if self.tokens > 0 else None


def claim_order(demands: list[ReloadDemand]) -> list[ReloadDemand]:
    """The order reloads claim in when the room is short: SGLang's queue order, then value."""
    return sorted(demands, key=lambda d: (d.position, -d.value))


@dataclass
class Holders:
    """The reloads between their claim and their request's admission (or abort, or the hold's
    deadline), with the admission need each was claimed with."""

    needs: dict[str, int] = field(default_factory=dict)

    def __contains__(self, rid: str) -> bool:
        return rid in self.needs

    def held_need(self) -> int:
        return sum(self.needs.values())

    def admits(self, room: int, demand: ReloadDemand) -> bool:
        return admits(room, self.held_need(), demand)

    def hold(self, demand: ReloadDemand) -> None:
        self.needs[demand.rid] = demand.need

    def release(self, rid: str) -> bool:
        """The request was admitted, left, or its hold timed out: True if it held."""
        return self.needs.pop(rid, None) is not None

    def reset(self) -> None:
        self.needs.clear()
