"""The shared SSD victim order and promotion sizing (mem_cache/ssd_order.py, WriteSequencer.promotion_set)."""

from __future__ import annotations

from sglang_saria.mem_cache.admission import make_admission_policy
from sglang_saria.mem_cache.metadata import ContextNode
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.mem_cache.sequencer import WriteSequencer
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from tests.core.helpers import make_core, run_request


def test_prefix_touched_deepest_first_head_goes_last():
    order = SSDVictimOrder()
    for k in "abcxy":
        order.written(k)
    order.touch_prefix(["a", "b", "c"])  # one reload of the prefix a-b-c, head first
    assert order.order() == ["x", "y", "c", "b", "a"]
    order.written("x")  # a rewrite of a held key is a touch
    assert order.order() == ["y", "c", "b", "a", "x"]
    assert order.victim() == "y" and order.victim(pinned={"y", "c"}) == "b"
    order.remove("y")
    assert "y" not in order and len(order) == 4


def test_fifo_order_ignores_touches_and_empty_order_has_no_victim():
    order = SSDVictimOrder("fifo")
    assert order.victim() is None
    for k in (1, 2, 3):
        order.written(k)
    order.touch_prefix([1, 2])
    assert order.order() == [1, 2, 3] and order.name == "fifo"


def test_replay_core_ssd_tier_uses_the_order_and_reads_touch_deepest_first():
    core = make_core("full-duplicate", dram_blocks=1, ssd_blocks=4)
    assert core.ssd.eviction is core.ssd_order
    run_request(core, [1, 2, 3], 0.0)  # written 3, 2, 1 (deepest first): 1 most recent
    run_request(core, [9], 1.0)  # pushes the prefix out of DRAM
    assert core.ssd_order.order() == [3, 2, 1, 9]
    plan, _, _ = run_request(core, [1, 2], 2.0)  # SSD hits 1, 2
    assert plan.ssd_blocks == 2
    assert core.ssd_order.order()[-2:] == [2, 1]  # head most recent


def _seq(rule="robust"):
    return WriteSequencer(make_admission_policy("eviction:E2"), rule)


CTRL = PromotionController("full", 1.0, 60.0, 1.0)
SAR = PromotionController("saria", 1.0, 60.0, 1.0)


def _node(t_reuse):
    n = ContextNode(t_reuse, False, -1)
    return n


def test_promotion_set_target_free_space_and_displaceable_head():
    seq = _seq()
    # target ceil(1.0 * 4) - 1 in DRAM = 3 candidates; free space for all
    assert seq.promotion_set(CTRL, 100.0, 4, 1, [1, 1, 1], 5, iter(())) == 3
    # no free space: the head's first victim may go (old, on SSD), the second is protected (saria: reused 10 s ago)
    head = [(_node(0.0), True, 2), (_node(90.0), True, 4)]
    assert seq.promotion_set(SAR, 100.0, 3, 0, [1, 1, 1], 0, iter(head)) == 2
    # robust rule: a victim not on SSD is the only copy, never displaced
    assert seq.promotion_set(SAR, 100.0, 3, 0, [1, 1, 1], 0, iter([(_node(0.0), False, 4)])) == 0
    assert _seq("paper").promotion_set(SAR, 100.0, 3, 0, [1, 1, 1], 0, iter([(_node(0.0), False, 4)])) == 3
    # unknown counters (a node the policy never saw): displaceable
    assert seq.promotion_set(SAR, 100.0, 2, 0, [1, 1], 1, iter([(None, False, 1)])) == 2
    # sizes cut the leading run: the second candidate (a checkpoint node) does not fit
    assert seq.promotion_set(CTRL, 100.0, 3, 0, [1, 5, 1], 3, iter(())) == 1


def test_promotion_set_reads_the_head_lazily():
    seq = _seq()
    taken = []

    def head():
        for i in range(100):
            taken.append(i)
            yield _node(0.0), True, 1

    assert seq.promotion_set(SAR, 100.0, 3, 0, [1, 1, 1], 1, head()) == 3
    assert taken == [0, 1]  # stops once the need is covered
    taken.clear()
    assert seq.promotion_set(SAR, 100.0, 3, 0, [1, 1, 1], 3, head()) == 3
    assert taken == []  # free space is enough: no head read
