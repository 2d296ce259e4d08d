"""Whose KV a store holds: the lock and the model fingerprint, checked before the store opens.

A rank's store is claimed in three steps, all before ``SariaStore`` reads its index:

1. every rank directory is locked (``storage/lock.py``): a second server on the store refuses
   to start, naming the PID that holds it;
2. the fingerprint recorded in the store's index (``meta.model_fingerprint``) is compared with
   this server's (``sglang_saria/fingerprint.py``). A store of another model (or of a release
   that recorded none, holding objects) is never read. ``on_fingerprint_mismatch`` chooses:
   ``set_aside`` (the default) moves its files to ``<rank dir>.set-aside-<time>-<its fingerprint>``
   beside the rank directory and the store starts empty; ``refuse`` stops the server naming both
   fingerprints and the setting;
3. once the store has opened, this server's fingerprint is recorded in its index
   (``record``), in its own transaction: a store that dies before that is found with no
   fingerprint and, if it holds objects, set aside at the next start (never served).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

from sglang_saria.fingerprint import KV_ARGS, Fingerprint, KVFormat, fingerprint
from sglang_saria.storage.index import index_path
from sglang_saria.storage.lock import LOCK_NAME, StoreLock
from sglang_saria.storage.metrics import store_metrics
from sglang_saria.storage.private import prepare_private_dir

logger = logging.getLogger(__name__)

FINGERPRINT_KEY = "model_fingerprint"
NONE_RECORDED = "none recorded"  # an index holding objects without a fingerprint (an older release)
FLAG = "on_fingerprint_mismatch"


class ForeignStore(RuntimeError):
    """The store holds another model's KV and ``on_fingerprint_mismatch`` is ``refuse``."""


@dataclass
class Claim:
    """A rank's store, locked and checked: release the locks after closing the store."""

    rank_dirs: List[str]
    fingerprint: str
    locks: List[StoreLock]
    set_aside: List[str] = field(default_factory=list)  # where another model's store went
    previous: Optional[str] = None  # that store's fingerprint
    _shown: Optional[str] = None  # the store name its info label is shown under

    def record(self, store_name: str) -> None:
        """Write this server's fingerprint into the (opened) store's index; shown in ``/metrics`` as
        ``sglang:saria_store_info{store, fingerprint}``."""
        with _connect(index_path(self.rank_dirs[0])) as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (FINGERPRINT_KEY, self.fingerprint))
        store_metrics().info.labels(store_name, self.fingerprint).set(1)
        self._shown = store_name

    def release(self) -> None:
        """Unlock (after the store closed); the info label goes with it."""
        if self._shown is not None:
            store_metrics().info.remove(self._shown, self.fingerprint)
            self._shown = None
        for lock in self.locks:
            lock.release()


def server_fingerprint(storage_config: Any, host_pool: Any, rank: str) -> Fingerprint:
    """This rank's fingerprint: the model and KV-relevant arguments of the server this process
    runs (SGLang's published server arguments), the host pool's KV format and the rank.
    Outside a server (a backend a test builds) no arguments are published: the served model
    name then stands for the model."""
    from sglang.srt.runtime_context import get_server_args

    try:
        args = get_server_args()
    except ValueError:  # "Global server args is not set yet!": not in a server process
        args = None
    kv = KVFormat(
        layout=str(getattr(host_pool, "layout", "")),
        dtype=str(getattr(host_pool, "dtype", "")).replace("torch.", ""),
        page_size=int(getattr(host_pool, "page_size", 0) or 0),
        tp_rank=storage_config.tp_rank,
        tp_size=storage_config.tp_size,
        extra=rank,
    )
    if args is None:
        return fingerprint(storage_config.model_name, kv, {})
    values = {k: getattr(args, k, None) for k in KV_ARGS}
    return fingerprint(args.model_path, kv, values)


def claim(rank_dirs: Sequence[str], digest: str, on_mismatch: str, name: str) -> Claim:
    """``on_mismatch``: ``StoreConfig.on_fingerprint_mismatch``, "set_aside" or "refuse". Lock ``rank_dirs`` and make sure they hold the KV of fingerprint ``digest`` or nothing (see module doc)."""
    locks: List[StoreLock] = []
    try:
        for d in rank_dirs:
            locks.append(StoreLock.acquire(d))
        result = Claim(list(rank_dirs), digest, locks)
        recorded = recorded_fingerprint(index_path(rank_dirs[0]))
        if recorded is None or recorded == digest:
            return result
        if on_mismatch == "refuse":
            raise ForeignStore(
                f"saria store {name}: it holds the KV of model fingerprint {recorded}, this server's is "
                f"{digest}: its pages are another model's (other weights, config, KV dtype or layout). "
                f"Serve that model, use other data_dirs, or set \"{FLAG}\": \"set_aside\" to move it aside "
                "and start empty"
            )
        stamp = time.strftime("%Y%m%dT%H%M%S")
        result.set_aside = [_move_aside(d, f"{os.path.basename(d)}.set-aside-{stamp}-{_label(recorded)}")
                            for d in rank_dirs]
        result.previous = recorded
        logger.warning(
            "saria store %s: it held the KV of model fingerprint %s, this server's is %s: never served, moved "
            "aside to %s; the store starts empty (remove those directories to free their space; %s=refuse "
            "stops the server instead)",
            name, recorded, digest, result.set_aside, FLAG,
        )
        return result
    except BaseException:
        for lock in locks:
            lock.release()
        raise


def recorded_fingerprint(path: str) -> Optional[str]:
    """The fingerprint the index at ``path`` records; ``NONE_RECORDED`` when it records none but
    holds objects; None when there is no index, an empty one, or one SQLite cannot read (the
    store moves that aside itself and starts empty)."""
    if not os.path.exists(path):
        return None
    try:
        with _connect(path) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" in tables:
                row = db.execute("SELECT v FROM meta WHERE k = ?", (FINGERPRINT_KEY,)).fetchone()
                if row is not None:
                    return str(row[0])
            held = "objects" in tables and db.execute("SELECT 1 FROM objects LIMIT 1").fetchone() is not None
    except sqlite3.DatabaseError:
        return None
    return NONE_RECORDED if held else None


class _connect:
    """A short SQLite connection, closed on exit, committing what was done (autocommit)."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)

    def __enter__(self) -> sqlite3.Connection:
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.db.close()


def _label(fingerprint: str) -> str:
    return fingerprint.replace(" ", "-")


def _move_aside(rank_dir: str, name: str) -> str:
    """Move everything in ``rank_dir`` but its lock file into a private sibling ``name``."""
    dest = os.path.join(os.path.dirname(rank_dir), name)
    prepare_private_dir(dest)
    for entry in os.listdir(rank_dir):
        if entry != LOCK_NAME:
            os.replace(os.path.join(rank_dir, entry), os.path.join(dest, entry))
    return dest
