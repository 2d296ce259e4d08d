"""`auto` admission: a block's reuse chance is learned per class from the ghost of evicted blocks,
a write must beat the bar (load, budget) and, when the SSD is full, the victim it displaces."""

import math

import pytest

from sglang_saria import policy_names
from sglang_saria.config import AdmissionConfig, ConfigError, SariaConfig
from sglang_saria.mem_cache.admission import AdmissionEvent
from sglang_saria.mem_cache.admission_factory import make_admission_policy
from sglang_saria.mem_cache.learned import (AGE_CLASSES, GHOST_BYTES_PER_BLOCK, N_CLASSES, LearnedAdmission,
                                            LearnedParams, block_class, node_class)
from sglang_saria.mem_cache.metadata import DRAM, SSD, ContextMetadata, ContextNode, bypassed
from sglang_saria.mem_cache.sequencer import WriteSequencer
from tests.mem_cache.helpers import ChainView

EVICT, INSERT, PREWRITE = AdmissionEvent.EVICT, AdmissionEvent.INSERT, AdmissionEvent.PREWRITE


def node(R: int, E: int, t_reuse: float) -> ContextNode:
    n = ContextNode(t_reuse, False)
    n.R, n.E = R, E
    return n


def teach(policy: LearnedAdmission, R: int, E: int, idle_s: float, n: int, reused: int, first_key: int) -> None:
    """``n`` evictions of blocks of one class, ``reused`` of them wanted again from below DRAM."""
    policy.on_clock(10_000.0)
    keys = range(first_key, first_key + n)
    for k in keys:
        policy.admits_key(k, EVICT, node(R, E - 1, 10_000.0 - idle_s))
    policy.on_missed(list(keys)[:reused])


def test_names_config_and_factory():
    assert policy_names.parse("auto") == policy_names.PolicyName("auto")
    assert policy_names.parse("auto:3") == policy_names.PolicyName("auto", dwpd=3.0)
    with pytest.raises(ValueError, match="auto:<DWPD> needs a positive number"):
        policy_names.parse("auto:0")
    with pytest.raises(ConfigError, match="admission.auto_odds"):
        SariaConfig.from_dict({"admission": {"policy": "auto", "auto_odds": 0}}).validate()
    with pytest.raises(ConfigError, match="admission.auto_max_bytes"):
        SariaConfig.from_dict({"admission": {"policy": "auto", "auto_max_bytes": -1}}).validate()
    p = make_admission_policy("auto", AdmissionConfig(policy="auto", auto_odds=2.0, auto_load_ref_s=3.0))
    assert isinstance(p, LearnedAdmission) and p.params.odds == 2.0 and p.params.load_ref_s == 3.0
    capped = make_admission_policy("auto:2", AdmissionConfig(policy="auto:2"), ssd_capacity_bytes=1 << 30)
    assert capped.budget is not None and capped.name == "auto:2"
    with pytest.raises(ConfigError, match="needs a drive capacity"):
        make_admission_policy("auto:2", AdmissionConfig(policy="auto:2"))


def test_classes_cover_counters_idle_time_and_going_around():
    seen = {block_class(R, E, idle, around) for R in range(6) for E in range(1, 6) for idle in (0, 0.5, 1, 3, 100, 1e9)
            for around in (False, True)}
    assert seen <= set(range(N_CLASSES))
    assert block_class(2, 1, 300.0, True) != block_class(2, 1, 300.0)
    assert block_class(0, 1, 0.2) != block_class(0, 1, 300.0) != block_class(5, 1, 300.0)
    assert block_class(0, 1, 1e9) % AGE_CLASSES == AGE_CLASSES - 1


