"""docs/fleet.md's tables are ``saria-fleet-table --json`` output, not hand-copied, and the JSON's fleet
numbers are what its per-node records give.

Every block the doc marks as generated (``<!-- PREFIX:NAME -->``) must equal the rendering of the JSON
that prefix names (the same run wrote both); the fleet-wide figures the tables show (busiest and mean
drive, busiest node) are recomputed here from the raw per-node records, and the session router's
constants from its sweep on WEKA sessions 1-175."""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from sglang_saria.replay import fleet_table
from sglang_saria.session_affinity import AffinityConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"
# doc prefix -> the JSON its blocks are rendered from, and the blocks it has
JSONS = {
    "fleet": ("fleet.json", {"setup", "main", "nodes", "shared"}),
    "session": ("fleet_session.json", {"setup", "main", "nodes", "targets"}),
    "heldout": ("fleet_session_heldout.json", {"setup", "targets", "main"}),
    "sweep": ("fleet_session_sweep.json", {"sweep"}),
    "sweep0": ("fleet_session_sweep_constants.json", {"sweep"}),
    "moves": ("fleet_session_sweep_moves.json", {"sweep"}),
    "halfeps": ("fleet_session_heldout_eps.json", {"sweep"}),
    "halfidle": ("fleet_session_heldout_idle.json", {"sweep"}),
}
SHIPPED = {"eps": AffinityConfig.eps, "idle_s": AffinityConfig.idle_s, "place_by": AffinityConfig.place_by,
           "wear_moves": AffinityConfig.wear_moves, "wear_shrink": AffinityConfig.wear_shrink}


def load(name: str) -> dict:
    return json.loads((DOCS / "data" / name).read_text())


@pytest.mark.parametrize("prefix", JSONS)
def test_every_generated_table_is_the_json_rendered(prefix):
    name, tables = JSONS[prefix]
    doc = load(name)
    blocks = fleet_table.doc_blocks((DOCS / "fleet.md").read_text(), prefix)
    assert set(blocks) == tables
    for table, text in blocks.items():
        assert text == fleet_table.DOC_TABLES[table](doc), f"docs/fleet.md block {prefix}:{table} differs from {name}"


def records(doc: dict) -> list[dict]:
    return [r for part in doc.get("sweep", [doc]) for r in part["records"]]


@pytest.mark.parametrize("prefix", JSONS)
def test_fleet_numbers_are_the_per_node_records(prefix):
    for r in records(load(JSONS[prefix][0])):
        f, nodes = r["fleet"], r["per_node"]
        if "session_writes_max_bytes" in f:  # one session's writes are part of the fleet's
            assert 0 <= f["session_writes_max_bytes"] <= r["metrics"]["ssd_write_bytes"]
        dwpd = [n["dwpd"] for n in nodes]
        reqs = [n["requests"] for n in nodes]
        assert len(nodes) == r["nodes"] and sum(reqs) == r["metrics"]["requests"]
        assert f["dwpd_per_drive_max"] == max(dwpd) and f["dwpd_per_drive_mean"] == pytest.approx(np.mean(dwpd))
        assert f["requests_max_over_mean"] == pytest.approx(max(reqs) / np.mean(reqs))
        assert f["prefill_max_over_mean"] == pytest.approx(
            max(n["prefill_tokens"] for n in nodes) / np.mean([n["prefill_tokens"] for n in nodes]))
        assert sum(n["ssd_write_bytes"] for n in nodes) == r["metrics"]["ssd_write_bytes"]


def test_the_json_covers_1_to_8_nodes_three_routers_both_models_over_the_same_requests():
    doc = load("fleet.json")
    recs = doc["records"]
    assert doc["sessions"] == 350
    assert {r["model"] for r in recs} == set(fleet_table.MODELS)
    assert {r["nodes"] for r in recs} == set(fleet_table.NODES)
    for model in fleet_table.MODELS:
        for policy in fleet_table.POLICIES:
            rows = [r for r in recs if (r["model"], r["policy"]) == (model, policy)]
            assert {(r["nodes"], r["router"]) for r in rows if r["nodes"] > 1} == {
                (n, rt) for n in fleet_table.NODES if n > 1 for rt in ("cache_aware", "round_robin", "random")}
            assert len({(r["metrics"]["requests"], r["metrics"]["request_set"]) for r in rows}) == 1


def test_the_session_tables_cover_both_models_e2_and_auto_on_4_and_8_nodes_with_the_shipped_constants():
    shipped = SHIPPED
    for name, sessions, skip in (("fleet_session.json", 350, 0), ("fleet_session_heldout.json", 350, 175)):
        doc = load(name)
        assert (doc["sessions"], doc["skip_sessions"]) == (sessions, skip)
        assert {k: fleet_table.setting(doc)[k] for k in shipped} == shipped
        fleets = {(r["model"], r["policy"], r["nodes"], r["router"]) for r in doc["records"] if r["nodes"] > 1}
        assert fleets == {(m, p, n, rt) for m in fleet_table.MODELS for p in ("eviction:E2", "auto")
                          for n in (4, 8) for rt in ("cache_aware", "session")}
        for model in fleet_table.MODELS:
            rows = [r["metrics"] for r in doc["records"] if r["model"] == model]
            assert len({(m["requests"], m["request_set"]) for m in rows}) == 1


