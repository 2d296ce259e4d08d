"""`sglang_saria.fidelity.figures`: the paper's Figures 1, 3a, 4, 6, 11, 13, 14 and 15 in the fidelity table.

Each figure runs on a few sessions (the numbers mean nothing at this size; the structure does):
one row per claim, the paper's number as quoted in the paper, and every replay a figure uses
compared over the same requests as the replays it is compared with.
"""

import json
import math

import numpy as np
import pytest

from sglang_saria.fidelity import figures as ff
from sglang_saria.fidelity import table as fidelity
from sglang_saria.fidelity.runs import Row, Runner
from sglang_saria.replay.loaders import shared_dir
from sglang_saria.replay.metrics import DifferentRequestsError

WEKA_SESSIONS = 4  # the synthetic figures take the same count: fast, and enough for every code path
PAPER = shared_dir() / "paper" / "saria-paper.txt"


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.1f}%"


def _rel(new: float, base: float) -> float:
    return new / base - 1.0


# figure -> the paper value of each row, in order (from the module's tables, which the next test checks
# against the paper's text)
def _expected_papers() -> dict[str, list[float]]:
    (_, p3), (_, p32) = sorted(ff.FIG1_PAPER.items())
    fig1 = [p3, _rel(p32, p3)] * 4  # two workloads x two models
    (r12, b12), (r2, b2) = ff.FIG3A_PAPER[12.0], ff.FIG3A_PAPER[2.0]
    fig3a = [r12, _rel(r2, r12), b12, _rel(b2, b12)] * 2
    p6 = ff.FIG6_PAPER
    fig6 = [p6["read_16_31_12h"], _rel(p6["read_16_31_2h"], p6["read_16_31_12h"]), p6["unread_64_12h"]] * 2
    ev = ff.FIG4_EVICTIONS_2H
    fig4 = ([_rel(h, f) for *_, h, f in ff.FIG4_PAPER] + [_rel(ev["half"], ev["zero"]), _rel(ev["full"], ev["zero"])]) * 2
    fig15 = [p for _, (_, *papers) in ff.FIG15_PAPER.items() for p in papers * 2]
    return {"1": fig1, "3a": fig3a, "4": fig4, "6": fig6, "11": list(ff.FIG11_PAPER.values()),
            "13": [ff.FIG13_R4_VS_E2_WRITES - 1.0] * 4, "14": list(ff.FIG14_PAPER.values()) * 2, "15": fig15}


def test_every_paper_number_is_quoted_from_the_paper():
    if not PAPER.is_file():
        pytest.skip(f"{PAPER} not present")
    text = PAPER.read_text()
    quoted = [_pct(v) for v in ff.FIG1_PAPER.values()] + ["3M token slots", "32M token slots"]
    quoted += [_pct(v) for pair in ff.FIG3A_PAPER.values() for v in pair]
    quoted += [_pct(v) for v in ff.FIG6_PAPER.values()]
    quoted += [f"{half} ms" if window == 12.0 else f"{full} to {half} ms" for window, *_, half, full in ff.FIG4_PAPER]
    quoted += [f"{full} ms" for window, *_, half, full in ff.FIG4_PAPER if window == 12.0]
    quoted += [f"{v:,}" for v in ff.FIG4_EVICTIONS_2H.values()]
    quoted += [_pct(v) for v in ff.FIG11_PAPER.values()] + ["1,960 requests", "0.5M-token DRAM, 5M-token SSD"]
    quoted += [f"{ff.FIG13_R4_VS_E2_WRITES} times as many writes as E2"]
    quoted += [_pct(v) for v in ff.FIG14_PAPER.values()]
    quoted += [_pct(v) for _, (_, *papers) in ff.FIG15_PAPER.items() for v in papers]
    quoted += [f"$r={r}$" for r, *_ in ff.FIG15_PAPER.values()]
    missing = [q for q in quoted if q not in text]
    assert not missing, f"not in the paper's text: {missing}"


@pytest.fixture(scope="module")
def run() -> Runner:
    return Runner(progress=False)


@pytest.fixture(scope="module")
def rows(run) -> dict[str, list[Row]]:
    return {name: fig(run, WEKA_SESSIONS) for name, fig in ff.PAPER_FIGURES.items()}


def test_fidelity_runs_every_paper_figure_and_no_figure_twice():
    assert set(ff.PAPER_FIGURES) <= set(fidelity.FIGURES)
    assert fidelity.FIGURES["15"] is ff.fig15  # the extended Figure 15 replaces the old one
    assert {"3b", "10", "12", "16"} <= set(fidelity.FIGURES)


