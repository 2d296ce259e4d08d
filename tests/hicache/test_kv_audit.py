"""The KV-transport audit: a page has one digest on the device, in every host layout and in
the store; moves that keep the bytes are counted clean, and one flipped byte is caught on
the path that moved it."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from sglang_saria.hicache.audit.kv import (
    DEVICE_TO_HOST,
    HOST_TO_DEVICE,
    HOST_TO_SSD,
    LOG_NAME,
    SSD_TO_DEVICE,
    SSD_TO_HOST,
    KVAudit,
    PoolRows,
)
from sglang_saria.hicache.backend import SariaStorage
from sglang_saria.reload.device import DeviceReloader
from tests.hicache.sglang_pools import PAGE, fill_random, mamba_host_pool, mha_pools, pages, storage_config

# Host layouts HiCache copies on CPU (its direct io backend); page_first is the GPU kernel
# layout, checked through the store's direct reload below.
CPU_LAYOUTS = ["layer_first", "page_first_direct"]


class Counts:
    """What the audit reported, by path: [pages checked, errors]."""

    def __init__(self) -> None:
        self.by_path: dict[str, list[int]] = {}

    def __call__(self, path: str, pool: str, pages: int, errors: int) -> None:
        entry = self.by_path.setdefault(path, [0, 0])
        entry[0] += pages
        entry[1] += errors


def kv_audit(host, counts: Counts, log_dir=None) -> KVAudit:
    return KVAudit({"kv": PoolRows.of_host_pool("kv", host)}, counts, log_dir=log_dir)


def backup(device, host, host_slots, device_slots) -> None:
    """HiCache's device -> host copy on CPU (direct io backend, CPU rig patch 003's torch copies)."""
    host.backup_from_device_all_layer(device, host_slots, device_slots, "direct")


def load(device, host, host_slots, device_slots) -> None:
    """HiCache's host -> device copy, layer by layer."""
    for layer in range(device.layer_num):
        host.load_to_device_per_layer(device, host_slots, device_slots, layer, "direct")


def flip_one_byte(row: torch.Tensor, byte: int = 0) -> None:
    """Flip one bit of one byte of ``row`` (a view into a pool buffer), in place."""
    row.view(torch.uint8).view(-1)[byte] ^= 0x01


@pytest.fixture(params=CPU_LAYOUTS)
def pools(request):
    device, host = mha_pools(request.param)
    fill_random(device.k_buffer + device.v_buffer)
    return device, host


def test_a_page_has_the_same_digest_on_the_device_and_in_every_host_layout(tmp_path):
    digests = []
    for layout in CPU_LAYOUTS:
        device, host = mha_pools(layout)
        fill_random(device.k_buffer + device.v_buffer, seed=3)
        audit = kv_audit(host, Counts())
        backup(device, host, pages(host, 5, 2), pages(device, 1, 2))
        on_device = audit.digests("kv", pages(device, 1, 2), "device")
        assert audit.digests("kv", pages(host, 5, 2), "host") == on_device, layout
        digests.append(on_device)
    assert digests[0] == digests[1]
    assert digests[0][0] != digests[0][1]
    # page_first (token-major pages): stored, then read straight into the device pool.
    device, host = mha_pools("page_first")
    fill_random(host.get_hybrid_pool_buffer(), seed=4)
    store = SariaStorage(storage_config({"data_dirs": [str(tmp_path)], "capacity": "8MiB"}), host)
    assert store.batch_set_v1(["a", "b"], pages(host, 5, 2)) == [True, True]
    reloader = DeviceReloader(store.read_page_async, device, "page_first", PAGE, store.page_bytes)
    assert reloader.load(["a", "b"], pages(device, 1, 2)).ok
    audit = kv_audit(host, Counts())
    assert audit.digests("kv", pages(host, 5, 2), "host") == audit.digests("kv", pages(device, 1, 2), "device")
    store.close()


