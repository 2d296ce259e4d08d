"""`saria-bench-storage` and `saria-bench-reload` at a benchmark model's page size
(`--model`): objects of one KV page (256 KiB), ratio columns against raw reads of the same
bytes, and clear errors for sizes they cannot run. Tiny sizes, one repeat: no timing asserts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_saria.bench import reload as bench_reload
from sglang_saria.bench import storage as bench_storage
from sglang_saria.tiny_models import FULL_ATTENTION_BENCH, HYBRID_BENCH, bench_config

PAGE_BYTES = 512 * 1024  # 16 tokens x 32 KiB (float32)


def model_dir(root: Path, name: str) -> Path:
    """A model dir holding only the benchmark model's config.json (all the scripts read)."""
    model = root / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps(bench_config(name)))
    return model


def test_bench_storage_runs_at_the_model_page_size(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = model_dir(tmp_path, FULL_ATTENTION_BENCH)
    summary = tmp_path / "summary.json"
    bench_storage.main(["--model", str(model), "--size", "2MiB", "--repeats", "1",
                        "--dir", str(tmp_path / "bench"), "--json", str(summary)])
    printed = capsys.readouterr().out
    assert f"512 KiB objects = one KV page of {FULL_ATTENTION_BENCH}" in printed
    assert "store/raw" in printed and "store/raw-qd4" in printed
    result = json.loads(summary.read_text())
    assert result["object_bytes"] == PAGE_BYTES and result["repeats"] == 1
    assert {k: len(v) for k, v in result["runs"].items()} == dict.fromkeys(("raw", "raw_qd", "raw_latency", "store", "store_2dirs"), 1)
    assert len(result["runs"]["store"][0]["lat_read"]) == 15
    assert set(bench_storage.render(result)) == {"table", "stripe", "summary"}


@pytest.mark.parametrize("argv,message", [
    (["--model", "M", "--object", "1MiB"], "not allowed with"),
    (["--model", "/nonexistent"], "no config.json"),
    (["--model", "M", "--size", "256KiB"], "at least 2 objects"),
])
def test_bench_storage_refuses_sizes_it_cannot_run(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = model_dir(tmp_path, FULL_ATTENTION_BENCH)
    with pytest.raises(SystemExit):
        bench_storage.parse_args([str(model) if a == "M" else a for a in argv])
    assert message in capsys.readouterr().err


def test_bench_reload_full_attention_rows_at_the_model_page_size(tmp_path: Path, capsys) -> None:
    model = model_dir(tmp_path, FULL_ATTENTION_BENCH)
    out = tmp_path / "reload.json"
    bench_reload.main(["--model", str(model), "--pages", "2", "--repeats", "1", "--dir", str(tmp_path), "--json", str(out)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("page = 16 tokens x 8 layers = 0.50 MiB")
    assert not any(line.startswith("hybrid") for line in lines)
    table = [line.strip("|").split("|") for line in lines if line.startswith("| ")]
    assert [c.strip() for c in table[0][-2:]] == ["staged / raw", "direct / raw"]
    (row,) = table[1:]
    assert row[0].strip() == "2" and len(row) == 10
    (record,) = json.loads(out.read_text())["rows"]
    assert record["kind"] == "fa" and all(len(record[k]) == 1 for k in ("raw_s", "staged_s", "direct_s", "direct_dram_s"))


def test_bench_reload_hybrid_rows_carry_the_model_checkpoint(tmp_path: Path, capsys) -> None:
    model = model_dir(tmp_path, HYBRID_BENCH)
    bench_reload.main(["--model", str(model), "--pages", "2", "--repeats", "1", "--dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("hybrid: 8 FA layers (page 0.50 MiB) + 6 GDN layers")
    table = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    assert table[0][-2:] == ["staged / raw", "direct / raw"]
    (row,) = table[1:]
    assert row[0] == "2" and row[2] == "6.28"  # MiB of fp32 recurrent + conv state, 6 GDN layers


def test_bench_reload_refuses_kv_that_is_no_whole_number_of_pool_layers(tiny_model: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        bench_reload.parse_args(["--model", str(tiny_model)])
    assert "not a whole number of pool layers" in capsys.readouterr().err
