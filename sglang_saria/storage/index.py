"""Durable object index in SQLite (WAL).

Ordering rule that makes kill -9 safe: an object's data is written (and, with
`sync_writes`, fdatasync'ed) before its row is committed, so a row always
points at complete data. Deletes of evicted objects are committed in the same
or an earlier transaction than the inserts that reuse their slots.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from sglang_saria.digest import as_int64
from sglang_saria.storage.counters import CounterBatch, CounterRow
from sglang_saria.storage.layout import blob_to_slots, slots_to_blob
from sglang_saria.storage.private import FILE_MODE, make_private
from sglang_saria.units import SECONDS_PER_HOUR

logger = logging.getLogger(__name__)
_U64 = (1 << 64) - 1

INDEX_NAME = "saria-index.sqlite"
# 2: objects.digest (device digest, sglang_saria/digest.py). A version-1 index
# is upgraded in place on open; its objects stay readable, with no digest.
FORMAT_VERSION = 2
_UPGRADABLE = {"1"}


@dataclass
class Entry:
    key: str
    size: int
    slots: np.ndarray
    checksums: Tuple[int, ...]  # one per SubIO of the layout's plan
    seq: int
    atime: float
    digest: Optional[int] = None  # whole-object device digest (uint64); None: written before format 2
    pins: int = 0  # in-flight reads
    dead: bool = False  # removed while pinned: slots freed on last unpin


KEPT_HOURS = 48  # hourly write totals kept: a write budget's day window plus a day of slack


@dataclass
class DeviceCounters:
    bytes_written: int = 0
    bytes_read: int = 0
    since: float = field(default_factory=time.time)
    # bytes written per wall-clock hour (hour number since the epoch), the last KEPT_HOURS:
    # a write budget's window survives a restart (mem_cache/budget.py ``seed``)
    hours: Dict[int, int] = field(default_factory=dict)


class SQLiteIndex:
    def __init__(self, path: str, sync_writes: bool) -> None:
        self.path = path
        self._lock = threading.Lock()
        make_private(path)
        for companion in _COMPANIONS:  # left by an older release: narrowed like the database
            if os.path.exists(path + companion):
                os.chmod(path + companion, FILE_MODE)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            self._create(sync_writes)
        except BaseException:  # e.g. not a database: the caller may move the file aside
            self._db.close()
            raise

    def _create(self, sync_writes: bool) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if sync_writes else 'NORMAL'}")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS objects(
                key TEXT PRIMARY KEY, size INTEGER NOT NULL, slots BLOB NOT NULL,
                checksums BLOB NOT NULL, seq INTEGER NOT NULL, atime REAL NOT NULL,
                digest INTEGER);
            CREATE TABLE IF NOT EXISTS devices(
                dir TEXT PRIMARY KEY, bytes_written INTEGER NOT NULL,
                bytes_read INTEGER NOT NULL, since REAL NOT NULL);
            CREATE TABLE IF NOT EXISTS device_hours(
                dir TEXT NOT NULL, hour INTEGER NOT NULL, bytes_written INTEGER NOT NULL,
                PRIMARY KEY(dir, hour));
            CREATE TABLE IF NOT EXISTS counters(
                scope TEXT NOT NULL, key INTEGER NOT NULL, r INTEGER NOT NULL, e INTEGER NOT NULL,
                e_spent INTEGER NOT NULL, t_reuse REAL NOT NULL, PRIMARY KEY(scope, key)) WITHOUT ROWID;
            """
        )

    def check_layout(self, data_dirs: Sequence[str], slot_bytes: int) -> None:
        """Persist the layout on first open; refuse a different one later."""
        want = {
            "format_version": str(FORMAT_VERSION),
            "data_dirs": json.dumps([os.path.abspath(d) for d in data_dirs]),
            "slot_bytes": str(slot_bytes),
        }
        with self._lock:
            have = dict(self._db.execute("SELECT k, v FROM meta").fetchall())
            if not have:
                self._db.execute("BEGIN")
                self._db.executemany("INSERT INTO meta VALUES (?, ?)", list(want.items()))
                self._db.execute("COMMIT")
                return
        version = have.get("format_version")
        if version != want["format_version"] and version not in _UPGRADABLE:
            raise ValueError(
                f"saria store: index {self.path!r} has format_version={version}; this sglang-saria "
                f"reads {', '.join(sorted(_UPGRADABLE))} and {FORMAT_VERSION} (a newer release wrote it: "
                f"use that release, or remove the data dirs to start over)"
            )
        for k, v in want.items():
            if k != "format_version" and have.get(k) != v:
                raise ValueError(
                    f"saria store: index {self.path!r} was created with {k}={have.get(k)}, "
                    f"now {k}={v}; use the old setting or remove the data dirs to start over"
                )
        if version in _UPGRADABLE:
            with self._lock:
                self._upgrade(version)

    def _upgrade(self, old: str) -> None:
        """Version 1 -> 2: add the digest column (NULL for the objects already stored)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(objects)").fetchall()}
        self._db.execute("BEGIN IMMEDIATE")
        if "digest" not in columns:
            self._db.execute("ALTER TABLE objects ADD COLUMN digest INTEGER")
        self._db.execute("UPDATE meta SET v = ? WHERE k = 'format_version'", (str(FORMAT_VERSION),))
        self._db.execute("COMMIT")
        logger.info("saria store: index %s upgraded from format %s to %d", self.path, old, FORMAT_VERSION)

    def load(self) -> List[Entry]:
        with self._lock:
            rows = self._db.execute(
                "SELECT key, size, slots, checksums, seq, atime, digest FROM objects ORDER BY atime, seq"
            ).fetchall()
        return [
            Entry(
                key=k,
                size=size,
                slots=blob_to_slots(slots),
                checksums=tuple(int(c) for c in np.frombuffer(cs, dtype=np.uint64)),
                seq=seq,
                atime=atime,
                digest=None if digest is None else digest & _U64,
            )
            for k, size, slots, cs, seq, atime, digest in rows
        ]

    def max_seq(self) -> int:
        with self._lock:
            (v,) = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM objects").fetchone()
        return int(v)

    def load_devices(self) -> Dict[str, DeviceCounters]:
        with self._lock:
            rows = self._db.execute("SELECT dir, bytes_written, bytes_read, since FROM devices").fetchall()
            hours = self._db.execute("SELECT dir, hour, bytes_written FROM device_hours").fetchall()
        devices = {d: DeviceCounters(w, r, s) for d, w, r, s in rows}
        for d, hour, w in hours:
            if d in devices:
                devices[d].hours[hour] = w
        return devices

    def commit(
        self,
        inserts: Sequence[Entry],
        deletes: Iterable[str],
        touches: Iterable[Tuple[str, float]],
        devices: Dict[str, DeviceCounters],
        counters: Optional[CounterBatch] = None,
    ) -> None:
        """One transaction: deletes first (their slots may be reused by inserts); page counters
        (``counters.py``) in the same one, rows older than their scope's expiry deleted."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM objects WHERE key = ?", [(k,) for k in deletes])
                self._db.executemany(
                    "INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            e.key,
                            e.size,
                            slots_to_blob(e.slots),
                            np.asarray(e.checksums, dtype=np.uint64).tobytes(),
                            e.seq,
                            e.atime,
                            None if e.digest is None else as_int64(e.digest),  # SQLite integers are signed
                        )
                        for e in inserts
                    ],
                )
                self._db.executemany(
                    "UPDATE objects SET atime = ? WHERE key = ?", [(t, k) for k, t in touches]
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO devices VALUES (?, ?, ?, ?)",
                    [(d, c.bytes_written, c.bytes_read, c.since) for d, c in devices.items()],
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO device_hours VALUES (?, ?, ?)",
                    [(d, hour, w) for d, c in devices.items() for hour, w in c.hours.items()],
                )
                oldest = min((min(c.hours) for c in devices.values() if c.hours), default=None)
                if oldest is not None:
                    self._db.execute("DELETE FROM device_hours WHERE hour < ?", (oldest,))
                if counters:
                    self._commit_counters(counters)
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite has rolled back already after some errors (SQLITE_FULL): a second
                # ROLLBACK would raise and hide the cause.
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _commit_counters(self, batch: CounterBatch) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO counters VALUES (?, ?, ?, ?, ?, ?)",
            [(scope, as_int64(r.key), r.r, r.e, r.e_spent, r.t_reuse) for (scope, _), r in batch.rows.items()],
        )
        self._db.executemany("DELETE FROM counters WHERE scope = ? AND t_reuse < ?", list(batch.expire.items()))

    def load_counters(self, scope: str, since: float) -> Tuple[List[CounterRow], int]:
        """Rows of ``scope`` last used at or after ``since`` (wall clock), oldest first; the older
        ones are deleted. Returns (rows, rows deleted)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT key, r, e, e_spent, t_reuse FROM counters WHERE scope = ? AND t_reuse >= ? ORDER BY t_reuse",
                (scope, since),
            ).fetchall()
            self._db.execute("BEGIN IMMEDIATE")
            deleted = self._db.execute("DELETE FROM counters WHERE scope = ? AND t_reuse < ?", (scope, since)).rowcount
            self._db.execute("COMMIT")
        return [CounterRow(k & _U64, r, e, spent, t) for k, r, e, spent, t in rows], deleted

    def damage(self) -> Optional[str]:
        """What SQLite's quick check finds wrong with the file (None: readable)."""
        with self._lock:
            rows = self._db.execute("PRAGMA quick_check").fetchall()
        return None if rows == [("ok",)] else "; ".join(str(r[0]) for r in rows[:3])

    def close(self) -> None:
        with self._lock:
            self._db.close()


