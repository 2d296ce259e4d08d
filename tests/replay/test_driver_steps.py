"""The replay driver's steps one at a time: issue, admit, transfer done, compute done, loop, result."""

import json

import pytest

from sglang_saria.replay.driver import ReplayRun, ReplaySettings, replay
from sglang_saria.replay.trace import TraceSession
from tests.replay.test_driver import BT, SPEC, _workload, cfg, req

PREFILL_TPS = 6500.0


def pending(run: ReplayRun) -> list[tuple[float, object]]:
    """The run's pending events as (time, payload), in the order they will run."""
    return [(t, payload) for t, _, _, payload in sorted(run.events.heap)]


def test_a_run_starts_with_each_nonempty_sessions_first_issue():
    sessions = [TraceSession("a", [req(1, 2)]), TraceSession("empty", []), TraceSession("b", [req(100, 1)])]
    run = ReplayRun(sessions, [5.0, 1.0, 2.0], cfg(), SPEC, ReplaySettings())
    assert pending(run) == [(2.0, (2, 0)), (5.0, (0, 0))]


def test_issue_admits_while_a_slot_is_free_then_waits_fifo_with_its_issue_time():
    sessions = [TraceSession(str(i), [req(100 * i, 2)]) for i in range(4)]
    run = ReplayRun(sessions, [0.0] * 4, cfg(), SPEC, ReplaySettings(in_flight=1, horizon_s=100.0))
    run.issue(0, 0, 0.0)
    run.issue(1, 0, 1.0)
    run.issue(2, 0, 2.0)
    run.issue(3, 0, 100.5)  # past the horizon in logical time: it exists, so it waits like the others
    assert run.in_flight == 1 and list(run.active) == [0]
    assert list(run.waiting) == [(1, 0, 1.0), (2, 0, 2.0), (3, 0, 100.5)]


def test_a_cold_request_skips_the_transfer_and_queues_its_whole_input_for_prefill():
    s = TraceSession("a", [req(1, 3, extra_tokens=100)])
    run = ReplayRun([s], [0.0], cfg(), SPEC, ReplaySettings(prefill_tokens_per_s=PREFILL_TPS))
    run.events.heap.clear()
    run.admit(0, 0, 7.0, 7.0)
    a = run.active[0]
    assert (a.computed_tokens, a.achievable, a.transfer_done_t) == (3 * BT + 100, 0, 7.0)
    assert run.block_events == 3 and run.coord.active == []
    prefill = (3 * BT + 100) / PREFILL_TPS
    assert pending(run) == [(7.0 + prefill, 0)]
    assert run.gpu_busy == prefill


def test_prefills_run_one_after_another_on_the_one_gpu():
    sessions = [TraceSession(str(i), [req(100 * i, 2)]) for i in range(2)]
    run = ReplayRun(sessions, [0.0, 0.0], cfg(), SPEC, ReplaySettings(prefill_tokens_per_s=PREFILL_TPS))
    run.events.heap.clear()
    run.admit(0, 0, 0.0, 0.0)
    run.admit(1, 0, 0.0, 0.0)
    c = 2 * BT / PREFILL_TPS
    assert pending(run) == [(c, 0), (2 * c, 1)]
    run.transfer_done(0, 10.0)  # a GPU idle since 2c starts the next prefill when its transfer ends
    assert pending(run)[-1] == (10.0 + c, 0)


def test_a_sessions_next_request_reuses_its_prefix_key_objects_and_counts_seen_blocks_achievable():
    a = TraceSession("a", [req(1, 2), req(1, 4)])
    b = TraceSession("b", [req(1, 3)])  # shares a's first two blocks
    run = ReplayRun([a, b], [0.0, 0.0], cfg(), SPEC, ReplaySettings())
    keys0, ach0 = run.keys.build(0, 0)
    keys1, ach1 = run.keys.build(0, 1)
    assert (len(keys0), ach0, len(keys1), ach1) == (2, 0, 4, 2)
    assert all(k1 is k0 for k0, k1 in zip(keys0, keys1))
    keys_b, ach_b = run.keys.build(1, 0)
    assert keys_b == keys1[:3] and ach_b == 3  # every block of b was in a's second request


def test_compute_done_logs_the_request_schedules_the_sessions_next_and_admits_a_waiter():
    a = TraceSession("a", [req(1, 2), req(1, 3, idle=10.0)])
    b = TraceSession("b", [req(100, 2)])
    run = ReplayRun([a, b], [0.0, 0.0], cfg(), SPEC, ReplaySettings(in_flight=1))
    run.events.heap.clear()
    run.issue(0, 0, 0.0)
    run.issue(1, 0, 0.5)
    run.events.heap.clear()
    run.compute_done(0, 1.0)
    assert len(run.log) == 1 and run.log.ttft_s == [1.0] and run.log.done_s == [1.0]
    assert run.end_t == 1.0
    assert list(run.waiting) == [] and list(run.active) == [1] and run.active[1].admit_t == 1.0
    assert run.active[1].issue_t == 0.5 and run.log.queue_s == [0.0]  # b waited 0.5 s for a's slot
    assert run.in_flight == 1
    assert pending(run) == [(1.0 + 2 * BT / PREFILL_TPS, 1), (11.0, (0, 1))]


def test_loop_then_result_is_what_replay_returns():
    sessions, starts = _workload()
    c = cfg("eviction:E2", dram=8 * BT, ssd=40 * BT)
    run = ReplayRun(sessions, starts, c, SPEC, ReplaySettings())
    assert run.loop() is False
    stepwise = run.result("E2")
    whole = replay(sessions, starts, c, SPEC, label="E2")
    assert json.dumps(stepwise.metrics) == json.dumps(whole.metrics)
    assert (stepwise.end_time_s, stepwise.block_events, stepwise.gpu_busy_s) == (whole.end_time_s, whole.block_events, whole.gpu_busy_s)
    assert stepwise.log.ttft_s == whole.log.ttft_s and not run.active and not run.waiting


def test_invalid_settings_are_rejected_before_the_run_is_built():
    with pytest.raises(ValueError, match="in_flight"):
        ReplayRun([TraceSession("a", [req(1, 1)])], [0.0], cfg(), SPEC, ReplaySettings(in_flight=0))
