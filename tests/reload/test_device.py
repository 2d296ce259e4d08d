"""Direct SSD -> device-pool reload (reload/device.py): real store files, pages in
SGLang's host-pool byte order, scattered into a device pool's per-layer K/V buffers by the
gather. On CPU: POSIX reads and the gather's torch path; on CUDA (scripts/gpu_check.sh):
kvikio reads into a CUDA staging buffer and the compiled Triton kernel."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from sglang_saria.reload import device as device_reload
from sglang_saria.storage import store as store_module
from sglang_saria.reload.device import DeviceReloader, PageGeometry, UnsupportedPoolLayout, staging_bytes
from tests.store_fixtures import slab_path

HERE = Path(__file__).resolve().parent

LAYERS, PAGE, HEADS, DIM = 3, 4, 2, 8
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPU: kvikio reads + compiled gather"),
        ],
    ),
]


class DevicePool:
    """The attributes of SGLang's MHATokenToKVPool the reloader reads: per-layer K and V."""

    def __init__(self, slots: int, dtype: torch.dtype, device: str = "cpu") -> None:
        self.k_buffer = [torch.zeros(slots, HEADS, DIM, dtype=dtype, device=device) for _ in range(LAYERS)]
        self.v_buffer = [torch.zeros(slots, HEADS, DIM, dtype=dtype, device=device) for _ in range(LAYERS)]


def stored_page(kv: torch.Tensor, layout: str) -> torch.Tensor:
    """One page as HiCache's host pool flattens it: kv is [2, layers, page, heads, dim]."""
    if layout == "page_first":  # host kv_buffer [2, size, layers, heads, dim]
        return kv.permute(0, 2, 1, 3, 4).contiguous().flatten()
    return kv.contiguous().flatten()  # layer_first / page_first_direct: [2, layers, page, ...]


def page_bytes(dtype: torch.dtype) -> int:
    return 2 * LAYERS * PAGE * HEADS * DIM * torch.empty(0, dtype=dtype).element_size()


def flip_stored_byte(store, key: str, offset: int = 100) -> None:
    """Corrupt one byte of a stored object on disk (one data dir; ``offset`` inside its first slot)."""
    slot = int(store._entries[key].slots[0])
    with open(slab_path(store), "r+b") as f:
        f.seek(slot * store.layout.unit + offset)
        b = f.read(1)
        f.seek(slot * store.layout.unit + offset)
        f.write(bytes([b[0] ^ 0x5A]))


def counting_host_hash(monkeypatch) -> list[int]:
    """Count the store's host xxh3 checks (each copies a CUDA page to host memory)."""
    calls: list[int] = []
    real = store_module.xxh3

    def counted(pieces):
        calls.append(1)
        return real(pieces)

    monkeypatch.setattr(store_module, "xxh3", counted)
    return calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pages_land_in_their_slots_exactly(make_store, layout, dtype, device):
    store = make_store(slot_bytes="4KiB")
    pages = [torch.randn(2, LAYERS, PAGE, HEADS, DIM).to(dtype) for _ in range(5)]
    for i, kv in enumerate(pages):
        assert store.put(f"p{i}", stored_page(kv, layout)).ok
    pool = DevicePool(64, dtype, device)
    reloader = DeviceReloader(store.get_async, pool, layout, PAGE, page_bytes(dtype), chunk_pages=2)
    slots = torch.cat([torch.arange(PAGE) + PAGE * p for p in (9, 2, 14, 5, 11)])
    progress = []
    outcome = reloader.load([f"p{i}" for i in range(5)], slots, pace=lambda done: progress.append(done) or 0)
    assert outcome.ok and outcome.pages == 5 and outcome.nbytes == 5 * page_bytes(dtype)
    assert progress == [2 * page_bytes(dtype), 4 * page_bytes(dtype), 5 * page_bytes(dtype)]
    for n, kv in enumerate(pages):
        page_slots = slots[n * PAGE : (n + 1) * PAGE]
        for layer in range(LAYERS):
            assert torch.equal(pool.k_buffer[layer][page_slots].cpu(), kv[0, layer])
            assert torch.equal(pool.v_buffer[layer][page_slots].cpu(), kv[1, layer])
    untouched = torch.ones(64, dtype=torch.bool, device=device)
    untouched[slots] = False
    assert all(not buf[untouched].any() for buf in pool.k_buffer + pool.v_buffer)


