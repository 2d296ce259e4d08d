"""Paper 4.2: persistence-aware SSD admission, as hand-built sequences on a 4-block DRAM."""

import pytest

from sglang_saria.mem_cache.admission import AdmissionEvent, parse_policy_name
from sglang_saria.mem_cache.admission_factory import make_admission_policy
from sglang_saria.mem_cache.metadata import DRAM, SSD

from tests.mem_cache.helpers import make_core, run_request


def test_policy_factory_builds_every_named_policy():
    assert make_admission_policy("none").name == "none"
    assert make_admission_policy("full-duplicate").name == "full-duplicate"
    assert make_admission_policy("eviction:E3").name == "eviction:E3"
    assert make_admission_policy("reuse:R8").name == "reuse:R8"
    assert make_admission_policy("combined:E2R8").name == "combined:E2R8"
    assert parse_policy_name("combined:E2R24") == ("combined", 2, 24)
    for bad in ("E2", "eviction:E0", "reuse:", "combined:R2E2", "lru"):
        with pytest.raises(ValueError, match="policy"):
            make_admission_policy(bad)


def test_should_admit_is_a_pure_predicate_over_counters():
    p = make_admission_policy("combined:E2R8")
    assert not p.should_admit(1, 0, AdmissionEvent.EVICT)
    assert p.should_admit(2, 0, AdmissionEvent.EVICT)
    assert p.should_admit(1, 0, AdmissionEvent.PREWRITE)  # E + 1 qualifies
    assert not p.should_admit(1, 0, AdmissionEvent.INSERT)
    assert p.should_admit(0, 8, AdmissionEvent.REUSE)
    assert p.should_admit(0, 8, AdmissionEvent.INSERT)
    assert p.admitted == {e.value: 0 for e in AdmissionEvent}  # predicate never counts


@pytest.mark.parametrize("name", ["none", "full-duplicate", "eviction:E1", "eviction:E3", "reuse:R2", "combined:E2R8", "budget:1"])
def test_thresholds_are_a_necessary_condition_of_should_admit(name):
    p = make_admission_policy(name, ssd_capacity_bytes=2**40)
    if name == "budget:1":
        p.on_clock(0.0)
        p.on_clock(3600.0)  # some earned budget: the thresholds of the controller's current theta
    for event in AdmissionEvent:
        r_min, e_min = p.thresholds(event)
        for E in range(16):
            for R in range(16):
                if p.should_admit(E, R, event):
                    assert R >= r_min or E >= e_min, (event, E, R)


def test_thresholds_bound_prewrite_at_E_minus_1_and_a_spent_budget_bounds_every_node_out():
    inf = float("inf")
    assert make_admission_policy("eviction:E3").thresholds(AdmissionEvent.PREWRITE) == (inf, 2)
    assert make_admission_policy("combined:E2R8").thresholds(AdmissionEvent.INSERT) == (8, inf)
    budget = make_admission_policy("budget:1", ssd_capacity_bytes=2**40)
    assert budget.thresholds(AdmissionEvent.PREWRITE) == (inf, 1)  # the day's budget is left: theta_min = 2
    budget.on_admitted(AdmissionEvent.EVICT, 2**40)  # one drive write: the day's budget spent
    assert budget.thresholds(AdmissionEvent.PREWRITE) == (inf, inf)


def _evict_once_then_return(core):
    """Block 1: computed, evicted (E=1), recomputed; other sessions fill DRAM."""
    run_request(core, [1], 0.0)
    run_request(core, [10, 11, 12, 13], 1.0)  # evicts 1 -> E=1
    run_request(core, [1], 2.0)  # R=1, recomputed into DRAM (evicts 10)


def test_block_evicted_twice_is_persisted_under_E2():
    core = make_core("eviction:E2")
    _evict_once_then_return(core)
    node = core.metadata.get(1)
    assert node.E == 1 and node.fa_loc == DRAM and 1 not in core.ssd
    _, _, acts = run_request(core, [20, 21, 22, 23], 3.0)
    assert node.E == 2  # E counts across residencies: metadata outlived the first eviction
    assert 1 in acts.ssd_writes and 1 in acts.dram_evictions  # written before its DRAM space is reclaimed
    assert node.fa_loc == SSD and 1 in core.ssd and 1 not in core.dram
    assert core.stats.evict_writes == 1


def test_block_evicted_twice_is_not_persisted_under_E3():
    core = make_core("eviction:E3")
    _evict_once_then_return(core)
    _, _, acts = run_request(core, [20, 21, 22, 23], 3.0)
    assert core.metadata.get(1).E == 2 and acts.ssd_writes == [] and core.metadata.get(1).fa_loc == 0


