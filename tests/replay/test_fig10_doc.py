"""docs/fidelity.md's Figure 10 section (server vs replay) is `saria-fig10 --json` output.

Every table marked ``<!-- fig10:NAME -->`` must equal the rendering of docs/data/fig10.json, the
file the bench wrote; the orderings the doc states in words are checked against the JSON too, and
the replay side is re-run by today's code against the recorded server numbers."""

import json
import math
from pathlib import Path

import pytest

from sglang_saria.bench import fig10
from sglang_saria.bench.fig10_replay import doc_blocks, doc_tables, update_doc
from sglang_saria.tiny_models import bench_config

REPO = Path(__file__).resolve().parents[2]

DOCS = REPO / "docs"
# the hybrid's earlier run, 600-token conversations (31 min: over the bench's time target)
LONG_HYBRID = DOCS / "data" / "fig10-hybrid-600.json"


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
    """The section's claim, on the recorded runs (3 repeats each), both models and the earlier
    hybrid run with longer conversations: no pair that the replay orders one way and the server
    the other beyond the server's run-to-run spread, by SSD writes or TTFT."""
    for entry in [*data, *json.loads(LONG_HYBRID.read_text())]:
        assert all(len(runs) == 3 for runs in entry["runs"].values()), entry["model"]
        cmp = entry["comparison"]
        assert cmp["disagree_writes"] == [] and cmp["disagree_ttft"] == [], entry["model"]


@pytest.mark.parametrize("recorded", [DOCS / "data" / "fig10.json", LONG_HYBRID], ids=lambda p: p.name)
def test_the_replay_today_gives_the_recorded_comparison(recorded, shared_dir, tmp_path):
    """The replay side of each recorded run re-run by today's code (`--replay-from`: the same
    sessions, capacities and measured prefill rate against the recorded server numbers): the
    comparison the doc shows is what the replay computes, so a change to the replay's model that
    moves an ordering shows here. The benchmark models' geometry comes from their configs
    (`make bench-models` is not needed: no weights are read)."""
    entries = json.loads(recorded.read_text())
    for entry in entries:  # the models' config.json, as `make bench-models` writes it
        model = tmp_path / "models" / Path(entry["model"]).name
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps(bench_config(model.name)))
        entry["model"] = str(model)
    moved = tmp_path / recorded.name
    moved.write_text(json.dumps(entries))
    fresh = fig10.replay_from_json(moved, tmp_path / "work", weka=shared_dir / "traces" / "weka-cc")
    for entry, run in zip(entries, fresh):
        _assert_same(json.loads(json.dumps(run.comparison)), entry["comparison"], entry["model"])


def _assert_same(fresh, recorded, where: str) -> None:
    """Equal structure, names and orderings; ratios equal up to float rounding (another CPU may
    sum in another order), NaN (no base) equal to NaN."""
    if isinstance(recorded, dict):
        assert set(fresh) == set(recorded), where
        for key in recorded:
            _assert_same(fresh[key], recorded[key], f"{where}.{key}")
    elif isinstance(recorded, list):
        assert len(fresh) == len(recorded), where
        for i, (a, b) in enumerate(zip(fresh, recorded)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(recorded, float):
        assert (math.isnan(fresh) and math.isnan(recorded)) or math.isclose(fresh, recorded, rel_tol=1e-9, abs_tol=1e-12), where
    else:
        assert fresh == recorded, where
