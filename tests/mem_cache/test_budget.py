"""``budget:<DWPD>`` write-budget controller: window arithmetic, thresholds, factory, core hook."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_saria.config import AdmissionConfig, CapacityConfig, ConfigError, SariaConfig
from sglang_saria.mem_cache.admission import AdmissionEvent, parse_policy_name
from sglang_saria.mem_cache.admission_factory import make_admission_policy
from sglang_saria.mem_cache.budget import BudgetParams, WriteBudgetController
from sglang_saria.replay.metrics import peak_window_bytes

EV, PRE, INS = AdmissionEvent.EVICT, AdmissionEvent.PREWRITE, AdmissionEvent.INSERT
DAY = 86400.0


def _ctl(**kw) -> WriteBudgetController:
    p = dict(dwpd=1.0, capacity_bytes=86_400_000, window_s=100.0, theta_min=1, theta_max=8, low_water=0.5)  # 1000 B/s
    p.update(kw)
    return WriteBudgetController(BudgetParams(**p))


def test_window_starts_with_its_budget_refuses_when_spent_and_frees_it_one_window_later():
    c = _ctl()
    assert c.rate == pytest.approx(1000.0) and c.budget == pytest.approx(100_000.0)
    c.on_clock(0.0)
    assert c.state() == {"theta_E": 1, "theta_R": 0, "fill": 1.0, "bytes_admitted": 0}  # no reuse writes by default
    assert c.should_admit(1, 0, EV)
    c.on_admitted(EV, 60_000)
    c.on_clock(10.0)
    c.on_admitted(EV, 50_000)  # one node may overdraw the window ...
    assert c.level == pytest.approx(-10_000.0) and not c.should_admit(99, 0, EV)  # ... then writes stop
    assert c.thresholds(EV) == (math.inf, math.inf)
    c.on_clock(99.9)
    assert not c.should_admit(99, 0, EV)  # nothing left the window yet
    c.on_clock(100.0)  # the first admission (t=0) leaves the window
    assert c.level == pytest.approx(50_000.0) and c.should_admit(1, 0, EV)
    c.on_clock(110.0)
    assert c.level == pytest.approx(100_000.0) and c.fill == 1.0
    assert c.bytes_admitted == 110_000 and c.admitted["evict"] == 2


def test_theta_stays_at_min_above_low_water_then_rises_to_max():
    c = _ctl()
    c.on_clock(0.0)
    seen = []
    for _ in range(10):
        seen.append(c.theta_E)
        c.on_admitted(EV, 10_000)
    seen.append(c.theta_E)
    assert seen[:6] == [1] * 6  # 100% .. 50% of the budget left: theta_min
    assert seen == sorted(seen) and seen[6] > 1 and seen[-1] == 8  # then stricter as it runs out
    assert c.should_admit(1, 0, INS) is False  # INSERT only via the reuse path


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 40.0), st.integers(0, 30_000)), min_size=1, max_size=200))
def test_no_window_ever_holds_more_than_its_budget_plus_one_node(steps):
    c = _ctl()
    t, log = 0.0, []
    for dt, nbytes in steps:
        t += dt
        c.on_clock(t)
        if nbytes and c.should_admit(99, 0, EV):
            c.on_admitted(EV, nbytes)
            log.append((t, nbytes))
    W = c.params.window_s
    for start, _ in log:  # every window that starts at an admission (the fullest ones)
        held = sum(b for s, b in log if start <= s < start + W)
        assert held <= c.budget + 30_000
    # the replay's measure of the same thing (windows (t - W, t] ending at each admission)
    brute = max((sum(b for s, b in log if end - W < s <= end) for end, _ in log), default=0)
    assert peak_window_bytes([t for t, _ in log], np.cumsum([b for _, b in log]), W) == brute


def test_admissions_share_slots_and_leave_with_the_latest_one():
    c = _ctl(window_s=1440.0)  # 1-s slots
    c.on_clock(0.0)
    c.on_admitted(EV, 100)
    c.on_clock(0.5)
    c.on_admitted(EV, 100)  # same slot, which now leaves at 0.5 + window
    assert len(c._window) == 1
    c.on_clock(1440.2)
    assert c.level == pytest.approx(c.budget - 200)  # never early
    c.on_clock(1440.5)
    assert c.level == pytest.approx(c.budget)


def test_clock_going_backwards_frees_nothing_and_is_deterministic():
    a, b = _ctl(), _ctl()
    for c in (a, b):
        for t in (0.0, 5.0, 3.0, 7.5):
            c.on_clock(t)
            c.on_admitted(EV, 1000)
    assert a.level == b.level == pytest.approx(96_000.0)
    a.on_clock(104.0)  # only t=0 leaves (the one at t=3 counts at 5.0, the clock's latest time)
    assert a.level == pytest.approx(97_000.0)
    a.reset()
    assert a.level == a.budget and a.bytes_admitted == 0 and a.theta_E == 1


def test_reuse_threshold_follows_theta_e_with_offset():
    c = _ctl(reuse_offset=2)
    c.on_clock(0.0)
    assert c.theta_E == 1 and c.theta_R == 3 and c.reuse_threshold == 3
    c.on_admitted(EV, 100_000)
    assert c.theta_E == 8 and c.theta_R == 10
    c.on_clock(1e6)
    assert c.theta_E == 1 and c.should_admit(0, 3, AdmissionEvent.REUSE) and c.should_admit(0, 3, INS)
    assert c.should_admit(0, 0, PRE)  # E + 1 >= theta_E = 1


def test_factory_and_config_wiring():
    assert parse_policy_name("budget:1") == ("budget", None, None)
    adm = AdmissionConfig(policy="budget:0.5", budget_window_s=60.0, budget_theta_max=5, budget_low_water=0.2)
    pol = make_admission_policy("budget:0.5", adm, ssd_capacity_bytes=2_000_000)
    assert isinstance(pol, WriteBudgetController) and pol.name == "budget:0.5"
    assert pol.rate == pytest.approx(2_000_000 * 0.5 / DAY) and pol.params.window_s == 60.0 and pol.theta_E == 2
    assert pol.budget == pytest.approx(pol.rate * 60.0) and pol.params.low_water == 0.2
    explicit = make_admission_policy("budget:1", AdmissionConfig(policy="budget:1", budget_capacity_bytes=10**12), 5)
    assert explicit.params.capacity_bytes == 10**12  # the drive's capacity wins over the SSD tier's
    cfg = SariaConfig.from_dict({"admission": {"policy": "budget:2", "budget_window_s": 600}}, source="extra-config")
    assert cfg.admission.budget_window_s == 600.0 and AdmissionConfig().budget_window_s == DAY


@pytest.mark.parametrize("name", ["budget:0", "budget:-1", "budget:", "budget:abc", "budget:1x"])
def test_impossible_budget_names_are_clear_errors(name):
    with pytest.raises(ValueError, match=r"budget:<DWPD> needs a positive number"):
        make_admission_policy(name)
    with pytest.raises(ConfigError, match=r"admission.policy="):
        AdmissionConfig(policy=name).validate()


def test_bad_controller_settings_name_the_field():
    with pytest.raises(ConfigError, match=r"admission.budget_window_s=0"):
        SariaConfig.from_dict({"admission": {"budget_window_s": 0}})
    for bad in (0, 1.5):
        with pytest.raises(ConfigError, match=rf"admission.budget_low_water={bad}"):
            SariaConfig.from_dict({"admission": {"budget_low_water": bad}})
    with pytest.raises(ConfigError, match=r"admission.budget_theta_min=13"):
        SariaConfig.from_dict({"admission": {"budget_theta_min": 13}})
    with pytest.raises(ConfigError, match=r"capacity_bytes=0"):
        make_admission_policy("budget:1", AdmissionConfig(policy="budget:1"), ssd_capacity_bytes=0)
    with pytest.raises(ConfigError, match=r"admission.budget_reuse_offset=-1"):
        SariaConfig.from_dict({"admission": {"budget_reuse_offset": -1}})


def test_core_reports_clock_and_bytes_to_the_controller():
    from sglang_saria.replay.core import SariaCore
    from sglang_saria.model_specs import get_model_spec

    spec = get_model_spec("qwen3-8b")
    cfg = SariaConfig(admission=AdmissionConfig(policy="budget:1000", budget_theta_min=1, budget_theta_max=1,
                                                budget_window_s=3600.0),
                      capacity=CapacityConfig(dram_tokens=1024, ssd_tokens=100_000)).validate()
    core = SariaCore(cfg, spec)
    ctl = core.admission
    assert isinstance(ctl, WriteBudgetController)
    t = 0.0
    for req in range(6):  # distinct 2-block requests: DRAM (2 blocks) evicts, E1 admits while the window has budget
        keys = [10 * req + 1, 10 * req + 2]
        t += 10.0
        plan, _ = core.begin_request(keys, t)
        core.finish_request(keys, plan, t)
    assert core.ssd.bytes_written > 0
    assert ctl.bytes_admitted == core.ssd.bytes_written
    assert ctl.level <= ctl.budget


def test_seed_holds_earlier_writes_until_their_window_ends():
    c = _ctl()  # 100 KB per 100-s window
    c.seed([(150.0, 99_999), (60.0, 30_000), (0.0, 20_000)], now=1000.0)  # the first is outside the window
    assert c.level == pytest.approx(50_000.0) and c.bytes_admitted == 0
    c.on_clock(1039.9)
    assert c.level == pytest.approx(50_000.0)
    c.on_clock(1040.0)  # written 60 s before 1000: leaves at 1040
    assert c.level == pytest.approx(80_000.0)
    c.on_clock(1100.0)
    assert c.level == pytest.approx(c.budget)
    c.on_admitted(EV, 10_000)  # seeded after an admission: merged in time order
    c.seed([(50.0, 5_000)], now=1100.0)
    assert c.level == pytest.approx(85_000.0)
    c.on_clock(1150.0)  # the seeded bytes (t=1050) leave first
    assert c.level == pytest.approx(90_000.0)
