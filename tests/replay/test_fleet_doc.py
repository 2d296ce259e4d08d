"""docs/fleet.md's tables are `scripts/fleet_table.py --json` output, not hand-copied (issue 28 item 3).

Every block the doc marks as generated (``<!-- fleet:NAME -->``) must equal the rendering of
docs/data/fleet.json, which the same run wrote."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import fleet_table  # noqa: E402

sys.path.pop(0)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_generated_table_is_the_json_rendered():
    doc = json.loads((DOCS / "data" / "fleet.json").read_text())
    blocks = fleet_table.doc_blocks((DOCS / "fleet.md").read_text())
    assert set(blocks) == set(fleet_table.DOC_TABLES)
    for name, text in blocks.items():
        assert text == fleet_table.DOC_TABLES[name](doc), f"docs/fleet.md block {name!r} differs from docs/data/fleet.json"


def test_the_json_covers_1_to_8_nodes_three_routers_both_models_over_the_same_requests():
    doc = json.loads((DOCS / "data" / "fleet.json").read_text())
    recs = doc["records"]
    assert doc["sessions"] == 350
    assert {r["model"] for r in recs} == set(fleet_table.MODELS)
    assert {r["nodes"] for r in recs} == set(fleet_table.NODES)
    for model in fleet_table.MODELS:
        for policy in fleet_table.POLICIES:
            rows = [r for r in recs if (r["model"], r["policy"]) == (model, policy)]
            assert {(r["nodes"], r["router"]) for r in rows if r["nodes"] > 1} == {
                (n, rt) for n in fleet_table.NODES if n > 1 for rt in fleet_table.ROUTERS}
            assert len({(r["metrics"]["requests"], r["metrics"]["request_set"]) for r in rows}) == 1
            for r in rows:
                assert len(r["per_node"]) == r["nodes"]
                assert sum(n["requests"] for n in r["per_node"]) == r["metrics"]["requests"]


def test_update_doc_rewrites_only_the_marked_blocks():
    doc = {"sessions": 1, "records": []}
    text = "intro\n<!-- fleet:shared -->\nold\n<!-- /fleet -->\noutro\n"
    out = fleet_table.update_doc(text, doc)
    assert out.startswith("intro\n<!-- fleet:shared -->\n| model |") and out.endswith("<!-- /fleet -->\noutro\n")
