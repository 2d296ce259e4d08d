"""Tiers and pluggable eviction: admission and eviction are separate concerns."""

import pytest

from sglang_saria.replay.core import SariaCore
from sglang_saria.mem_cache.eviction import make_eviction
from sglang_saria.mem_cache.metadata import DRAM, SSD
from sglang_saria.replay.tiers import Tier

from tests.mem_cache.helpers import make_core, run_request


def test_lru_and_fifo_orders():
    for name, expect in (("lru", [2, 3, 1]), ("fifo", [1, 2, 3])):
        t = Tier(DRAM, 100, make_eviction(name))
        for k in (1, 2, 3):
            t.insert(k, 10, 100)
        t.access(1)
        assert list(t.victims()) == expect and t.victim() == expect[0]
    with pytest.raises(ValueError, match="lru"):
        make_eviction("arc")


def test_tier_accounting_and_writes_never_read():
    t = Tier(SSD, 30)
    t.insert(1, 10, 100)
    t.insert(2, 10, 100)
    with pytest.raises(ValueError, match="exceeds free"):
        t.insert(3, 11, 100)
    with pytest.raises(KeyError, match="already resident"):
        t.insert(1, 10, 100)
    t.read(1, 100)
    t.read(1, 100)  # a second read of the same write does not count it twice
    assert (t.bytes_written, t.bytes_read, t.bytes_written_then_read) == (200, 200, 100)
    assert t.writes_never_read_frac == 0.5
    t.remove(2)
    assert t.used_tokens == 10 and t.evictions == 1 and t.writes_never_read_frac == 0.5


def test_a_state_pool_counts_slots_apart_from_tokens():
    t = Tier(DRAM, 30, capacity_states=1)
    t.insert(1, 10, 100, state=True)
    assert t.states_full and t.used_tokens == 10
    with pytest.raises(ValueError, match="no free state slot"):
        t.insert(2, 10, 100, state=True)
    t.insert(2, 10, 100)  # an FA block alone needs no slot
    t.remove(1)
    assert not t.states_full and t.used_tokens == 10
    with pytest.raises(ValueError, match="no free state slot of 0"):
        Tier(DRAM, 30).insert(1, 10, 100, state=True)  # no pool: states count in the tokens
    assert not Tier(DRAM, 30).states_full


def test_zero_capacity_ssd_never_receives_writes():
    core = make_core("full-duplicate", ssd_blocks=0)
    _, _, acts = run_request(core, [1, 2], 0.0)
    assert acts.ssd_writes == [] and core.ssd.bytes_written == 0


def test_eviction_policy_is_chosen_independently_of_admission():
    base = make_core("full-duplicate", dram_blocks=2)
    core = SariaCore(base.cfg, base.spec, dram_eviction="fifo")
    run_request(core, [1], 0.0)
    run_request(core, [2], 1.0)
    run_request(core, [1], 2.0)  # a DRAM hit: LRU would protect 1, FIFO does not
    _, _, acts = run_request(core, [3], 3.0)
    assert acts.dram_evictions == [1]
