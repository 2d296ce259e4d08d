"""Slot allocator: a bump pointer over never-used slots plus a min-heap of freed ones.

Handing out the lowest free slots keeps multi-slot objects adjacent on disk
(one vectored I/O per drive) without tracking extents.
"""

from __future__ import annotations

import heapq
from typing import Iterable, List


class SlotAllocator:
    def __init__(self, nslots: int, used: Iterable[int] = ()) -> None:
        self.nslots = nslots
        used_set = {int(s) for s in used if 0 <= s < nslots}
        self._bump = max(used_set) + 1 if used_set else 0
        self._free = [s for s in range(self._bump) if s not in used_set]
        heapq.heapify(self._free)

    @property
    def free_slots(self) -> int:
        return (self.nslots - self._bump) + len(self._free)

    def take(self, n: int) -> List[int]:
        """n slots, lowest first; caller checked `free_slots >= n`."""
        if n > self.free_slots:
            raise ValueError(f"saria store: asked for {n} slots, {self.free_slots} free")
        out: List[int] = []
        while len(out) < n and self._free:
            out.append(heapq.heappop(self._free))
        if len(out) < n:
            k = n - len(out)
            out.extend(range(self._bump, self._bump + k))
            self._bump += k
        return out

    def release(self, slots: Iterable[int]) -> None:
        for s in slots:
            s = int(s)
            if s < self.nslots:
                heapq.heappush(self._free, s)