@pytest.mark.parametrize("device", DEVICES)
def test_failed_read_lands_the_pages_before_it_and_nothing_after(make_store, device):
    store = make_store(slot_bytes="4KiB")
    kv = [torch.randn(2, LAYERS, PAGE, HEADS, DIM).to(torch.bfloat16) for _ in range(2)]
    for i in range(2):
        assert store.put(f"p{i}", stored_page(kv[i], "page_first")).ok
    pool = DevicePool(32, torch.bfloat16, device)
    reloader = DeviceReloader(store.get_async, pool, "page_first", PAGE, page_bytes(torch.bfloat16))
    outcome = reloader.load(["p0", "missing", "p1"], torch.arange(3 * PAGE))
    assert (outcome.ok, outcome.pages, outcome.reason) == (False, 1, "miss")
    assert outcome.failed == [("missing", "miss")]
    for layer in range(LAYERS):
        assert torch.equal(pool.k_buffer[layer][:PAGE].cpu(), kv[0][0, layer])
        assert not pool.k_buffer[layer][PAGE:].any() and not pool.v_buffer[layer][PAGE:].any()


def test_stop_ends_a_load_between_chunks_with_a_leading_run_landed(make_store):
    store = make_store(slot_bytes="4KiB")
    for i in range(4):
        assert store.put(f"p{i}", stored_page(torch.randn(2, LAYERS, PAGE, HEADS, DIM).half(), "page_first")).ok
    pool = DevicePool(32, torch.float16)
    reloader = DeviceReloader(store.get_async, pool, "page_first", PAGE, page_bytes(torch.float16), chunk_pages=2)
    outcome = reloader.load([f"p{i}" for i in range(4)], torch.arange(4 * PAGE), stop=lambda: True)
    assert (outcome.ok, outcome.pages, outcome.reason, outcome.failed) == (False, 2, "stopped", [])
    assert all(buf[: 2 * PAGE].any() and not buf[2 * PAGE :].any() for buf in pool.k_buffer)


def test_slot_count_must_match_the_pages(make_store):
    pool = DevicePool(32, torch.bfloat16)
    reloader = DeviceReloader(make_store().get_async, pool, "page_first", PAGE, page_bytes(torch.bfloat16))
    with pytest.raises(ValueError, match="2 pages need 8 slots, got 7"):
        reloader.load(["a", "b"], torch.arange(7))


def test_unsupported_layouts_are_refused_with_the_reason(make_store):
    pool = DevicePool(32, torch.bfloat16)
    read = make_store().get_async
    with pytest.raises(UnsupportedPoolLayout, match="--hicache-mem-layout page_head"):
        DeviceReloader(read, pool, "page_head", PAGE, page_bytes(torch.bfloat16))
    with pytest.raises(UnsupportedPoolLayout, match="a stored page is 100 bytes"):
        DeviceReloader(read, pool, "page_first", PAGE, 100)
    with pytest.raises(UnsupportedPoolLayout, match="no per-layer k_buffer"):
        DeviceReloader(read, object(), "page_first", PAGE, 100)


@pytest.mark.parametrize("token_major", [True, False])
def test_staging_rows_cover_each_page_once(token_major):
    g = PageGeometry(layers=LAYERS, page_size=PAGE, token_major=token_major)
    rows = torch.cat([g.staging_rows(3, kv, layer) for kv in (0, 1) for layer in range(LAYERS)])
    assert sorted(rows.tolist()) == list(range(3 * g.rows_per_page))


def test_failure_in_a_later_chunk_reports_the_pages_already_loaded(make_store):
    store = make_store(slot_bytes="4KiB")
    for i in range(2):
        assert store.put(f"p{i}", stored_page(torch.randn(2, LAYERS, PAGE, HEADS, DIM).half(), "page_first")).ok
    pool = DevicePool(32, torch.float16)
    reloader = DeviceReloader(store.get_async, pool, "page_first", PAGE, page_bytes(torch.float16), chunk_pages=2)
    outcome = reloader.load(["p0", "p1", "gone"], torch.arange(3 * PAGE))
    assert (outcome.ok, outcome.pages, outcome.reason) == (False, 2, "miss")


