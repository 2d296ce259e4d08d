"""Store fixtures for every test folder (a plugin of tests/conftest.py): small stores in tmp
dirs, deterministic object contents."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import SariaStore


def make_payload(key: str, size: int) -> np.ndarray:
    """Content derived from the key, so any served object can be checked on its own."""
    seed = int.from_bytes(hashlib.blake2b(f"{key}:{size}".encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


@pytest.fixture
def payload():
    return make_payload


@pytest.fixture
def store_dirs(tmp_path):
    def dirs(n: int):
        return [str(tmp_path / f"ssd{j}") for j in range(n)]

    return dirs


@pytest.fixture
def make_store(store_dirs):
    """make_store(ndirs, capacity, slot_bytes, on_evict=..., engine=..., **StoreConfig keys).

    make_store(config=old.config) reopens an existing store. Closed at teardown.
    """
    opened = []

    def make(ndirs=1, capacity="16MiB", slot_bytes="64KiB", on_evict=None, engine=None, config=None, **kw):
        cfg = config or StoreConfig(
            data_dirs=store_dirs(ndirs), capacity=capacity, slot_bytes=slot_bytes, **kw
        )
        store = SariaStore(cfg, on_evict=on_evict, engine=engine, victim_order=SSDVictimOrder())
        opened.append(store)
        return store

    yield make
    for s in opened:
        s.close()


def slab_path(store: SariaStore, dir_idx: int = 0) -> str:
    return os.path.join(store.layout.data_dirs[dir_idx], "saria-slab.dat")
