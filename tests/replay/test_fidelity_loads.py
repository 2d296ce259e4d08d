"""`scripts/fidelity.py`: Figure 10 at the paper's load, derived from full duplicate's writes.

The paper's FD wrote at most 1 / (1 - 0.782) C on WEKA; sessions whose FD writes more are
replayed with the GPU sped up by the ratio (docs/fidelity.md, section 5).
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import fidelity  # noqa: E402

sys.path.pop(0)


class _FixedFD:
    """A runner whose full-duplicate replay wrote ``wc`` capacities (the arithmetic alone)."""

    def __init__(self, wc: float) -> None:
        self.wc = wc
        self.asked: list = []

    def __call__(self, setup: "fidelity.Setup") -> dict:
        self.asked.append(setup)
        return {"ssd_writes_norm": self.wc}


def test_heavier_sessions_get_a_proportionally_faster_gpu():
    run = _FixedFD(11.258)  # qwen3.5-9b FD on the 350 WEKA sessions at 6,500 tokens/s
    tps = fidelity.paper_load_tps(run, 350)
    assert tps == 15950.0  # 6,500 x 11.258 / 4.587, rounded to 50
    assert run.asked[0].policy == "full-duplicate" and run.asked[0].prefill_tps == fidelity.NOMINAL_TPS
    assert run.asked[0].model == "qwen3.5-9b"
    assert fidelity.loads(run, 350) == {"nominal": 6500.0, "paper load": 15950.0}


@pytest.mark.parametrize("wc", [0.0, 2.0, fidelity.PAPER_FD_WRITES_MAX_C])
def test_sessions_no_heavier_than_the_papers_keep_the_nominal_speed(wc):
    run = _FixedFD(wc)
    assert fidelity.paper_load_tps(run, 10) == fidelity.NOMINAL_TPS
    assert fidelity.loads(run, 10) == {"nominal": fidelity.NOMINAL_TPS}


def test_figure_10_and_the_e3_target_come_from_the_same_replays(shared_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(fidelity, "WEKA", f"weka:{shared_dir / 'traces' / 'weka-cc'}")
    out = tmp_path / "fidelity.json"
    assert fidelity.main(["--figures", "10", "--sessions", "8", "--rules", "robust", "--no-progress",
                          "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    weka = [r for r in doc["rows"] if r["claim"].startswith("weka qwen3.5-9b")]
    assert len(weka) == 3 * len(fidelity.loads(fidelity.Runner(progress=False), 8))
    target = doc["e3_target"]
    assert {t["model"] for t in target} == set(fidelity.MODELS)
    for t in target:
        assert t["prefill_tps"] >= fidelity.NOMINAL_TPS
        assert t["fd_writes_norm"] > 0  # 8 sessions already reload from SSD
        assert t["e3_vs_fd"] == pytest.approx(t["e3_writes_norm"] / t["fd_writes_norm"])
        assert t["met"] == (t["e3_vs_fd"] <= 0.5 and t["e3_char"] >= 0.93)
    # E3's writes against FD agree with the Figure 10 row of the same (nominal) replays
    row = next(r for r in weka if r["claim"] == "weka qwen3.5-9b [robust] E3 SSD writes vs FD")
    nominal = next(t for t in target if t["model"] == "qwen3.5-9b" and t["load"] == "nominal")
    assert row["replay"] == pytest.approx(nominal["e3_vs_fd"] - 1.0)


def test_e3_meets_the_issue_target_at_the_papers_load_on_the_350_weka_sessions(shared_dir, monkeypatch):
    """Issue 13's done-when, kept: on the paper's 350 WEKA sessions at the paper's load (derived in
    this run from full duplicate's writes), E3 writes at most half of full duplicate's bytes at
    CHAR >= 0.93, on the hybrid and the dense model (measured: 0.42x at 0.953, 0.43x at 0.959)."""
    monkeypatch.setattr(fidelity, "WEKA", f"weka:{shared_dir / 'traces' / 'weka-cc'}")
    run = fidelity.Runner(progress=False)
    assert fidelity.paper_load_tps(run, 350) > 2 * fidelity.NOMINAL_TPS  # these sessions are heavier
    at_paper_load = [t for t in fidelity.e3_target(run, 350) if t["load"] == "paper load"]
    assert {t["model"] for t in at_paper_load} == set(fidelity.MODELS)
    for t in at_paper_load:
        assert t["e3_vs_fd"] <= 0.5 and t["e3_char"] >= 0.93, t