@pytest.mark.parametrize("name", sorted(ff.PAPER_FIGURES))
def test_one_row_per_claim_with_the_papers_number(rows, name):
    got = rows[name]
    assert all(isinstance(r, Row) and r.figure == name for r in got)
    assert [r.paper for r in got] == pytest.approx(_expected_papers()[name])
    assert len({r.claim for r in got}) == len(got)
    assert all(type(r.replay) is float and math.isfinite(r.replay) for r in got)
    json.dumps([r.as_dict() for r in got])  # the table's --json
    for r in got:
        if not r.baseline_relative:  # a fraction measured in the replay
            assert 0.0 <= r.replay <= 1.0


def _tamper_each(monkeypatch, run: Runner, name: str) -> int:
    """Run figure ``name`` once per replay it fetches, that one replay claiming other requests each time;
    returns how many it fetches. Every run must refuse the comparison."""
    calls = []
    real = ff.paper_run

    def counting(run_, setup, ext=ff.Ext()):
        calls.append(setup)
        return real(run_, setup, ext)

    monkeypatch.setattr(ff, "paper_run", counting)
    ff.PAPER_FIGURES[name](run, WEKA_SESSIONS)
    for i in range(len(calls)):
        seen = iter(range(len(calls)))

        def tampered(run_, setup, ext=ff.Ext(), i=i, seen=seen):
            res = real(run_, setup, ext)
            return {**res, "request_set": "other"} if next(seen) == i else res

        monkeypatch.setattr(ff, "paper_run", tampered)
        with pytest.raises(DifferentRequestsError):
            ff.PAPER_FIGURES[name](run, WEKA_SESSIONS)
    return len(calls)


@pytest.mark.parametrize("name", sorted(ff.PAPER_FIGURES))
def test_every_replay_of_a_figure_is_compared_over_the_same_requests(monkeypatch, run, rows, name):
    assert _tamper_each(monkeypatch, run, name) >= 2


def test_load_figures_serve_every_request_at_every_window(run):
    """3a, 6 and 11 compare windows: without the 24 h truncation each serves the whole workload."""
    for window_h in (12.0, 2.0):
        res = ff.section3(run, "weka", WEKA_SESSIONS, window_h)
        served = sum(len(s.requests) for s in ff.paper_sessions(run, ff.WEKA, "qwen3-8b", WEKA_SESSIONS))
        assert res["requests"] == served


def test_block_reads_count_each_requests_reload_plan():
    from sglang_saria.mem_cache.metadata import SSD
    from sglang_saria.mem_cache.planner import ReloadPlan

    class Core:
        def begin_request(self, keys, now):
            plans = {0: ReloadPlan(3, [1, SSD, SSD], 0, 1, 2), 1: ReloadPlan(2, [1, 1], 0, 2, 0)}
            return plans[int(now)], None

    core, reads = Core(), ff.BlockReads()
    reads.attach(core)
    core.begin_request([5, 6, 7, 8], 0.0)  # blocks 5 (DRAM), 6 and 7 (SSD) reused; 8 computed
    core.begin_request([5, 6, 9], 1.0)  # 5 and 6 from DRAM
    reuse, ssd = reads.counts()
    assert reuse.tolist() == [2, 2, 1] and ssd.tolist() == [0, 1, 1]  # blocks 5, 6, 7


def test_reuse_groups_split_blocks_by_reuse_and_ssd_reads():
    reuse = np.array([1, 16, 20, 31, 32, 64, 100])
    ssd = np.array([0, 0, 2, 5, 1, 0, 4])
    g = ff.reuse_groups(reuse, ssd)
    assert g[16] == {"blocks": 3, "none": pytest.approx(1 / 3), "1-3": pytest.approx(1 / 3), ">=4": pytest.approx(1 / 3)}
    assert g[64]["blocks"] == 2 and g[64]["none"] == 0.5
    assert g[2]["blocks"] == 0


def test_worst_mean_is_the_mean_of_the_slowest_share():
    v = np.arange(1.0, 101.0)
    assert ff.worst_mean(v, 0.05) == pytest.approx(98.0)  # 96..100
    assert ff.worst_mean(v, 0.10) == pytest.approx(95.5)
    assert ff.worst_mean(np.array([3.0]), 0.05) == 3.0 and ff.worst_mean(np.array([]), 0.1) == 0.0


def test_uncapped_promotion_is_its_own_replay_and_capped_is_the_runners(run):
    capped = ff.promotion_ratio(run, WEKA_SESSIONS, "qwen3-8b", 0.8)
    assert capped is ff.promotion_ratio(run, WEKA_SESSIONS, "qwen3-8b", 0.8)  # cached, shared
    assert "hit_rate" not in capped  # the Runner's own replay: metrics only
    assert "hit_rate" in ff.promotion_ratio(run, WEKA_SESSIONS, "qwen3-8b", 0.8, capped=False)
