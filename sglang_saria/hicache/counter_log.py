"""Admission counters across restarts (paper 4.3: metadata outlives residency).

The policy's counters per page (``R``, ``E``, ``e_spent``, ``t_reuse``: `ContextMetadata`) carry
a page's history across host residencies. Without this module they die with the process, and a
restarted server admits as if every block were new: under ``eviction:E2`` a page evicted once
before a restart would need two more evictions after it.

- save (`CounterLog.save`, once per scheduler step, on the scheduler thread): the counters
  changed since the last step are handed to the store (`SariaStore.save_counters`), whose
  committer writes them in its next index commit: the same transaction and sync as the pages'
  rows. Nothing waits for the disk here. About once a minute a save also carries the window's
  start, and rows unused for a whole window leave the index.
- restore (`restore_counters`, once per policy, where the runtime is built: `runtime.build_runtime`,
  the same point on every rank): rows used within
  ``metadata.metadata_window_s`` come back as counters (``t_reuse`` as an age on the policy's
  clock); older ones are dropped from the index. With several attention ranks each rank's
  store holds the rows its own saves wrote (the same decisions, but a rank killed between two
  commits lags): every rank restores the same rows, its own if a digest says all ranks hold
  the same, else the keys every rank holds with the smallest counters and the oldest use.
- `sglang:saria_counters_unsaved` is 1 while counters changed since the last save, plus one per
  save not yet durable: 0 means a restart now keeps every counter (tests wait on it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Optional

from sglang_saria.hicache.metrics import SariaServingMetrics
from sglang_saria.mem_cache.metadata import ContextMetadata
from sglang_saria.storage.counters import CounterRow

logger = logging.getLogger(__name__)

EXPIRE_EVERY_S = 60.0  # how often a save carries the window's start (the delete scans the table)

Row = tuple[int, int, int, int, int]  # key, R, E, e_spent, age in whole seconds


class _ChangeSet(set):
    """The metadata's changed keys; calls ``on_first`` when a change comes into an empty set."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        super().__init__()
        self.on_first = on_first

    def update(self, *keys: Iterable[int]) -> None:
        empty = not self
        super().update(*keys)
        if empty and self:
            self.on_first()


class CounterLog:
    """Hands the policy's changed counters to the store each step (see the module docstring)."""

    def __init__(self, store: Any, scope: str, metadata: ContextMetadata, clock: Callable[[], float],
                 window_s: float) -> None:
        self.store = store
        self.scope = scope
        self.metadata = metadata
        self.clock = clock
        self.window_s = window_s
        self.saved_rows = 0  # rows handed to the store by this process
        self._metrics = SariaServingMetrics.get()
        self._expired_at: Optional[float] = None
        metadata.changed = _ChangeSet(lambda: self._metrics.counters_unsaved(1))

    def save(self) -> None:
        """The counters changed since the last call go to the store's next commit (no I/O here)."""
        if not self.metadata.changed:
            return
        changed = self.metadata.take_changed()
        now, wall = self.clock(), time.time()
        rows = [CounterRow(key, n.R, n.E, n.e_spent, wall - (now - n.t_reuse)) for key, n in changed]
        expire = None
        if self._expired_at is None or now - self._expired_at >= EXPIRE_EVERY_S:
            self._expired_at, expire = now, wall - self.window_s
        try:
            future = self.store.save_counters(self.scope, rows, expire)
        except RuntimeError as e:  # the store was closed (backend detached): nothing to keep them in
            logger.warning("saria: %d page counters not saved: %s", len(rows), e)
            self._metrics.counters_unsaved(-1)
            return
        self.saved_rows += len(rows)
        future.add_done_callback(lambda _: self._metrics.counters_unsaved(-1))


def restore_counters(policy: Any, backend: Any, agreement: Any = None) -> Optional[CounterLog]:
    """Seed ``policy``'s metadata with the counters its store kept within the window, and start
    saving its changes there (None: the backend has no store). ``agreement``: the ranks'
    `RankAgreement` (every rank restores the same rows; a collective), None on one rank."""
    store = getattr(backend, "store", None)
    if store is None:
        return None
    window = policy.config.metadata.metadata_window_s
    scope = backend.storage_key("")  # the model and page format the store's keys carry
    wall = time.time()
    loaded, expired = store.load_counters(scope, wall - window)
    rows: list[Row] = [(r.key, r.r, r.e, r.e_spent, int(max(0.0, wall - r.t_reuse))) for r in loaded]
    if agreement is not None:
        rows = agree_rows(agreement, rows)
    now = policy.clock()
    rows.sort(key=lambda row: -row[4])  # oldest use first
    restored = policy.metadata.restore((k, r, e, spent, now - age) for k, r, e, spent, age in rows)
    SariaServingMetrics.get().counters_restored(restored, expired)
    if restored or expired:
        logger.info("saria: %d page counters restored from the store (last used within %.0f s), %d older dropped",
                    restored, window, expired)
    return CounterLog(store, scope, policy.metadata, policy.clock, window)


def agree_rows(agreement: Any, rows: list[Row]) -> list[Row]:
    """The rows every rank restores: its own when all ranks hold the same, else the keys every rank
    holds, with the smallest counters and the largest age (a collective)."""
    rows = sorted(rows)
    if agreement.same_everywhere([repr(row) for row in rows]):
        return rows
    merged = agreement.reduce_objects({row[0]: row for row in rows}, _common_rows)
    logger.warning("saria: the ranks' stores kept different page counters; %d kept by every rank restored", len(merged))
    return sorted(merged.values())


def _common_rows(*per_rank: dict[int, Row]) -> dict[int, Row]:
    merged = {}
    for key in set(per_rank[0]).intersection(*per_rank[1:]):
        rows = [d[key] for d in per_rank]
        merged[key] = (key, min(r[1] for r in rows), min(r[2] for r in rows), min(r[3] for r in rows),
                       max(r[4] for r in rows))
    return merged
