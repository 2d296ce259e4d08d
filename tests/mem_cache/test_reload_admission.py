"""Reload admission (mem_cache/reload_admission.py) against a model of SGLang's admission rule
(replay/device.py: `add_one_req`'s ``extend + max_new + page < free + evictable - reserve``, the
first request that does not fit ends the loop): over arrival orders and pool sizes, the rule
never deadlocks and never evicts a reloaded tail before its request is admitted; claiming
whenever the pool allows deadlocks (tails held to the prefill) or wastes reloads (held a step)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sglang_saria.mem_cache.reload_admission import (
    Holders,
    ReloadDemand,
    admission_need,
    admits,
    Throughput,
    claim_order,
    fits_alone,
    waiting_pays,
)
from sglang_saria.replay.device import DevicePool, DeviceRequest

PAGE = 16


def test_need_and_rule_are_sglangs_strict_check() -> None:
    # 800-token prompt, 784 on the device, 8 new tokens: 16 + 8 + one page.
    assert admission_need(800, 784, 8, PAGE) == 40
    d = ReloadDemand("a", tokens=480, need=40, position=0)
    assert admits(room=521, held_need=0, demand=d)  # 521 - 480 = 41 > 40
    assert not admits(room=520, held_need=0, demand=d)  # SGLang admits on total < remaining
    assert not admits(room=600, held_need=81, demand=d)  # the holders' needs come first
    ahead = ReloadDemand("a", tokens=480, need=40, position=2, ahead=81)
    assert not admits(room=600, held_need=0, demand=ahead)  # so do the requests ahead in the queue
    assert admits(room=602, held_need=0, demand=ahead)
    assert fits_alone(521, d) and not fits_alone(520, d)


def test_claim_order_is_queue_position_then_value() -> None:
    first = ReloadDemand("late-arrival-first-in-queue", 100, 50, position=0)
    small = ReloadDemand("b", 100, 300, position=1)
    big = ReloadDemand("c", 600, 20, position=1)
    assert [d.rid for d in claim_order([big, small, first])] == [first.rid, big.rid, small.rid]


def test_holders_ledger() -> None:
    holders = Holders()
    holders.hold(ReloadDemand("a", 100, 40, 0))
    holders.hold(ReloadDemand("b", 100, 60, 1))
    assert holders.held_need() == 100 and "a" in holders
    assert holders.release("a") and not holders.release("a")
    assert holders.held_need() == 60


def _sessions(n: int, stored: int, uncached: int = 16, max_new: int = 8) -> list[DeviceRequest]:
    return [DeviceRequest(f"s{i}", 0, stored, uncached, max_new) for i in range(n)]


def test_greedy_claims_held_to_prefill_deadlock() -> None:
    """The issue's case: two reloads lock 1,264 of 1,280 tokens, neither request admissible."""
    run = DevicePool(1280, claims="greedy", hold="prefill").run(_sessions(2, 632), max_steps=500)
    assert run.deadlocked and not run.admitted


def test_greedy_claims_held_one_step_waste_reloads() -> None:
    """Before the rule: each claim evicts the tail the previous reload published."""
    sessions = _sessions(4, 500, uncached=200)
    run = DevicePool(1280, claims="greedy", hold="step").run(sessions, max_steps=500)
    assert not run.deadlocked
    assert run.wasted > 0
    assert sum(run.reused.values()) < 4 * 500
    ruled = DevicePool(1280).run(sessions, max_steps=500)
    assert ruled.wasted == 0 and sum(ruled.reused.values()) == 4 * 500


def test_rule_serves_every_session_its_reload() -> None:
    for sessions in (1, 2, 3, 4, 8):
        run = DevicePool(1280).run(_sessions(sessions, 632), max_steps=5_000)
        assert not run.deadlocked, sessions
        assert run.wasted == 0
        assert run.reused == {f"s{i}": 632 for i in range(sessions)}


@st.composite
def workloads(draw: st.DrawFn, plain: bool) -> tuple[int, list[DeviceRequest]]:
    capacity = draw(st.integers(128, 2048))
    n = draw(st.integers(1, 8))
    requests = []
    for i in range(n):
        # Every request fits an empty pool (SGLang rejects a longer one at its input check).
        max_new = draw(st.integers(1, 32))
        uncached = draw(st.integers(1, min(200, capacity - PAGE - max_new - 2)))
        top = capacity - PAGE - max_new - uncached - 1
        stored = draw(st.integers(0 if plain else 1, top))
        requests.append(DeviceRequest(f"r{i}", draw(st.integers(0, 6)), stored, uncached, max_new))
    return capacity, requests


@settings(max_examples=300, deadline=None)
@given(workloads(plain=False), st.integers(1, 3))
def test_rule_never_deadlocks_nor_wastes(workload: tuple[int, list[DeviceRequest]], read_steps: int) -> None:
    """Only reloading requests (every session after a restart), any arrival order and pool size:
    all finish, no tail is evicted before its request, each request reuses all it reloaded."""
    capacity, requests = workload
    run = DevicePool(capacity, read_steps=read_steps).run(requests, max_steps=20_000)
    assert not run.deadlocked
    assert run.wasted == 0
    assert run.refused == 0
    assert run.reused == {r.rid: r.stored for r in requests}


