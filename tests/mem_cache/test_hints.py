"""Agents' hints (issue 26): an ended session's blocks are never written and leave SSD first; a block
whose session returns after DRAM gave it up is written at that eviction; blocks a session went on
without are not written while no request uses them, though ``auto`` still learns from them; hints are
bounded."""

from sglang_saria.mem_cache.admission import AdmissionEvent
from sglang_saria.mem_cache.auto import LoadAwareAdmission, LoadParams
from sglang_saria.mem_cache.hints import AgentHints, HintLimits
from sglang_saria.mem_cache.learned import LearnedAdmission
from sglang_saria.mem_cache.metadata import ContextNode
from sglang_saria.mem_cache.sequencer import WriteSequencer
from tests.mem_cache.helpers import ChainView, FlatView
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder


def _sequencer() -> tuple[WriteSequencer, AgentHints]:
    auto = LoadAwareAdmission(LoadParams())  # idle: theta_E 2
    auto.on_load(0.0, 0.0)
    return WriteSequencer(auto, "robust"), auto.hints


def test_an_ended_sessions_blocks_are_never_written():
    seq, hints = _sequencer()
    node = ContextNode(0.0, False)
    node.E = 5
    assert seq.evict(FlatView(), 1, node) == [1]
    hints.session_end([1])
    assert seq.evict(FlatView(), 1, node) is None and hints.counts["skipped_writes"] == 1
    hints.used([1])  # a request uses the block again: it is live
    assert seq.evict(FlatView(), 1, node) == [1]


def test_a_block_whose_session_returns_is_written_at_its_first_eviction():
    seq, hints = _sequencer()
    node = ContextNode(0.0, False)
    assert seq.evict(FlatView(), 7, node) is None  # idle auto writes at E2
    hints.on_clock(100.0)
    hints.expect_return([7], after_s=30.0)
    assert seq.evict(FlatView(), 7, node) == [7] and hints.counts["hinted_writes"] == 1
    assert seq.admission.thresholds(AdmissionEvent.EVICT)[1] <= 1  # the core asks for E1 blocks while hints wait
    hints.on_clock(131.0)  # past its return: no longer a reason
    assert seq.evict(FlatView(), 7, node) is None


def test_hints_are_bounded_and_a_return_is_capped():
    hints = AgentHints(HintLimits(max_keys=3, max_return_s=60.0))
    hints.expect_return([1, 2], after_s=10**9)
    hints.session_end([3, 4])
    assert len(hints) == 3 and hints.counts["dropped"] == 1
    hints.on_clock(59.0)
    assert hints.returns_later(2)
    hints.on_clock(61.0)
    assert not hints.returns_later(2)


def test_ended_blocks_become_the_first_ssd_victims_tail_first():
    order = SSDVictimOrder()
    for k in (1, 2, 3, 10, 11, 12):
        order.written(k)
    assert order.demote([10, 11, 12, 99]) == 3  # a prefix, head first; 99 is not held
    assert order.order() == [12, 11, 10, 1, 2, 3]


def test_a_block_its_session_left_behind_is_not_written_but_auto_still_counts_it_seen():
    auto = LearnedAdmission()
    auto.on_load(100.0, 0.0)  # a queued GPU: the bar is low enough for a class never seen reused
    seq, hints = WriteSequencer(auto, "robust"), auto.hints
    node = ContextNode(0.0, False)
    assert seq.evict(ChainView(), 1, node) == [1]
    seen = sum(auto.seen)
    hints.left_behind([2, 3])
    assert hints.is_left_behind(2) and hints.counts["left_behind"] == 1
    assert seq.evict(ChainView(), 2, node) is None and hints.counts["left_skipped_writes"] == 1
    assert sum(auto.seen) == seen + 1 and 2 in auto.ghost  # tracked: a later want of it teaches its class
    hints.used([3])  # a request uses it again: live
    assert not hints.is_left_behind(3) and seq.evict(ChainView(), 3, node) == [3]


def test_left_behind_blocks_share_the_hints_bound():
    hints = AgentHints(HintLimits(max_keys=3))
    hints.session_end([1])
    hints.left_behind([2, 3, 4])
    assert len(hints) == 3 and hints.counts["dropped"] == 1
    assert not hints.is_left_behind(2) and hints.is_left_behind(4)  # the oldest of the largest kind went
    hints.left_behind([4])  # nothing new: not counted as another hint
    assert hints.counts["left_behind"] == 1
