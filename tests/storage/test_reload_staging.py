"""The direct reload's staging in SGLang's memory plan (hicache/reload_staging.py, patch
009): the KV sizing takes exactly the reloader's staging off its budget when saria's direct
reload will run, nothing otherwise, and the reloader's log says whether it was reserved."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from sglang_saria.hicache import reload_staging
from sglang_saria.hicache.reload_staging import report_staging, reserve_bytes
from sglang_saria.hicache.device_reload import staging_bytes
from sglang_saria.units import ConfigError

CELL, PAGE_SIZE = 1000, 16  # bytes per token of the KV pool, tokens per page


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
        (memory_args(), 0),  # a pool SGLang does not price per token cell (hybrid)
    ],
)
def test_nothing_is_reserved_where_no_reloader_will_be_built(args, cell):
    assert reserve_bytes(args, cell, PAGE_SIZE) == 0


def test_a_bad_chunk_size_stops_the_sizing_naming_the_key():
    with pytest.raises(ConfigError, match="transfer.reload_chunk_pages=0"):
        reserve_bytes(memory_args({"transfer": {"reload_chunk_pages": 0}}), CELL, PAGE_SIZE)


def test_staging_log_says_whether_the_kv_sizing_reserved_it(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=reload_staging.__name__)
    monkeypatch.setattr(reload_staging, "_reserved", None)
    report_staging(1 << 20, "cuda:0")
    assert "is patch 009 applied?" in caplog.text and "reserved nothing" in caplog.text
    caplog.clear()
    reserve_bytes(memory_args({"transfer": {"reload_chunk_pages": 4}}), CELL, PAGE_SIZE)
    report_staging(staging_bytes(4, PAGE_SIZE * CELL), "cuda:0")
    assert "reserved at KV sizing" in caplog.text and "patch 009" not in caplog.text


def test_unreserved_gdn_checkpoint_staging_is_reported_apart_from_the_reserved_kv_staging(caplog):
    caplog.set_level(logging.INFO, logger=reload_staging.__name__)
    reserve_bytes(memory_args({"transfer": {"reload_chunk_pages": 4}}), CELL, PAGE_SIZE)
    report_staging(staging_bytes(4, PAGE_SIZE * CELL), "cuda:0", state_bytes=3 << 20)
    assert "GDN checkpoint staging 3.00 MiB on cuda:0 is not reserved" in caplog.text
    assert "reserved at KV sizing" in caplog.text and "patch 009 applied" not in caplog.text


def test_patched_kv_sizing_takes_the_staging_off_the_budget(monkeypatch):
    """Patch 009 in the installed SGLang: config_from_budget prices the pool from the budget
    minus the staging (pre-capture sizing and post-capture resize both call it)."""
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
    this = SimpleNamespace(use_mla_backend=False, _apply_token_constraints=lambda tokens: tokens)
    budget = 10**9
    config = kvc_module.KVCacheConfigurator.config_from_budget(this, budget)
    assert seen == [budget - 2 * 4 * PAGE_SIZE * CELL]
    assert config.max_total_num_tokens == (budget - 2 * 4 * PAGE_SIZE * CELL) // CELL
    memory.hicache_storage_backend = "file"
    kvc_module.KVCacheConfigurator.config_from_budget(this, budget)
    assert seen[-1] == budget