def test_prewrite_starts_writing_a_dram_tail_node_that_qualifies_with_E_plus_1():
    core = make_core("eviction:E2", prewrite=True)
    _evict_once_then_return(core)  # DRAM (LRU first): 11 12 13 1
    _, _, acts = run_request(core, [30, 31], 4.0)  # evicts 11, 12 -> tail is 13, 1
    node = core.metadata.get(1)
    assert acts.ssd_writes == [1] and 1 not in acts.dram_evictions
    assert node.E == 1 and node.fa_loc == DRAM | SSD  # written while still resident
    assert core.stats.prewrites == 1


def test_reuse_triggered_write_fires_when_R_reaches_theta_R():
    core = make_core("reuse:R2")
    _, a0, f0 = run_request(core, [1, 2], 0.0)
    _, a1, f1 = run_request(core, [1, 2], 1.0)  # R=1
    assert a1.ssd_writes == [] and f1.ssd_writes == []
    _, a2, _ = run_request(core, [1, 2, 3], 2.0)  # R=2 while resident: asynchronous write at reuse
    assert a2.ssd_writes == [1, 2]
    assert core.metadata.get(1).fa_loc == DRAM | SSD and core.stats.reuse_writes == 2


def test_reuse_threshold_reached_while_evicted_writes_on_recompute():
    core = make_core("reuse:R1")
    run_request(core, [1], 0.0)
    run_request(core, [10, 11, 12, 13], 1.0)  # 1 evicted, not written (R=0)
    assert core.metadata.get(1).fa_loc == 0
    _, a, f = run_request(core, [1], 2.0)  # R=1 but not in DRAM: written when recomputed
    assert a.ssd_writes == [] and f.ssd_writes == [1]


def test_full_duplicate_writes_every_new_block_once():
    core = make_core("full-duplicate")
    _, _, f = run_request(core, [1, 2, 3], 0.0)
    assert f.ssd_writes == [3, 2, 1]  # deepest first
    _, _, f = run_request(core, [1, 2, 3, 4], 1.0)
    assert f.ssd_writes == [4]
    assert core.ssd.bytes_written == 4 * core.block_bytes


def test_none_never_writes_ssd():
    core = make_core("none")
    for t in range(5):
        run_request(core, list(range(10 * t, 10 * t + 4)), float(t))
    assert core.ssd.bytes_written == 0 and len(core.ssd) == 0
    assert core.stats.dram_evictions == 16


def test_ssd_evicts_a_prefix_tail_before_its_head_and_evicted_nodes_lose_their_location():
    core = make_core("full-duplicate", dram_blocks=2, ssd_blocks=3)
    run_request(core, [1, 2], 0.0)
    _, _, f = run_request(core, [5, 6], 1.0)
    assert f.ssd_evictions == [2]  # leaf first, as in a radix tree: 1 still serves the prefix [1]
    assert core.metadata.get(2).fa_loc == 0 and core.metadata.get(1).fa_loc == SSD
    assert core.lookup([1, 2]).n_blocks == 1 and core.ssd.used_tokens <= core.ssd.capacity_tokens


def test_dram_evicts_a_prefix_tail_before_its_head_even_when_the_head_was_a_hit():
    core = make_core("none", dram_blocks=4)
    run_request(core, [1, 2], 0.0)
    run_request(core, [1, 2, 3, 4], 1.0)  # hits 1, 2; computes 3, 4
    _, _, f = run_request(core, [9], 2.0)
    assert f.dram_evictions == [4]
    assert core.lookup([1, 2, 3, 4]).n_blocks == 3


def test_reuse_triggered_write_never_evicts_a_block_the_same_request_reads_from_ssd():
    core = make_core("combined:E2R3", dram_blocks=1, ssd_blocks=1)
    now = 0.0
    for length in (1, 2, 3, 2, 3, 1, 2):
        now += 10.0
        keys = list(range(length))
        plan, _ = core.begin_request(keys, now)
        for k, src in zip(keys, plan.sources):
            assert core.metadata.get(k).fa_loc & src, f"planned block {k} lost its source"
        core.finish_request(keys, plan, now)


def test_config_validates_policy_names_without_importing_the_policies():
    """The name grammar is a leaf module: config -> admission -> budget is no longer a cycle."""
    import subprocess
    import sys

    code = ("import sys, sglang_saria.config as c; c.AdmissionConfig(policy='budget:2').validate(); "
            "assert 'sglang_saria.mem_cache.admission' not in sys.modules, 'config imported admission'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_policy_kind_is_registered_once():
    from sglang_saria import policy_names

    assert policy_names.parse("budget:1.5") == policy_names.PolicyName("budget", dwpd=1.5)
    with pytest.raises(ValueError, match="already registered"):
        policy_names.register("eviction")(lambda pn, cfg, cap: None)
    with pytest.raises(ValueError, match="no registered factory"):
        policy_names.factory_for("lru")
