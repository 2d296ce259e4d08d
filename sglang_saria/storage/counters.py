"""Per-page admission counters kept with the store (paper 4.3 metadata across restarts).

The policy's counters (``R``, ``E``, the evictions its lost SSD copy spent, last use) outlive
DRAM residency; without these rows they would not outlive the process, and a restarted server
would admit as if every block were new. The store keeps them as opaque rows in its index
(``counters`` table), written by the same group commit as the pages' rows (same transaction,
same ``sync_writes``), under a ``scope`` (the caller's model and page format), and returns
the rows younger than a window at start. It decides nothing about them.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple


@dataclass(frozen=True)
class CounterRow:
    """One page's counters as last saved; ``t_reuse`` is wall-clock seconds (``time.time``)."""

    key: int  # the page's 64-bit key (unsigned)
    r: int
    e: int
    e_spent: int
    t_reuse: float


@dataclass
class CounterBatch:
    """Rows taken for one commit: the newest row per (scope, key), the expiry per scope, the
    futures of the saves they came with (resolved once the commit is durable)."""

    rows: Dict[Tuple[str, int], CounterRow] = field(default_factory=dict)
    expire: Dict[str, float] = field(default_factory=dict)  # scope -> delete rows used before this
    futures: List[Future] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.rows or self.expire or self.futures)

    def done(self, ok: bool) -> None:
        for f in self.futures:
            f.set_result(ok)


class PendingCounters:
    """Counter rows waiting for the store's next index commit (callers hold the store's lock)."""

    def __init__(self) -> None:
        self._batch = CounterBatch()

    def add(self, scope: str, rows: Sequence[CounterRow], expire_before: float | None) -> Future:
        batch = self._batch
        for row in rows:
            batch.rows[(scope, row.key)] = row
        if expire_before is not None:
            batch.expire[scope] = max(expire_before, batch.expire.get(scope, expire_before))
        future: Future = Future()
        batch.futures.append(future)
        return future

    def take(self) -> CounterBatch:
        batch, self._batch = self._batch, CounterBatch()
        return batch

    def put_back(self, batch: CounterBatch) -> None:
        """A commit failed: its rows go with the next one (rows saved since are newer and win)."""
        batch.rows.update(self._batch.rows)
        for scope, t in self._batch.expire.items():
            batch.expire[scope] = max(t, batch.expire.get(scope, t))
        batch.futures += self._batch.futures
        self._batch = batch