# The files SQLite keeps beside the database: moved aside and made private with it.
_COMPANIONS = ("-wal", "-shm", "-journal")
_DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


@dataclass(frozen=True)
class MovedAside:
    """An unreadable index the store set aside to start empty (it is a cache: nothing is lost
    that a request cannot recompute)."""

    path: str  # where the database file went
    reason: str


def open_index(path: str, sync_writes: bool) -> Tuple[SQLiteIndex, Optional[MovedAside]]:
    """The index at ``path``; one SQLite cannot read (not a database, a corrupt page) is renamed
    to ``<name>.damaged-<time>`` with its -wal/-shm, and an empty one takes its place."""
    index = None
    try:
        index = SQLiteIndex(path, sync_writes)
        reason = index.damage()
    except sqlite3.DatabaseError as e:
        if getattr(e, "sqlite_errorcode", None) not in _DAMAGED:
            raise
        reason = str(e)
    if reason is None:
        return index, None
    if index is not None:
        index.close()
    suffix = time.strftime(".damaged-%Y%m%dT%H%M%S")
    for companion in ("",) + _COMPANIONS:
        if os.path.exists(path + companion):
            os.replace(path + companion, path + companion + suffix)
    return SQLiteIndex(path, sync_writes), MovedAside(path + suffix, reason)


def index_path(first_dir: str) -> str:
    return os.path.join(first_dir, INDEX_NAME)


def newest_claims(entries: Sequence[Entry]) -> Tuple[List[Entry], List[Entry]]:
    """Keep, per slot, only the newest entry claiming it (defence in depth at recovery)."""
    owner: Dict[int, Entry] = {}
    for e in sorted(entries, key=lambda e: e.seq):
        for s in e.slots.tolist():
            owner[s] = e
    keep, drop = [], []
    for e in entries:
        (keep if all(owner[s] is e for s in e.slots.tolist()) else drop).append(e)
    return keep, drop
