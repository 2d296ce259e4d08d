"""The direct reload's staging in SGLang's memory plan (hicache/direct_reload/staging.py, the
plugin hook on `config_from_budget`): the KV sizing takes exactly the reloader's staging off its budget when saria's direct
reload will run, nothing otherwise, and the reloader's log says whether it was reserved. For
the tiny hybrid model the real configurator sizes the pool and the real SGLang pools build
the reloader: the FA staging of its full-attention layer plus one GDN checkpoint page."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_saria.hicache.direct_reload import staging
from sglang_saria.hicache.direct_reload.staging import checkpoint_bytes, report_staging, reserve_bytes
from sglang_saria.reload.device import DeviceReloader, staging_bytes
from sglang_saria.reload.gdn_state import StateRows
from sglang_saria.units import ConfigError

CELL, PAGE_SIZE = 1000, 16  # bytes per token of the KV pool, tokens per page

pytestmark = pytest.mark.usefixtures("sglang_plugins")  # saria reaches SGLang through its plugin


def memory_args(extra=None, backend="saria", hicache=True) -> SimpleNamespace:
    """The fields of SGLang's get_memory() the reservation reads."""
    raw = extra if extra is None or isinstance(extra, str) else json.dumps(extra)
    return SimpleNamespace(
        enable_hierarchical_cache=hicache, hicache_storage_backend=backend, hicache_storage_backend_extra_config=raw
    )


def test_saria_direct_reload_reserves_two_chunks_of_pages():
    args = memory_args({"transfer": {"reload_chunk_pages": 4}, "prefetch_threshold": 64})
    assert reserve_bytes(args, CELL, PAGE_SIZE) == staging_bytes(4, PAGE_SIZE * CELL) == 2 * 4 * PAGE_SIZE * CELL
    assert reserve_bytes(memory_args(), CELL, PAGE_SIZE) == 2 * 16 * PAGE_SIZE * CELL  # the default chunk


def test_extra_config_from_a_file_is_read_as_sglang_reads_it(tmp_path):
    path = tmp_path / "saria.json"
    path.write_text(json.dumps({"transfer": {"reload_chunk_pages": 2}}))
    assert reserve_bytes(memory_args(f"@{path}"), CELL, PAGE_SIZE) == 2 * 2 * PAGE_SIZE * CELL


@pytest.mark.parametrize(
    "args, cell",
    [
        (memory_args({"transfer": {"direct_reload": False}}), CELL),  # HiCache's prefetch: no staging
        (memory_args(backend="file"), CELL),
        (memory_args(hicache=False), CELL),
        (memory_args(), 0),  # a pool SGLang does not price per token cell (MLA): no reloader
    ],
)
def test_nothing_is_reserved_where_no_reloader_will_be_built(args, cell):
    assert reserve_bytes(args, cell, PAGE_SIZE) == 0


def test_a_bad_chunk_size_stops_the_sizing_naming_the_key():
    with pytest.raises(ConfigError, match="transfer.reload_chunk_pages=0"):
        reserve_bytes(memory_args({"transfer": {"reload_chunk_pages": 0}}), CELL, PAGE_SIZE)


def test_staging_log_says_whether_the_kv_sizing_reserved_it(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=staging.__name__)
    monkeypatch.setattr(staging, "_reserved", None)
    report_staging(1 << 20, "cuda:0")
    assert "is the sglang-saria plugin loaded" in caplog.text and "reserved nothing" in caplog.text
    caplog.clear()
    reserve_bytes(memory_args({"transfer": {"reload_chunk_pages": 4}}), CELL, PAGE_SIZE)
    report_staging(staging_bytes(4, PAGE_SIZE * CELL), "cuda:0")
    assert "reserved at KV sizing" in caplog.text and "plugin loaded" not in caplog.text


def test_gdn_checkpoint_staging_counts_towards_what_must_be_reserved(caplog):
    caplog.set_level(logging.INFO, logger=staging.__name__)
    fa = staging_bytes(4, PAGE_SIZE * CELL)
    reserve_bytes(memory_args({"transfer": {"reload_chunk_pages": 4}}), CELL, PAGE_SIZE)
    report_staging(fa, "cuda:0", state_bytes=3 << 20)
    assert f"but the KV sizing reserved {fa} bytes" in caplog.text and "plugin loaded" in caplog.text
    caplog.clear()
    reserve_bytes(memory_args({"transfer": {"reload_chunk_pages": 4}}), CELL, PAGE_SIZE, state_bytes=3 << 20)
    report_staging(fa, "cuda:0", state_bytes=3 << 20)
    assert f"FA pages {fa} + GDN checkpoint {3 << 20} on cuda:0, reserved at KV sizing" in caplog.text
    assert "plugin loaded" not in caplog.text


