"""``saria-plan``: JSON shape, recommendation, Pareto front, parallel == serial, Table 1, bad input."""

import json

import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings
from sglang_saria.replay.planning.cli import format_plan, main
from sglang_saria.replay.planning.recommend import (
    POINT_KEYS,
    PlanError,
    build_plan,
    endurance_arithmetic,
    pareto_front,
    parse_drives,
    recommend,
)
from sglang_saria.replay.planning.sweep import sweep
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.workload import session_starts
from sglang_saria.units import ConfigError, DriveRating

SMALL = ["--trace", "synthetic:4", "--sessions", "10", "--window", "40m", "--dram-tokens", "200k", "--no-progress"]
DRIVE = ["--ssd-capacity", "1.92TB", "--dwpd", "1", "--years", "5"]


def _point(policy, writes, ttft, c25=0.5, budget=100):
    return {"policy": policy, "ssd_write_bytes": writes, "char": 0.9, "char_p25_bad": c25, "ttft_mean_s": ttft,
            "within_budget": writes <= budget}


def test_json_has_exactly_the_issue_shape(tmp_path, capsys):
    out, png = tmp_path / "plan.json", tmp_path / "front.png"
    rc = main([*SMALL, *DRIVE, "--policy", "eviction:E2", "--policy", "eviction:E4", "--jobs", "1",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert list(d) == ["budget_bytes", "recommendation", "points", "auto"]
    assert list(d["recommendation"]) == ["policy", "ssd_write_bytes", "within_budget", "char_p25_bad", "ttft_mean_s"]
    assert [p["policy"] for p in d["points"]] != [] and all(tuple(p) == POINT_KEYS for p in d["points"])
    assert {p["policy"] for p in d["points"]} == {"full-duplicate", "eviction:E2", "eviction:E4", "budget:1", "auto:1"}
    writes = [p["ssd_write_bytes"] for p in d["points"]]
    assert writes == sorted(writes)
    for p in d["points"]:
        assert p["within_budget"] == (p["ssd_write_bytes"] <= d["budget_bytes"])
    assert next(p for p in d["points"] if p["policy"] == "budget:1")["within_budget"]  # the controller, by construction
    rec = d["recommendation"]
    feasible = [p for p in d["points"] if p["within_budget"]]
    assert rec["within_budget"] and rec["ttft_mean_s"] == min(p["ttft_mean_s"] for p in feasible)
    text = capsys.readouterr().out
    assert "recommendation:" in text and "Table 1 arithmetic" in text and "C_min" in text and "lifetime" in text
    # auto next to the best fixed threshold within the same budget (issue 26 item 5)
    assert d["auto"]["auto"]["policy"] == "auto:1" and "auto (needs only the drives' rating): auto:1" in text
    fixed_within = [p for p in d["points"] if p["policy"].startswith("eviction:") and p["within_budget"]]
    best = d["auto"]["best_fixed"]
    assert (best is None) == (not fixed_within)
    if best is not None:
        assert best["char"] == max(p["char"] for p in fixed_within)
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000


def test_parallel_sweep_equals_serial():
    spec = get_model_spec("qwen3-8b")
    sessions = load_trace("synthetic:6", 512, max_sessions=8)
    starts = session_starts(sessions, 2400.0, 1)
    settings = ReplaySettings(window_s=2400.0)
    cfgs = [SariaConfig(admission=AdmissionConfig(policy=p), capacity=CapacityConfig(150_000, 1_000_000)).validate()
            for p in ("full-duplicate", "eviction:E2", "combined:E3R4", "budget:20")]
    serial = sweep(cfgs, sessions, starts, spec, settings, jobs=1, progress=False)
    parallel = sweep(cfgs, sessions, starts, spec, settings, jobs=2, progress=False)
    assert serial == parallel
    assert [p.metrics["policy"] for p in parallel] == ["full-duplicate", "eviction:E2", "combined:E3R4", "budget:20"]
    assert all(p.span_s > 0 for p in parallel)


def test_recommendation_is_lowest_ttft_within_budget_else_closest():
    pts = [_point("a", 50, 3.0), _point("b", 90, 2.0), _point("c", 150, 1.0), _point("d", 80, 2.0)]
    best, ok = recommend(pts)
    assert ok and best["policy"] == "d"  # ties on TTFT go to fewer writes
    over = [_point("x", 300, 1.0), _point("y", 120, 5.0), _point("z", 200, 2.0)]
    best, ok = recommend(over)
    assert not ok and best["policy"] == "y"  # closest to the budget
    results = [dict(p, **{"char": 0.5}) for p in over]
    plan = build_plan(results, 100)
    assert plan["recommendation"] == {"policy": "y", "ssd_write_bytes": 120, "within_budget": False,
                                      "char_p25_bad": 0.5, "ttft_mean_s": 5.0}
    assert "no policy fits the write budget; closest: y" in format_plan(plan) and "1.20x the budget" in format_plan(plan)


def test_pareto_front_over_writes_char_and_ttft():
    pts = [_point("fd", 100, 1.0, 0.9), _point("e2", 60, 2.0, 0.7), _point("worse", 70, 2.5, 0.6),
           _point("e3", 40, 3.0, 0.5), _point("dup", 60, 2.0, 0.7)]
    assert pareto_front(pts) == [True, True, False, True, True]  # equal points do not dominate each other


def test_table1_arithmetic_matches_the_paper():
    # paper 2.2: a C-TB drive at 1 DWPD over 5 years lasts 1825C/(86.4B) days; C_min = 86.4B TB
    C, B = 4.0, 1.5
    e = endurance_arithmetic([DriveRating(int(C * 1e12), 1.0, 5.0)], B * 1e9)
    assert e["lifetime_days"] == pytest.approx(1825 * C / (86.4 * B))
    assert e["c_min_bytes"] == pytest.approx(86.4 * B * 1e12)
    two = endurance_arithmetic([DriveRating(int(C * 1e12), 1.0, 5.0)] * 2, B * 1e9)  # striped pair: twice the life
    assert two["lifetime_days"] == pytest.approx(2 * e["lifetime_days"]) and two["c_min_bytes"] == e["c_min_bytes"]
    assert endurance_arithmetic([DriveRating(10**12, 3.0, 5.0)], 0.0)["lifetime_days"] == float("inf")


def test_drive_flags_repeat_and_multiply():
    d = parse_drives(["1.92TB", "3.84TB"], ["1"], ["5", "3"], copies=2)
    assert [x.capacity_bytes for x in d] == [1_920_000_000_000, 3_840_000_000_000] * 2
    assert [x.years for x in d] == [5.0, 3.0, 5.0, 3.0] and all(x.dwpd == 1.0 for x in d)
    assert d[0].rated_write_bytes == pytest.approx(1.92e12 * 1825)


@pytest.mark.parametrize("flags,msg", [
    (["--ssd-capacity", "1.92TB", "--dwpd", "0", "--years", "5"], "--dwpd='0': must be a positive number"),
    (["--ssd-capacity", "1.92TB", "--dwpd", "-1", "--years", "5"], "--dwpd='-1': must be a positive number"),
    (["--ssd-capacity", "1.92TB", "--dwpd", "1"], "drive rating is missing --years"),
    (["--dwpd", "1", "--years", "5"], "drive rating is missing --ssd-capacity"),
    (["--ssd-capacity", "0TB", "--dwpd", "1", "--years", "5"], "--ssd-capacity='0TB': a size must be positive"),
    (["--ssd-capacity", "big", "--dwpd", "1", "--years", "5"], "--ssd-capacity='big': not a size"),
    (["--ssd-capacity", "1TB", "--ssd-capacity", "2TB", "--dwpd", "1", "--dwpd", "2", "--dwpd", "3", "--years", "5"],
     "--dwpd given 3 times for 2 --ssd-capacity values"),
    ([*DRIVE, "--drives", "0"], "--drives=0: must be >= 1"),
    ([*DRIVE, "--policy", "budget:0"], "budget:<DWPD> needs a positive number"),
    ([*DRIVE, "--jobs", "0"], "--jobs=0: must be >= 1"),
])
def test_bad_input_is_a_clear_error(flags, msg, capsys):
    assert main([*SMALL, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("saria-plan: error:") and msg in err


def test_no_feasible_point_reports_the_closest(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = main([*SMALL, "--ssd-capacity", "1.92TB", "--dwpd", "0.0001", "--years", "5", "--no-controller",
               "--policy", "eviction:E2", "--policy", "eviction:E6", "--jobs", "1", "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert not any(p["within_budget"] for p in d["points"])
    rec = d["recommendation"]
    assert rec["within_budget"] is False
    assert rec["ssd_write_bytes"] == min(p["ssd_write_bytes"] for p in d["points"])
    assert f"no policy fits the write budget; closest: {rec['policy']}" in capsys.readouterr().out


def test_parse_errors_name_the_flag_and_value():
    with pytest.raises(ConfigError, match="--years='x': not a number"):
        parse_drives(["1TB"], ["1"], ["x"])
    with pytest.raises(PlanError, match="must be positive"):
        build_plan([], 0)
    assert parse_drives(["4TiB"], ["1"], ["5"])[0].capacity_bytes == 4 * 2**40


def test_load_step_flag_and_drive_pool(tmp_path):
    out = tmp_path / "p.json"
    rc = main([*SMALL, "--load-step", "10m", "--ssd-capacity", "0.2TB", "--dwpd", "2", "--years", "5", "--drives", "2",
               "--policy", "eviction:E2", "--jobs", "1", "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert {p["policy"] for p in d["points"]} == {"full-duplicate", "eviction:E2", "budget:2", "auto:2"}
    assert next(p for p in d["points"] if p["policy"] == "budget:2")["within_budget"]
