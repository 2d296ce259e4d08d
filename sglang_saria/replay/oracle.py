"""The clairvoyant write bound (``--policy oracle``, replay only): the fewest writes that keep FD's hits.

Full duplicate writes every block; most of its copies are never read (docs/fidelity.md). The
oracle reads the trace's future instead: at a block's DRAM eviction it writes the block only if
a request that has not begun yet will want it while it is out of DRAM. Nothing else is written
(no insert, reuse or prewrite writes, no prefix closure), with the same SSD capacity and victim
order as every other policy, so a copy written for a request may still be evicted before it.

Which request wants which block depends on timing, and timing depends on the policy (a hit
shortens a request and moves its session's later ones), so the future is found by iteration:
pass 0 writes nothing (DRAM-only) and records, per request, the blocks it could have reused but
found neither in DRAM (``achievable`` blocks it missed) nor read from SSD; each later pass writes
for the union of every earlier pass's records. It stops at a fixed point (a pass records no new
(block, request) pair) or after ``max_passes``; the result says which. It is an estimate from
above of the minimum, not a proof: a write for a request that then finds the block in DRAM
anyway (another session recomputed it first) is counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang_saria import policy_names
from sglang_saria.mem_cache.admission import AdmissionEvent, AdmissionPolicy
from sglang_saria.mem_cache.metadata import SSD

_EVICT = AdmissionEvent.EVICT


def request_id(sid: int, ridx: int) -> int:
    """One int per request of a trace, the same in every pass (session index, request index)."""
    return (sid << 24) | ridx


@dataclass
class FutureNeeds:
    """Which blocks each request wants from below DRAM, and how many requests not yet begun want each block."""

    by_request: dict[int, set[int]] = field(default_factory=dict)
    pending: dict[int, int] = field(default_factory=dict)  # block -> requests not yet begun that want it

    @classmethod
    def of(cls, by_request: dict[int, set[int]]) -> "FutureNeeds":
        pending: dict[int, int] = {}
        for keys in by_request.values():
            for k in keys:
                pending[k] = pending.get(k, 0) + 1
        return cls(by_request, pending)

    def begun(self, rid: int) -> None:
        """Request ``rid`` was admitted: the blocks it wants are no longer wanted by a future request of it."""
        keys = self.by_request.get(rid)
        if keys:
            pending = self.pending
            for k in keys:
                pending[k] -= 1

    def wanted_later(self, key: int) -> bool:
        return self.pending.get(key, 0) > 0


class OracleAdmission(AdmissionPolicy):
    """Write a block at its DRAM eviction iff a request not yet begun wants it (``FutureNeeds``)."""

    name = "oracle"
    keyed = True

    def __init__(self, future: FutureNeeds | None = None) -> None:
        super().__init__()
        self.future = future or FutureNeeds()

    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        raise TypeError("the oracle decides by block (admits_key), not by counters")

    def admits_key(self, key: int, event: AdmissionEvent, node: object = None, victim: object = None) -> bool:
        return event is _EVICT and self.future.wanted_later(key)

    def thresholds(self, event: AdmissionEvent) -> tuple[float, float]:
        # asked at every eviction of a block not on SSD, never at insert or reuse
        return (0, 0) if event is _EVICT else (math.inf, math.inf)


@policy_names.register("oracle")
def _make_oracle(pn: policy_names.PolicyName, cfg: object, ssd_capacity_bytes: int) -> OracleAdmission:
    return OracleAdmission()


class NeedsRecorder:
    """Records, per request, the blocks it wanted from below DRAM in this pass (read from SSD or missed);
    with ``allowed``, only those blocks (the frontier's oracle restricted to its most valuable blocks)."""

    def __init__(self, allowed: frozenset[int] | None = None) -> None:
        self.by_request: dict[int, set[int]] = {}
        self.allowed = allowed

    def record(self, rid: int, keys: Sequence[int], sources: Sequence[int], achievable: int) -> None:
        """``sources``: the plan's source per hit block (DRAM or SSD); blocks past the hit prefix up to
        ``achievable`` were reusable in an ideal cache and missed."""
        wanted = [k for k, src in zip(keys, sources) if src == SSD]
        wanted += keys[len(sources):achievable]
        if self.allowed is not None:
            wanted = [k for k in wanted if k in self.allowed]
        if wanted:
            self.by_request.setdefault(rid, set()).update(wanted)

    def merge_into(self, needs: dict[int, set[int]]) -> int:
        """Add this pass's records to ``needs``; returns how many (block, request) pairs were new."""
        added = 0
        for rid, keys in self.by_request.items():
            have = needs.setdefault(rid, set())
            before = len(have)
            have |= keys
            added += len(have) - before
        return added
