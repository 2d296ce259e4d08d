"""The store's write path: slots, stripe runs on the write workers, group commits.

A put reserves slots (evicting the victim order's first objects for room, or waiting for an
in-flight put to commit when the rest of the store is in flight: backpressure), writes its
stripe runs on the write workers (xxh3 per run and the device digest's lanes on the way), and
resolves once the committer thread has made its index row durable: data first, then the row,
so after kill -9 every object whose put completed is back and nothing else is. A full file
system (ENOSPC) puts the write path in a refusing state with back-off (``DiskFull``).

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
from sglang_saria.storage.results import (
    ObjectOp,
    PutResult,
    StoreOffline,
    describe,
    host_pieces,
    is_enospc,
    resolved,
    xxh3,
)

logger = logging.getLogger("sglang_saria.storage.store")  # one logger for the store's messages

_FLUSH_EVERY_S = 1.0
DISK_FULL_FIRST_RETRY_S = 1.0
DISK_FULL_MAX_RETRY_S = 60.0


@dataclass
class DiskFull:
    """The store's answer to a full file system: after ENOSPC (a slab write or an index commit)
    it refuses puts without touching the disk while reads go on, lets one put through to try
    again (1 s later, then after twice as long each time, up to 60 s), and resumes when a put
    commits. A full disk costs one log line, not a failed write and fsync per put."""

    since: Optional[float] = None  # when the disk filled; None: puts are admitted
    reason: str = ""
    retry_in_s: float = 0.0
    retry_at: float = 0.0
    probe: Optional[str] = None  # the key of the put let through to try the disk again

    def admits(self, key: str, now: float) -> bool:
        """May this put touch the disk? While full, only the retry (one put at a time) may."""
        if self.since is None or self.probe == key:
            return True
        if self.probe is None and now >= self.retry_at:
            self.probe = key
            return True
        return False

    def failed(self, keys: Sequence[str], reason: str, now: float) -> bool:
        """Puts of ``keys`` (or a commit of none) hit ENOSPC; True when the disk just filled."""
        if self.since is None:
            self.since, self.reason, self.retry_in_s, self.probe = now, reason, DISK_FULL_FIRST_RETRY_S, None
            self.retry_at = now + self.retry_in_s
            return True
        if self.probe in keys:
            self.probe = None
            self.retry_in_s = min(2 * self.retry_in_s, DISK_FULL_MAX_RETRY_S)
            self.retry_at = now + self.retry_in_s
        return False

    def settled(self, keys: Sequence[str]) -> None:
        """Puts of ``keys`` ended without telling whether there is room (another error, no slots):
        the next put after the retry time tries instead."""
        if self.probe in keys:
            self.probe = None

    def succeeded(self, now: float) -> Optional[float]:
        """A put committed, so the disk has room: how long it was full (None: it was not)."""
        if self.since is None:
            return None
        full_s, self.since, self.probe = now - self.since, None, None
        return full_s


@dataclass
class PendingPut:
    entry: Entry
    future: Future
    evicted: List[str]
    t0: float


class WritePath:
    """``put_async`` and the committer thread of ``SariaStore``."""

    @property
    def disk_full(self) -> Optional[str]:
        """Why puts are refused after ENOSPC (the first failure), or None while they are admitted."""
        return None if self._disk_full.since is None else self._disk_full.reason

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
                if not self._disk_full.admits(key, time.monotonic()):
                    self._count("put", "disk_full")
                    reason = f"ENOSPC: disk full ({self._disk_full.reason}); puts refused until a retry succeeds"
                    return resolved(PutResult(key, False, reason)), None
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
                    self._disk_full.settled([key])
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
        keys = [p.entry.key for p in pendings]
        with self._lock:
            for p in pendings:
                self._alloc.release(p.entry.slots.tolist())
                self._inflight.pop(p.entry.key, None)
            if is_enospc(err):
                self._count("put", "enospc", len(pendings))
                self._note_disk_full(keys, reason)
            else:
                self._count("put", "error", len(pendings))
                self._disk_full.settled(keys)
                logger.warning("saria store %s: %d put(s) failed: %s", self.name, len(pendings), reason)
        for p in pendings:
            p.future.set_result(PutResult(p.entry.key, False, reason, p.evicted))

    def _note_disk_full(self, keys: Sequence[str], reason: str) -> None:
        """Under the lock: ENOSPC; the one log line when the disk has just filled."""
        if self._disk_full.failed(keys, reason, time.monotonic()):
            self._metrics.disk_full.labels(self.name).set(1)
            logger.warning(
                "saria store %s: disk full (%s): puts are refused without touching the disk and "
                "reads go on; a put retries after %.0f s, then after twice as long each time up to %.0f s",
                self.name,
                reason,
                DISK_FULL_FIRST_RETRY_S,
                DISK_FULL_MAX_RETRY_S,
            )

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
            self._commit(puts, asked=bool(waiters) or stop)
            for w in waiters:
                w.set()

    def _commit(self, puts: List[PendingPut], asked: bool) -> None:
        """Commit ``puts`` with the pending deletes and touches. While the disk is full these wait
        for a put (the retry) or an ``asked`` commit (flush, close) instead of trying every second."""
        if self._offline is not None:  # the index went with the data dir
            if puts:
                self._fail_puts(puts, StoreOffline(self._offline))
            with self._lock:
                self._counters.take().done(False)
            return
        if not (puts or asked) and self._disk_full.since is not None:
            return
        with self._lock:
            deletes, self._pending_deletes = self._pending_deletes, []
            touches, self._touched = self._touched, {}
            counters = self._counters.take()
        if not (puts or deletes or touches or counters):
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
                counters,
            )
        except BaseException as e:  # noqa: BLE001 - e.g. ENOSPC in the index: reads go on
            with self._lock:
                self._pending_deletes = deletes + self._pending_deletes
                self._counters.put_back(counters)
            if puts:
                self._fail_puts(puts, e)
            elif is_enospc(e):
                with self._lock:
                    self._note_disk_full([], describe(e))
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
            full_s = self._disk_full.succeeded(time.monotonic()) if puts else None
        counters.done(True)
        if full_s is not None:
            logger.info("saria store %s: the disk has room again after %.1f s full: puts resumed", self.name, full_s)
        now = time.perf_counter()
        for p in puts:
            self._metrics.op_seconds.labels(self.name, "put").observe(now - p.t0)
            p.future.set_result(PutResult(p.entry.key, True, None, p.evicted))
        self._update_gauges()
