"""The store records each object's device digest (kernels/checksum.py) at write time, keeps it
across restarts, and opens index format 1 (no digests) by upgrading it in place."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
import torch

from sglang_saria.digest import digest
from sglang_saria.storage.index import FORMAT_VERSION, index_path
from sglang_saria.storage.store import GetStatus

SLOT = 64 * 1024
SIZES = {"tiny": 1001, "fa_page": 48 * 1024 + 7, "striped": 3 * SLOT + 12345}


@pytest.mark.parametrize("ndirs", [1, 2])
def test_recorded_digest_is_the_digest_of_the_object_bytes(payload, make_store, ndirs):
    store = make_store(ndirs=ndirs)
    assert all(f.result().ok for f in store.put_batch([(k, payload(k, n)) for k, n in SIZES.items()]))
    for k, n in SIZES.items():
        assert store.digest_of(k) == digest(payload(k, n)), k


def test_digest_of_a_scatter_list_with_pieces_that_split_words(payload, make_store):
    store = make_store(ndirs=2)
    data = payload("s", 2 * SLOT + 5)
    pieces = [data[:3], data[3:70_001], data[70_001:]]
    assert store.put("s", pieces).ok
    assert store.digest_of("s") == digest(data)
    src = torch.randn(4, 1024, dtype=torch.bfloat16)
    assert store.put("t", src).ok
    assert store.digest_of("t") == digest(src.view(torch.uint8).numpy())


def test_digest_survives_a_restart_and_a_missing_key_has_none(payload, make_store):
    store = make_store(ndirs=2)
    assert store.put("k", payload("k", 100_000)).ok
    config = store.config
    store.close()
    reopened = make_store(config=config)
    assert reopened.digest_of("k") == digest(payload("k", 100_000))
    assert reopened.digest_of("absent") is None


def _downgrade_to_format_1(path: str) -> None:
    """Rewrite an index as the release before digests wrote it (no digest column, format 1)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(
        """
        BEGIN;
        CREATE TABLE objects_v1(key TEXT PRIMARY KEY, size INTEGER NOT NULL, slots BLOB NOT NULL,
            checksums BLOB NOT NULL, seq INTEGER NOT NULL, atime REAL NOT NULL);
        INSERT INTO objects_v1 SELECT key, size, slots, checksums, seq, atime FROM objects;
        DROP TABLE objects;
        ALTER TABLE objects_v1 RENAME TO objects;
        UPDATE meta SET v = '1' WHERE k = 'format_version';
        COMMIT;
        """
    )
    db.close()


def _format_version(path: str) -> str:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT v FROM meta WHERE k = 'format_version'").fetchone()[0]
    finally:
        db.close()


def test_format_1_index_is_upgraded_and_its_objects_stay_readable(payload, make_store):
    store = make_store(ndirs=2)
    assert store.put("old", payload("old", 90_000)).ok
    config = store.config
    store.close()
    path = index_path(config.data_dirs[0])
    _downgrade_to_format_1(path)

    reopened = make_store(config=config)
    assert _format_version(path) == str(FORMAT_VERSION)
    dest = np.zeros(90_000, dtype=np.uint8)
    assert reopened.get("old", dest) is GetStatus.HIT
    np.testing.assert_array_equal(dest, payload("old", 90_000))
    assert reopened.digest_of("old") is None  # written before digests: verify on the host
    assert reopened.put("new", payload("new", 5000)).ok
    assert reopened.digest_of("new") == digest(payload("new", 5000))


def test_index_from_a_newer_release_is_refused_naming_its_format(payload, make_store):
    store = make_store()
    config = store.config
    store.close()
    path = index_path(config.data_dirs[0])
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE meta SET v = '99' WHERE k = 'format_version'")
    db.close()
    with pytest.raises(ValueError, match=r"saria-index.sqlite' has format_version=99; this sglang-saria reads 1 and 2"):
        make_store(config=config)
