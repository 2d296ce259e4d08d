"""docs/admission.md's DRAM-residency tables: rendered from docs/data/dram-residency.json by
``scripts/dram_residency.py``, and their numbers recomputed here from the JSON's raw records (frontier
points, policy rows, timed runs) without the script's code."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from tests.doc_blocks import marked_block

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "data" / "dram-residency.json"


@pytest.fixture(scope="module")
def block():
    return marked_block(ROOT / "docs" / "admission.md", "<!-- dram-residency:tables -->", "<!-- /dram-residency -->")


@pytest.fixture(scope="module")
def doc():
    return json.loads(DATA.read_text())


def _script():
    spec = importlib.util.spec_from_file_location("dram_residency", ROOT / "scripts" / "dram_residency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows(block: str) -> list[list[str]]:
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in block.splitlines()
            if ln.startswith("|") and not ln.startswith("|---")]


def frontier_writes(points, char):
    front = []
    for w, c in sorted(((p["writes_norm"], p["char"]) for p in points), key=lambda x: (x[0], -x[1])):
        if not front or c > front[-1][1]:
            front.append((w, c))
    if char > front[-1][1]:
        return None
    return float(np.interp(char, [c for _, c in front], [w for w, _ in front]))


def _where(rec):
    return [rec["workload"], rec["model"], f"{rec['prefill_tps']:,.0f}", f"{rec['ssd_tokens'] / 1e6:g}M"]


def test_doc_block_is_the_rendering_of_the_json(doc, block):
    assert block == _script().render(doc)


def test_each_setting_replays_the_same_requests_with_both_residencies(doc):
    settings = {}
    for rec in doc["records"]:
        settings.setdefault(tuple(_where(rec)), []).append(rec)
    assert settings and all(sorted(r["dram_residency"] for r in recs) == ["flat", "tree"] for recs in settings.values())
    for recs in settings.values():
        assert len({(r["requests"], r["request_set"]) for rec in recs for r in rec["rows"]}) == 1


def test_tree_dram_never_reads_dram_after_ssd_and_flat_mostly_does(doc):
    for rec in doc["records"]:
        for r in rec["rows"]:
            if rec["dram_residency"] == "tree":
                assert r["dram_after_ssd_requests"] == 0
            else:
                assert 2 * r["dram_after_ssd_requests"] > r["ssd_hit_requests"] > 0


def test_ratios_to_the_frontier_recomputed(doc, block):
    table = rows(block)
    for rec in doc["records"]:
        for r in rec["rows"]:
            at = frontier_writes(rec["frontier"]["points"], r["char"])
            cells = _where(rec) + [rec["dram_residency"], r["policy"], f"{r['writes_norm']:.2f}", f"{r['char']:.3f}",
                                   "-" if at is None else f"{at:.2f}",
                                   "above frontier" if at is None else f"{r['writes_norm'] / at:.2f}x"]
            assert any(row[:len(cells)] == cells for row in table), cells


def test_tree_over_flat_recomputed(doc, block):
    table = rows(block)
    by = {}
    for rec in doc["records"]:
        by.setdefault(tuple(_where(rec)), {})[rec["dram_residency"]] = rec
    for where, recs in by.items():
        flat = {r["policy"]: r for r in recs["flat"]["rows"]}
        for t in recs["tree"]["rows"]:
            f = flat[t["policy"]]
            cells = [*where, t["policy"], f"{t['char'] - f['char']:+.3f}", f"{t['writes_norm'] / f['writes_norm']:.2f}x"]
            assert any(row[:len(cells)] == cells for row in table), cells
        best = [max(p["char"] for p in recs[k]["frontier"]["points"]) for k in ("flat", "tree")]
        assert [*where, "frontier best", f"{best[1] - best[0]:+.3f}"] in [row[:6] for row in table]


def test_timing_medians_recomputed(doc, block):
    runs = doc["timing"]["runs"]
    table = rows(block)
    for key, times in runs.items():
        residency, policy = key.split(" ", 1)
        ratio = statistics.median(times) / statistics.median(runs[f"{residency} eviction:E2"])
        cells = [doc["timing"]["workload"], doc["timing"]["model"], residency, policy,
                 f"{statistics.median(times):.2f}", str(len(times)), f"{ratio:.2f}x"]
        assert cells in table


def test_the_prose_on_tree_dram_at_2m_quotes_the_records(doc):
    """The paragraph after the tables: `auto` at 2M under tree DRAM holds, with its load term off it
    collapses on files 1-175."""
    at = {(r["workload"], r["dram_residency"], x["policy"]): x for r in doc["records"] if r["ssd_tokens"] == 2_000_000
          for x in r["rows"]}
    sets, off = ("weka:1-175", "weka:176-360"), "auto@auto_load_ref_s=1e9"

    def both(residency, policy, field, fmt, joiner=" and "):
        return joiner.join(f"{at[w, residency, policy][field]:{fmt}}" for w in sets)

    text = " ".join((ROOT / "docs" / "admission.md").read_text().split())
    for figure in (f"CHAR {both('tree', 'auto', 'char', '.3f')} against {both('flat', 'auto', 'char', '.3f')} flat, "
                   f"{both('tree', 'auto', 'credit_refused', ',')} writes refused, "
                   f"mean queue {both('tree', 'auto', 'queue_mean_s', '.1f', ' s and ')} s",
                   f"(CHAR {both('tree', off, 'char', '.3f')} against {both('flat', off, 'char', '.3f')} flat; "
                   f"{both('tree', off, 'credit_refused', ',')} writes refused, "
                   f"mean queue {both('tree', off, 'queue_mean_s', '.1f', ' s and ')} s)"):
        assert figure in text, figure
    assert all(at[w, "tree", "auto"]["char"] > at[w, "flat", "auto"]["char"] - 0.05 for w in sets)  # holds
    assert at["weka:1-175", "tree", off]["char"] < at["weka:1-175", "flat", off]["char"] - 0.05  # collapses