def test_cold_class_rejected_hot_class_admitted_after_learning():
    p = LearnedAdmission()
    teach(p, R=0, E=1, idle_s=600, n=50, reused=2, first_key=0)  # cold: 2 of 50 came back
    teach(p, R=3, E=2, idle_s=600, n=50, reused=45, first_key=1000)  # hot: 45 of 50
    assert p.chance(block_class(0, 1, 600)) < 0.1 < 0.85 < p.chance(block_class(3, 2, 600))
    before = dict(p.decisions)
    assert not p.admits_key(5000, EVICT, node(0, 0, 10_000.0 - 600))
    assert p.admits_key(5001, EVICT, node(3, 1, 10_000.0 - 600))
    assert p.decisions["cold"] == before["cold"] + 1 and p.decisions["admit"] == before["admit"] + 1
    assert not p.admits_key(5002, INSERT, node(3, 1, 0.0)) and not p.admits_key(5002, PREWRITE, node(3, 1, 0.0))


def test_fixed_chances_decide_while_the_counts_still_grow():
    """``fix_chances`` (the sweep's hindsight bound) answers from its table, whatever was learned;
    the ghost and the counts go on as before; a table of the wrong size or range is refused."""
    p = LearnedAdmission()
    teach(p, R=0, E=1, idle_s=600, n=50, reused=2, first_key=0)  # learned: cold
    cold = block_class(0, 1, 600)
    learned = p.chances()
    assert len(learned) == N_CLASSES and learned[cold] == p.chance(cold) < 0.1
    table = [0.0] * N_CLASSES
    table[cold] = 0.9  # odds 9: past the bar of 4
    p.fix_chances(table)
    assert p.chance(cold) == 0.9 and p.admits_key(900, EVICT, node(0, 0, 10_000.0 - 600))
    assert p.seen[cold] == 51 and 900 in p.ghost
    table[cold] = 0.75  # odds 3: short of it
    p.fix_chances(table)
    assert not p.admits_key(901, EVICT, node(0, 0, 10_000.0 - 600))
    for bad in ([0.5] * (N_CLASSES - 1), [1.5] + [0.5] * (N_CLASSES - 1)):
        with pytest.raises(ValueError, match=f"need {N_CLASSES} chances"):
            p.fix_chances(bad)


def test_asking_twice_for_one_eviction_tracks_the_block_once():
    p = LearnedAdmission()
    n = node(1, 0, 0.0)
    cls = block_class(1, 1, 0.0)
    p.admits_key(7, EVICT, n)
    p.admits_key(7, EVICT, n)
    assert p.seen[cls] == 1 and len(p.ghost) == 1
    p.on_missed({7, 8})
    assert p.reused[cls] == 1 and 7 not in p.ghost
    p.on_missed([7])  # once reused, the block's eviction is settled
    assert p.reused[cls] == 1


def test_a_hotter_victim_is_kept():
    p = LearnedAdmission()
    teach(p, R=1, E=1, idle_s=600, n=40, reused=36, first_key=0)  # odds past the default bar (4)
    teach(p, R=3, E=3, idle_s=600, n=40, reused=39, first_key=100)
    candidate = node(1, 0, 10_000.0 - 600)
    assert p.admits_key(500, EVICT, candidate, victim=None)
    assert not p.admits_key(501, EVICT, node(1, 0, 10_000.0 - 600), victim=node(3, 3, 10_000.0 - 600))
    assert p.decisions["victim"] == 1
    assert p.admits_key(502, EVICT, node(3, 2, 10_000.0 - 600), victim=node(1, 1, 10_000.0 - 600))


def test_load_lowers_the_bar_and_an_empty_budget_closes_it():
    p = LearnedAdmission(LearnedParams(odds=1.0, load_ref_s=2.0))
    teach(p, R=0, E=1, idle_s=50, n=30, reused=10, first_key=0)  # odds about 1/2
    k = block_class(0, 1, 50)
    assert 0.3 < p.chance(k) < 0.4
    assert not p.admits_key(100, EVICT, node(0, 0, 10_000.0 - 50))
    p.on_load(4.0, 10_000.0)  # bar 1 / (1 + 4 / 2) = 1/3
    assert p.bar() == pytest.approx(1 / 3)
    assert p.admits_key(101, EVICT, node(0, 0, 10_000.0 - 50))
    capped = make_admission_policy("auto:1", AdmissionConfig(policy="auto:1"), ssd_capacity_bytes=1000)
    capped.on_clock(0.0)
    capped.on_admitted(EVICT, 10_000)  # far past the day's 1,000 bytes
    assert capped.bar() == math.inf
    assert not capped.admits_key(1, EVICT, node(3, 3, 0.0)) and capped.decisions["budget"] == 1


