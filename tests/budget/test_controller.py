"""``budget:<DWPD>`` write-budget controller: bucket arithmetic, thresholds, factory, core hook."""

import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, ConfigError, SariaConfig
from sglang_saria.mem_cache.admission import AdmissionEvent, make_admission_policy, parse_policy_name
from sglang_saria.mem_cache.budget import BudgetParams, WriteBudgetController

EV, PRE, INS = AdmissionEvent.EVICT, AdmissionEvent.PREWRITE, AdmissionEvent.INSERT
DAY = 86400.0


def _ctl(**kw) -> WriteBudgetController:
    p = dict(dwpd=1.0, capacity_bytes=86_400_000, horizon_s=100.0, theta_min=1, theta_max=8)  # 1000 B/s
    p.update(kw)
    return WriteBudgetController(BudgetParams(**p))


def test_bucket_starts_empty_refuses_then_earns_the_rated_rate():
    c = _ctl()
    assert c.rate == pytest.approx(1000.0) and c.depth == pytest.approx(100_000.0)
    c.on_clock(0.0)
    assert c.state() == {"theta_E": 8, "theta_R": 12, "fill": 0.0, "bytes_admitted": 0}
    assert c.level == 0 and c.theta_E == 8 and not c.should_admit(99, 0, EV)  # nothing earned yet
    c.on_clock(10.0)
    assert c.level == pytest.approx(10_000.0)
    assert c.should_admit(8, 0, EV) and not c.should_admit(7, 0, EV)
    c.on_admitted(EV, 25_000)  # one node may overdraw the bucket ...
    assert c.level == pytest.approx(-15_000.0) and not c.should_admit(99, 0, EV)  # ... then writes stop
    assert c.bytes_admitted == 25_000 and c.admitted["evict"] == 1


def test_fill_maps_linearly_to_theta_and_caps_at_the_horizon():
    c = _ctl()
    c.on_clock(0.0)
    c.on_clock(1e6)  # far past the horizon: the bucket holds only horizon_s of writes
    assert c.level == pytest.approx(c.depth) and c.fill == 1.0 and c.theta_E == 1
    seen = []
    for _ in range(8):
        c.on_admitted(EV, int(c.depth / 8))
        c.on_clock(1e6)
        seen.append(c.theta_E)
    assert seen == sorted(seen) and seen[0] >= 1 and seen[-1] == 8  # emptier bucket, stricter threshold
    assert c.should_admit(1, 0, INS) is False  # INSERT only via the reuse path


def test_clock_going_backwards_earns_nothing_and_is_deterministic():
    a, b = _ctl(), _ctl()
    for c in (a, b):
        for t in (0.0, 5.0, 3.0, 7.5):
            c.on_clock(t)
    assert a.level == b.level == pytest.approx(7500.0)
    a.reset()
    assert a.level == 0 and a.bytes_admitted == 0 and a.theta_E == 8


def test_reuse_threshold_follows_theta_e_with_offset():
    c = _ctl(reuse_offset=2)
    c.on_clock(0.0)
    assert c.theta_R == 10 and c.reuse_threshold == 10
    c.on_clock(1e6)
    assert c.theta_E == 1 and c.theta_R == 3
    assert c.should_admit(0, 3, AdmissionEvent.REUSE) and c.should_admit(0, 3, INS)
    assert c.should_admit(0, 0, PRE)  # E + 1 >= theta_E = 1


def test_factory_and_config_wiring():
    assert parse_policy_name("budget:1") == ("budget", None, None)
    adm = AdmissionConfig(policy="budget:0.5", budget_horizon_s=60.0, budget_theta_max=5)
    pol = make_admission_policy("budget:0.5", adm, ssd_capacity_bytes=2_000_000)
    assert isinstance(pol, WriteBudgetController) and pol.name == "budget:0.5"
    assert pol.rate == pytest.approx(2_000_000 * 0.5 / DAY) and pol.params.horizon_s == 60.0 and pol.theta_E == 5
    explicit = make_admission_policy("budget:1", AdmissionConfig(policy="budget:1", budget_capacity_bytes=10**12), 5)
    assert explicit.params.capacity_bytes == 10**12  # the drive's capacity wins over the SSD tier's
    cfg = SariaConfig.from_dict({"admission": {"policy": "budget:2", "budget_horizon_s": 600}}, source="extra-config")
    assert cfg.admission.budget_horizon_s == 600.0


@pytest.mark.parametrize("name", ["budget:0", "budget:-1", "budget:", "budget:abc", "budget:1x"])
def test_impossible_budget_names_are_clear_errors(name):
    with pytest.raises(ValueError, match=r"budget:<DWPD> needs a positive number"):
        make_admission_policy(name)
    with pytest.raises(ConfigError, match=r"admission.policy="):
        AdmissionConfig(policy=name).validate()


def test_bad_controller_settings_name_the_field():
    with pytest.raises(ConfigError, match=r"admission.budget_horizon_s=0"):
        SariaConfig.from_dict({"admission": {"budget_horizon_s": 0}})
    with pytest.raises(ConfigError, match=r"admission.budget_theta_min=13"):
        SariaConfig.from_dict({"admission": {"budget_theta_min": 13}})
    with pytest.raises(ConfigError, match=r"capacity_bytes=0"):
        make_admission_policy("budget:1", AdmissionConfig(policy="budget:1"), ssd_capacity_bytes=0)
    with pytest.raises(ConfigError, match=r"admission.budget_reuse_offset=-1"):
        SariaConfig.from_dict({"admission": {"budget_reuse_offset": -1}})


def test_core_reports_clock_and_bytes_to_the_controller():
    from sglang_saria.mem_cache.core import SariaCore
    from sglang_saria.model_specs import get_model_spec

    spec = get_model_spec("qwen3-8b")
    cfg = SariaConfig(admission=AdmissionConfig(policy="budget:1000", budget_theta_min=1, budget_theta_max=1,
                                                budget_horizon_s=3600.0),
                      capacity=CapacityConfig(dram_tokens=1024, ssd_tokens=100_000)).validate()
    core = SariaCore(cfg, spec)
    ctl = core.admission
    assert isinstance(ctl, WriteBudgetController)
    t = 0.0
    for req in range(6):  # distinct 2-block requests: DRAM (2 blocks) evicts, E1 admits while the bucket has bytes
        keys = [10 * req + 1, 10 * req + 2]
        t += 10.0
        plan, _ = core.begin_request(keys, t)
        core.finish_request(keys, plan, t)
    assert core.ssd.bytes_written > 0
    assert ctl.bytes_admitted == core.ssd.bytes_written
    assert ctl.level <= ctl.depth
