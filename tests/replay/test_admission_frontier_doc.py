"""docs/admission.md's frontier tables: rendered from docs/data/admission-frontier.json, and every number in
them recomputed here from the JSON's raw records (frontier points, policy rows) without the renderer's code."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from sglang_saria.bench.admission_sweep import CHAR_SLACK, WRITES_BOUND, render
from sglang_saria.model_specs import get_model_spec

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "admission.md"
DATA = ROOT / "docs" / "data" / "admission-frontier.json"
BEGIN, END = "<!-- frontier-tables:begin -->", "<!-- frontier-tables:end -->"


@pytest.fixture(scope="module")
def doc():
    return json.loads(DATA.read_text())


@pytest.fixture(scope="module")
def block():
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n") + "\n"


def pareto(points):
    """(writes, char) pairs no other point beats on both, by increasing writes."""
    out = []
    for w, c in sorted(((p["writes_norm"], p["char"]) for p in points), key=lambda x: (x[0], -x[1])):
        if not out or c > out[-1][1]:
            out.append((w, c))
    return out


def frontier_writes(points, char):
    front = pareto(points)
    if char > front[-1][1]:
        return None
    return float(np.interp(char, [c for _, c in front], [w for w, _ in front]))


def table_rows(block, title):
    part = block[block.index(title) + len(title):]
    part = part.split("\n### ")[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("|")][2:]  # past the header and its rule
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_doc_block_is_the_rendering_of_the_json(doc, block):
    assert block == render(doc)


def test_every_setting_compares_the_same_requests_and_has_its_frontier(doc):
    assert doc["settings"]
    for s in doc["settings"]:
        assert len({(r["requests"], r["request_set"]) for r in s["rows"]}) == 1
        assert s["frontier"]["points"][0]["writes_norm"] == 0 and len(s["frontier"]["points"]) >= 3


def test_policy_rows_recomputed_from_raw_records(doc, block):
    shown = table_rows(block, "### Policies against the frontier")
    shown += table_rows(block, "### Constants halved and doubled") if "### Constants halved" in block else []
    by_key = {}
    for s in doc["settings"]:
        for r in s["rows"]:
            label = r["policy"] + (f" ({r['variant']})" if r["variant"] else "")
            by_key[(s["workload"], s["model"], f"{s['prefill_tps']:,.0f}", f"{s['ssd_tokens'] / 1e6:g}M", label)] = (s, r)
    assert shown
    for cells in shown:
        s, r = by_key[tuple(cells[:5])]
        best = max(p["char"] for p in s["frontier"]["points"])
        fw = frontier_writes(s["frontier"]["points"], r["char"])
        assert float(cells[5]) == pytest.approx(r["writes_norm"], abs=0.006)
        assert float(cells[6]) == pytest.approx(r["char"], abs=0.0006)
        assert float(cells[9]) == pytest.approx(r["char"] - best, abs=0.0006)
        assert (cells[11] == "met") == (r["char"] - best >= -CHAR_SLACK)
        if fw is None:
            assert cells[7] == "-" and cells[8] == "above frontier" and cells[10] == "**unmet**"
            continue
        assert float(cells[7]) == pytest.approx(fw, abs=0.006)
        ratio = r["writes_norm"] / fw if fw > 0 else (1.0 if r["writes_norm"] == 0 else float("inf"))
        if np.isfinite(ratio):
            assert float(cells[8].rstrip("x")) == pytest.approx(ratio, abs=0.006)
        assert (cells[10] == "met") == (ratio <= WRITES_BOUND)


def test_frontier_rows_recomputed_from_raw_records(doc, block):
    rows = table_rows(block, "### The frontier")
    assert len(rows) == len(doc["settings"])
    for cells, s in zip(rows, doc["settings"]):
        pts = s["frontier"]["points"]
        best = max(pts, key=lambda p: p["char"])
        assert cells[2] == (s["placement"] or "-")
        assert float(cells[6]) == pytest.approx(best["char"], abs=0.0006)
        assert float(cells[7]) == pytest.approx(best["writes_norm"], abs=0.006)
        assert (cells[8] == "yes") == all(p["fixed_point"] for p in pts)
        above = [r for r in s["rows"] if not r["variant"] and r["char"] > best["char"]]
        assert (cells[9] == "none") == (not above)


def test_hybrid_settings_place_states_as_sglang_does(doc):
    """Every hybrid record was replayed with SGLang 0.5.23's GDN state placement; FA records have none."""
    for rec in doc["settings"] + doc.get("labels", []):
        hybrid = get_model_spec(rec["model"]).is_hybrid
        assert rec.get("placement") == ("sglang" if hybrid else None), (rec["workload"], rec["model"])


def test_timing_ratio_recomputed(doc, block):
    if "timing" not in doc:
        pytest.fail("docs/data/admission-frontier.json has no timing record (saria-admission-sweep timing)")
    runs = doc["timing"]["runs"]
    base = float(np.median(runs["eviction:E2"]))
    for cells in table_rows(block, "### Replay time"):
        assert float(cells[5].rstrip("x")) == pytest.approx(float(np.median(runs[cells[2]])) / base, abs=0.006)


def test_label_rows_add_up_and_match_the_json(doc, block):
    if not doc.get("labels"):
        pytest.fail("docs/data/admission-frontier.json has no labels record (saria-admission-sweep labels)")
    shown = table_rows(block, "### Where policies go wrong, by the oracle's labels")
    records = [(s, r) for s in doc["labels"] for r in s["rows"]]
    assert len(shown) == len(records)
    for cells, (s, r) in zip(shown, records):
        assert s["oracle_fixed_point"]
        assert r["useful"] + r["wasted_admitted"] + r["wasted_closure"] == r["writes"]
        assert 0 <= r["missed"] <= r["wanted"]
        assert [int(c.replace(",", "")) for c in (cells[6], cells[8], cells[9], cells[10], cells[11])] == [
            r["writes"], r["wasted_admitted"], r["wasted_closure"], r["wanted"], r["missed"]]
        if r["writes"]:
            assert float(cells[7].rstrip("%")) == pytest.approx(100 * r["useful"] / r["writes"], abs=0.51)
