"""The doc generators that had no reduced run of their own, each re-run on 20 real WEKA sessions:
the JSON has the committed file's shape, and the signs every run shows hold. (Others: `saria-fidelity`
in test_fidelity_reduced.py, `saria-hybrid-placement` in test_hybrid_placement_doc.py,
`saria-admission-sweep` in test_admission_sweep_cli.py, the benchmarks in tests/bench and
tests/storage/test_bench_storage_sizes.py; docs/README.md lists them.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_saria.bench import admission_budget
from sglang_saria.replay import fleet_table

DATA = Path(__file__).resolve().parents[2] / "docs" / "data"
pytestmark = pytest.mark.slow


def test_a_reduced_admission_budget_run_has_the_committed_shape_and_signs(tmp_path, shared_dir):
    out = tmp_path / "a.json"
    assert admission_budget.main(["--workloads", "weka", "--models", "qwen3-8b", "--loads", "6500", "--sessions", "20",
                                  "--no-progress", "--json", str(out)]) == 0
    got, committed = json.loads(out.read_text()), json.loads((DATA / "admission.json").read_text())
    assert set(got) == set(committed)
    assert set(got["rows"][0]) == set(committed["rows"][0]) and set(got["checks"][0]) == set(committed["checks"][0])
    at = {(r["policy"], r["hints"]): r for r in got["rows"]}
    assert {k for k in at} == {(r["policy"], r["hints"]) for r in committed["rows"] if r["workload"] == "weka"
                                and r["model"] == "qwen3-8b" and r["prefill_tps"] == 6500.0}
    assert len({r["request_set"] for r in got["rows"]}) == 1  # every policy on the same requests
    assert at["none", "none"]["writes_norm"] == 0 and at["oracle", "none"]["vs_oracle"] == pytest.approx(1.0)
    assert at["full-duplicate", "none"]["char"] > at["none", "none"]["char"]
    for r in got["rows"]:  # the robust rule never writes more than full duplicate
        assert r["writes_norm"] <= at["full-duplicate", "none"]["writes_norm"] * 1.0001, r["policy"]


def test_a_reduced_fleet_table_run_has_the_committed_shape_and_signs(tmp_path, shared_dir):
    out = tmp_path / "f.json"
    assert fleet_table.main(["--sessions", "20", "--models", "qwen3-8b", "--nodes", "1,2", "--json", str(out)]) == 0
    got, committed = json.loads(out.read_text()), json.loads((DATA / "fleet.json").read_text())
    assert set(committed) <= set(got)
    assert set(got["records"][0]) >= set(committed["records"][0])
    for key in ("metrics", "fleet"):  # every committed field is still produced (a newer run may add fields)
        assert set(got["records"][0][key]) >= set(committed["records"][0][key]), key
    # every (policy, router) of the committed run, and the session router added since
    assert {(r["policy"], r["router"]) for r in got["records"] if r["nodes"] == 2} >= \
        {(r["policy"], r["router"]) for r in committed["records"] if r["nodes"] == 2 and r["model"] == "qwen3-8b"}
    for r in got["records"]:
        assert len(r["per_node"]) == r["nodes"]
        assert r["metrics"]["ssd_writes_norm"] >= 0 and 0 <= r["metrics"]["char"] <= 1


def test_a_reduced_sweep_over_two_seeds_counts_every_seeds_fleets_and_prefers_the_exact_bound(tmp_path, shared_dir):
    out = tmp_path / "s.json"
    common = ["--sessions", "12", "--copies", "2", "--models", "qwen3-8b", "--policies", "eviction:E2", "--nodes", "2",
              "--routers", "session", "--seeds", "0,1"]
    with pytest.raises(SystemExit):  # several seeds: a sweep only
        fleet_table.main(common)
    assert fleet_table.main([*common, "--session-bound", "cheap,shed", "--baseline", "replay", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["seeds"] == [0, 1]
    assert sorted((r["router"], r["seed"]) for r in doc["baseline"]) == [("cache_aware", 0), ("cache_aware", 1)]
    for part in doc["sweep"]:
        assert sorted(r["seed"] for r in part["records"]) == [0, 1]
        for r in part["records"]:  # CHAR judged against cache_aware's of the same seed
            same = next(c for c in doc["baseline"] if c["seed"] == r["seed"])
            assert fleet_table.targets({"records": [r, same]}, r)["char_drop"][0] == pytest.approx(
                r["metrics"]["char"] - same["metrics"]["char"])
    assert [s[0] <= 2 for s in fleet_table.sweep_scores(doc)] == [True, True]
    assert fleet_table.chosen_setting(doc)["bound"] == "shed"  # the only exact bound of the two
    assert "of 2" in fleet_table.format_sweep(doc)
