"""A store process killed with -9 while a put is half on disk (the test-only HeldWrites injector):
the reopened store holds every completed object, whole, and not the half-written one; its slot
is free again. The server version: tests/faults/test_kill_mid_write.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.layout import SLAB_NAME
from sglang_saria.storage.store import SariaStore

SLOT = 64 << 10
CHILD = """
import sys, numpy as np
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.fault_injection import HeldWrites
data, hold, held = sys.argv[1:4]
from sglang_saria.storage.store import SariaStore
store = SariaStore(
    StoreConfig(data_dirs=[data], capacity="4MiB", slot_bytes="64KiB", fault_injector=HeldWrites(hold, held)),
    victim_order=SSDVictimOrder())
assert store.put("done", np.full(60000, 7, np.uint8)).ok
store.flush()
open(hold, "w").close()
store.put("held", np.full(60000, 9, np.uint8))
"""


def test_a_put_killed_half_way_is_gone_and_the_completed_one_whole(tmp_path):
    data, hold, held = tmp_path / "ssd", tmp_path / "hold", tmp_path / "held"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data), str(hold), str(held)])
    deadline = time.monotonic() + 120
    while not held.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held.exists(), f"the put was never held (child exit {child.poll()})"
    time.sleep(0.2)  # the held file is written before the wait: the half is on disk already
    child.send_signal(signal.SIGKILL)
    child.wait()
    dir_idx, offset = map(int, held.read_text().split())
    assert dir_idx == 0
    slab = data / SLAB_NAME
    with open(slab, "rb") as f:
        f.seek(offset)
        on_disk = np.frombuffer(f.read(60000), np.uint8)
    assert (on_disk[:28672] == 9).all() and not (on_disk[28672:] == 9).all()  # half of it, no more

    store = SariaStore(StoreConfig(data_dirs=[str(data)], capacity="4MiB", slot_bytes="64KiB"),
                       victim_order=SSDVictimOrder())
    try:
        assert store.keys() == ["done"]
        dest = np.zeros(60000, np.uint8)
        assert store.get("done", dest).ok and (dest == 7).all()
        assert store.stats().objects == 1
        assert store.put("after", np.ones(SLOT, np.uint8)).ok  # its slot is free again
    finally:
        store.close()
