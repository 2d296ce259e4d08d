"""Hybrid direct reload (issue 15): one gather per chunk moves FA rows into the hybrid
pool's full-attention layers and a GDN checkpoint (fp32 temporal + conv state) into a
mamba slot, from SSD staging and the host pool in the same launch, bit for bit. Under
TRITON_INTERPRET=1 (a subprocess) the Triton kernel runs on CPU pools; in process, the
gather's torch path."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.reload import device as device_reload
from sglang_saria.reload.device import DeviceReloader, StateLoad, fa_pool_of, UnsupportedPoolLayout
from sglang_saria.reload.gdn_state import StateRows, UnsupportedStatePool
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import SariaStore
from tests.kernels.hybrid_cases import CASES, DTYPES, PAGE, HostMambaPool, HybridPool, case, kv_page_bytes

import torch

HERE = Path(__file__).resolve().parent
ALL = [(n, d) for n in CASES for d in DTYPES]


@pytest.fixture
def make_store(tmp_path):
    """make_store(slot_bytes=...): a real SariaStore in tmp_path, closed at teardown."""
    opened = []

    def make(slot_bytes: str = "4KiB") -> SariaStore:
        store = SariaStore(StoreConfig(data_dirs=[str(tmp_path / f"store{len(opened)}")], capacity="16MiB", slot_bytes=slot_bytes), victim_order=SSDVictimOrder())
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture(scope="module")
def interpreted(run_interpreted) -> dict[str, dict]:
    return run_interpreted(HERE / "hybrid_interpreter_check.py")


@pytest.mark.parametrize("name,dtype", ALL)
def test_interpreted_kernel_moves_fa_pages_and_gdn_state_bit_exact_in_one_launch_per_chunk(interpreted, name, dtype):
    r = interpreted[f"{name}/{dtype}"]
    assert (r["ok"], r["state_loaded"], r["fa_bit_exact"], r["state_bit_exact"]) == (True, True, True, True), r
    assert r["pages"] == CASES[name]["ssd_pages"]
    chunks = max(1, -(-CASES[name]["ssd_pages"] // 2))
    # One gather per chunk, each one kernel launch; the state rides in the last one.
    assert r["gathers"] == r["triton"] == chunks, r


@pytest.mark.parametrize("name,dtype", ALL)
def test_torch_path_moves_the_same_rows(make_store, monkeypatch, name, dtype):
    gathers = []
    real = device_reload.gather_rows
    monkeypatch.setattr(device_reload, "gather_rows", lambda *a, **k: gathers.append(1) or real(*a, **k))
    r = case(name, dtype).run(make_store(slot_bytes="4KiB"), chunk_pages=2)
    assert (r["ok"], r["state_loaded"], r["fa_bit_exact"], r["state_bit_exact"]) == (True, True, True, True), r
    assert len(gathers) == max(1, -(-CASES[name]["ssd_pages"] // 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPU: kvikio reads + compiled gather")
@pytest.mark.parametrize("name,dtype", ALL)
def test_compiled_kernel_moves_fa_pages_and_gdn_state_bit_exact_on_gpu(make_store, monkeypatch, name, dtype):
    """The same reloads into CUDA pools: staging on the GPU, pinned host pools read over UVA,
    the compiled kernel once per chunk."""
    from sglang_saria.kernels import gather

    launches = []
    real = gather._gather_mixed_triton
    monkeypatch.setattr(gather, "_gather_mixed_triton", lambda *a, **k: launches.append(1) or real(*a, **k))
    r = case(name, dtype, device="cuda").run(make_store(), chunk_pages=2)
    assert (r["ok"], r["state_loaded"], r["fa_bit_exact"], r["state_bit_exact"]) == (True, True, True, True), r
    assert len(launches) == max(1, -(-CASES[name]["ssd_pages"] // 2))


def _reloader(store: SariaStore) -> tuple[DeviceReloader, HostMambaPool, HybridPool]:
    host_mamba = HostMambaPool(torch.float16, torch.Generator().manual_seed(0))
    pool = HybridPool(torch.float16)
    reloader = DeviceReloader(
        store.get_async, pool, "page_first", PAGE, kv_page_bytes(torch.float16),
        state_rows=StateRows.of_pools(host_mamba), read_state=store.get_async,
    )
    return reloader, host_mamba, pool


def _put_kv_page(store: SariaStore, key: str) -> torch.Tensor:
    kv = torch.randn(2, 2, PAGE, 2, 8).to(torch.float16)
    assert store.put(key, kv.permute(0, 2, 1, 3, 4).contiguous().flatten()).ok
    return kv


def test_failed_state_read_lands_the_fa_pages_but_reports_no_state(make_store):
    store = make_store()
    kv = _put_kv_page(store, "p0")
    reloader, host_mamba, pool = _reloader(store)
    outcome = reloader.load(["p0"], torch.arange(PAGE), state=StateLoad(1, key="absent.mamba"))
    assert (outcome.ok, outcome.pages, outcome.state_loaded, outcome.state_failed) == (False, 1, False, "miss")
    assert outcome.reason == "state_miss" and outcome.failed == []
    assert torch.equal(pool.full_kv_pool.k_buffer[1][:PAGE], kv[0, 1])
    assert not host_mamba.buffer_info.temporal.any() and not host_mamba.buffer_info.conv[0].any()


def test_failed_fa_page_leaves_the_state_slot_untouched(make_store):
    store = make_store()
    _put_kv_page(store, "p0")
    state = HostMambaPool(torch.float16, torch.Generator().manual_seed(1))
    assert store.put("ck.mamba", torch.cat([state.temporal_buffer[0].view(torch.uint8).flatten(), state.conv_buffer[0][0].contiguous().view(torch.uint8).flatten()])).ok
    reloader, host_mamba, _ = _reloader(store)
    outcome = reloader.load(["p0", "missing"], torch.arange(2 * PAGE), state=StateLoad(1, key="ck.mamba"))
    assert (outcome.ok, outcome.pages, outcome.reason, outcome.state_loaded) == (False, 1, "miss", False)
    assert not host_mamba.buffer_info.temporal.any() and not host_mamba.buffer_info.conv[0].any()


def test_a_plain_pool_is_its_own_fa_pool():
    pool = HybridPool(torch.float16).full_kv_pool
    assert fa_pool_of(pool) is pool


def test_layer_mapping_out_of_model_order_is_refused():
    pool = HybridPool(torch.float16)
    pool.full_attention_layer_id_mapping = {1: 1, 3: 0}
    with pytest.raises(UnsupportedPoolLayout, match="not in model layer order"):
        fa_pool_of(pool)


def test_state_pool_with_side_states_keeps_hicache_load_back():
    host_mamba = HostMambaPool(torch.float16, torch.Generator().manual_seed(0))
    host_mamba.slot_state_device_tensors = (torch.zeros(6, 4),)
    with pytest.raises(UnsupportedStatePool, match="side states"):
        StateRows.of_pools(host_mamba)
