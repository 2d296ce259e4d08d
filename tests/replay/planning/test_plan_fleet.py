"""``saria-plan --nodes N``: the per-drive budget across a fleet, a policy and a routing mode (issue 28 item 4)."""

import json

import pytest

from sglang_saria.replay.planning.cli import main
from sglang_saria.replay.routing import ROUTERS

SMALL = ["--trace", "synthetic:4", "--sessions", "8", "--window", "40m", "--dram-tokens", "200k", "--no-progress",
         "--jobs", "1", "--no-controller", "--policy", "eviction:E4"]


def test_fleet_plan_judges_the_busiest_drive_and_recommends_a_policy_and_a_router(tmp_path, capsys):
    out = tmp_path / "plan.json"
    drive = ["--ssd-capacity", "0.05TB", "--dwpd", "8", "--years", "5"]
    assert main([*SMALL, *drive, "--nodes", "2", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    fleet = d["fleet"]
    assert fleet["nodes"] == 2
    pts = fleet["points"]
    assert {(p["policy"], p["router"]) for p in pts} == {(pol, r) for pol in ("full-duplicate", "eviction:E4") for r in ROUTERS}
    budget = fleet["budget_bytes_per_drive"]
    for p in pts:
        assert p["busiest_drive_write_bytes"] * 2 >= p["fleet_write_bytes"] >= p["busiest_drive_write_bytes"]
        assert p["dwpd_per_drive_max"] >= p["dwpd_per_drive_mean"]
        assert p["within_budget"] == (p["busiest_drive_write_bytes"] <= budget)
        # the budget is the node's drives over the replayed period: DWPD per drive against the rating
        assert p["within_budget"] == (p["dwpd_per_drive_max"] <= 8 * (1 + 1e-9))
    # cache_aware piles these sessions (one shared system prompt) on one node: its mean drive would fit, its
    # busiest does not, and the busiest decides
    assert any(p["dwpd_per_drive_mean"] <= 8 < p["dwpd_per_drive_max"] and not p["within_budget"] for p in pts)
    fits = [p for p in pts if p["within_budget"]]
    assert fits and len(fits) < len(pts)
    rec = d["recommendation"]
    assert rec["within_budget"] and rec["ttft_mean_s"] == min(p["ttft_mean_s"] for p in fits)
    assert (rec["policy"], rec["router"]) in {(p["policy"], p["router"]) for p in fits}
    text = capsys.readouterr().out
    assert "per node, 2 nodes" in text and "a point fits when its busiest drive does" in text
    assert f"recommendation: {rec['policy']} with {rec['router']} routing" in text
    assert "busiest node: B =" in text


def test_fleet_plan_with_one_router_sweeps_only_it(tmp_path, capsys):
    out = tmp_path / "plan.json"
    drive = ["--ssd-capacity", "1.92TB", "--dwpd", "1", "--years", "5"]
    assert main([*SMALL, *drive, "--nodes", "3", "--router", "round_robin", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert {p["router"] for p in d["fleet"]["points"]} == {"round_robin"} and d["fleet"]["nodes"] == 3
    # a 1.92 TB drive per node holds every write of this small trace: the fastest policy fits
    assert d["recommendation"] == {**d["recommendation"], "router": "round_robin", "within_budget": True}
    assert "recommendation: " in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "msg"), [
    (["--nodes", "0"], "--nodes 0: must be"),
    (["--nodes", "2", "--router", "nearest"], "--router 'nearest': choose one of"),
])
def test_fleet_plan_bad_input_names_the_flag(flags, msg, capsys):
    assert main([*SMALL, "--ssd-capacity", "1.92TB", "--dwpd", "1", "--years", "5", *flags]) == 2
    assert msg in capsys.readouterr().err