@pytest.mark.parametrize(("name", "swept"), [("fleet_session_sweep.json", {"place_by", "wear_moves"}),
                                              ("fleet_session_sweep_moves.json", {"wear_shrink"})])
def test_the_shipped_constants_are_the_sweeps_choice_on_sessions_1_to_175(name, swept):
    """The placement sweep (run before ``wear_shrink`` existed: its moves are the largest session's, 0) chose the
    placement and the wear moves; the later sweep, at that choice, when a session moves for wear."""
    doc = load(name)
    assert (doc["sessions"], doc["skip_sessions"]) == (175, 0)
    chosen = fleet_table.chosen_setting(doc)
    assert {k: chosen[k] for k in swept} == {k: SHIPPED[k] for k in swept}
    for part in doc["sweep"]:  # the constants not swept: as shipped then
        c = fleet_table.setting(part)
        assert {k: c[k] for k in SHIPPED if k not in swept and k != "wear_shrink"} == {
            k: v for k, v in SHIPPED.items() if k not in swept and k != "wear_shrink"}
        assert "wear_shrink" in swept or c["wear_shrink"] == 0.0
    fleets = {(r["model"], r["policy"], r["nodes"]) for r in doc["sweep"][0]["records"]}
    assert fleets == {(m, p, n) for m in fleet_table.MODELS for p in ("eviction:E2", "auto") for n in (4, 8)}
    # CHAR is judged against cache_aware's on the same sessions and requests
    assert {(r["model"], r["policy"], r["nodes"], r["router"]) for r in doc["baseline"]} == {
        (*f, "cache_aware") for f in fleets}
    for model in fleet_table.MODELS:
        rows = [r["metrics"] for r in records(doc) + doc["baseline"] if r["model"] == model]
        assert len({(m["requests"], m["request_set"]) for m in rows}) == 1


def test_the_shipped_eps_and_idle_are_the_earlier_sweeps_choice_on_sessions_1_to_175():
    doc = load("fleet_session_sweep_constants.json")
    assert (doc["sessions"], doc["skip_sessions"]) == (175, 0)
    chosen = fleet_table.chosen_setting(doc)
    assert (chosen["eps"], chosen["idle_s"]) == (AffinityConfig.eps, AffinityConfig.idle_s)


@pytest.mark.parametrize(("name", "field"), [("fleet_session_heldout_eps.json", "eps"),
                                             ("fleet_session_heldout_idle.json", "idle_s")])
def test_the_halved_and_doubled_constants_are_replayed_on_the_held_out_sessions(name, field):
    doc = load(name)
    assert (doc["sessions"], doc["skip_sessions"]) == (350, 175)
    settings = [part["session_router"] for part in doc["sweep"]]
    assert sorted(c[field] for c in settings) == [SHIPPED[field] / 2, SHIPPED[field] * 2]
    for c in settings:  # everything else as shipped
        assert {k: c[k] for k in SHIPPED if k != field} == {k: v for k, v in SHIPPED.items() if k != field}


def test_update_doc_rewrites_only_the_marked_blocks_of_its_prefix():
    doc = {"sessions": 1, "records": []}
    text = "intro\n<!-- fleet:shared -->\nold\n<!-- /fleet -->\n<!-- session:shared -->\nkept\n<!-- /session -->\noutro\n"
    out = fleet_table.update_doc(text, doc)
    assert out.startswith("intro\n<!-- fleet:shared -->\n| model |")
    assert out.endswith("<!-- /fleet -->\n<!-- session:shared -->\nkept\n<!-- /session -->\noutro\n")


def test_a_recorded_session_row_is_what_the_replay_gives_now():
    """The 350-session table's qwen3-8b E2 8-node session row, replayed again: the same record."""
    doc = load("fleet_session.json")
    want = next(r for r in doc["records"] if (r["model"], r["policy"], r["nodes"], r["router"]) ==
                ("qwen3-8b", "eviction:E2", 8, "session"))
    got = fleet_table.run_one("qwen3-8b", "eviction:E2", 8, "session", fleet_table.Workload(350, 0))
    assert json.loads(json.dumps(got)) == want


def test_keep_from_takes_only_the_policies_not_replayed_and_refuses_another_workload(tmp_path):
    doc = load("fleet_session_heldout.json")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    settings = [AffinityConfig()]
    args = argparse.Namespace(keep_from=str(path), sessions=350, skip_sessions=175, policies=["auto"])
    kept = fleet_table.keep_from(args, settings)[0]
    assert kept and {r["policy"] for r in kept} == {"eviction:E2"}
    new = [r for r in doc["records"] if r["policy"] == "auto"]
    assert fleet_table.merge_records(kept, new) == doc["records"]  # the order the run itself writes
    args.skip_sessions = 0
    with pytest.raises(SystemExit, match="--keep-from .*old.json: sessions 350 less 175"):
        fleet_table.keep_from(args, settings)
