"""The benchmark models (`make bench-models`) are real-shaped where caching cares: 16 KiB of KV
per full-attention token, a Qwen3.5-style hybrid with both layer kinds; and
`saria-bench-models` reports prefill against store reads of the same tokens' KV.
The configs are checked without building weights; the server run uses the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_saria.bench import models as bench_models
from sglang_saria.bench import reload as bench_reload
from sglang_saria.tiny_models import (
    FULL_ATTENTION_BENCH,
    HYBRID_BENCH,
    KNOWN,
    bench_config,
    geometry_of,
    kv_geometry,
)

BENCH = (FULL_ATTENTION_BENCH, HYBRID_BENCH)


@pytest.mark.parametrize("name", BENCH)
def test_benchmark_models_hold_at_least_16_KiB_of_kv_per_token(name: str) -> None:
    config = bench_config(name)
    geometry = geometry_of(config)
    assert geometry.bytes_per_token >= 16 * 1024
    assert geometry.page_bytes(16) == 16 * geometry.bytes_per_token


def test_bench_hybrid_has_gdn_and_full_attention_layers_three_to_one() -> None:
    config = bench_config(HYBRID_BENCH)
    kinds = config["layer_types"]
    geometry = geometry_of(config)
    assert set(kinds) == {"linear_attention", "full_attention"}
    assert geometry.gdn is not None and geometry.gdn.layers == 3 * geometry.fa_layers == kinds.count("linear_attention")
    # SGLang 0.5.23 reads the layer kinds from this field only (save_pretrained drops it).
    assert config["full_attention_interval"] == 4


def test_full_attention_bench_model_has_no_gdn_state() -> None:
    geometry = geometry_of(bench_config(FULL_ATTENTION_BENCH))
    assert geometry.gdn is None
    assert (geometry.fa_layers, geometry.kv_heads, geometry.head_dim) == (4, 8, 128)


def test_every_model_name_is_buildable_and_distinct() -> None:
    assert len(set(KNOWN)) == 4 and set(BENCH) < set(KNOWN)
    with pytest.raises(ValueError, match="not a benchmark model"):
        bench_config(KNOWN[0])


def test_checkpoint_bytes_agree_with_the_reload_benchmarks_pools(tmp_path: Path) -> None:
    """bench_models reads the hybrid's checkpoint as GDNGeometry sizes it; bench_reload's
    pools (SGLang's mamba layout) must hold the same bytes, or the two benchmarks differ."""
    model = tmp_path / HYBRID_BENCH
    model.mkdir()
    (model / "config.json").write_text(json.dumps(bench_config(HYBRID_BENCH)))
    geometry = kv_geometry(model)
    layers, shape = bench_reload.model_pools(model)
    pools = bench_reload.HybridPools(1, shape, "cpu")
    assert pools.get_size_per_token() == geometry.gdn.state_bytes
    assert bench_reload.Pools.page_bytes(layers) == geometry.page_bytes(16)


def test_store_read_and_table_report_the_ratio_to_prefill(tmp_path: Path) -> None:
    geometry = geometry_of(bench_config(HYBRID_BENCH))
    read = bench_models.store_read_s(geometry, [32], repeats=1, directory=str(tmp_path))
    assert len(read[32]) == 1 and read[32][0] > 0
    row = bench_models.Row(HYBRID_BENCH, 32, geometry.bytes_per_token, geometry.page_bytes(16),
                           geometry.gdn.state_bytes, prefill_s=[50 * read[32][0]], store_read_s=read[32])
    table = bench_models.markdown([row])
    assert "| prefill / read |" in table.splitlines()[0]
    assert table.splitlines()[2].endswith("| 50.0 |")
    assert row.read_mib == pytest.approx((2 * geometry.page_bytes(16) + geometry.gdn.state_bytes) / 2**20)


@pytest.mark.parametrize("argv", [["--lengths", "100"], ["--repeats", "0"], ["--models", "/nonexistent"]])
def test_bad_arguments_stop_with_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        bench_models.parse_args(argv)
    assert "error:" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_models_serves_chat_and_prints_the_ratio_table(tiny_model: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "rows.json"
    code = bench_models.main(["--models", str(tiny_model), "--lengths", "32", "--repeats", "1",
                              "--min-ratio", "0", "--dir", str(tmp_path), "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "chat reply" in printed and "| prefill / read |" in printed
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["tokens"] == 32 and row["kv_bytes_per_token"] == 256
    assert len(row["prefill_s"]) == len(row["store_read_s"]) == 1 and row["prefill_s"][0] > 0
    assert doc["repeats"] == 1 and set(doc["load_average_1min"]) == {"start", "end"}
    assert "x the store read" in bench_models.render(doc)["summary"]
