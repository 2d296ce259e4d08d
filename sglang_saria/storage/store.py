"""SariaStore: the L3 object store on local SSDs.

Objects (FA KV blocks, GDN checkpoints) are byte strings under string keys,
kept in fixed-size aligned slots striped over all data dirs. Reads and writes
run on separate worker pools so reloads never queue behind persistence (paper
5.1); every call has an async form returning a Future so callers overlap I/O.

Durability: data first, then the index row (group-committed by one committer
thread, ``writes.py``), so after kill -9 every object whose put completed is back and
nothing else is. Each stripe run carries an xxh3 checksum verified on every read: a
torn or corrupt object is a counted miss and is dropped, never served. Each object
also records a device digest (sglang_saria/digest.py, summed over its stripe
runs), so a read into GPU memory can be verified there (`digest_of`).

Which objects go when the store is full is the caller's victim order (``VictimOrder``; the
server passes the SSD victim order both drivers share, ``mem_cache/ssd_order.py``): the store
decides nothing about recency itself.

Callers must keep source buffers unchanged until a put's future resolves, and
must not use a destination buffer unless the get reports HIT.

A data dir removed while serving takes the store offline (checked once a second): its
open files would otherwise go on taking writes and serving reads of deleted files, lost
at the next start. Offline, the store drops its objects (the owner hears them as
evictions), refuses puts with a counted result and misses every lookup, so requests
recompute their prefixes; a restart with the directory back opens a fresh store.

Damage found at start never stops it either (it is a cache): an unreadable index is moved
aside, objects past the end of a truncated slab are dropped, an index missing beside a used
slab is reported; each is one warning and counted (``op="recover"``). A full file system is
``writes.DiskFull``. Its files are private to this user (``private.py``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from sglang_saria.storage.allocator import SlotAllocator
from sglang_saria.storage.buffers import ScatterList, as_segments, total_bytes
from sglang_saria.storage.config import DEFAULT_CAPACITY_BYTES, StoreConfig
from sglang_saria.storage.counters import CounterRow, PendingCounters
from sglang_saria.storage.endurance import DeviceAccount, DeviceEndurance
from sglang_saria.storage.engine import select_engine
from sglang_saria.storage.index import DeviceCounters, Entry, SQLiteIndex, index_path, newest_claims, open_index
from sglang_saria.storage.io_engine import IOEngine
from sglang_saria.storage.layout import SlabLayout, SubIO, block_device_name, prepare_slab
from sglang_saria.storage.metrics import store_metrics
from sglang_saria.storage.private import prepare_private_dir
from sglang_saria.storage.results import GetStatus, ObjectOp, StoreStats, describe, resolved, xxh3
from sglang_saria.storage.writes import DiskFull, WritePath
from sglang_saria.units import SECONDS_PER_HOUR

logger = logging.getLogger(__name__)

DEFAULT_SLOT_BYTES = 4 << 20
MAX_KEY_CHARS = 1024


class VictimOrder(Protocol):
    """The order in which stored objects are evicted, kept by the caller; the store calls it
    under its lock (``mem_cache.ssd_order.SSDVictimOrder`` is the one both drivers share)."""

    def written(self, key: str) -> None:
        """A put of ``key`` committed (or touched a stored copy)."""

    def access(self, key: str) -> None:
        """``key`` was read."""

    def touch_prefix(self, keys: Sequence[str]) -> None:
        """Stored objects of one prefix (head first) were read or written together."""

    def demote(self, keys: Sequence[str]) -> int:
        """Held objects of ``keys`` become the first victims, the last key first; returns how many."""

    def remove(self, key: str) -> None:
        """``key`` left the store."""

    def victim(self) -> Optional[str]:
        """The next key to evict; None when none is held."""

    def order(self) -> List[str]:
        """Held keys, the next victim first."""


class SariaStore(WritePath):
    def __init__(
        self,
        config: StoreConfig,
        *,
        victim_order: VictimOrder,
        bytes_per_token: Optional[int] = None,
        default_slot_bytes: int = DEFAULT_SLOT_BYTES,
        on_evict: Optional[Callable[[List[str]], None]] = None,
        engine: Optional[IOEngine] = None,
        name: Optional[str] = None,
    ) -> None:
        self.config = config
        # Which objects go when the store is full; callers that know a read or write covered one
        # prefix report it (`touch_prefix`) so its head stays longest.
        self.order = victim_order
        self.name = name or os.path.abspath(config.data_dirs[0])
        self.on_evict = on_evict
        dirs = tuple(os.path.abspath(d) for d in config.data_dirs)
        self._metrics = store_metrics()
        self._counts: Dict[str, int] = {}
        self._counts_lock = threading.Lock()
        self._open_files(dirs, bytes_per_token, default_slot_bytes, engine)
        self._lock = threading.Lock()
        self._disk_full = DiskFull()
        self._entries: Dict[str, Entry] = {}  # key -> committed object; victims: self.order
        self._inflight: Dict[str, Future] = {}
        self._pending_deletes: List[str] = []
        self._touched: Dict[str, float] = {}
        self._counters = PendingCounters()  # page counters for the next commit (counters.py)
        self._offline: Optional[str] = None  # why the store went offline, once it has
        self._recover()
        self._seq = self._index.max_seq()
        self._start_workers()
        self._update_gauges()
        logger.info(
            "saria store %s: %d dirs, %d slots of %d bytes (%.2f GiB), engine=%s, O_DIRECT=%s, "
            "%d objects recovered",
            self.name,
            len(dirs),
            self.layout.nslots,
            self.layout.slot_bytes,
            self.capacity_bytes / 2**30,
            self.engine.name,
            [self.engine.direct(j) for j in range(len(dirs))],
            len(self._entries),
        )

    def _open_files(self, dirs: Tuple[str, ...], bytes_per_token: Optional[int], default_slot_bytes: int,
                    engine: Optional[IOEngine]) -> None:
        """Data dirs, slab files, the index and the engine (wrapped by a test's fault injector)."""
        config = self.config
        for d in dirs:
            prepare_private_dir(d)
        slot_bytes = SlabLayout.round_slot_bytes(config.slot_bytes or default_slot_bytes, len(dirs))
        capacity = config.capacity.resolve(bytes_per_token)
        if config.capacity.bytes == DEFAULT_CAPACITY_BYTES:
            logger.info("saria store: capacity %d bytes (the default; set 'capacity' to change)", capacity)
        self.layout = SlabLayout(dirs, slot_bytes, capacity // slot_bytes)
        self.capacity_bytes = self.layout.nslots * slot_bytes
        slabs = [self.layout.slab_path(j) for j in range(len(dirs))]
        # Sizes before they are grown to the layout's: what a truncated slab still holds.
        self._slab_sizes = [os.path.getsize(p) if os.path.exists(p) else 0 for p in slabs]
        self._index = self._open_index()
        self._index.check_layout(dirs, slot_bytes)
        for j in range(len(dirs)):
            prepare_slab(self.layout.slab_path(j), self.layout.slab_bytes, config.preallocate)
        self.engine = engine or select_engine(config.engine)
        if config.fault_injector is not None:
            logger.warning("saria store: fault injector %r: test-only", config.fault_injector)
            self.engine = config.fault_injector.wrap(self.engine)
        self.engine.open([self.layout.slab_path(j) for j in range(len(dirs))], config.o_direct)
        saved = self._index.load_devices()
        self._devices = [
            DeviceAccount(d, block_device_name(d), saved.get(d) or DeviceCounters()) for d in dirs
        ]

    def _open_index(self) -> SQLiteIndex:
        """The index. The store is a cache, so damage never stops it: an unreadable index is
        moved aside and a missing one beside a used slab reported; either way it starts empty and
        reuses the slab."""
        path = index_path(self.layout.data_dirs[0])
        existed = os.path.exists(path)
        index, moved = open_index(path, self.config.sync_writes)
        if moved is not None:
            self._count("recover", "index_unreadable")
            logger.warning(
                "saria store %s: index %s is unreadable (%s): moved aside to %s; the store starts empty",
                self.name, path, moved.reason, moved.path,
            )
        elif not existed and any(self._slab_sizes):
            self._count("recover", "index_missing")
            logger.warning(
                "saria store %s: index %s is missing beside slab files of %s bytes: their objects are "
                "lost; the store starts empty and reuses the slabs",
                self.name, path, self._slab_sizes,
            )
        return index

    def _start_workers(self) -> None:
        """The read and write pools and the committer thread."""
        self._readers = ThreadPoolExecutor(self.config.read_threads, thread_name_prefix="saria-read")
        self._writers = ThreadPoolExecutor(self.config.write_threads, thread_name_prefix="saria-write")
        self._commit_q: "queue.Queue[Any]" = queue.Queue()
        self._closed = False
        self._committer = threading.Thread(target=self._commit_loop, name="saria-commit", daemon=True)
        self._committer.start()

    # ---------------------------------------------------------------- recovery
    def _recover(self) -> None:
        loaded = self._index.load()
        valid, dropped = [], []
        for e in loaded:
            in_range = e.slots.size and int(e.slots.max()) < self.layout.nslots
            if in_range and len(e.checksums) == len(self.layout.plan(e.slots.tolist(), e.size)):
                valid.append(e)
            else:
                dropped.append(e)
        valid, overlapping = newest_claims(valid)
        dropped += overlapping
        if dropped:
            logger.warning(
                "saria store %s: dropped %d index entries that no longer fit", self.name, len(dropped)
            )
        short = [e for e in valid if self._past_slab_end(e)]
        if short:
            self._count("recover", "past_slab_end", len(short))
            logger.warning(
                "saria store %s: slab files hold %s bytes, the layout %d each: %d objects past their end dropped",
                self.name, self._slab_sizes, self.layout.slab_bytes, len(short),
            )
            gone = {e.key for e in short}
            valid = [e for e in valid if e.key not in gone]
        self._pending_deletes.extend(e.key for e in dropped + short)
        for e in valid:  # load() returns LRU order
            self._entries[e.key] = e
            self.order.written(e.key)
        self._alloc = SlotAllocator(self.layout.nslots, (s for e in valid for s in e.slots.tolist()))

    def _past_slab_end(self, e: Entry) -> bool:
        """Some of the object lies past the end its slab file had at open (it was truncated)."""
        subs = self.layout.plan(e.slots.tolist(), e.size)
        return any(sub.file_offset + sub.nbytes > self._slab_sizes[sub.dir_idx] for sub in subs)

    # ---------------------------------------------------------------- helpers
    def _count(self, op: str, result: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[f"{op}_{result}"] = self._counts.get(f"{op}_{result}", 0) + n
        self._metrics.ops.labels(self.name, op, result).inc(n)

    @staticmethod
    def check_key(key: Any) -> None:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS or "\x00" in key:
            raise ValueError(
                f"saria store: invalid key {key!r}: keys are non-empty strings of at most "
                f"{MAX_KEY_CHARS} characters without NUL"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"saria store {self.name} is closed")

    def _discard(self, e: Entry) -> None:
        """Free an entry's slots now, or at its last unpin if a read is in flight."""
        e.dead = True
        if e.pins == 0:
            self._alloc.release(e.slots.tolist())

    def _remove(self, e: Entry) -> None:
        del self._entries[e.key]
        self.order.remove(e.key)
        self._touched.pop(e.key, None)
        self._pending_deletes.append(e.key)
        self._discard(e)

    def _notify_evicted(self, keys: List[str]) -> None:
        if keys and self.on_evict is not None:
            try:
                self.on_evict(keys)
            except Exception:
                logger.exception("saria store: on_evict callback failed")

    # ---------------------------------------------------------------- data dirs
    @property
    def offline(self) -> Optional[str]:
        """Why the store is offline (its data dir was removed), or None while it serves."""
        return self._offline

    def _check_data_dirs(self) -> None:
        """Go offline when a slab file is gone (its data dir was removed while serving)."""
        if self._offline is not None:
            return
        paths = [self.layout.slab_path(j) for j in range(len(self.layout.data_dirs))]
        missing = [p for p in paths if not os.path.exists(p)]
        if not missing:
            return
        reason = f"data dir {os.path.dirname(missing[0])} was removed while serving ({missing[0]} is gone)"
        with self._lock:
            self._offline = reason
            dropped = list(self._entries.values())
            for e in dropped:
                self._remove(e)
            self._pending_deletes, self._touched = [], {}
        logger.error(
            "saria store %s: %s; the store is offline: %d objects dropped, KV pages are no longer "
            "written and lookups miss (requests recompute their prefixes). Restore the directory and "
            "restart the server to use the store again.",
            self.name,
            reason,
            len(dropped),
        )
        self._count("offline", "data_dir_removed")
        self._notify_evicted([e.key for e in dropped])
        self._update_gauges()

    # ---------------------------------------------------------------- get
    def get_async(self, key: str, dest: Any, host_check: bool = True) -> "Future[GetStatus]":
        """Read an object straight into `dest` (buffer, tensor, or list of them).

        ``host_check=False`` skips the xxh3 check, which copies a CUDA destination to host
        memory: for a caller that verifies the object's device digest (`digest_of`) where
        the bytes landed, as the direct reload does on the GPU. HIT then means "read", not
        "verified"."""
        self.check_key(key)
        segs = as_segments(dest, writable=True)
        nbytes = total_bytes(segs)
        with self._lock:
            self._check_open()
            e = self._entries.get(key)
            if e is None:
                self._count("get", "miss")
                return resolved(GetStatus.MISS)
            if e.size != nbytes:
                self._count("get", "size_mismatch")
                logger.warning(
                    "saria store %s: %r holds %d bytes, destination has %d: not read",
                    self.name,
                    key,
                    e.size,
                    nbytes,
                )
                return resolved(GetStatus.SIZE_MISMATCH)
            e.pins += 1
            self.order.access(key)
            self._touched[key] = time.time()
        subs = self.layout.plan(e.slots.tolist(), e.size)
        op = ObjectOp(len(subs))
        fut: Future = Future()
        scatter = ScatterList(segs)
        for i, sub in enumerate(subs):
            self._readers.submit(self._read_sub, op, i, sub, scatter, e, fut, host_check)
        return fut

    def _read_sub(
        self, op: ObjectOp, i: int, sub: SubIO, scatter: ScatterList, e: Entry, fut: Future, host_check: bool
    ) -> None:
        try:
            pieces = [p for s, t in sub.ranges for p in scatter.slice(s, t)]
            got = self.engine.read(sub.dir_idx, sub.file_offset, pieces)
            self._devices[sub.dir_idx].add(read=got)
            self._metrics.ssd_bytes_read.labels(self._devices[sub.dir_idx].data_dir).inc(got)
            ok = not host_check or (i < len(e.checksums) and xxh3(pieces) == e.checksums[i])
            last = op.done(i, ok)
        except BaseException as err:  # noqa: BLE001 - a failed read is a counted miss
            last = op.done(i, error=err)
        if last:
            self._finish_get(op, e, fut)

    def _finish_get(self, op: ObjectOp, e: Entry, fut: Future) -> None:
        corrupt = op.error is None and not all(op.results)
        with self._lock:
            e.pins -= 1
            if e.dead and e.pins == 0:
                self._alloc.release(e.slots.tolist())
            dropped = corrupt and self._entries.get(e.key) is e
            if dropped:
                self._remove(e)
        if dropped:
            self._notify_evicted([e.key])
        if op.error is not None:
            status = GetStatus.IO_ERROR
            logger.warning("saria store %s: read of %r failed: %s", self.name, e.key, describe(op.error))
        elif corrupt:
            status = GetStatus.CORRUPT
            logger.warning("saria store %s: %r failed its checksum; dropped", self.name, e.key)
        else:
            status = GetStatus.HIT
            self._metrics.op_seconds.labels(self.name, "get").observe(time.perf_counter() - op.t0)
        with self._lock:
            self._count("get", status.value)
        fut.set_result(status)

    def get(self, key: str, dest: Any) -> GetStatus:
        return self.get_async(key, dest).result()

    def get_batch(self, keys: Sequence[str], dests: Sequence[Any]) -> List["Future[GetStatus]"]:
        if len(keys) != len(dests):
            raise ValueError(f"saria store: {len(keys)} keys but {len(dests)} destinations")
        return [self.get_async(k, d) for k, d in zip(keys, dests)]

    # ---------------------------------------------------------------- queries, removal
    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def prefix_hits(self, keys: Sequence[str]) -> int:
        """How many leading keys are stored (HiCache's batch_exists contract)."""
        with self._lock:
            for i, k in enumerate(keys):
                if k not in self._entries:
                    return i
            return len(keys)

    def digest_of(self, key: str) -> Optional[int]:
        """The object's device digest (uint64), to verify a read where it landed; None when the
        key is absent or was stored by a release before index format 2."""
        with self._lock:
            e = self._entries.get(key)
            return None if e is None else e.digest

    def size_of(self, key: str) -> Optional[int]:
        with self._lock:
            e = self._entries.get(key)
            return None if e is None else e.size

    def keys(self) -> List[str]:
        """Stored keys in eviction order (the first goes first)."""
        with self._lock:
            return self.order.order()

    def touch_prefix(self, keys: Sequence[str]) -> None:
        """These objects were read or written together as one prefix's run (``keys`` head first):
        the victim order's rule puts the head last in line (absent keys are skipped)."""
        with self._lock:
            held = [k for k in keys if k in self._entries]
            if held:
                self.order.touch_prefix(held)

    def demote(self, keys: Sequence[str]) -> int:
        """These objects (``keys`` head first; absent ones skipped) become the next victims, the
        tail first: nothing will read them (an agent's session ended). Kept at the next commit
        (access time 0: a restart recovers them at the eviction end too). Returns how many."""
        with self._lock:
            held = [k for k in keys if k in self._entries]
            for k in held:
                self._touched[k] = 0.0
            return self.order.demote(held) if held else 0

    def evict(self, keys: Sequence[str]) -> List[str]:
        """Remove objects on the caller's decision (policy eviction); returns those removed."""
        removed = []
        with self._lock:
            for k in keys:
                e = self._entries.get(k)
                if e is not None:
                    self._remove(e)
                    removed.append(k)
            self._count("evict", "caller", len(removed))
        self._notify_evicted(removed)
        return removed

    def delete(self, key: str) -> bool:
        return bool(self.evict([key]))

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return self._alloc.free_slots * self.layout.slot_bytes

    # ---------------------------------------------------------------- page counters
    def save_counters(
        self, scope: str, rows: Sequence[CounterRow], expire_before: Optional[float] = None
    ) -> "Future[bool]":
        """Keep ``rows`` (a caller's per-page counters, ``counters.py``) with the next index commit:
        the same transaction and sync as the pages' rows. Rows of ``scope`` used before
        ``expire_before`` (wall clock) are deleted then. The future is True once they are
        durable, False if the store went offline first."""
        with self._lock:
            self._check_open()
            future = self._counters.add(scope, rows, expire_before)
        self._commit_q.put(scope)  # wakes the committer (anything but a put, an event or None)
        return future

    def load_counters(self, scope: str, since: float) -> Tuple[List[CounterRow], int]:
        """The counter rows of ``scope`` last used at or after ``since`` (wall clock), oldest first;
        older ones are deleted. Returns (rows, rows deleted)."""
        return self._index.load_counters(scope, since)

    # ---------------------------------------------------------------- stats
    def endurance(self) -> List[DeviceEndurance]:
        return [d.report(self.config.drive_rating) for d in self._devices]

    def recent_writes(self, within_s: float, now: Optional[float] = None) -> List[Tuple[float, int]]:
        """Bytes written to the data dirs within the last ``within_s`` seconds, as (age, bytes)
        per wall-clock hour, oldest first, persisted across restarts. The age is the bucket's
        latest possible write (its end, or now), so a window seeded with it never frees
        bytes early."""
        now = time.time() if now is None else now
        totals: Dict[int, int] = {}
        for device in self._devices:
            for hour, written in device.snapshot().hours.items():
                totals[hour] = totals.get(hour, 0) + written
        ages = ((now - min(now, (hour + 1) * SECONDS_PER_HOUR), written) for hour, written in sorted(totals.items()))
        return [(age, written) for age, written in ages if age < within_s and written]

    def stats(self) -> StoreStats:
        with self._lock:
            objects = len(self._entries)
            stored = sum(e.size for e in self._entries.values())
            used = (self.layout.nslots - self._alloc.free_slots) * self.layout.slot_bytes
        with self._counts_lock:
            counts = dict(self._counts)
        self._update_gauges()
        return StoreStats(
            objects,
            stored,
            used,
            self.capacity_bytes,
            self.layout.slot_bytes,
            self.engine.name,
            [self.engine.direct(j) for j in range(len(self.layout.data_dirs))],
            counts,
            self.endurance(),
        )

    def _update_gauges(self) -> None:
        m = self._metrics
        with self._lock:
            objects = len(self._entries)
            used = (self.layout.nslots - self._alloc.free_slots) * self.layout.slot_bytes
        m.objects.labels(self.name).set(objects)
        m.used_bytes.labels(self.name).set(used)
        m.capacity_bytes.labels(self.name).set(self.capacity_bytes)
        m.online.labels(self.name).set(0 if self._offline else 1)
        m.disk_full.labels(self.name).set(0 if self._disk_full.since is None else 1)
        for rep in self.endurance():
            if rep.projected_lifetime_years is not None:
                m.ssd_projected_lifetime_years.labels(rep.data_dir).set(rep.projected_lifetime_years)
                m.ssd_observed_dwpd.labels(rep.data_dir).set(rep.observed_dwpd)
                m.ssd_write_budget_used.labels(rep.data_dir).set(rep.write_budget_used)

    # ---------------------------------------------------------------- lifecycle
    def flush(self) -> None:
        """Wait for in-flight puts and make pending index updates durable."""
        with self._lock:
            inflight = list(self._inflight.values())
        for f in inflight:
            f.result()
        done = threading.Event()
        self._commit_q.put(done)
        done.wait()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
        self._readers.shutdown(wait=True)
        self._writers.shutdown(wait=True)
        self._commit_q.put(None)
        self._committer.join()
        self.engine.close()
        self._index.close()

    def __enter__(self) -> "SariaStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
