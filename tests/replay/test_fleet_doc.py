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
    "heldout2": ("fleet_session_heldout_x2.json", {"setup", "targets", "main"}),
    "loadsweep": ("fleet_session_sweep_load.json", {"sweep"}),
    "loadheld": ("fleet_session_heldout_x2_sweep.json", {"sweep"}),
    "idle350": ("fleet_session_idle_350.json", {"sweep"}),
    "design": ("fleet_session_design.json", {"sweep"}),
    "designeps": ("fleet_session_design_eps.json", {"sweep"}),
    "designidle": ("fleet_session_design_idle.json", {"sweep"}),
    "designheld": ("fleet_session_design_held.json", {"sweep"}),
    "designshed": ("fleet_session_design_shed.json", {"sweep"}),
}
SHIPPED = {"eps": AffinityConfig.eps, "idle_s": AffinityConfig.idle_s, "place_by": AffinityConfig.place_by,
           "wear_moves": AffinityConfig.wear_moves, "wear_shrink": AffinityConfig.wear_shrink}
# the rule's structure, chosen after the constants above (fleet_session_design.json)
DESIGN = {"placement": AffinityConfig.placement, "bound": AffinityConfig.bound, "held_frac": AffinityConfig.held_frac}


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
    shipped = {**SHIPPED, **DESIGN}
    for name, sessions, skip in (("fleet_session.json", 350, 0), ("fleet_session_heldout.json", 350, 175),
                                 ("fleet_session_heldout_x2.json", 350, 175)):
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


def test_the_shipped_rule_is_the_design_sweeps_choice_on_sessions_1_to_175_copied_twice():
    """Placement, the bound and the wear moves' held-prefix test, each on or off (2 x 2 x 2), at the shipped
    constants, on the load the targets are stated at; CHAR against cache_aware's on the same copies."""
    doc = load("fleet_session_design.json")
    assert (doc["sessions"], doc["skip_sessions"], doc["copies"]) == (175, 0, 2)
    # its bounds were strict and cheap; the exact bound was chosen after it (the next test)
    assert fleet_table.chosen_setting(doc) == {**fleet_table.setting(doc["sweep"][0]), **SHIPPED, **DESIGN,
                                               "bound": "cheap", "vnodes": AffinityConfig.vnodes}
    assert {tuple(fleet_table.setting(p)[k] for k in DESIGN) for p in doc["sweep"]} == {
        (pl, b, h) for pl in ("ring", "least") for b in ("strict", "cheap") for h in (0.0, 0.5)}
    assert {(r["model"], r["policy"], r["nodes"]) for r in doc["baseline"]} == {
        (r["model"], r["policy"], r["nodes"]) for r in doc["sweep"][0]["records"]}


def test_the_shipped_bound_is_the_exact_one_chosen_over_cheap_on_eight_arrival_orders():
    """``shed`` (the session bound exact after every pick) against the design sweep's ``cheap`` bound (exact at
    placement only), everything else shipped, on sessions 1-175 copied twice at seeds 0-7, CHAR against
    cache_aware's of the same seed: the exact bound is the only candidate, and what it costs is in the JSON."""
    doc = load("fleet_session_design_shed.json")
    assert (doc["sessions"], doc["skip_sessions"], doc["copies"], doc["seeds"]) == (175, 0, 2, list(range(8)))
    settings = [fleet_table.setting(part) for part in doc["sweep"]]
    assert sorted(c["bound"] for c in settings) == ["cheap", "shed"]
    assert all({k: c[k] for k in SHIPPED} == SHIPPED and c["placement"] == AffinityConfig.placement
               and c["held_frac"] == AffinityConfig.held_frac for c in settings)
    assert fleet_table.chosen_setting(doc)["bound"] == AffinityConfig.bound == "shed"
    fleets = {(m, p, n) for m in fleet_table.MODELS for p in ("eviction:E2", "auto") for n in (4, 8)}
    for part in [{"records": doc["baseline"]}, *doc["sweep"]]:
        assert sorted((r["model"], r["policy"], r["nodes"], r["seed"]) for r in part["records"]) == sorted(
            (*f, seed) for f in fleets for seed in range(8))
    for model in fleet_table.MODELS:
        for seed in range(8):
            rows = [r["metrics"] for r in records(doc) + doc["baseline"] if (r["model"], r["seed"]) == (model, seed)]
            assert len({(m["requests"], m["request_set"]) for m in rows}) == 1
    (met_cheap, worst_cheap, _), (met_shed, worst_shed, _) = (
        fleet_table.sweep_scores(doc)[[c["bound"] for c in settings].index(b)] for b in ("cheap", "shed"))
    shed = doc["sweep"][[c["bound"] for c in settings].index("shed")]["records"]
    text = " ".join((DOCS / "fleet.md").read_text().split())
    for phrase in (f"Over the 64 fleets the exact bound meets every target in {met_shed} and the cheap bound in {met_cheap}",
                   f"the worst 8-node drive of the 64 at {worst_shed:.2f}x the mean",
                   f"the cheap bound's worst {worst_cheap:.2f}x",
                   f"moves up to {max(r['fleet']['moved_frac'] for r in shed):.1%} of requests",
                   f"({_span([r['fleet']['router_stats']['shed'] for r in shed], 'd')} sessions sent off per fleet)"):
        assert phrase in text, f"docs/fleet.md does not say {phrase!r}"


