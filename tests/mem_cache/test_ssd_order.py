"""The shared SSD victim order (mem_cache/ssd_order.py)."""

from __future__ import annotations

from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from tests.mem_cache.helpers import make_core, run_request


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
