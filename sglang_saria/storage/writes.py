"""The store's write path: slots, stripe runs on the write workers, group commits.

A put reserves slots (evicting the victim order's first objects for room, or waiting for an
in-flight put to commit when the rest of the store is in flight: backpressure), writes its
stripe runs on the write workers (xxh3 per run and the device digest's lanes on the way), and
resolves once the committer thread has made its index row durable: data first, then the row,
so after kill -9 every object whose put completed is back and nothing else is.

``WritePath`` is mixed into ``SariaStore`` (``store.py``), whose state it shares.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from sglang_saria.digest import Lanes
from sglang_saria.digest import lanes as digest_lanes
from sglang_saria.storage.buffers import ScatterList, Segment, as_segments, total_bytes
from sglang_saria.storage.index import Entry
from sglang_saria.storage.layout import SubIO
from sglang_saria.storage.results import ObjectOp, PutResult, StoreOffline, describe, host_pieces, resolved, xxh3

logger = logging.getLogger("sglang_saria.storage.store")  # one logger for the store's messages

_FLUSH_EVERY_S = 1.0


@dataclass
class PendingPut:
    entry: Entry
    future: Future
    evicted: List[str]
    t0: float


class WritePath:
    """``put_async`` and the committer thread of ``SariaStore``."""

    def put_async(self, key: str, data: Any, overwrite: bool = False) -> "Future[PutResult]":
        """Write an object; the future resolves once it is durable in the index."""
        self.check_key(key)
        segs = as_segments(data, writable=False)
        size = total_bytes(segs)
        if size == 0:
            raise ValueError(f"saria store: object {key!r} is empty")
        evicted: List[str] = []
        result, entry = self._reserve(key, size, overwrite, evicted)
        if evicted:
            self._count("evict", "lru", len(evicted))
            self._metrics.evictions.labels(self.name).inc(len(evicted))
            self._notify_evicted(evicted)
        if entry is not None:
            self._submit_writes(entry, segs, result, evicted)
        return result

    def _reserve(self, key: str, size: int, overwrite: bool, evicted: List[str]) -> Tuple[Future, Optional[Entry]]:
        """Slots for ``key``: (its future, the entry to write), evicting victims into ``evicted``; or
        (an answer, None) when no write is needed or none can be. Waits while in-flight puts hold
        the room it needs (they become evictable once committed)."""
        need = self.layout.slots_for(size)
        while True:
            with self._lock:
                answer = self._answer_without_write(key, overwrite)
                if answer is not None:
                    return answer, None
                while self._alloc.free_slots < need and self._entries:
                    victim = self._entries[self.order.victim()]
                    self._remove(victim)
                    evicted.append(victim.key)
                if self._alloc.free_slots >= need:
                    self._seq += 1
                    slots = np.asarray(self._alloc.take(need), dtype=np.int64)
                    future: Future = Future()
                    self._inflight[key] = future
                    return future, Entry(key, size, slots, (), self._seq, time.time())
                waiting = next(iter(self._inflight.values()), None) if need <= self.layout.nslots else None
                if waiting is None:
                    self._count("put", "full")
                    reason = (
                        f"store full: object {key!r} needs {need} slots of {self.layout.slot_bytes} "
                        f"bytes, {self._alloc.free_slots} free of {self.layout.nslots} "
                        f"(rest held by in-flight reads)"
                    )
                    return resolved(PutResult(key, False, reason, evicted)), None
            waiting.result()

    def _answer_without_write(self, key: str, overwrite: bool) -> Optional[Future]:
        """Under the lock: the answer of a put that writes nothing (store offline, key stored and
        not ``overwrite``: a touch, the same key in flight: its future); None: write it."""
        self._check_open()
        if self._offline is not None:
            self._count("put", "offline")
            return resolved(PutResult(key, False, f"store offline: {self._offline}"))
        if key in self._entries and not overwrite:
            self.order.written(key)
            self._touched[key] = time.time()
            return resolved(PutResult(key, True, already_present=True))
        return self._inflight.get(key)

    def _submit_writes(self, entry: Entry, segs: Sequence[Segment], future: Future, evicted: List[str]) -> None:
        """One write task per stripe run of the entry's slots; the last one to finish queues the commit."""
        subs = self.layout.plan(entry.slots.tolist(), entry.size)
        op = ObjectOp(len(subs))
        pending = PendingPut(entry, future, evicted, op.t0)
        scatter = ScatterList(segs)
        for i, sub in enumerate(subs):
            self._writers.submit(self._write_sub, op, i, sub, scatter, pending)

    def _write_sub(self, op: ObjectOp, i: int, sub: SubIO, scatter: ScatterList, pending: PendingPut) -> None:
        try:
            runs = [scatter.slice(s, e) for s, e in sub.ranges]
            pieces = [p for run in runs for p in run]
            host = [host_pieces(run) for run in runs]  # one host copy of CUDA pieces for both sums
            checksum = xxh3([p for run in host for p in run])
            part = sum((digest_lanes(run, s) for run, (s, _) in zip(host, sub.ranges)), Lanes())
            written = self.engine.write(sub.dir_idx, sub.file_offset, pieces)
            self._devices[sub.dir_idx].add(written=written)
            self._metrics.ssd_bytes_written.labels(self._devices[sub.dir_idx].data_dir).inc(written)
            last = op.done(i, (checksum, part))
        except BaseException as e:  # noqa: BLE001 - reported to the caller through the future
            last = op.done(i, error=e)
        if last:
            if op.error is None:
                pending.entry.checksums = tuple(c for c, _ in op.results)
                pending.entry.digest = sum((part for _, part in op.results), Lanes()).digest
                self._commit_q.put(pending)
            else:
                self._fail_puts([pending], op.error)

    def _fail_puts(self, pendings: Sequence[PendingPut], err: BaseException) -> None:
        reason = describe(err)
        logger.warning("saria store %s: %d put(s) failed: %s", self.name, len(pendings), reason)
        with self._lock:
            for p in pendings:
                self._alloc.release(p.entry.slots.tolist())
                self._inflight.pop(p.entry.key, None)
            self._count("put", "enospc" if reason.startswith("ENOSPC") else "error", len(pendings))
        for p in pendings:
            p.future.set_result(PutResult(p.entry.key, False, reason, p.evicted))

    def put(self, key: str, data: Any, overwrite: bool = False) -> PutResult:
        return self.put_async(key, data, overwrite).result()

    def put_batch(
        self, items: Sequence[Tuple[str, Any]], overwrite: bool = False
    ) -> List["Future[PutResult]"]:
        return [self.put_async(k, d, overwrite) for k, d in items]

    # ---------------------------------------------------------------- commit
    def _commit_loop(self) -> None:
        stop = False
        while not stop:
            try:
                batch = [self._commit_q.get(timeout=_FLUSH_EVERY_S)]
            except queue.Empty:
                batch = []
            while True:
                try:
                    batch.append(self._commit_q.get_nowait())
                except queue.Empty:
                    break
            puts = [b for b in batch if isinstance(b, PendingPut)]
            waiters = [b for b in batch if isinstance(b, threading.Event)]
            stop = any(b is None for b in batch)
            self._check_data_dirs()
            self._commit(puts)
            for w in waiters:
                w.set()

    def _commit(self, puts: List[PendingPut]) -> None:
        if self._offline is not None:  # the index went with the data dir
            if puts:
                self._fail_puts(puts, StoreOffline(self._offline))
            return
        with self._lock:
            deletes, self._pending_deletes = self._pending_deletes, []
            touches, self._touched = self._touched, {}
        if not (puts or deletes or touches):
            return
        try:
            if puts and self.config.sync_writes:
                for j in range(len(self.layout.data_dirs)):
                    self.engine.sync(j)
            self._index.commit(
                [p.entry for p in puts],
                deletes,
                touches.items(),
                {d.data_dir: d.snapshot() for d in self._devices},
            )
        except BaseException as e:  # noqa: BLE001 - e.g. ENOSPC in the index: reads go on
            with self._lock:
                self._pending_deletes = deletes + self._pending_deletes
            if puts:
                self._fail_puts(puts, e)
            else:
                logger.warning("saria store %s: index update failed: %s", self.name, describe(e))
            return
        with self._lock:
            for p in puts:
                old = self._entries.pop(p.entry.key, None)
                if old is not None:
                    self._discard(old)
                self._entries[p.entry.key] = p.entry
                self.order.written(p.entry.key)
                self._inflight.pop(p.entry.key, None)
            if puts:
                self._count("put", "ok", len(puts))
        now = time.perf_counter()
        for p in puts:
            self._metrics.op_seconds.labels(self.name, "put").observe(now - p.t0)
            p.future.set_result(PutResult(p.entry.key, True, None, p.evicted))
        self._update_gauges()