@pytest.mark.parametrize(("name", "field", "values"), [("fleet_session_design_eps.json", "eps", None),
                                                       ("fleet_session_design_idle.json", "idle_s", None),
                                                       ("fleet_session_design_held.json", "held_frac", [0.25, 1.0])])
def test_the_shipped_rules_constants_halved_and_doubled_on_sessions_1_to_175_copied_twice(name, field, values):
    doc = load(name)
    assert (doc["sessions"], doc["skip_sessions"], doc["copies"]) == (175, 0, 2)
    shipped = {**SHIPPED, **DESIGN}
    settings = [fleet_table.setting(part) for part in doc["sweep"]]
    assert sorted(c[field] for c in settings) == (values or [shipped[field] / 2, shipped[field] * 2])
    for c in settings:
        assert {k: c[k] for k in shipped if k != field} == {k: v for k, v in shipped.items() if k != field}


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


def _span(values, fmt: str) -> str:
    lo, hi = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return lo if lo == hi else f"{lo}-{hi}"


def test_the_held_out_copies_and_the_sweeps_at_the_stated_load_say_what_their_records_give():
    """The section on the held-out sessions at the 350 sessions' load: its JSONs are of the sessions and
    settings it says, and every figure of its two reading paragraphs is recomputed from the records."""
    held = load("fleet_session_heldout_x2.json")
    tune, held_sweep, all350 = (load(n) for n in ("fleet_session_sweep_load.json", "fleet_session_heldout_x2_sweep.json",
                                                  "fleet_session_idle_350.json"))
    assert (held["sessions"], held["skip_sessions"], held["copies"]) == (350, 175, 2)
    assert {k: fleet_table.setting(held)[k] for k in {**SHIPPED, **DESIGN}} == {**SHIPPED, **DESIGN}
    assert (tune["sessions"], tune["skip_sessions"], tune["copies"]) == (175, 0, 2) and fleet_table.chooses(tune)
    assert (held_sweep["sessions"], held_sweep["skip_sessions"], held_sweep["copies"]) == (350, 175, 2)
    assert not fleet_table.chooses(held_sweep) and not fleet_table.chooses(all350)
    assert "copies" not in all350 and (all350["sessions"], all350["skip_sessions"]) == (350, 0)
    base = load("fleet_session_load_base.json")  # the tuning sweep's CHAR baseline, as its command wrote it
    assert tune["baseline"] == [r for r in base["records"] if r["router"] == "cache_aware" and r["nodes"] > 1]
    assert held_sweep["baseline"] == [{k: v for k, v in r.items() if k != "seed"} for r in held["records"]
                                      if r["router"] == "cache_aware" and r["nodes"] > 1]  # a run before seeds
    for doc in (tune, held_sweep):  # eps below 1/3: a dead worker's two sessions land on two workers
        assert {fleet_table.setting(p)["eps"] for p in doc["sweep"]} == {0.1, 0.175, 0.25}
    fleets = [r for r in held["records"] if r["router"] == "session" and r["nodes"] > 1]
    t = {(r["model"], r["policy"], r["nodes"]): fleet_table.targets(held, r) for r in fleets}
    cells = [ok for x in t.values() for _, ok in x.values()]
    assert all(cells)  # the shipped rule, replayed once on the held-out copies
    s8 = [r["fleet"] for r in fleets if r["nodes"] == 8]
    # the earlier rule at the same constants: its part of the held-out sweep (the same copies and baseline)
    (old,) = [p for p in held_sweep["sweep"] if (p["session_router"]["eps"], p["session_router"]["idle_s"]) ==
              (SHIPPED["eps"], SHIPPED["idle_s"])]
    assert fleet_table.setting(old)["placement"] == "ring" and fleet_table.setting(old)["bound"] == "strict"
    scored_old = {"records": old["records"] + held_sweep["baseline"]}
    t_old = {(r["model"], r["policy"], r["nodes"]): fleet_table.targets(scored_old, r) for r in old["records"]
             if r["nodes"] > 1}
    unmet = {(k, name): v for k, x in t_old.items() for name, (v, ok) in x.items() if not ok}
    assert set(unmet) == {(("qwen3-8b", "eviction:E2", 8), "dwpd"), (("qwen3.5-9b", "eviction:E2", 8), "requests")}
    scores = {n: fleet_table.sweep_scores(d) for n, d in (("tune", tune), ("held", held_sweep), ("350", all350))}
    idle = {n: [fleet_table.setting(p)["idle_s"] for p in d["sweep"]] for n, d in
            (("tune", tune), ("held", held_sweep), ("350", all350))}

    def met(name: str, eps: float, idle_s: float) -> int:
        doc = {"tune": tune, "held": held_sweep, "350": all350}[name]
        (i,) = [i for i, p in enumerate(doc["sweep"]) if (p["session_router"]["eps"], p["session_router"]["idle_s"]) == (eps, idle_s)]
        return scores[name][i][0]

    chosen = fleet_table.chosen_setting(tune)
    assert (chosen["eps"], chosen["idle_s"]) == (0.25, 3600.0) != (SHIPPED["eps"], SHIPPED["idle_s"])
    part3600 = all350["sweep"][idle["350"].index(3600.0)]
    scored = {"records": part3600["records"] + all350["baseline"]}
    (req350,) = [x["requests"][0] for r in part3600["records"] if r["nodes"] == 8
                 for x in [fleet_table.targets(scored, r)] if not x["requests"][1]]

    def worst8(doc: dict) -> list[float]:  # per setting: its worst 8-node busiest / mean drive
        return [max(fleet_table.targets({"records": p["records"] + doc["baseline"]}, r)["dwpd"][0]
                    for r in p["records"] if r["nodes"] == 8) for p in doc["sweep"]]

    phrases = [
        f"meet every target in all 8 fleets ({sum(cells)} of {len(cells)} cells)",
        f"the busiest drive at most {max(x['dwpd'][0] for x in t.values()):.2f}x the mean drive (8 nodes: "
        f"{_span([x['dwpd'][0] for k, x in t.items() if k[2] == 8], '.2f')}; 4 nodes: "
        f"{_span([x['dwpd'][0] for k, x in t.items() if k[2] == 4], '.2f')}), the busiest node at most "
        f"{max(x['requests'][0] for x in t.values()):.2f}x",
        f"at most {max(x['moved'][0] for x in t.values()):.1%} of requests moved; the busiest 8-node drive writes "
        f"{_span([f['dwpd_per_drive_max'] for f in s8], '.2f')} DWPD",
        f"the bound sent off {_span([r['fleet']['router_stats']['shed'] for r in fleets], 'd')} sessions per fleet",
        f"The earlier rule met {sum(ok for x in t_old.values() for _, ok in x.values())} of the 32 here (busiest drive "
        f"{unmet[('qwen3-8b', 'eviction:E2', 8), 'dwpd']:.2f}x for qwen3-8b E2 at 8 nodes, busiest node "
        f"{unmet[('qwen3.5-9b', 'eviction:E2', 8), 'requests']:.4f}x for qwen3.5-9b E2 at 8 nodes)",
        f"all 8 fleets ({_span([x[0] for x in scores['tune']], 'd')} of 8); the rule would choose idle "
        f"{chosen['idle_s']:.0f} s ({met('tune', 0.25, 3600.0)} of 8) over the shipped {SHIPPED['idle_s']:.0f} s "
        f"({met('tune', SHIPPED['eps'], SHIPPED['idle_s'])} of 8)",
        f"the settings meet {_span([x[0] for x in scores['held']], 'd')} of 8",
        f"(the shipped setting and the rule's choice: {met('held', SHIPPED['eps'], SHIPPED['idle_s'])} of 8 each)",
        f"({req350:.2f}x the mean; "
        f"{met('350', 0.25, 3600.0)} of 8 fleets) where the shipped 1800 s meets all {met('350', 0.25, 1800.0)}",
        f"{_span(worst8(tune), '.2f')}x the mean on sessions 1-175, {_span(worst8(held_sweep), '.2f')}x held out",
    ]
    assert met("held", 0.25, 3600.0) == met("held", SHIPPED["eps"], SHIPPED["idle_s"])
    text = " ".join((DOCS / "fleet.md").read_text().split())
    for phrase in phrases:
        assert phrase in text, f"docs/fleet.md does not say {phrase!r}"


