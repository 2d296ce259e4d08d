"""Faults: corrupt slabs, full disks, file systems without O_DIRECT, kill -9 mid-batch, a data
dir removed while serving."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.fault_injection import DelayedReads, ReadDelay
from sglang_saria.storage.store import GetStatus, SariaStore
from sglang_saria.units import ConfigError
from tests.faults.injection import flip_byte

SLOT = 64 * 1024



@pytest.mark.parametrize("stripe", [0, 1])
def test_flipped_byte_in_slab_is_a_counted_miss_never_served(make_store, payload, stripe):
    evicted: list[str] = []
    store = make_store(ndirs=2, on_evict=evicted.extend)
    assert store.put("victim", payload("victim", 3 * SLOT)).ok
    assert store.put("bystander", payload("bystander", 3 * SLOT)).ok
    slot0 = int(store._entries["victim"].slots[0])
    flip_byte(
        os.path.join(store.layout.data_dirs[stripe], "saria-slab.dat"), slot0 * store.layout.unit + 100
    )

    dest = np.zeros(3 * SLOT, np.uint8)
    assert store.get("victim", dest) is GetStatus.CORRUPT
    assert store.stats().counts["get_corrupt"] == 1
    assert not store.exists("victim")  # dropped, so SGLang sees a plain miss next time
    assert evicted == ["victim"], "the owner hears the drop (the ranks' agreed SSD view)"
    assert store.get("victim", dest) is GetStatus.MISS
    assert store.get("bystander", dest).ok
    np.testing.assert_array_equal(dest, payload("bystander", 3 * SLOT))
    store.flush()
    store.close()
    # The drop is durable: a restart does not resurrect the corrupt object.
    assert not SariaStore(store.config, victim_order=SSDVictimOrder()).exists("victim")


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root with mount rights; said in the skip reason otherwise)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(
            f"cannot mount a tiny tmpfs here ({r.stderr.decode().strip()}); ENOSPC is covered by injection"
        )
    yield str(mnt)
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_enospc_on_a_real_full_tmpfs(tiny_tmpfs, payload):
    with pytest.raises(ValueError, match="needs .* more bytes"):
        SariaStore(
            StoreConfig(data_dirs=[os.path.join(tiny_tmpfs, "pre")], capacity="4MiB", slot_bytes="64KiB"),
            victim_order=SSDVictimOrder(),
        )
    cfg = StoreConfig(
        data_dirs=[os.path.join(tiny_tmpfs, "sparse")], capacity="4MiB", slot_bytes="64KiB", preallocate=False
    )
    store = SariaStore(cfg, victim_order=SSDVictimOrder())
    try:
        results = [store.put(f"k{i}", payload(f"k{i}", SLOT)) for i in range(32)]
        ok = [r.key for r in results if r.ok]
        failed = [r for r in results if not r.ok]
        assert ok and failed and all(r.error.startswith("ENOSPC") for r in failed)
        dest = np.zeros(SLOT, np.uint8)
        for k in ok:
            assert store.get(k, dest).ok
            np.testing.assert_array_equal(dest, payload(k, SLOT))
    finally:
        store.close()


def test_file_system_without_o_direct_falls_back_with_a_log_line(make_store, payload, monkeypatch, caplog):
    real_open = os.open

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", no_direct)
    with caplog.at_level(logging.WARNING):
        store = make_store(o_direct="auto")
    assert "refuses O_DIRECT" in caplog.text
    assert store.stats().o_direct == [False]
    assert store.put("k", payload("k", 5000)).ok
    dest = np.zeros(5000, np.uint8)
    assert store.get("k", dest).ok
    np.testing.assert_array_equal(dest, payload("k", 5000))
    store.close()
    with pytest.raises(ValueError, match="o_direct=on"):
        make_store(config=StoreConfig(**{**store.config.__dict__, "o_direct": "on"}))


CHILD = textwrap.dedent(
    """
    import sys, hashlib, numpy as np
    from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
    from sglang_saria.storage.config import StoreConfig
    from sglang_saria.storage.store import SariaStore
    def payload(key, size):
        seed = int.from_bytes(hashlib.blake2b(f"{key}:{size}".encode(), digest_size=8).digest(), "little")
        return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    cfg = StoreConfig(data_dirs=sys.argv[1:3], capacity="64MiB", slot_bytes="64KiB", sync_writes=False)
    store = SariaStore(cfg, victim_order=SSDVictimOrder())
    i = 0
    while True:
        batch = [(f"obj{i + j}", payload(f"obj{i + j}", 200_000 + 4099 * (i + j))) for j in range(8)]
        for fut in store.put_batch(batch):
            r = fut.result()
            if r.ok:
                print(r.key, flush=True)
        i += 8
    """
)


def test_kill_9_mid_batch_recovers_completed_objects_and_serves_no_torn_one(tmp_path, payload):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *dirs],
        stdout=subprocess.PIPE,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": repo},
    )
    reported = []
    for line in child.stdout:
        reported.append(line.decode().strip())
        if len(reported) >= 45:  # mid-way through the sixth batch
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL

    store = SariaStore(StoreConfig(data_dirs=dirs, capacity="64MiB", slot_bytes="64KiB"), victim_order=SSDVictimOrder())
    try:
        recovered = set(store.keys())
        assert set(reported) <= recovered
        for key in recovered:  # every recovered object reads back intact
            n = 200_000 + 4099 * int(key[3:])
            dest = np.zeros(n, np.uint8)
            assert store.get(key, dest).ok, key
            np.testing.assert_array_equal(dest, payload(key, n))
        # Slots of unfinished writes are free again: a new object fits and round trips.
        assert store.put(f"after-{uuid.uuid4().hex}", np.ones(SLOT, np.uint8)).ok
    finally:
        store.close()


def _wait_offline(store: SariaStore, timeout_s: float = 10.0) -> str:
    """The committer checks the data dirs about once a second."""
    deadline = time.monotonic() + timeout_s
    while store.offline is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.offline is not None, f"store did not notice its removed data dir within {timeout_s} s"
    return store.offline


def test_data_dir_removed_while_serving_takes_the_store_offline_with_a_log_line_and_counts(
    make_store, payload, caplog
):
    evicted: list[str] = []
    store = make_store(ndirs=2, on_evict=evicted.extend)
    assert store.put("before", payload("before", SLOT)).ok
    removed = store.layout.data_dirs[1]
    with caplog.at_level(logging.ERROR, logger="sglang_saria.storage.store"):
        shutil.rmtree(removed)
        reason = _wait_offline(store)
    assert removed in reason
    assert any("the store is offline" in r.getMessage() and removed in r.getMessage() for r in caplog.records)
    # Its objects are dropped (the owner hears them as evictions), lookups miss, puts are refused.
    assert evicted == ["before"]
    assert not store.exists("before") and store.prefix_hits(["before"]) == 0
    assert store.get("before", np.zeros(SLOT, np.uint8)) is GetStatus.MISS
    refused = store.put("after", payload("after", SLOT))
    assert not refused.ok and refused.error.startswith("store offline: ") and removed in refused.error
    counts = store.stats().counts
    assert counts["offline_data_dir_removed"] == 1 and counts["put_offline"] == 1
    store.close()
    # A restart with the directory back opens a fresh, serving store.
    reopened = make_store(config=store.config)
    assert reopened.offline is None and reopened.put("after", payload("after", SLOT)).ok


def test_test_only_read_delay_holds_every_read_and_bad_values_are_refused(make_store, payload, tmp_path):
    delay = {"class": "sglang_saria.storage.fault_injection:ReadDelay", "read_delay_s": 0.3}
    store = make_store(slot_bytes="64KiB", fault_injector=delay)
    assert isinstance(store.engine, DelayedReads) and store.config.fault_injector == ReadDelay(0.3)
    data = payload("k", 4096)
    assert store.put("k", data).ok
    dest = np.empty_like(data)
    t0 = time.monotonic()
    assert store.get("k", dest) is GetStatus.HIT
    assert time.monotonic() - t0 >= 0.3
    assert np.array_equal(dest, data)
    dirs = [str(tmp_path / "bad")]
    with pytest.raises(ConfigError, match=r"fault_injector.read_delay_s='soon'"):
        StoreConfig.from_extra_config({"data_dirs": dirs, "fault_injector": {**delay, "read_delay_s": "soon"}})
    with pytest.raises(ConfigError, match=r"fault_injector.read_delay_s=-1"):
        StoreConfig(data_dirs=dirs, fault_injector={**delay, "read_delay_s": -1})
    with pytest.raises(ConfigError, match=r"fault_injector.class='sglang_saria.storage.fault_injection:Nope'"):
        StoreConfig(data_dirs=dirs, fault_injector={**delay, "class": "sglang_saria.storage.fault_injection:Nope"})
    with pytest.raises(ConfigError, match=r"fault_injector: .*ReadDelay does not take the arguments \['delay'"):
        StoreConfig(data_dirs=dirs, fault_injector={"class": delay["class"], "delay": 1})
    with pytest.raises(ConfigError, match=r"fault_injector.class='sglang_saria.storage.config:StoreConfig' is not"):
        StoreConfig(data_dirs=dirs, fault_injector={"class": "sglang_saria.storage.config:StoreConfig", "data_dirs": dirs})
