"""docs/fidelity.md's tables are `saria-fidelity --json` output, not hand-copied (issue 25, item 6).

Every table the doc marks as generated (``<!-- fidelity:NAME -->``) must equal the rendering of
docs/data/fidelity.json, the file `saria-fidelity --json docs/data/fidelity.json
--update-doc docs/fidelity.md` wrote in the same run."""

import json
from pathlib import Path

from sglang_saria.fidelity import table as fidelity

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_generated_table_is_the_json_rendered():
    doc = json.loads((DOCS / "data" / "fidelity.json").read_text())
    blocks = fidelity.doc_blocks((DOCS / "fidelity.md").read_text())
    assert set(blocks) == set(fidelity.DOC_TABLES)
    for name, text in blocks.items():
        assert text == fidelity.DOC_TABLES[name](doc), f"docs/fidelity.md table {name!r} differs from docs/data/fidelity.json"


def test_the_json_covers_the_papers_session_count_the_anchor_and_the_bound():
    doc = json.loads((DOCS / "data" / "fidelity.json").read_text())
    assert doc["sessions"] == 350 and doc["anchor_sessions"] < 350
    assert {t["model"] for t in doc["e3_target"]} == set(fidelity.MODELS)
    assert {b["policy"] for b in doc["oracle_bound"]} == set(fidelity.BOUND_POLICIES)
    # one request set per (model, session set): every policy of a comparison served the same requests
    for model in fidelity.MODELS:
        for label in {b["set"] for b in doc["oracle_bound"]}:
            assert len({b["requests"] for b in doc["oracle_bound"] if b["model"] == model and b["set"] == label}) == 1


def test_update_doc_rewrites_only_the_marked_tables():
    text = "intro\n<!-- fidelity:target -->\nold table\n<!-- /fidelity -->\noutro\n"
    row = {"model": "m", "setting": "s", "sessions": 1, "prefill_tps": 6500, "fd_writes_norm": 2.0,
           "e3_writes_norm": 1.0, "e3_vs_fd": 0.5, "e3_char": 0.95, "met": True}
    new = fidelity.update_doc(text, {"e3_target": [row]})
    assert new.startswith("intro\n<!-- fidelity:target -->\n| model |") and new.endswith("<!-- /fidelity -->\noutro\n")
    assert "| m | s | 6,500 | 2.00 | 1.00 | 0.500x | 0.950 | met |" in new
    assert fidelity.doc_blocks(new)["target"] == fidelity.format_target([row])


def test_the_e3_target_is_stated_met_or_unmet_at_each_setting_as_measured():
    """Issue 25 item 2: unmet at the paper's stated 6,500 tokens/s on the 350 sessions, met on the
    anchor set; the faster GPUs are a sensitivity sweep, never "the paper's load"."""
    doc = json.loads((DOCS / "data" / "fidelity.json").read_text())
    verdict = {(t["model"], t["setting"]): t["met"] for t in doc["e3_target"]}
    anchor = f"anchor: {doc['anchor_sessions']} sessions"
    for model in fidelity.MODELS:
        assert verdict[model, "stated load, 350 sessions"] is False
        assert verdict[model, f"stated load, {anchor}"] is True
    for t in doc["e3_target"]:
        assert t["met"] == (t["e3_vs_fd"] <= 0.5 and t["e3_char"] >= 0.93)
        assert t["setting"].startswith(("stated load", "sensitivity")) and "paper" not in t["setting"]
        if t["setting"].startswith("stated load"):
            assert t["prefill_tps"] == 6500
