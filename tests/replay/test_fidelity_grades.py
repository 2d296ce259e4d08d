"""docs/fidelity.md's graded agreement with the paper, recounted from docs/data/fidelity.json's raw
values (each row's paper and replay change), independently of the script that rendered it: the
numbers in the doc's `grades` table and every row's grade in the `rows` table."""

import json
import re
from pathlib import Path

import pytest

from sglang_saria.fidelity import table as fidelity
from sglang_saria.fidelity.runs import Row

DOCS = Path(__file__).resolve().parents[2] / "docs"


def recount(raw_rows: list[dict]) -> dict[str, int]:
    """Relative rows and those of the same sign, within 2x and 1.25x of the paper's magnitude."""
    relative = [r for r in raw_rows if r["baseline_relative"]]
    same = [r for r in relative if (r["paper"] > 0) == (r["replay"] > 0)]
    ratios = [abs(r["replay"]) / abs(r["paper"]) for r in same if r["paper"]]
    return {"relative rows": len(relative), "same sign": len(same),
            "within 2x": sum(0.5 <= q <= 2.0 for q in ratios), "within 1.25x": sum(0.8 <= q <= 1.25 for q in ratios)}


def doc_counts(md: str, prefix: str = "fidelity") -> dict[str, int]:
    table = fidelity.doc_blocks(md, prefix)["grades"]
    return {cells[0]: int(cells[1]) for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:])}


@pytest.mark.parametrize(("data", "prefix"), [("fidelity.json", "fidelity"), ("fidelity-grid.json", "fidelity-grid")])
def test_the_docs_grade_counts_are_the_jsons_raw_values_recounted(data, prefix):
    doc = json.loads((DOCS / "data" / data).read_text())
    assert doc_counts((DOCS / "fidelity.md").read_text(), prefix) == recount(doc["rows"])


def test_sglangs_placement_changes_only_the_hybrid_rows_and_the_anchor_set():
    grid, sglang = (json.loads((DOCS / "data" / f).read_text()) for f in ("fidelity-grid.json", "fidelity.json"))
    assert (grid.get("placement", "grid"), sglang["placement"]) == ("grid", "sglang")
    assert [r["claim"] for r in grid["rows"]] == [r["claim"].replace(f"anchor: {sglang['anchor_sessions']} ", f"anchor: {grid['anchor_sessions']} ")
                                                 for r in sglang["rows"]]
    hybrid = ("qwen3.5", "anchor:")
    for g, s in zip(grid["rows"], sglang["rows"]):
        if not any(h in g["claim"] + g["note"] for h in hybrid):
            assert s["replay"] == g["replay"], g["claim"]


def test_each_rows_grade_in_the_doc_follows_from_its_paper_and_replay_values():
    doc = json.loads((DOCS / "data" / "fidelity.json").read_text())
    table = fidelity.doc_blocks((DOCS / "fidelity.md").read_text())["rows"]
    grades = [line.split(" | ")[4] for line in table.splitlines()[2:]]
    assert len(grades) == len(doc["rows"])
    for raw, grade in zip(doc["rows"], grades):
        if not raw["baseline_relative"]:
            assert grade == "-"
            continue
        q = abs(raw["replay"]) / abs(raw["paper"])
        same = (raw["paper"] > 0) == (raw["replay"] > 0)
        expected = "**no**" if not same else "1.25x" if 0.8 <= q <= 1.25 else "2x" if 0.5 <= q <= 2 else "sign"
        assert grade == expected, raw["claim"]


def test_grades_at_their_edges():
    def grade(paper: float, replay: float) -> str:
        return Row("x", "c", paper, replay).grade

    assert grade(-0.283, -0.017) == "sign"  # figure 11: same sign, 17x apart
    assert (grade(-0.2, -0.25), grade(-0.2, -0.17), grade(0.2, 0.4), grade(0.2, 0.1)) == ("1.25x", "1.25x", "2x", "2x")
    assert (grade(0.2, 0.41), grade(0.2, -0.2), Row("x", "c", 0.8, 0.7, baseline_relative=False).grade) == ("sign", "no", "-")
