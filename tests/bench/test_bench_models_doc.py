"""docs/bench-models.md's figures (and the README's quote of them) recomputed from the raw records
of the JSON the benchmarks wrote (docs/data/bench-*.json: every timed run), independently of the
scripts' rendering: each table cell is a median of those runs or a ratio of two medians of the
same run, each range in a sentence the min and max of the recomputed ratios. A re-run that moves
a number fails here until the doc is rendered from the new JSON."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from sglang_saria.bench import doc_blocks
from sglang_saria.bench import models as bench_models
from sglang_saria.bench import reload as bench_reload
from sglang_saria.bench import storage as bench_storage
from sglang_saria.model_specs import get_model_spec
from sglang_saria.tiny_models import FULL_ATTENTION_BENCH, HYBRID_BENCH, bench_config, geometry_of, kv_geometry

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "bench-models.md"
DATA = ROOT / "docs" / "data"


def _json(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _table(prefix: str, name: str) -> list[list[str]]:
    text = doc_blocks.blocks(DOC.read_text(), prefix)[name]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()[2:]]


def _close(cell: str, value: float) -> None:
    """A cell shows ``value`` rounded to the cell's own number of decimals."""
    decimals = len(cell.split(".")[1]) if "." in cell else 0
    assert float(cell) == pytest.approx(value, abs=0.5 * 10**-decimals + 1e-9), (cell, value)


