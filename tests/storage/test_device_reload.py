"""Direct SSD -> device-pool reload (hicache/device_reload.py): real store files, pages in
SGLang's host-pool byte order, scattered into a device pool's per-layer K/V buffers by the
gather. On CPU: POSIX reads and the gather's torch path; on CUDA (scripts/gpu_check.sh):
kvikio reads into a CUDA staging buffer and the compiled Triton kernel."""

from __future__ import annotations

import pytest
import torch

from sglang_saria.hicache.device_reload import DeviceReloader, PageGeometry, UnsupportedPoolLayout

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


def test_host_pool_of_another_kind_leaves_dram_pages_to_hicache(make_store):
    pool = DevicePool(32, torch.bfloat16)
    other = HostPool(4, "page_first", torch.float16)  # dtype differs from the device pool
    reloader = DeviceReloader(make_store().get_async, pool, "page_first", PAGE, page_bytes(torch.bfloat16), host_pool=other)
    assert not reloader.moves_host_pages
    with pytest.raises(ValueError, match="DRAM pages need HiCache's copy"):
        reloader.load([], torch.arange(0), torch.arange(PAGE), torch.arange(PAGE))
