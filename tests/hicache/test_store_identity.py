"""Whose KV a store holds (hicache/store_identity.py), through the backend on real files: a store
of another model fingerprint is set aside (or refused, naming both), never read; a store of an
older release holding objects without a fingerprint likewise; one backend per store. The server
versions: tests/faults/test_store_ownership_served.py."""

from __future__ import annotations

import logging
import sqlite3
import warnings

import pytest

from tests.hicache.sglang_pools import fill_random, mha_host_pool, pages, storage_config

warnings.filterwarnings("ignore", category=UserWarning)
from prometheus_client import REGISTRY  # noqa: E402

from sglang_saria.hicache.backend import SariaStorage  # noqa: E402
from sglang_saria.hicache.store_identity import FINGERPRINT_KEY, ForeignStore, recorded_fingerprint  # noqa: E402
from sglang_saria.storage.index import INDEX_NAME  # noqa: E402
from sglang_saria.storage.lock import StoreLocked  # noqa: E402

KEYS = [f"h{i}" for i in range(4)]
RANK = "rank_tp0of1"


def backend(extra: dict, model: str) -> SariaStorage:
    pool = mha_host_pool("page_first")
    fill_random(pool.get_hybrid_pool_buffer())
    config = storage_config(extra)
    config.model_name = model
    return SariaStorage(config, pool)


def written(extra: dict, model: str) -> str:
    """A store holding KEYS for ``model``; returns its fingerprint."""
    b = backend(extra, model)
    assert b.batch_set_v1(KEYS, pages(b.mem_pool_host, 1, len(KEYS))) == [True] * len(KEYS)
    b.close()
    return recorded_fingerprint(extra_index(extra))


def extra_index(extra: dict) -> str:
    return f"{extra['data_dirs'][0]}/{RANK}/{INDEX_NAME}"


@pytest.fixture(autouse=True)
def outside_a_server(monkeypatch):
    """No server arguments published in this process (another test in the same worker may have
    published some): the backends here stand for models by their served names."""
    from sglang.srt import runtime_context

    def unpublished():
        raise ValueError("Global server args is not set yet!")

    monkeypatch.setattr(runtime_context, "get_server_args", unpublished)


@pytest.fixture
def extra(tmp_path):
    return {"data_dirs": [str(tmp_path / "nvme0"), str(tmp_path / "nvme1")], "capacity": "16MiB"}


def info_fingerprints(store_name: str) -> set[str]:
    return {s.labels["fingerprint"] for m in REGISTRY.collect() if m.name == "sglang:saria_store_info"
            for s in m.samples if s.labels.get("store") == store_name and s.value == 1}


def test_a_store_of_another_model_is_set_aside_and_never_read(extra, tmp_path, caplog):
    old = written(extra, "org/model-a")
    with caplog.at_level(logging.WARNING):
        b = backend(extra, "org/model-b")
    new = recorded_fingerprint(extra_index(extra))
    assert new not in (None, old)
    assert b.store.stats().objects == 0 and b.batch_exists(KEYS) == 0
    assert info_fingerprints(b.store.name) == {new}
    aside = [sorted(p.iterdir()) for d in ("nvme0", "nvme1") for p in (tmp_path / d).iterdir() if ".set-aside-" in p.name]
    assert len(aside) == 2 and all(p.name.endswith(old) for d in ("nvme0", "nvme1") for p in (tmp_path / d).iterdir()
                                   if ".set-aside-" in p.name)
    assert any(p.name == INDEX_NAME for p in aside[0])  # the old index went with its slabs
    warning = [r.getMessage() for r in caplog.records if "moved aside" in r.getMessage()]
    assert len(warning) == 1 and old in warning[0] and new in warning[0]
    b.close()


def test_refuse_stops_naming_both_fingerprints_and_the_setting_and_leaves_the_store(extra):
    old = written(extra, "org/model-a")
    with pytest.raises(ForeignStore) as err:
        backend({**extra, "on_fingerprint_mismatch": "refuse"}, "org/model-b")
    assert old in str(err.value) and "on_fingerprint_mismatch" in str(err.value)
    again = backend(extra, "org/model-a")  # untouched, and the refused open released its locks
    assert again.batch_exists(KEYS) == len(KEYS)
    again.close()


def test_a_store_holding_objects_without_a_fingerprint_is_set_aside(extra):
    written(extra, "org/model-a")
    with sqlite3.connect(extra_index(extra)) as db:  # as a release before fingerprints left it
        db.execute("DELETE FROM meta WHERE k = ?", (FINGERPRINT_KEY,))
    b = backend(extra, "org/model-a")
    assert b.batch_exists(KEYS) == 0
    b.close()


def test_one_backend_per_store(extra):
    first = backend(extra, "org/model-a")
    with pytest.raises(StoreLocked, match="already holds its lock"):
        backend(extra, "org/model-a")
    first.close()
    backend(extra, "org/model-a").close()


def test_a_bad_mismatch_setting_is_named(extra):
    with pytest.raises(ValueError, match="on_fingerprint_mismatch='keep'"):
        backend({**extra, "on_fingerprint_mismatch": "keep"}, "org/model-a")
