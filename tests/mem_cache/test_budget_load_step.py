"""The controller under a load step (Figure 11's windows as a step: 40 min -> 10 min).

Synthetic agent sessions (100, ~1,800 requests, 0.5M DRAM / 5M SSD like Figure 11) with
the first half starting over 40 minutes and the second half over the next 10 minutes.
The budget is 5.5 DWPD of the 5M-token SSD, held over every one-hour window (the replay
lasts about five hours; the default window is a day): the fixed E2 threshold overshoots it,
and a fixed threshold that stays within it through the peak must be high and gives up CHAR
that the controller keeps by spending the budget at theta_min while it lasts.
"""

import numpy as np
import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, SariaConfig
from sglang_saria.mem_cache.budget import WriteBudgetController
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.metrics import peak_window_bytes
from sglang_saria.replay.planning.sweep import load_step_starts
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.workload import apply_limits

DWPD = 5.5
SPEC = get_model_spec("qwen3-8b")
CAP = CapacityConfig(dram_tokens=500_000, ssd_tokens=5_000_000)
RATE = CAP.ssd_tokens * SPEC.kv_bytes_per_token * DWPD / 86400.0
NODE = 512 * SPEC.kv_bytes_per_token
WINDOW_S = 3600.0


@pytest.fixture(scope="module")
def workload():
    sessions = apply_limits(load_trace("synthetic", 512, max_sessions=100))
    return sessions, load_step_starts(sessions, 2400.0, 600.0, seed=0)


def _run(workload, policy):
    sessions, starts = workload
    cfg = SariaConfig(admission=AdmissionConfig(policy=policy, budget_window_s=WINDOW_S), capacity=CAP).validate()
    return replay(sessions, starts, cfg, SPEC, ReplaySettings(window_s=3000.0))


def _peak_window_ratio(res) -> float:
    """Largest writes of any one-hour window (as of request completions) / the window's budget."""
    return peak_window_bytes(res.log.done_s, res.log.ssd_bytes_written, WINDOW_S) / (RATE * WINDOW_S)


def test_load_step_starts_are_a_step():
    sessions = apply_limits(load_trace("synthetic", 512, max_sessions=20))
    s = load_step_starts(sessions, 2400.0, 600.0, seed=3)
    assert len(s) == len(sessions) and s[0] == 0.0
    assert np.all(s[:10] < 2400.0) and np.all((s[10:] >= 2400.0) & (s[10:] < 3000.0))
    assert np.array_equal(s, load_step_starts(sessions, 2400.0, 600.0, seed=3))


def test_controller_tracks_budget_where_fixed_thresholds_cannot(workload, monkeypatch):
    admitted: list[tuple[float, int]] = []  # (controller clock, bytes) of every admission
    record = WriteBudgetController.on_admitted

    def spy(self, event, nbytes=0):
        admitted.append((self._t or 0.0, nbytes))
        record(self, event, nbytes)

    monkeypatch.setattr(WriteBudgetController, "on_admitted", spy)
    ctl = _run(workload, f"budget:{DWPD}")
    assert sum(b for _, b in admitted) == ctl.metrics["ssd_write_bytes"] > 0
    # no one-hour window on the controller's clock holds more than its budget (one node may overdraw)
    times = [t for t, _ in admitted]
    assert times == sorted(times)
    assert peak_window_bytes(times, np.cumsum([b for _, b in admitted]), WINDOW_S) <= RATE * WINDOW_S + NODE
    assert ctl.metrics["ssd_write_bytes"] > 0.4 * RATE * ctl.end_time_s  # and it does use the budget

    e2 = _run(workload, "eviction:E2")
    assert e2.metrics["ssd_write_bytes"] > RATE * e2.end_time_s  # fixed E2 overshoots the budget
    assert _peak_window_ratio(e2) > 2.0

    # the lowest fixed eviction threshold that stays within the budget through the peak
    fixed = None
    for theta in (3, 4, 6, 8, 10, 12, 16):
        res = _run(workload, f"eviction:E{theta}")
        if _peak_window_ratio(res) <= 1.0:
            fixed = res
            break
    assert fixed is not None, "no fixed threshold meets the budget at peak"
    assert ctl.metrics["char"] > fixed.metrics["char"]
    assert ctl.metrics["char_p25_bad"] > fixed.metrics["char_p25_bad"]
    assert ctl.metrics["ttft_mean_s"] < fixed.metrics["ttft_mean_s"]