def _replayed_again(check: str) -> tuple[dict, dict]:
    """The session table's metrics and those of ``check`` (its fleets replayed again), by (model, policy,
    nodes, router); both of the same sessions and session-router settings."""
    before, after = (json.loads((DOCS / "data" / f).read_text()) for f in ("fleet_session.json", check))
    assert (after["sessions"], after["skip_sessions"], after["session_router"]) == (
        before["sessions"], before["skip_sessions"], before["session_router"])
    key = lambda r: (r["model"], r["policy"], r["nodes"], r["router"])  # noqa: E731
    return ({key(r): r["metrics"] for r in before["records"]}, {key(r): r["metrics"] for r in after["records"]})


def test_the_state_completion_check_is_the_session_tables_hybrid_fleets_replayed_again():
    """The qwen3.5-9b fleets of fleet_session.json replayed with the GDN state completion: the same
    fleets and router settings, and the moves docs/fleet.md quotes, recomputed."""
    old, new = _replayed_again("fleet_session_state_check.json")
    assert set(new) == {k for k in old if k[0] == "qwen3.5-9b"}
    writes = [100 * (new[k]["ssd_write_bytes"] / old[k]["ssd_write_bytes"] - 1) for k in new]
    ttft = [100 * (new[k]["ttft_mean_s"] / old[k]["ttft_mean_s"] - 1) for k in new]
    char = max(abs(new[k]["char"] - old[k]["char"]) for k in new)
    text = " ".join((DOCS / "fleet.md").read_text().split())
    assert (f"each fleet's SSD writes move by {min(writes):+.1f}% to {max(writes):+.1f}%, its CHAR by at most "
            f"{char:.3f} and its mean TTFT by {min(ttft):+.1f}% to {max(ttft):+.1f}%") in text


