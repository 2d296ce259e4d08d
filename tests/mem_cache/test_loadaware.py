"""`auto` admission (issue 26): the eviction threshold follows a smoothed load signal, a long-reused
block is written at its first eviction, and `loadaware:<DWPD>` never passes its window's budget."""

import itertools
import math

import pytest

from sglang_saria import policy_names
from sglang_saria.config import AdmissionConfig, ConfigError, SariaConfig
from sglang_saria.mem_cache.admission import AdmissionEvent
from sglang_saria.mem_cache.admission_factory import make_admission_policy
from sglang_saria.mem_cache.auto import LoadAwareAdmission, LoadParams

EVICT, PREWRITE, INSERT, REUSE = (AdmissionEvent.EVICT, AdmissionEvent.PREWRITE, AdmissionEvent.INSERT,
                                  AdmissionEvent.REUSE)


def test_names_parse_and_bad_ratings_are_refused():
    assert policy_names.parse("loadaware") == policy_names.PolicyName("loadaware")
    assert policy_names.parse("loadaware:2.5") == policy_names.PolicyName("loadaware", dwpd=2.5)
    for bad in ("loadaware:0", "loadaware:-1", "loadaware:x", "loadaware:"):
        with pytest.raises(ValueError, match="loadaware:<DWPD> needs a positive number"):
            policy_names.parse(bad)
    with pytest.raises(ConfigError, match="admission.loadaware_tau_s"):
        SariaConfig.from_dict({"admission": {"policy": "loadaware", "loadaware_tau_s": 0}}).validate()
    with pytest.raises(ConfigError, match="admission.loadaware_spend_fill"):
        SariaConfig.from_dict({"admission": {"policy": "loadaware:2", "loadaware_spend_fill": 1.5}}).validate()


def test_one_long_prompt_is_no_load_but_ten_minutes_of_queueing_is():
    auto = LoadAwareAdmission(LoadParams(spend_backlog_s=1.0, tau_s=600.0))
    auto.on_load(0.0, 0.0)
    auto.on_load(30.0, 1.0)  # a 30-s prefill queued for a second: the average barely moves
    assert not auto.loaded and auto.theta_E == 2
    for t in range(2, 600, 10):  # the GPU stays 5 s behind for ten minutes
        auto.on_load(5.0, float(t))
    assert auto.loaded and auto.theta_E == 1
    auto.on_load(0.0, 4000.0)  # an hour idle
    assert not auto.loaded and auto.theta_E == 2
    assert auto.backlog_s < 5.0 * math.exp(-(4000.0 - 592.0) / 600.0)  # decayed below the last average


def test_a_clock_going_backwards_changes_nothing():
    auto = LoadAwareAdmission(LoadParams())
    auto.on_load(10.0, 100.0)
    auto.on_load(0.0, 50.0)
    assert auto.backlog_s == 10.0 and auto.loaded


def test_loaded_writes_at_the_first_eviction_idle_at_the_second_and_reused_blocks_at_the_first():
    auto = LoadAwareAdmission(LoadParams(reuse_spend=4))
    auto.on_load(0.0, 0.0)
    assert not auto.should_admit(1, 0, EVICT) and auto.should_admit(2, 0, EVICT)
    assert auto.should_admit(1, 4, EVICT) and not auto.should_admit(1, 3, EVICT)
    assert auto.should_admit(0, 4, PREWRITE)  # it would qualify at its next (first) eviction
    assert not auto.should_admit(0, 9, INSERT) and not auto.should_admit(0, 9, REUSE)  # never before an eviction
    auto.on_load(50.0, 10.0)
    auto.on_load(50.0, 10_000.0)
    assert auto.loaded and auto.should_admit(1, 0, EVICT)


@pytest.mark.parametrize("reuse_spend", [0, 4])
@pytest.mark.parametrize("backlog", [0.0, 100.0])
def test_thresholds_are_a_necessary_condition(reuse_spend, backlog):
    auto = LoadAwareAdmission(LoadParams(reuse_spend=reuse_spend))
    auto.on_load(backlog, 0.0)
    for event in (EVICT, PREWRITE, INSERT, REUSE):
        r_min, e_min = auto.thresholds(event)
        for E, R in itertools.product(range(6), range(8)):
            if auto.should_admit(E, R, event):
                assert R >= r_min or E >= e_min, (event, E, R)


def test_auto_with_a_rating_never_passes_its_windows_budget():
    cfg = AdmissionConfig(policy="loadaware:1", budget_window_s=100.0)
    auto = make_admission_policy("loadaware:1", cfg, ssd_capacity_bytes=86_400_000)  # 1 DWPD: 1 KB/s, 100 KB per window
    assert isinstance(auto, LoadAwareAdmission) and auto.name == "loadaware:1"
    auto.on_clock(0.0)
    auto.on_load(100.0, 0.0)
    auto.on_load(100.0, 5000.0)
    assert auto.theta_E == 1  # loaded, budget full: spend
    written = 0
    while auto.should_admit(1, 0, EVICT):
        auto.on_admitted(EVICT, 7_000)
        written += 7_000
    assert written == 35_000 and auto.theta_E == 2  # spending stops below 70% unspent: the E2 floor keeps the rest
    while auto.should_admit(2, 0, EVICT):
        auto.on_admitted(EVICT, 7_000)
        written += 7_000
    assert 90_000 < written <= 100_000 and auto.theta_E > 2  # the budget's threshold wins as the window runs out
    assert auto.should_admit(50, 0, EVICT)  # budget left: a block evicted often enough still goes
    auto.on_admitted(EVICT, 100_000)  # one node may overdraw the window; then nothing more
    assert auto.budget.level <= 0 and not auto.should_admit(50, 50, EVICT)
    assert auto.thresholds(EVICT) == (math.inf, math.inf)
    auto.on_clock(201.0)  # the window slid past every write
    assert auto.budget.level == pytest.approx(100_000) and auto.theta_E == 1


def test_auto_with_a_rating_needs_a_drive_capacity():
    with pytest.raises(ConfigError, match="loadaware:2.*needs a drive capacity"):
        make_admission_policy("loadaware:2", AdmissionConfig(policy="loadaware:2"), ssd_capacity_bytes=0)


def test_decisions_are_counted_by_load_state():
    auto = LoadAwareAdmission(LoadParams())
    auto.on_load(0.0, 0.0)
    auto.on_admitted(EVICT, 1)
    auto.on_load(100.0, 1.0)
    auto.on_load(100.0, 9000.0)
    auto.on_admitted(EVICT, 1)
    assert auto.decisions == {"spend": 1, "save": 1}
    assert auto.state()["loaded"] == 1.0 and auto.state()["fill"] == 1.0