def _span(values: list[float], fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _med_ms(samples: list[float]) -> float:
    return 1e3 * statistics.median(samples)


def test_every_generated_block_is_its_json_rendered():
    text = DOC.read_text()
    for prefix, rendered in (("bench-models", bench_models.render(_json("bench-models.json"))),
                             ("bench-storage", bench_storage.render(_json("bench-storage.json"))),
                             ("bench-reload", bench_reload.render(_json("bench-reload-fa.json"))
                              | bench_reload.render(_json("bench-reload-hybrid.json")))):
        assert doc_blocks.blocks(text, prefix) == {k: v.rstrip() for k, v in rendered.items()}, prefix


def test_prefill_against_store_read_is_recomputed_from_every_timed_run():
    doc = _json("bench-models.json")
    rows = _table("bench-models", "table")
    assert len(rows) == len(doc["rows"]) == 4
    ratios = {}
    for raw, cells in zip(doc["rows"], rows):
        assert len(raw["prefill_s"]) == len(raw["store_read_s"]) == doc["repeats"] >= 3
        prefill, read = _med_ms(raw["prefill_s"]), _med_ms(raw["store_read_s"])
        assert cells[:2] == [raw["model"], str(raw["tokens"])]
        _close(cells[4], (raw["tokens"] // 16 * raw["page_bytes"] + raw["state_bytes"]) / 2**20)
        _close(cells[5], prefill)
        _close(cells[6], prefill / raw["tokens"])
        _close(cells[7], read)
        _close(cells[8], prefill / read)
        ratios[raw["model"], raw["tokens"]] = prefill / read
    summary = " ".join(doc_blocks.blocks(DOC.read_text(), "bench-models")["summary"].split())
    assert f"Prefill costs {_span(list(ratios.values()), '.0f')}x the store read" in summary
    assert min(ratios.values()) >= doc["min_ratio"]
    # the README quotes the full-attention model's range
    fa = [r for (m, _), r in ratios.items() if m == FULL_ATTENTION_BENCH]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"a CPU prefill {_span(fa, '.0f')}x the store read of the same KV" in readme


def test_store_against_raw_is_recomputed_from_every_run():
    doc = _json("bench-storage.json")
    runs = doc["runs"]
    assert all(len(v) == doc["repeats"] for v in runs.values())

    def med(name: str, key: str) -> float:
        vals = [x for r in runs[name] for x in (r[key] if isinstance(r[key], list) else [r[key]])]
        return statistics.median(vals)

    rows = {cells[0]: cells for cells in _table("bench-storage", "table")}
    reads, writes = [], []
    for metric, store_key, raw_key in (("seq write GB/s", "write", "write"), ("seq read GB/s", "read", "read"),
                                       ("rand write GB/s", "randwrite", "write"), ("rand read GB/s", "randread", "randread")):
        s, r, q = med("store", store_key), med("raw", raw_key), med("raw_qd", raw_key)
        cells = rows[metric]
        for cell, value in zip(cells[1:], (s, r, s / r, q, s / q)):
            _close(cell, value)
        (writes if "write" in metric else reads).extend([s / r, s / q])
    for metric, store_key, raw_key in (("1-object write ms", "lat_write", "write"), ("1-object read ms", "lat_read", "read")):
        assert all(len(r[store_key]) == 15 for r in runs["store"])
        s, r = med("store", store_key), med("raw_latency", raw_key)
        for cell, value in zip(rows[metric][1:4], (1e3 * s, 1e3 * r, s / r)):
            _close(cell, value)
    stripe = {cells[0]: cells for cells in _table("bench-storage", "stripe")}
    for metric, key in (("seq read GB/s", "read"), ("seq write GB/s", "write"), ("rand read GB/s", "randread")):
        _close(stripe[metric][3], med("store_2dirs", key) / med("store", key))
    summary = " ".join(doc_blocks.blocks(DOC.read_text(), "bench-storage")["summary"].split())
    assert f"reaches {_span(reads, '.2f')} of the raw device on reads and {_span(writes, '.2f')} on writes" in summary


@pytest.mark.parametrize("data,kind", [("bench-reload-fa.json", "fa"), ("bench-reload-hybrid.json", "hybrid")])
def test_reload_against_raw_and_staged_is_recomputed_from_every_timed_run(data, kind):
    doc = _json(data)
    rows = _table("bench-reload", kind)
    assert [r["kind"] for r in doc["rows"]] == [kind] * len(rows) and rows
    for raw, cells in zip(doc["rows"], rows):
        assert all(len(v) == doc["repeats"] for k, v in raw.items() if k.endswith("_s"))
        r, st, d = (_med_ms(raw[k]) for k in ("raw_s", "staged_s", "direct_s"))
        values = [raw["pages"], raw["pages"] * raw["page_bytes"] / 2**20]
        values += [raw["state_bytes"] / 2**20] if kind == "hybrid" else []
        values += [r, st, d, d / st]
        if kind == "fa":
            m = _med_ms(raw["direct_dram_s"])
            values += [m, m / st]
        values += [st / r, d / r]
        assert len(cells) == len(values)
        for cell, value in zip(cells, values):
            _close(cell, value)
    top = max(doc["rows"], key=lambda x: x["pages"])
    staged_raw = _med_ms(top["staged_s"]) / _med_ms(top["raw_s"])
    direct_raw = _med_ms(top["direct_s"]) / _med_ms(top["raw_s"])
    summary = " ".join(doc_blocks.blocks(DOC.read_text(), "bench-reload")[f"{kind}-summary"].split())
    assert f"takes {staged_raw:.2f}x (staged) and {direct_raw:.2f}x (direct) the raw read" in summary


def test_the_geometry_table_is_the_configs(tiny_model: Path):
    rows = {cells[0].split()[0].strip("`"): cells for cells in
            [[c.strip() for c in line.strip("|").split("|")] for line in DOC.read_text().splitlines()
             if line.startswith("| `qwen3")]}
    for name in (FULL_ATTENTION_BENCH, HYBRID_BENCH):
        g = geometry_of(bench_config(name))
        assert rows[name][2] == f"{g.bytes_per_token // 1024} KiB" and rows[name][3] == f"{g.page_bytes(16) // 1024} KiB"
        assert rows[name][1].startswith(f"{g.gdn.layers} GDN + {g.fa_layers} full attention" if g.gdn else f"{g.fa_layers} full attention")
    state = geometry_of(bench_config(HYBRID_BENCH)).gdn.state_bytes / 2**20
    assert re.search(rf"\b{state:.2f} MiB GDN checkpoint per prefix", DOC.read_text())
    tiny = kv_geometry(tiny_model)
    assert f"hold {tiny.bytes_per_token} B of KV per token (`{tiny_model.name}`)" in " ".join(DOC.read_text().split())
    q = get_model_spec("qwen3-8b")  # the real model the benchmark models are cut from
    per_token = q.fa_layers * q.kv_heads * q.head_dim * 2 * 2
    assert (f"Qwen3-8B has {per_token // 1024} KiB per token ({q.fa_layers} layers x {q.kv_heads} KV heads x "
            f"{q.head_dim} x 2 x 2 B)") in " ".join(DOC.read_text().split())