def test_ghost_memory_is_bounded_oldest_first():
    p = LearnedAdmission(LearnedParams(max_bytes=10 * GHOST_BYTES_PER_BLOCK))
    for k in range(25):
        p.admits_key(k, EVICT, node(0, 0, 0.0))
    assert len(p.ghost) == 10 and min(p.ghost) == 15


def test_state_round_trip_and_bad_state_named():
    p = LearnedAdmission()
    teach(p, R=2, E=2, idle_s=100, n=20, reused=15, first_key=0)
    q = LearnedAdmission()
    q.load_state_dict(p.state_dict())
    assert q.seen == p.seen and q.reused == p.reused and q.ghost == p.ghost
    good = p.state_dict()
    for field, bad in (("version", 99), ("seen", [1, 2]), ("reused", [-1] * N_CLASSES), ("ghost", [[1, N_CLASSES]])):
        with pytest.raises(ConfigError, match=field):
            q.load_state_dict({**good, field: bad}, source="state.json")
    with pytest.raises(ConfigError, match="reused must not exceed seen"):
        q.load_state_dict({**good, "reused": [s + 1 for s in good["seen"]]})
    assert q.seen == p.seen  # a refused state changes nothing


def test_blocks_a_later_request_went_around_learn_their_own_chance():
    """An agent that rewrote its history left blocks out: their class learns that they do not come back,
    while blocks of the same counters and idle time on a path still followed keep theirs."""
    md = ContextMetadata(block_tokens=16, checkpoint_tokens=None, window_s=1e9)
    p = LearnedAdmission()
    for s in range(40):  # sessions of 3 blocks; the even ones later rewrite everything after their first block
        base = 1000 * s
        md.record_use([base, base + 1, base + 2], now=0.0)
        if s % 2 == 0:
            md.record_use([base, base + 500], now=50.0)
    p.on_clock(600.0)
    for s in range(40):
        p.admits_key(1000 * s + 2, EVICT, md.get(1000 * s + 2))
    p.on_missed([1000 * s + 2 for s in range(1, 40, 2)])  # the sessions that went on along their path came back
    followed, around = md.get(1002 + 2000), md.get(2)
    assert bypassed(around) and not bypassed(followed)
    assert p.chance(node_class(around, 1, 600.0)) < 0.1 < 0.9 < p.chance(node_class(followed, 1, 600.0))
    assert not p.admits_key(90_001, EVICT, md.get(2000 + 2)) and p.admits_key(90_002, EVICT, md.get(3000 + 2))