class HostPool:
    """SGLang's MHATokenToKVPoolHost as the reloader sees it: one kv_buffer in its layout."""

    def __init__(self, pages: int, layout: str, dtype: torch.dtype, device: str = "cpu") -> None:
        dims = {
            "page_first": (2, pages * PAGE, LAYERS, HEADS, DIM),
            "layer_first": (2, LAYERS, pages * PAGE, HEADS, DIM),
            "page_first_direct": (2, pages, LAYERS, PAGE, HEADS, DIM),
        }[layout]
        self.layout = layout
        self.kv_buffer = torch.randn(dims).to(dtype)
        if device == "cuda":
            self.kv_buffer = self.kv_buffer.pin_memory()

    def page(self, host_page: int) -> torch.Tensor:
        """Host page as [2, layers, page, heads, dim]."""
        b, p = self.kv_buffer, host_page
        if self.layout == "page_first":
            return b[:, p * PAGE : (p + 1) * PAGE].permute(0, 2, 1, 3, 4)
        if self.layout == "layer_first":
            return b[:, :, p * PAGE : (p + 1) * PAGE]
        return b[:, p]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
def test_dram_and_ssd_pages_of_one_plan_move_in_the_same_gathers(make_store, layout, device):
    dtype = torch.bfloat16
    store = make_store(slot_bytes="4KiB")
    ssd = [torch.randn(2, LAYERS, PAGE, HEADS, DIM).to(dtype) for _ in range(4)]
    for i, kv in enumerate(ssd):
        assert store.put(f"s{i}", stored_page(kv, layout)).ok
    host = HostPool(8, layout, dtype, device)
    pool = DevicePool(64, dtype, device)
    reloader = DeviceReloader(store.get_async, pool, layout, PAGE, page_bytes(dtype), host_pool=host, chunk_pages=1)
    assert reloader.moves_host_pages
    host_pages, host_dst_pages, ssd_dst_pages = [6, 1, 3], [10, 4, 7], [2, 12, 9, 5]
    tokens = lambda ps: torch.cat([torch.arange(PAGE) + PAGE * p for p in ps])  # noqa: E731
    due = []

    def pace(done: int) -> float:  # a coordinated pacer: one DRAM page per SSD page read
        due.append(done // page_bytes(dtype))
        return done

    outcome = reloader.load([f"s{i}" for i in range(4)], tokens(ssd_dst_pages), tokens(host_pages), tokens(host_dst_pages), pace)
    assert outcome.ok and outcome.pages == 4
    assert due == [1, 2, 3, 4]
    expected = [(d, ssd[i]) for i, d in enumerate(ssd_dst_pages)] + [
        (d, host.page(h)) for h, d in zip(host_pages, host_dst_pages)
    ]
    for dst_page, kv in expected:
        for layer in range(LAYERS):
            rows = slice(dst_page * PAGE, (dst_page + 1) * PAGE)
            assert torch.equal(pool.k_buffer[layer][rows].cpu(), kv[0, layer])
            assert torch.equal(pool.v_buffer[layer][rows].cpu(), kv[1, layer])


def test_a_load_that_fails_midway_still_moves_every_dram_page_it_publishes(make_store):
    """The DRAM part comes before the SSD pages: a failed read ends the SSD part, but the
    pages before it are published with the whole DRAM part, so all of it must be in place
    (a paced load has moved only part of it when the read fails)."""
    dtype = torch.bfloat16
    store = make_store(slot_bytes="4KiB")
    ssd = [torch.randn(2, LAYERS, PAGE, HEADS, DIM).to(dtype) for _ in range(2)]
    for i, kv in enumerate(ssd):
        assert store.put(f"s{i}", stored_page(kv, "page_first")).ok
    host = HostPool(8, "page_first", dtype, "cpu")
    pool = DevicePool(64, dtype)
    reloader = DeviceReloader(store.get_async, pool, "page_first", PAGE, page_bytes(dtype), host_pool=host, chunk_pages=1)
    tokens = lambda ps: torch.cat([torch.arange(PAGE) + PAGE * p for p in ps])  # noqa: E731
    host_pages, host_dst_pages = [6, 1, 3, 2], [10, 4, 7, 8]
    pace = lambda done: 0.0  # noqa: E731 - the pacer has let no DRAM byte through yet
    outcome = reloader.load(["s0", "s1", "missing"], tokens([2, 12, 9]), tokens(host_pages), tokens(host_dst_pages), pace)
    assert (outcome.ok, outcome.pages, outcome.reason, outcome.host_pages) == (False, 2, "miss", 4)
    for h, d in zip(host_pages, host_dst_pages):
        assert torch.equal(pool.k_buffer[1][d * PAGE : (d + 1) * PAGE].cpu(), host.page(h)[0, 1])


def test_host_pool_of_another_kind_leaves_dram_pages_to_hicache(make_store):
    pool = DevicePool(32, torch.bfloat16)
    other = HostPool(4, "page_first", torch.float16)  # dtype differs from the device pool
    reloader = DeviceReloader(make_store().get_async, pool, "page_first", PAGE, page_bytes(torch.bfloat16), host_pool=other)
    assert not reloader.moves_host_pages
    with pytest.raises(ValueError, match="DRAM pages need HiCache's copy"):
        reloader.load([], torch.arange(0), torch.arange(PAGE), torch.arange(PAGE))


def test_staging_is_allocated_once_and_a_load_allocates_none(make_store, monkeypatch):
    store = make_store(slot_bytes="4KiB")
    kvs = [torch.randn(2, LAYERS, PAGE, HEADS, DIM).half() for _ in range(5)]
    for i, kv in enumerate(kvs):
        assert store.put(f"p{i}", stored_page(kv, "page_first")).ok
    pool = DevicePool(64, torch.float16)
    reloader = DeviceReloader(store.get_async, pool, "page_first", PAGE, page_bytes(torch.float16), chunk_pages=2)
    assert reloader.staging_bytes == staging_bytes(2, page_bytes(torch.float16)) == 2 * 2 * page_bytes(torch.float16)

    def no_allocation(*args, **kwargs):
        raise AssertionError("a reload allocated a buffer")

    monkeypatch.setattr(device_reload.torch, "empty", no_allocation)
    for _ in range(2):  # 5 pages through 2-page chunks: both buffers reused, twice
        assert reloader.load([f"p{i}" for i in range(5)], torch.arange(5 * PAGE)).ok
    for i, kv in enumerate(kvs):
        assert torch.equal(pool.v_buffer[2][i * PAGE : (i + 1) * PAGE], kv[1, 2])


def test_concurrent_loads_take_turns_on_the_one_staging(make_store):
    store = make_store(slot_bytes="4KiB")
    kvs = [torch.randn(2, LAYERS, PAGE, HEADS, DIM).half() for _ in range(6)]
    for i, kv in enumerate(kvs):
        assert store.put(f"p{i}", stored_page(kv, "page_first")).ok
    order: list[str] = []

    def slow_read(key, dest):
        order.append(key)
        time.sleep(0.02)  # both loads are in flight at once unless the reloader serialises them
        return store.get_async(key, dest)

    pool = DevicePool(64, torch.float16)
    reloader = DeviceReloader(slow_read, pool, "page_first", PAGE, page_bytes(torch.float16), chunk_pages=1)
    with ThreadPoolExecutor(2) as ex:
        a = ex.submit(reloader.load, ["p0", "p1", "p2"], torch.arange(3 * PAGE))
        b = ex.submit(reloader.load, ["p3", "p4", "p5"], torch.arange(3 * PAGE, 6 * PAGE))
        assert a.result(timeout=30).ok and b.result(timeout=30).ok
    for i, kv in enumerate(kvs):
        assert torch.equal(pool.k_buffer[0][i * PAGE : (i + 1) * PAGE], kv[0, 0])
    assert order in (["p0", "p1", "p2", "p3", "p4", "p5"], ["p3", "p4", "p5", "p0", "p1", "p2"])


@pytest.mark.parametrize("device", DEVICES)
def test_device_verify_flipped_byte_is_corrupt_for_that_page_only(make_store, monkeypatch, device):
    store = make_store(slot_bytes="4KiB")
    kvs = [torch.randn(2, LAYERS, PAGE, HEADS, DIM).half() for _ in range(5)]
    for i, kv in enumerate(kvs):
        assert store.put(f"p{i}", stored_page(kv, "page_first")).ok
    flip_stored_byte(store, "p2")
    host_hashes = counting_host_hash(monkeypatch)
    pool = DevicePool(64, torch.float16, device)
    verify = "device" if device == "cpu" else "auto"  # on CPU "auto" keeps the host check
    reloader = DeviceReloader(
        store.get_async, pool, "page_first", PAGE, page_bytes(torch.float16), chunk_pages=2,
        page_digest=store.digest_of, verify=verify,
    )
    assert reloader.verify == "device"
    outcome = reloader.load([f"p{i}" for i in range(5)], torch.arange(5 * PAGE))
    assert (outcome.ok, outcome.pages, outcome.reason, outcome.failed) == (False, 2, "corrupt", [("p2", "corrupt")])
    assert host_hashes == []  # no page went to host memory to be checked
    for i in range(2):
        assert torch.equal(pool.k_buffer[1][i * PAGE : (i + 1) * PAGE].cpu(), kvs[i][0, 1])
    assert all(not buf[2 * PAGE :].any() for buf in pool.k_buffer + pool.v_buffer)
    assert "get_corrupt" not in store.stats().counts  # the store served bytes; the digest caught them
    clean = reloader.load(["p0", "p1", "p3", "p4"], torch.arange(4 * PAGE))
    assert clean.ok and clean.pages == 4


def test_page_without_a_recorded_digest_keeps_the_host_check(make_store, monkeypatch):
    store = make_store(slot_bytes="4KiB")
    for i in range(3):
        assert store.put(f"p{i}", stored_page(torch.randn(2, LAYERS, PAGE, HEADS, DIM).half(), "page_first")).ok
    flip_stored_byte(store, "p1")
    host_hashes = counting_host_hash(monkeypatch)
    legacy = {"p1"}  # as if stored before index format 2
    reloader = DeviceReloader(
        store.get_async, DevicePool(32, torch.float16), "page_first", PAGE, page_bytes(torch.float16),
        page_digest=lambda k: None if k in legacy else store.digest_of(k), verify="device",
    )
    outcome = reloader.load(["p0", "p1", "p2"], torch.arange(3 * PAGE))
    assert (outcome.pages, outcome.failed) == (1, [("p1", "corrupt")])
    assert len(host_hashes) == 1 and store.stats().counts["get_corrupt"] == 1  # the store caught it, on the host


def test_device_verify_needs_the_recorded_digests(make_store):
    with pytest.raises(ValueError, match="verify='device' needs page_digest"):
        DeviceReloader(make_store().get_async, DevicePool(8, torch.float16), "page_first", PAGE, page_bytes(torch.float16), verify="device")


@pytest.fixture(scope="module")
def interpreted_verify(run_interpreted) -> dict[str, dict]:
    return run_interpreted(HERE / "device_verify_interpreter.py")


def test_interpreted_kernel_verifies_each_chunk_with_one_launch(interpreted_verify):
    r = interpreted_verify["clean"]
    assert r["kernel"] is True and r["verify"] == "device"
    assert (r["ok"], r["pages"], r["launches"], r["host_hashes"], r["landed_exactly"]) == (True, 5, 3, 0, True)


def test_interpreted_kernel_flipped_byte_is_corrupt_for_that_page_only(interpreted_verify):
    r = interpreted_verify["flipped"]
    assert (r["ok"], r["pages"], r["reason"], r["failed"]) == (False, 3, "corrupt", [["p3", "corrupt"]])
    assert (r["launches"], r["host_hashes"], r["leading_run_landed"], r["rest_untouched"]) == (2, 0, True, True)


def test_interpreted_kernel_corrupt_page_leaves_the_store_index_through_the_worker(interpreted_verify):
    r = interpreted_verify["worker"]
    assert (r["pages"], r["reason"], r["failed"], r["dropped"]) == (3, "corrupt", [["p3", "corrupt"]], ["p3"])
    assert r["stored"] == ["p0", "p1", "p2", "p4"]
