"""docs/fidelity.md's Figure 10 section (server vs replay) is `scripts/bench_fig10.py --json` output.

Every table marked ``<!-- fig10:NAME -->`` must equal the rendering of docs/data/fig10.json, the
file the bench wrote; the orderings the doc states in words are checked against the JSON too."""

import json
from pathlib import Path

import pytest

from sglang_saria.bench.fig10_replay import doc_blocks, doc_tables, update_doc

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def data() -> list[dict]:
    return json.loads((DOCS / "data" / "fig10.json").read_text())


def test_every_fig10_table_in_the_doc_is_the_json_rendered(data):
    blocks = doc_blocks((DOCS / "fidelity.md").read_text())
    tables = doc_tables(data)
    assert blocks, "docs/fidelity.md has no <!-- fig10:NAME --> tables"
    assert set(blocks) == set(tables)
    for name, text in blocks.items():
        assert text == tables[name], f"docs/fidelity.md table {name!r} differs from docs/data/fig10.json"


def test_the_json_has_every_configuration_no_failure_and_a_clean_audit(data):
    for entry in data:
        assert {"dram-only", "hicache-file", "full-duplicate", "eviction:E2", "eviction:E3", "auto"} <= set(entry["medians"])
        assert any(n.startswith("budget:") for n in entry["medians"])
        for name, runs in entry["runs"].items():
            assert all(r["failed"] == 0 for r in runs), name
            if name not in ("dram-only", "hicache-file"):
                assert all(r["audit_pages"] > 0 and r["audit_errors"] == 0 for r in runs), name
        # the replay served the same sessions: one request count on both sides
        assert {r["requests"] for r in entry["replay"].values()} == {entry["workload"]["requests"]}


def test_update_doc_rewrites_only_the_marked_tables(data):
    name = next(iter(doc_tables(data)))
    text = f"intro\n<!-- fig10:{name} -->\nold\n<!-- /fig10 -->\noutro\n"
    new = update_doc(text, data)
    assert new.startswith(f"intro\n<!-- fig10:{name} -->\n| ") and new.endswith("<!-- /fig10 -->\noutro\n")
    assert doc_blocks(new)[name] == doc_tables(data)[name]
    with pytest.raises(ValueError, match="unknown fig10 table"):
        update_doc("<!-- fig10:nope -->\nx\n<!-- /fig10 -->\n", data)


def test_the_orderings_the_doc_states_hold_in_the_json(data):
    """The section's claims, on the recorded runs (3 repeats each): on the full-attention model
    no pair that the replay orders one way and the server the other beyond the server's
    run-to-run spread, by SSD writes or TTFT; on the hybrid, the swap it explains (E3 and the
    budget by writes) and the one TTFT pair at the edge of the spread."""
    by_model = {Path(e["model"]).name: e for e in data}
    for entry in data:
        assert all(len(runs) == 3 for runs in entry["runs"].values()), entry["model"]
    bench = by_model["qwen3-bench"]["comparison"]
    assert bench["disagree_writes"] == [] and bench["disagree_ttft"] == []
    hybrid = by_model["qwen3.5-bench-hybrid"]["comparison"]
    assert [d.split(" (")[0] for d in hybrid["disagree_writes"]] == ["eviction:E3 < budget:0.145"]
    assert [d.split(" (")[0] for d in hybrid["disagree_ttft"]] == ["full-duplicate < budget:0.145"]