def test_a_state_of_version_1_fills_the_classes_not_gone_around():
    p = LearnedAdmission()
    teach(p, R=2, E=2, idle_s=100, n=20, reused=15, first_key=0)
    v1 = {"version": 1, "seen": p.seen[:N_CLASSES // 2], "reused": p.reused[:N_CLASSES // 2],
          "ghost": [[k, c] for k, c in p.ghost.items()]}
    q = LearnedAdmission()
    q.load_state_dict(v1)
    assert q.seen == p.seen and q.reused == p.reused and q.ghost == p.ghost
    with pytest.raises(ConfigError, match="seen must be 192 counts"):
        q.load_state_dict({**v1, "seen": p.seen})


def _hot_auto(lazy: bool, lazy_hybrid: bool = False) -> LearnedAdmission:
    p = LearnedAdmission(LearnedParams(lazy_closure=lazy, lazy_hybrid=lazy_hybrid))
    teach(p, R=1, E=1, idle_s=100, n=10, reused=10, first_key=1000)  # blocks like these come back
    return p


def test_lazy_closure_writes_an_ancestor_at_its_own_eviction_because_the_descendant_needs_it():
    view = ChainView()
    eager = WriteSequencer(_hot_auto(lazy=False), "robust")
    assert eager.evict(view, 3, node(1, 0, 10_000.0 - 100)) == [3, 2, 1]  # closes over the DRAM ancestors
    p = _hot_auto(lazy=True)
    lazy = WriteSequencer(p, "robust")
    assert lazy.evict(view, 3, node(1, 0, 10_000.0 - 100)) == [3]  # the parent keeps its DRAM copy
    view.on_ssd.add(3)
    assert lazy.stats.closure_deferred == 1
    # block 2 is evicted later: it is cold by its own class, and written because block 3's SSD copy needs it
    cold = node(0, 0, 10_000.0)
    assert lazy.evict(view, 2, cold) == [2] and lazy.stats.closure_forced == 1 and p.decisions["admit"] == 1
    view.on_ssd.add(2)
    assert lazy.evict(view, 1, cold) == [1] and lazy.stats.closure_forced == 2


def test_lazy_closure_forces_nothing_once_the_descendants_copy_is_gone():
    view = ChainView()
    p = _hot_auto(lazy=True)
    lazy = WriteSequencer(p, "robust")
    assert lazy.evict(view, 3, node(1, 0, 10_000.0 - 100)) == [3]  # ordered, never stored (or evicted since)
    cold = p.decisions["cold"]
    assert lazy.evict(view, 2, node(0, 0, 10_000.0)) is None  # a first eviction in a new class: cold
    assert lazy.stats.closure_forced == 0 and p.decisions["cold"] == cold + 1


class _SpentCredit(ChainView):
    """The chain with 3 bytes of computed content: the credit for writes."""

    def computed_bytes(self):
        return 3


def test_a_forced_ancestor_is_written_past_the_credit_a_decided_block_is_not():
    view = _SpentCredit()
    lazy = WriteSequencer(_hot_auto(lazy=True), "robust")
    assert lazy.evict(view, 3, node(1, 0, 10_000.0 - 100)) == [3]
    view.on_ssd.add(3)
    lazy.written(AdmissionEvent.EVICT, 3)  # block 3's write used the whole credit
    # block 2 completes block 3's write: without it block 3's SSD copy has no prefix
    assert lazy.evict(view, 2, node(0, 0, 10_000.0)) == [2]
    assert lazy.stats.closure_forced == 1 and lazy.stats.closure_past_credit == 1 and lazy.stats.credit_refused == 0
    view.on_ssd.add(2)
    lazy.written(AdmissionEvent.EVICT, 1)
    hot = WriteSequencer(_hot_auto(lazy=True), "robust")  # a decided write past the credit is refused
    hot.written(AdmissionEvent.EVICT, 3)
    assert hot.evict(view, 1, node(1, 0, 10_000.0 - 100)) is None and hot.stats.credit_refused == 1


class _HybridChain(ChainView):
    """Blocks 1 <- 2 <- 3 of a hybrid model: only block 3 carries a state checkpoint."""

    hybrid = True

    def has_checkpoint(self, key):
        return key == 3


def test_with_lazy_hybrid_a_closure_starts_at_a_checkpoint_and_forces_ancestors_without_one():
    view = _HybridChain()
    for eager in (WriteSequencer(make_admission_policy("eviction:E2"), "robust"),
                  WriteSequencer(_hot_auto(lazy=True), "robust")):  # auto_lazy_hybrid off: eager on hybrids
        assert eager.write_floor(view, AdmissionEvent.EVICT)[2]  # drivers need not ask about blocks without one
    assert eager.evict(view, 3, node(1, 0, 10_000.0 - 100)) == [3, 2, 1]
    lazy = WriteSequencer(_hot_auto(lazy=True, lazy_hybrid=True), "robust")
    assert not lazy.write_floor(view, AdmissionEvent.EVICT)[2]  # every block: any may be a forced ancestor
    assert lazy.evict(view, 2, node(1, 0, 10_000.0 - 100)) is None  # hot, but no checkpoint: starts no write
    assert lazy.evict(view, 3, node(1, 0, 10_000.0 - 100)) == [3]
    view.on_ssd.add(3)
    assert lazy.evict(view, 2, node(0, 0, 10_000.0)) == [2] and lazy.stats.closure_forced == 1