def test_checkpoint_is_priced_for_the_mamba_layers_of_this_rank():
    params = SimpleNamespace(layers=[0, 1, 2, 4, 5, 6], mamba_cache_per_req=6 * 1000)
    config = SimpleNamespace(mamba2_cache_params=params)
    assert checkpoint_bytes(config, 0, 8) == 6 * 1000
    assert checkpoint_bytes(config, 4, 8) == 3 * 1000  # pipeline stage 2 of 2
    assert checkpoint_bytes(None, 0, 8) == 0  # no mamba states


def test_patched_kv_sizing_takes_the_staging_off_the_budget(monkeypatch):
    """The plugin's hook on config_from_budget: the pool is priced from the budget minus the
    staging (pre-capture sizing and post-capture resize both call it)."""
    from sglang.srt import runtime_context
    from sglang.srt.mem_cache import kv_cache_configurator as kvc_module
    from sglang.srt.model_executor import pool_configurator

    seen: list[int] = []
    sizer = SimpleNamespace(
        _cell_size=CELL,
        calculate_pool_sizes=lambda budget, page: seen.append(budget) or SimpleNamespace(max_total_num_tokens=budget // CELL),
    )
    monkeypatch.setattr(pool_configurator, "create_memory_pool_configurator", lambda kvc: sizer)
    memory = memory_args({"transfer": {"reload_chunk_pages": 4}})
    memory.enable_unified_memory = False
    monkeypatch.setattr(kvc_module, "get_memory", lambda: memory)
    monkeypatch.setattr(kvc_module, "get_schedule", lambda: SimpleNamespace(page_size=PAGE_SIZE))
    monkeypatch.setattr(runtime_context, "get_memory", lambda: memory)
    monkeypatch.setattr(runtime_context, "get_schedule", lambda: SimpleNamespace(page_size=PAGE_SIZE))
    this = SimpleNamespace(
        use_mla_backend=False,
        mambaish_config=None,
        layer_info=SimpleNamespace(start_layer=0, end_layer=4),
        _apply_token_constraints=lambda tokens: tokens,
    )
    budget = 10**9
    config = kvc_module.KVCacheConfigurator.config_from_budget(this, budget)
    assert seen == [budget - 2 * 4 * PAGE_SIZE * CELL]
    assert config.max_total_num_tokens == (budget - 2 * 4 * PAGE_SIZE * CELL) // CELL
    memory.hicache_storage_backend = "file"
    kvc_module.KVCacheConfigurator.config_from_budget(this, budget)
    assert seen[-1] == budget


HYBRID_PAGE, HYBRID_CHUNK = 16, 4


@pytest.fixture(scope="module")
def hybrid_sizing(hybrid_model: Path, tmp_path_factory):
    """SGLang's real `KVCacheConfigurator` for the tiny hybrid model (3 GDN + 1 FA layers, fp16)
    as the model runner builds it for a saria server with direct reload."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo
    from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import SpecAuxHiddenStateConfig
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    extra = {"data_dirs": [str(tmp_path_factory.mktemp("store"))], "transfer": {"reload_chunk_pages": HYBRID_CHUNK}}
    args = ServerArgs(
        model_path=str(hybrid_model), device="cpu", attention_backend="torch_native", dtype="float16",
        page_size=HYBRID_PAGE, enable_hierarchical_cache=True, hicache_storage_backend="saria",
        hicache_storage_backend_extra_config=json.dumps(extra), mamba_radix_cache_strategy="extra_buffer",
        mamba_track_interval=64, max_mamba_cache_size=8, disable_overlap_schedule=True,
    )
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    model_config = ModelConfig.from_server_args(args)
    layers = model_config.num_hidden_layers
    return KVCacheConfigurator(
        device="cpu", gpu_id=0, attn_dp_size=1, pp_size=1, pp_group=None, model=None, model_config=model_config,
        server_args=args, kv_cache_dtype=torch.float16, kv_cache_dtype_str="auto", model_dtype=torch.float16,
        page_size=HYBRID_PAGE, sliding_window_size=None, spec_algorithm=SpeculativeAlgorithm.NONE,
        is_draft_worker=False, post_capture_kv_active=False, spec_aux_config=SpecAuxHiddenStateConfig(),
        is_hybrid_swa=False, is_hybrid_swa_compress=False, use_mla_backend=False,
        layer_info=ModelLayerInfo(start_layer=0, end_layer=layers, num_effective_layers=layers),
        forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None,
    )


def hybrid_reloader(kvc) -> tuple[DeviceReloader, list[torch.Tensor], list[torch.Tensor]]:
    """The hybrid reloader as `build_direct_reload` (hicache/direct_reload/build.py) builds it, over
    SGLang's real device pools (the hybrid KV pool's full-attention layers, the mamba state
    pool) and host mamba pool; with the device FA K/V buffers ``[slot, head, dim]`` and state
    tensors ``[layer, slot, ...]``."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_mamba_host_pool
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool

    config = kvc.mambaish_config
    params, model = config.mamba2_cache_params, kvc.model_config
    req_pool = HybridReqToTokenPool(
        size=4, mamba_size=8, mamba_spec_state_size=4, max_context_len=1024, device="cpu",
        enable_memory_saver=False, cache_params=params, mamba_layer_ids=params.layers,
        enable_mamba_extra_buffer=True, enable_overlap_schedule=False,
    )
    kv = HybridLinearKVPool(
        size=512, dtype=kvc.kv_cache_dtype, page_size=HYBRID_PAGE, head_num=model.get_num_kv_heads(1),
        head_dim=model.head_dim, full_attention_layer_ids=config.full_attention_layer_ids, device="cpu",
        mamba_pool=req_pool.mamba_pool,
    )
    mamba = req_pool.mamba_pool
    mamba_host = build_mamba_host_pool(mamba, mamba.get_device_pool_infos()[0], host_size=0, layout="page_first")
    fa = kv.full_kv_pool
    fa_page_bytes = HYBRID_PAGE * sum(t[0].numel() * t.element_size() for t in fa.k_buffer + fa.v_buffer)
    reloader = DeviceReloader(
        lambda *a, **k: None, kv, "page_first", HYBRID_PAGE, fa_page_bytes, chunk_pages=HYBRID_CHUNK,
        state_rows=StateRows.of_pools(mamba_host), read_state=lambda *a, **k: None,
    )
    states = mamba.get_device_pool_infos()[0].buffer_info
    return reloader, fa.k_buffer + fa.v_buffer, [states.temporal, *states.conv]