def test_the_auto_check_is_the_session_tables_auto_fleets_replayed_again():
    """The `auto` fleets of fleet_session.json replayed with today's `auto`, the E2 ones kept: the moves
    docs/fleet.md quotes, recomputed, and the router comparison it says still holds."""
    old, new = _replayed_again("fleet_session_auto_check.json")
    assert set(new) == set(old)
    assert all(new[k] == old[k] for k in new if k[1] != "auto")  # kept, not replayed
    autos = [k for k in new if k[1] == "auto"]
    writes = [100 * (new[k]["ssd_write_bytes"] / old[k]["ssd_write_bytes"] - 1) for k in autos]
    ttft = [100 * (new[k]["ttft_mean_s"] / old[k]["ttft_mean_s"] - 1) for k in autos]
    char = [new[k]["char"] - old[k]["char"] for k in autos]
    pairs = [(m, n) for m, _, n, r in autos if r == "session"]
    fewer = sum(new[m, "auto", n, "session"]["ssd_write_bytes"] < new[m, "auto", n, "cache_aware"]["ssd_write_bytes"]
                for m, n in pairs)
    text = " ".join((DOCS / "fleet.md").read_text().split())
    assert (f"each `auto` fleet's SSD writes move by {min(writes):+.1f}% to {max(writes):+.1f}%, its CHAR by "
            f"{min(char):+.4f} to {max(char):+.4f} and its mean TTFT by {min(ttft):+.1f}% to {max(ttft):+.1f}%; the "
            f"session router still writes less than `cache_aware` in {'all ' if fewer == len(pairs) else ''}{fewer} "
            f"{'' if fewer == len(pairs) else f'of {len(pairs)} '}multi-node pairs") in text