@settings(max_examples=300, deadline=None)
@given(workloads(plain=True), st.integers(1, 3))
# Deadlocked before the rule counted the requests ahead that wait for no reload: r3's claim took
# the room r0 (ahead of it, recomputing) needed, and r0 stopped the loop before r3.
@example((128, [DeviceRequest("r0", 2, 0, 12, 1), DeviceRequest("r1", 0, 0, 1, 1), DeviceRequest("r2", 1, 0, 1, 1),
                DeviceRequest("r3", 2, 99, 1, 2)]), 1)
def test_rule_with_plain_requests_never_deadlocks_nor_wastes(workload: tuple[int, list[DeviceRequest]], read_steps: int) -> None:
    """Mixed with requests that reload nothing, holds without a deadline: all finish (the
    requests ahead of a reload in the queue keep their room), no tail is evicted unused."""
    capacity, requests = workload
    run = DevicePool(capacity, read_steps=read_steps).run(requests, max_steps=20_000)
    assert not run.deadlocked
    assert set(run.finished) == {r.rid for r in requests}
    assert run.wasted == 0


@settings(max_examples=200, deadline=None)
@given(workloads(plain=False), st.integers(1, 20), st.floats(1.0, 400.0))
# Deadlocked while a reload given up left the ledger: r5 recomputing ahead of r4, whose claim
# locked the memory r5 needed.
@example((767, [DeviceRequest("r0", 0, 1, 1, 1), DeviceRequest("r1", 0, 647, 1, 1), DeviceRequest("r2", 0, 1, 1, 1),
                DeviceRequest("r3", 0, 1, 1, 1), DeviceRequest("r4", 1, 409, 1, 1), DeviceRequest("r5", 0, 200, 163, 6),
                DeviceRequest("r6", 0, 1, 1, 1), DeviceRequest("r7", 0, 1, 1, 1)]), 2, 178.0)
def test_rule_weighing_reads_never_deadlocks_nor_wastes(workload: tuple[int, list[DeviceRequest]],
                                                        read_steps: int, prefill_tps: float) -> None:
    """With prefill taking time and reloads held back giving up when their read is slower:
    all finish, nothing reloaded is evicted unused, each request reuses all it reloaded or
    (given up) nothing."""
    capacity, requests = workload
    run = DevicePool(capacity, read_steps=read_steps, prefill_tps=prefill_tps).run(requests, max_steps=50_000)
    assert not run.deadlocked
    assert run.wasted == 0 and run.refused == 0
    assert all(run.reused[r.rid] in (0, r.stored) for r in requests)
    assert sum(1 for r in requests if run.reused[r.rid] == 0) == run.gave_up


def test_waiting_pays_compares_read_with_compute() -> None:
    assert waiting_pays(480, read_tps=2000.0, prefill_tps=1000.0)
    assert not waiting_pays(480, read_tps=1000.0, prefill_tps=2000.0)
    assert waiting_pays(480, None, 2000.0) and waiting_pays(480, 1000.0, None)  # unknown: wait


def test_throughput_weighs_observations_by_tokens() -> None:
    rate = Throughput()
    assert rate.tps() is None
    rate.add(1, 0.5)  # a warm-up prefill: its fixed cost is all there is of it
    rate.add(1000, 0.5)
    assert 1900 < rate.tps() < 2000
    rate.add(0, 1.0)  # nothing prefilled: no observation
    assert 1900 < rate.tps() < 2000


def test_slow_reads_give_up_and_the_last_session_finishes_sooner() -> None:
    """8 demo sessions; reads 20 steps for 480 tokens (24/step), prefill 30 tokens/step: the
    reloads held back recompute, and the last session finishes before it would waiting; with
    reads 5 steps (96/step) nothing gives up."""
    sessions = _sessions(8, 480, uncached=228)
    slow = {c: DevicePool(1280, claims=c, read_steps=20, prefill_tps=30).run(sessions) for c in ("rule", "rule-wait")}
    assert slow["rule"].gave_up == 7 and slow["rule-wait"].gave_up == 0
    assert max(slow["rule"].finished.values()) < max(slow["rule-wait"].finished.values())
    assert slow["rule"].wasted == slow["rule-wait"].wasted == 0
    fast = DevicePool(1280, read_steps=5, prefill_tps=30).run(sessions)
    assert fast.gave_up == 0 and sum(fast.reused.values()) == 8 * 480


def test_bad_mode_is_named() -> None:
    with pytest.raises(ValueError, match="claims='fifo'"):
        DevicePool(1280, claims="fifo")


def test_compare_table_at_scale_shows_the_rule_keeps_every_reload():
    from sglang_saria.replay.device import compare

    rows = {(r["sessions"], r["claims"], r["hold"]): r for r in compare(1280, [4, 64], 480, 228, 8)}
    for n in (4, 64):
        assert rows[n, "greedy", "step"]["wasted"] > 0
        rule = rows[n, "rule", "prefill"]
        assert rule["reused"] == rule["stored"] == n * 480 and rule["wasted"] == 0 and not rule["deadlocked"]
    naive = compare(1280, [2], 632, 16, 8, max_steps=500)
    assert {(r["claims"], r["hold"]): r["deadlocked"] for r in naive}[("greedy", "prefill")]