def test_hybrid_kv_sizing_reserves_exactly_the_hybrid_reloaders_staging(hybrid_sizing, monkeypatch, caplog):
    """The staging reserve for a hybrid model: the real sizing takes the FA staging (full-attention
    layers only) plus one GDN checkpoint page off the budget, the bytes the reloader built from
    the real pools allocates; the reloader's startup log then says it was reserved."""
    from sglang.srt.model_executor import pool_configurator

    caplog.set_level(logging.INFO, logger=staging.__name__)
    seen: list[int] = []
    price = pool_configurator.DefaultPoolConfigurator.calculate_pool_sizes
    monkeypatch.setattr(
        pool_configurator.DefaultPoolConfigurator,
        "calculate_pool_sizes",
        lambda self, budget, page: seen.append(budget) or price(self, budget, page),
    )
    budget = 10**8
    config = hybrid_sizing.config_from_budget(budget)
    reloader, fa, states = hybrid_reloader(hybrid_sizing)

    # Independently, from the pools' shapes: per token, K and V of each full-attention layer;
    # per checkpoint, one mamba slot of every part (temporal, conv) of every GDN layer.
    assert len(fa) == 2 and all(t.shape[0] == 3 for t in states)  # 1 FA + 3 GDN layers
    fa_bytes = 2 * HYBRID_CHUNK * HYBRID_PAGE * sum(t[0].numel() * t.element_size() for t in fa)
    state_bytes = sum(t[:, 0].numel() * t.element_size() for t in states)
    assert (reloader.staging_bytes, reloader.state_staging_bytes) == (fa_bytes, state_bytes)
    assert seen == [budget - fa_bytes - state_bytes]
    cell = fa_bytes // (2 * HYBRID_CHUNK * HYBRID_PAGE)
    assert config.max_total_num_tokens == (budget - fa_bytes - state_bytes) // cell // HYBRID_PAGE * HYBRID_PAGE

    report_staging(reloader.staging_bytes, "cpu", reloader.state_staging_bytes)
    assert f"FA pages {fa_bytes} + GDN checkpoint {state_bytes} on cpu, reserved at KV sizing" in caplog.text
    assert "plugin loaded" not in caplog.text