def test_device_to_host_and_back_is_clean_and_counted(pools):
    device, host = pools
    counts = Counts()
    audit = kv_audit(host, counts)
    backup(device, host, pages(host, 3, 4), pages(device, 2, 4))
    audit.device_to_host("kv", pages(host, 3, 4), pages(device, 2, 4))
    load(device, host, pages(host, 3, 4), pages(device, 20, 4))
    audit.host_to_device("kv", pages(host, 3, 4), pages(device, 20, 4))
    assert counts.by_path == {DEVICE_TO_HOST: [4, 0], HOST_TO_DEVICE: [4, 0]}


def test_one_flipped_byte_in_the_host_pool_is_caught_when_the_page_reloads(pools):
    device, host = pools
    counts = Counts()
    audit = kv_audit(host, counts)
    backup(device, host, pages(host, 3, 4), pages(device, 2, 4))
    audit.device_to_host("kv", pages(host, 3, 4), pages(device, 2, 4))
    # One byte of the third host page (layer 1, V), after it left the device.
    index = int(pages(host, 5, 1)[7])
    layer1_v = {"layer_first": host.kv_buffer[1, 1], "page_first": host.kv_buffer[1][:, 1]}.get(host.layout)
    if layer1_v is None:  # page_first_direct: [2, page, layer, token in page, head, dim]
        flip_one_byte(host.kv_buffer[1, index // PAGE, 1, index % PAGE], 3)
    else:
        flip_one_byte(layer1_v[index], 3)
    load(device, host, pages(host, 3, 4), pages(device, 20, 4))
    audit.host_to_device("kv", pages(host, 3, 4), pages(device, 20, 4))
    assert counts.by_path[HOST_TO_DEVICE] == [4, 1]


@pytest.fixture
def backend(tmp_path):
    device, host = mha_pools("page_first_direct")
    fill_random(device.k_buffer + device.v_buffer)
    store = SariaStorage(storage_config({"data_dirs": [str(tmp_path / "nvme")], "capacity": "32MiB"}), host)
    yield device, host, store
    store.close()


def test_store_round_trips_are_checked_and_a_flipped_byte_after_a_store_read_is_caught(backend):
    device, host, store = backend
    counts = Counts()
    store.kv_audit = audit = kv_audit(host, counts, log_dir=store.store.config.data_dirs[0])
    keys = [f"p{i}" for i in range(3)]
    backup(device, host, pages(host, 1, 3), pages(device, 1, 3))
    audit.device_to_host("kv", pages(host, 1, 3), pages(device, 1, 3))
    assert store.batch_set_v1(keys, pages(host, 1, 3)) == [True] * 3
    assert store.batch_get_v1(keys, pages(host, 10, 3)) == [True] * 3
    assert counts.by_path[HOST_TO_SSD] == [3, 0]
    assert counts.by_path[SSD_TO_HOST] == [3, 0]

    # The host copy read from the store is corrupted before HiCache loads it to the device.
    flip_one_byte(host.kv_buffer[0, 11, 0, 0])  # page 11, layer 0, first token, K
    load(device, host, pages(host, 10, 3), pages(device, 10, 3))
    audit.host_to_device("kv", pages(host, 10, 3), pages(device, 10, 3))
    assert counts.by_path[HOST_TO_DEVICE] == [3, 1]


def test_direct_reload_into_the_device_pool_is_checked_also_after_a_restart(backend):
    device, host, store = backend
    log_dir = store.store.config.data_dirs[0]
    counts = Counts()
    store.kv_audit = audit = kv_audit(host, counts, log_dir=log_dir)
    keys = [f"d{i}" for i in range(4)]
    backup(device, host, pages(host, 1, 4), pages(device, 1, 4))
    audit.device_to_host("kv", pages(host, 1, 4), pages(device, 1, 4))
    assert store.batch_set_v1(keys, pages(host, 1, 4)) == [True] * 4

    # A new audit (a restarted server) knows the stored pages from the log next to the store.
    restarted = Counts()
    again = kv_audit(host, restarted, log_dir=log_dir)
    reloader = DeviceReloader(store.read_page_async, device, host.layout, PAGE, store.page_bytes)
    assert reloader.load(keys, pages(device, 20, 4)).ok
    again.store_to_device("kv", keys, pages(device, 20, 4))
    assert restarted.by_path == {SSD_TO_DEVICE: [4, 0]}

    flip_one_byte(device.k_buffer[1][int(pages(device, 22, 1)[5])], 17)
    again.store_to_device("kv", keys, pages(device, 20, 4))
    assert restarted.by_path[SSD_TO_DEVICE] == [8, 1]


def test_pages_of_unknown_origin_are_not_counted_as_checked(pools):
    device, host = pools
    counts = Counts()
    audit = kv_audit(host, counts)
    audit.host_to_device("kv", pages(host, 3, 2), pages(device, 2, 2))
    audit.store_to_device("kv", ["never-stored"], pages(device, 2, 1))
    assert counts.by_path == {}


def test_mamba_states_are_audited_slot_by_slot():
    host = mamba_host_pool()
    info = host.buffer_info
    fill_random([info.temporal, *info.conv], seed=5)
    counts = Counts()
    audit = KVAudit({"mamba": PoolRows.of_host_pool("mamba", host)}, counts)
    host_slots, device_slots = torch.tensor([4, 6]), torch.tensor([1, 7])
    host.backup_from_device_all_layer(None, host_slots, device_slots, "direct")
    audit.device_to_host("mamba", host_slots, device_slots)
    flip_one_byte(host.temporal_buffer[6], 11)
    for layer in range(3):
        host.load_to_device_per_layer(None, host_slots, torch.tensor([2, 3]), layer, "direct")
    audit.host_to_device("mamba", host_slots, torch.tensor([2, 3]))
    assert counts.by_path == {DEVICE_TO_HOST: [2, 0], HOST_TO_DEVICE: [2, 1]}


def test_a_torn_last_line_of_the_audit_log_is_ignored_counted_and_cut_off(backend):
    """A server killed mid-append leaves half a line; the next one audits what the whole lines say,
    starts its own lines on a fresh line, and keeps the log private (0600)."""
    device, host, store = backend
    log_dir = store.store.config.data_dirs[0]
    store.kv_audit = audit = kv_audit(host, Counts(), log_dir=log_dir)
    keys = [f"t{i}" for i in range(4)]
    backup(device, host, pages(host, 1, 4), pages(device, 1, 4))
    audit.device_to_host("kv", pages(host, 1, 4), pages(device, 1, 4))
    assert store.batch_set_v1(keys, pages(host, 1, 4)) == [True] * 4
    log = os.path.join(log_dir, LOG_NAME)
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
    whole = open(log, "rb").read()
    last = whole.splitlines(keepends=True)[-1]
    os.truncate(log, len(whole) - len(last) + 4)  # the fourth page's line: "kv " and a character

    restarted = Counts()
    again = kv_audit(host, restarted, log_dir=log_dir)
    assert again.bad_log_lines == 1
    assert open(log, "rb").read() == b"".join(whole.splitlines(keepends=True)[:3])
    reloader = DeviceReloader(store.read_page_async, device, host.layout, PAGE, store.page_bytes)
    assert reloader.load(keys, pages(device, 20, 4)).ok
    again.store_to_device("kv", keys, pages(device, 20, 4))
    assert restarted.by_path == {SSD_TO_DEVICE: [3, 0]}  # the torn page is not audited, nothing fails

    store.kv_audit = again  # a page the restarted server writes is a whole line after the cut
    backup(device, host, pages(host, 6, 1), pages(device, 6, 1))
    again.device_to_host("kv", pages(host, 6, 1), pages(device, 6, 1))
    assert store.batch_set_v1(["t4"], pages(host, 6, 1)) == [True]
    third = kv_audit(host, Counts(), log_dir=log_dir)
    assert third.bad_log_lines == 0 and len(open(log, "rb").read().splitlines()) == 4
