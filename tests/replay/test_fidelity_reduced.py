"""`saria-fidelity` re-run on 20 WEKA sessions (Figure 10 and what comes with it: the anchor, the
E3 target, the oracle bound, the mechanism): the JSON has docs/data/fidelity.json's shape, and the
signs every run shows hold. Under both GDN state placements."""

import json
from pathlib import Path

import pytest

from sglang_saria.fidelity import table as fidelity

DOCS = Path(__file__).resolve().parents[2] / "docs"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("placement", ["grid", "sglang"])
def test_a_reduced_run_has_the_committed_shape_and_signs(tmp_path, shared_dir, placement):
    out = tmp_path / "f.json"
    assert fidelity.main(["--figures", "10", "--sessions", "20", "--mechanism", "--no-progress",
                          "--placement", placement, "--json", str(out)]) == 0
    got, committed = json.loads(out.read_text()), json.loads((DOCS / "data" / "fidelity.json").read_text())
    assert got["placement"] == placement
    assert set(committed) <= set(got)
    for key in ("rows", "e3_target", "oracle_bound", "mechanism"):
        assert got[key] and set(got[key][0]) == set(committed[key][0]), key
    assert 0 < got["anchor_sessions"] <= 20
    claims = [r for r in got["rows"] if r["figure"] == "10"]
    def claim(r: dict) -> str:  # without the session set, which differs at 20 sessions
        return r["claim"].split("] ")[-1] + r["claim"].split(" [")[0]

    assert {claim(r) for r in claims} == {claim(r) for r in committed["rows"] if r["figure"] == "10"}
    for r in claims:
        if "SSD writes vs FD" in r["claim"] and "[robust]" in r["claim"]:
            assert r["replay"] < 0, r["claim"]  # the robust rule's E3 never out-writes full duplicate
    for t in got["e3_target"]:
        assert t["met"] == (t["e3_vs_fd"] <= 0.5 and t["e3_char"] >= 0.93)


@pytest.mark.parametrize("data", ["fidelity.json", "fidelity-grid.json"])
def test_the_anchor_is_its_rule_on_the_real_traces(shared_dir, data):
    """The committed K is what the anchor rule gives when it scans the real WEKA traces now (full
    duplicate's replays at K = 10, 20, ... under the run's placement; about 20 s each here)."""
    from sglang_saria.fidelity.runs import Runner

    committed = json.loads((DOCS / "data" / data).read_text())
    run = Runner(progress=False, placement=committed.get("placement", "grid"))
    assert fidelity.anchor_sessions(run, committed["sessions"]) == committed["anchor_sessions"]
