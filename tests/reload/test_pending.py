"""The pending-reload state machine (reload/pending.py) without SGLang: a fake adapter holds
the device pool, the locks and the ranks; jobs are finished by hand, as the worker would."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pytest
import torch

from sglang_saria.mem_cache.metadata import SSD
from sglang_saria.mem_cache.reload_admission import ReloadDemand, admits
from sglang_saria.reload.pending import (GIVE_UP_FIRST_S, HOLD_AND_WAIT_S, PendingReload, PendingReloads, publishable,
                                         reload_job)
from sglang_saria.reload.plan import PageObjects, plan_pages
from sglang_saria.reload.worker import ReloadJob

PAGE = 4
PAGE_BYTES = 64


@dataclass
class Request:
    rid: str


@dataclass
class FakeHost:
    """SGLang's side: ``free`` device slots and ``states`` mamba slots, locks, ranks, a clock."""

    free: int = 64
    capacity: int = 128
    states: int = 2
    needs: dict = field(default_factory=dict)  # request id -> its admission need (default 1)
    queue: list = field(default_factory=list)  # SGLang's waiting queue, where it differs from arrival
    clock: float = 0.0
    prefill: Optional[float] = None  # measured prefill tokens per second (None: not yet)
    loading_anchors: set = field(default_factory=set)
    peer_done: bool = True  # the other ranks have finished too
    next_slot: int = 0
    submitted: list[ReloadJob] = field(default_factory=list)
    published: list[str] = field(default_factory=list)
    freed_slots: int = 0
    freed_states: int = 0
    unlocked: list[str] = field(default_factory=list)
    resumed: list[tuple[str, object]] = field(default_factory=list)  # followers told to probe again

    def reload_demands(self, pendings: list[PendingReload], tokens: list[int]) -> list[ReloadDemand]:
        queue = {rid: i for i, rid in enumerate(self.queue)}
        return [ReloadDemand(p.rid, n, self.needs.get(p.rid, 1), queue.get(p.rid, i))
                for i, (p, n) in enumerate(zip(pendings, tokens))]

    def device_capacity(self) -> int:
        return self.capacity

    def claim_reload(self, pending: PendingReload, demand: ReloadDemand, held_need: int) -> Optional[torch.Tensor]:
        need_state, tokens = pending.state_key is not None, demand.tokens
        # The fake pool's room: its free slots and one (nothing evictable, no decode reserve),
        # so with the default need of 1 a reload may take every free slot when it holds alone.
        if not admits(self.free + 1, held_need, demand) or (need_state and not self.states):
            return None
        self.free -= tokens
        slots = torch.arange(self.next_slot, self.next_slot + tokens)
        self.next_slot += tokens
        pending.path_lock = "path"
        if need_state:
            self.states -= 1
            pending.state_slot = torch.tensor([7])
        return slots

    def submit_reload(self, pending: PendingReload, slots: torch.Tensor) -> ReloadJob:
        job = reload_job(pending, slots, PAGE, PAGE_BYTES)
        self.submitted.append(job)
        return job

    def publish_reload(self, pending: PendingReload) -> None:
        landed = (pending.tail_dram_pages + pending.job.pages) * PAGE
        self.free_reload_slots(pending.job.slots[landed:])
        self.published.append(pending.rid)

    def free_reload_slots(self, slots: torch.Tensor) -> None:
        self.free += slots.numel()
        self.freed_slots += slots.numel()

    def free_reload_state(self, slot: torch.Tensor) -> None:
        self.states += 1
        self.freed_states += 1

    def unlock_reload(self, pending: PendingReload) -> None:
        self.unlocked.append(pending.rid)

    def reload_loading(self, pending: PendingReload) -> bool:
        return pending.anchor in self.loading_anchors

    def all_ranks_done(self, done: list[bool]) -> list[bool]:
        return [d and self.peer_done for d in done]

    def step_clock(self) -> float:
        return self.clock

    def prefill_tps(self) -> Optional[float]:
        return self.prefill

    def resume_follower(self, rid: str, context: object) -> None:
        self.resumed.append((rid, context))


@dataclass
class Metrics:
    fallbacks: list[str] = field(default_factory=list)
    inflight: list[int] = field(default_factory=list)

    def reload_fallback(self, reason: str) -> None:
        self.fallbacks.append(reason)

    def reload_inflight(self, tokens: int) -> None:
        self.inflight.append(tokens)


def pending(rid: str, pages: int, deadline: float = 10.0, state: bool = False) -> PendingReload:
    objects = [PageObjects(i, SSD) for i in range(pages)]
    return PendingReload(
        request=Request(rid), anchor=f"node-{rid}", key=None, start=0, host_tokens=0,
        page_hashes=[f"{rid}-{i}" for i in range(pages)], plan=plan_pages(objects, "saria", hybrid=False),
        host_lock="host", deadline=deadline, state_key=f"{rid}-{pages - 1}" if state else None,
    )


def finish(job: ReloadJob, pages: Optional[int] = None, reason: str = "", state_loaded: bool = False) -> None:
    """What the worker writes when a job ends."""
    job.pages = len(job.page_hashes) if pages is None else pages
    job.reason, job.state_loaded = reason, state_loaded
    job._done.set()


def run_to_end(reloads: PendingReloads, host: FakeHost, p: PendingReload, **ended) -> ReloadJob:
    """``p`` tracked and started, its job ended as ``ended`` says (`finish`), then one step."""
    reloads.track(p)
    reloads.start_deferred(cap=1000)
    job = host.submitted[-1]
    finish(job, **ended)
    reloads.advance("wait_complete")
    return job


@pytest.fixture
def machine() -> tuple[PendingReloads, FakeHost, Metrics]:
    host, metrics = FakeHost(), Metrics()
    return PendingReloads(host, metrics, PAGE), host, metrics


def test_a_reload_is_claimed_then_advanced_then_published(machine):
    reloads, host, metrics = machine
    reloads.track(pending("a", 3))
    assert "a" in reloads and reloads.inflight_tokens == 0  # nothing held before the next step
    reloads.start_deferred(cap=1000)
    (job,) = host.submitted
    assert job.page_hashes == ["a-0", "a-1", "a-2"] and reloads.inflight_tokens == 12 and host.free == 52
    reloads.advance("wait_complete")
    assert "a" in reloads and host.published == []  # the worker is still reading
    finish(job)
    reloads.advance("wait_complete")
    assert host.published == ["a"] and "a" not in reloads
    assert reloads.inflight_tokens == 0 and metrics.inflight[-1] == 0 and metrics.fallbacks == []


def test_a_partial_load_publishes_its_leading_pages_and_frees_the_rest(machine):
    reloads, host, _ = machine
    run_to_end(reloads, host, pending("a", 4), pages=1, reason="io_error")
    assert host.published == ["a"] and host.freed_slots == 3 * PAGE and host.free == 60


def test_a_load_with_no_page_is_released_with_the_stores_reason(machine):
    reloads, host, metrics = machine
    run_to_end(reloads, host, pending("a", 2), pages=0, reason="corrupt")
    assert host.published == [] and metrics.fallbacks == ["store_corrupt"]
    assert host.free == 64 and host.unlocked == ["a"] and reloads.inflight_tokens == 0


def test_a_release_while_the_worker_runs_is_abandoned_until_its_job_ends(machine):
    reloads, host, metrics = machine
    reloads.track(pending("a", 2))
    reloads.start_deferred(cap=1000)
    job = host.submitted[0]
    reloads.abort("a")
    assert job.stopping and metrics.fallbacks == ["aborted"] and "a" not in reloads
    reloads.reap()
    assert host.freed_slots == 0 and host.unlocked == [] and reloads.inflight_tokens == 8  # the worker may still write
    finish(job, pages=1, reason="stopped")
    reloads.reap()
    assert host.freed_slots == 8 and host.unlocked == ["a"] and reloads.inflight_tokens == 0 and not reloads.abandoned


def test_the_in_flight_cap_holds_a_second_reload_back_in_arrival_order(machine):
    reloads, host, _ = machine
    for rid in ("a", "b", "c"):
        reloads.track(pending(rid, 2))
    reloads.start_deferred(cap=8)
    assert [j.rid for j in host.submitted] == ["a"] and reloads.deferred == ["b", "c"]
    finish(host.submitted[0])
    reloads.advance("wait_complete")
    reloads.start_deferred(cap=8)
    assert [j.rid for j in host.submitted] == ["a", "b"] and reloads.deferred == ["c"]


def test_a_reload_larger_than_the_cap_still_starts_when_nothing_else_is_in_flight(machine):
    reloads, host, _ = machine
    reloads.track(pending("a", 5))
    reloads.start_deferred(cap=8)
    assert [j.rid for j in host.submitted] == ["a"] and reloads.inflight_tokens == 20


def test_a_reload_the_pool_cannot_take_waits_until_its_deadline_then_recomputes(machine):
    reloads, host, metrics = machine
    host.free = 4
    reloads.track(pending("a", 2, deadline=5.0))
    reloads.start_deferred(cap=1000)
    assert reloads.deferred == ["a"] and metrics.fallbacks == []
    host.clock = 6.0
    reloads.start_deferred(cap=1000)
    assert "a" not in reloads and metrics.fallbacks == ["device_memory"]
    assert host.unlocked == ["a"] and host.freed_slots == 0 and host.submitted == []


def test_a_stalled_scheduler_lets_reloads_behind_one_held_back_claim(machine):
    """Nothing runs and nothing reads: the first reload the rule holds back waits for nothing
    but a deadline (or `HOLD_AND_WAIT_S`), while one behind it may hold what it waits for (a
    follower's locked path)."""
    reloads, host, metrics = machine
    host.free = 12
    reloads.track(pending("a", 4))  # 16 tokens: more than the pool has now
    reloads.track(pending("b", 2))
    held_back = reloads.start_deferred(cap=1000)
    assert held_back.rid == "a" and host.submitted == []  # queue order: b waits behind a
    held_back = reloads.start_deferred(cap=1000, stalled=True)
    assert held_back.rid == "a" and [j.rid for j in host.submitted] == ["b"]
    assert reloads.deferred == ["a"] and metrics.fallbacks == []
    assert reloads.start_deferred(cap=1000, stalled=True).rid == "a"  # still waiting, nothing else claimed


def test_a_stall_no_claim_ends_gives_up_the_locked_reloads_behind_the_first(machine):
    """The first reload held back waits for room the followers behind it lock (the paths they
    resumed on), and none of them fits either: after `HOLD_AND_WAIT_S` of stalled passes with no
    claim, those followers are given up (their requests compute what they lack) and stay out of
    the ledger; a reload behind that locks nothing keeps waiting, and one step of stall (the
    overlap scheduler's) gives up nothing."""
    reloads, host, metrics = machine
    host.free = 12
    for rid, pages in (("a", 4), ("f", 4), ("g", 4), ("plain", 4)):
        reloads.track(pending(rid, pages))
    reloads.by_rid["f"].anchor_lock = reloads.by_rid["g"].anchor_lock = "published path"
    host.clock = 1.0
    assert reloads.start_deferred(cap=1000, stalled=True).rid == "a"
    host.clock = 1.5
    reloads.start_deferred(cap=1000, stalled=True)
    assert metrics.fallbacks == [] and reloads.deferred == ["a", "f", "g", "plain"]
    host.clock = 2.0
    assert reloads.start_deferred(cap=1000, stalled=True).rid == "a"
    assert metrics.fallbacks == ["stalled", "stalled"] and host.unlocked == ["f", "g"]
    assert reloads.deferred == ["a", "plain"] and reloads.holders.needs == {}
    host.clock = 4.0  # a pass that is not stalled starts the count again
    reloads.start_deferred(cap=1000)
    reloads.by_rid["plain"].anchor_lock = "published path"
    host.clock = 4.5
    reloads.start_deferred(cap=1000, stalled=True)
    assert metrics.fallbacks == ["stalled", "stalled"]


def test_a_stall_nothing_behind_can_break_gives_up_the_first_reload_held_back(machine):
    """No reload behind the first one locks a path, and no claim ends the stall: after
    `GIVE_UP_FIRST_S` (not `HOLD_AND_WAIT_S`: a loaded machine's slow steps are no stall) the
    first one is given up (`stalled`), not left to its 30 s memory deadline; its request
    recomputes and stays in the ledger (ahead of those behind it) until its prefill; the one
    behind it keeps its reload."""
    reloads, host, metrics = machine
    host.free = 12
    reloads.track(pending("a", 4))  # 16 tokens: more than the pool has now
    reloads.track(pending("b", 4))
    host.clock = 1.0
    assert reloads.start_deferred(cap=1000, stalled=True).rid == "a"
    for host.clock in (1.0 + HOLD_AND_WAIT_S, 1.0 + GIVE_UP_FIRST_S - 0.01):
        reloads.start_deferred(cap=1000, stalled=True)
        assert metrics.fallbacks == [] and reloads.deferred == ["a", "b"]
    host.clock = 1.0 + GIVE_UP_FIRST_S
    reloads.start_deferred(cap=1000, stalled=True)
    assert metrics.fallbacks == ["stalled"] and host.unlocked == ["a"]
    assert reloads.deferred == ["b"] and reloads.holders.needs == {"a": 1 + 16}
    assert host.submitted == []


def test_best_effort_cuts_every_reload_at_its_first_step(machine):
    reloads, host, metrics = machine
    reloads.track(pending("a", 2))
    reloads.start_deferred(cap=8)
    reloads.track(pending("b", 2))  # held back by the cap
    reloads.advance("best_effort")
    assert host.submitted[0].stopping
    assert "b" not in reloads and reloads.deferred == [] and metrics.fallbacks == ["policy_best_effort"]
    finish(host.submitted[0], pages=1, reason="stopped")
    reloads.advance("best_effort")
    assert host.published == ["a"]  # its leading page (the adapter reports the partial load)


def test_timeout_cuts_a_reload_only_past_its_deadline(machine):
    reloads, host, _ = machine
    reloads.track(pending("a", 2, deadline=5.0))
    reloads.start_deferred(cap=1000)
    reloads.advance("timeout")
    assert not host.submitted[0].stopping
    host.clock = 5.5
    reloads.advance("timeout")
    assert host.submitted[0].stopping


def test_a_reload_is_published_only_once_every_rank_and_the_dram_part_are_done(machine):
    reloads, host, _ = machine
    reloads.track(pending("a", 2))
    reloads.start_deferred(cap=1000)
    finish(host.submitted[0])
    host.peer_done, host.loading_anchors = False, {"node-a"}
    reloads.advance("wait_complete")
    host.peer_done = True
    reloads.advance("wait_complete")
    assert host.published == []  # HiCache's host -> device copy of the DRAM part is not acked yet
    host.loading_anchors = set()
    reloads.advance("wait_complete")
    assert host.published == ["a"]


def test_a_hybrid_reload_without_its_state_publishes_nothing(machine):
    reloads, host, metrics = machine
    job = run_to_end(reloads, host, pending("a", 2, state=True), state_loaded=False)
    assert job.state.key == "a-1" and host.states == 2
    assert host.published == [] and metrics.fallbacks == ["state"]
    assert reloads.inflight_states == 0 and host.freed_states == 1 and host.states == 2


def test_a_hybrid_reload_with_its_state_hands_the_slot_to_the_tree(machine):
    reloads, host, _ = machine
    p = pending("a", 2, state=True)
    run_to_end(reloads, host, p, state_loaded=True)
    assert host.published == ["a"] and reloads.inflight_states == 0 and host.freed_states == 0
    assert p.state_slot is None  # the boundary node's value now


def test_reset_stops_and_waits_for_running_jobs_and_forgets_every_reload(machine):
    reloads, host, metrics = machine
    reloads.track(pending("a", 2, state=True))
    reloads.track(pending("b", 2))
    reloads.start_deferred(cap=8)
    assert reloads.inflight_states == 1 and reloads.inflight_tokens == 8  # "b" waits for the cap
    job = host.submitted[0]
    finish(job, pages=1, reason="stopped")  # the worker ends it once asked to stop
    reloads.reset()
    assert job.stopping and "a" not in reloads and reloads.deferred == []
    assert reloads.inflight_tokens == 0 and reloads.inflight_states == 0 and metrics.inflight[-1] == 0


def test_the_job_gathers_tail_dram_pages_before_its_ssd_pages():
    p = pending("a", 3)
    p.tail_dram_pages, p.host_tokens = 1, 8
    p.tail_host_slots = torch.arange(100, 100 + PAGE)
    slots = torch.arange(3 * PAGE)
    job = reload_job(p, slots, PAGE, PAGE_BYTES)
    assert job.page_hashes == ["a-1", "a-2"] and torch.equal(job.ssd_slots, slots[PAGE:])
    assert torch.equal(job.host_device_slots, slots[:PAGE]) and torch.equal(job.host_slots, p.tail_host_slots)
    assert job.dram_bytes == (8 + PAGE) * (PAGE_BYTES // PAGE) and job.state is None


@pytest.mark.parametrize("moved, published", [(1, None), (0, "store_miss")])
def test_a_dram_part_that_moved_is_published_though_no_ssd_page_landed(moved, published):
    p = pending("a", 3)
    p.tail_dram_pages, p.tail_host_slots = 1, torch.arange(100, 100 + PAGE)
    p.job = reload_job(p, torch.arange(3 * PAGE), PAGE, PAGE_BYTES)
    p.job.pages, p.job.reason, p.job.host_pages = 0, "miss", moved
    assert publishable(p) == published


# ---------------------------------------------------------------- one reload per page in flight


def test_request_on_pages_being_reloaded_follows_that_reload_until_it_is_published():
    host = FakeHost()
    reloads = PendingReloads(host, Metrics(), PAGE)
    leader = pending("a", 3)
    reloads.track(leader)
    assert reloads.leader_of(["a-0", "a-1"]) == "a"  # a shorter request on the same prefix
    assert reloads.leader_of(["a-0", "a-1", "a-2", "b-3"]) == "a"  # a longer one: reads b-3 after a ends
    assert reloads.leader_of(["x-9", "a-1"]) is None  # its first page is read by nobody: it reads itself
    # hybrid trees: only a reload of all of them, ending on the same page (the GDN state is at its end)
    assert reloads.leader_of(["a-0", "a-1"], whole=True) is None
    assert reloads.leader_of(["a-0", "a-1", "a-2", "b-3"], whole=True) is None
    assert reloads.leader_of(["a-0", "a-1", "a-2"], whole=True) == "a"
    reloads.follow("b", "a", context="b's probe")
    assert "b" in reloads  # waits in the queue (check_prefetch_progress)
    reloads.start_deferred(cap=1000)
    assert len(host.submitted) == 1  # one job: b reads nothing yet
    finish(host.submitted[0])
    reloads.advance("wait_complete")
    assert host.published == ["a"] and host.resumed == [("b", "b's probe")]  # b matches a's pages, probes the rest
    assert "b" not in reloads and reloads.reading == {}


def test_followers_of_a_released_reload_probe_again_and_an_aborted_follower_is_forgotten():
    host = FakeHost(free=0)  # the pool cannot take the reload: released at its deadline
    reloads = PendingReloads(host, Metrics(), PAGE)
    reloads.track(pending("a", 2, deadline=1.0))
    reloads.follow("b", "a")
    reloads.follow("c", "a")
    reloads.abort("c")
    host.clock = 2.0
    reloads.start_deferred(cap=1000)
    assert host.resumed == [("b", None)]  # b reads the pages itself now; c left
    assert not reloads.following and not reloads.followers and not reloads.reading


def test_aborted_leader_hands_its_followers_back():
    host = FakeHost()
    reloads = PendingReloads(host, Metrics(), PAGE)
    reloads.track(pending("a", 2))
    reloads.follow("b", "a")
    reloads.abort("a")
    assert host.resumed == [("b", None)] and "b" not in reloads


def test_a_request_probed_again_waits_one_step_and_an_aborted_one_is_forgotten():
    """A match ending on a reload's published nodes is probed at the next step (the adapter's
    `resume_follower`); until then its request stays in the queue."""
    host = FakeHost()
    reloads = PendingReloads(host, Metrics(), PAGE)
    reloads.reprobe("b", "b's probe")
    reloads.reprobe("c", "c's probe")
    assert "b" in reloads and "c" in reloads
    reloads.abort("c")
    reloads.resume_reprobes()
    assert host.resumed == [("b", "b's probe")]
    assert "b" not in reloads and "c" not in reloads
    reloads.resume_reprobes()
    assert host.resumed == [("b", "b's probe")]  # once


def test_claims_keep_every_holders_request_admissible(machine):
    """A reload claims only while the room left covers its own request's need and every
    holder's (published or not, until the adapter ends the hold at the request's prefill)."""
    reloads, host, metrics = machine
    host.needs = {"a": 20, "b": 20}
    reloads.track(pending("a", 4))  # 16 slots: 64 + 1 - 16 = 49 > 20
    reloads.track(pending("b", 4))  # then 48 + 1 - 16 = 33, not > 20 + 20
    reloads.start_deferred(cap=1000)
    assert [j.rid for j in host.submitted] == ["a"] and reloads.holders.held_need() == 20
    finish(host.submitted[0])
    reloads.advance("wait_complete")
    assert host.published == ["a"] and "a" in reloads.holders  # published, its request not admitted
    reloads.start_deferred(cap=1000)
    assert len(host.submitted) == 1  # b still waits for a's request
    assert reloads.holders.release("a")  # a's prefill ran (the adapter's `checkpoint`)
    reloads.start_deferred(cap=1000)
    assert [j.rid for j in host.submitted] == ["a", "b"]


def test_claims_follow_sglangs_queue_not_arrival(machine):
    reloads, host, metrics = machine
    host.needs, host.queue = {"a": 30, "b": 30}, ["b", "a"]
    reloads.track(pending("a", 4))
    reloads.track(pending("b", 4))
    reloads.start_deferred(cap=1000)
    assert [j.rid for j in host.submitted] == ["b"]  # the queue's head first; a waits behind it


def test_a_reload_that_never_fits_is_released_at_once(machine):
    reloads, host, metrics = machine
    host.needs = {"big": 100, "a": 1}
    reloads.track(pending("big", 8))  # 32 slots + 100 needed: more than the 128-token pool
    reloads.track(pending("a", 2))
    reloads.start_deferred(cap=1000)
    assert metrics.fallbacks == ["device_capacity"] and "big" not in reloads
    assert [j.rid for j in host.submitted] == ["a"]  # not held up behind it


def test_a_released_reload_stops_holding(machine):
    reloads, host, metrics = machine
    host.needs = {"a": 20}
    reloads.track(pending("a", 4))
    reloads.start_deferred(cap=1000)
    assert "a" in reloads.holders
    reloads.abort("a")
    assert "a" not in reloads.holders and reloads.holders.held_need() == 0


def track_held_back_to_its_memory_deadline(reloads: PendingReloads, host: FakeHost) -> None:
    """Reload "a" (8 tokens) tracked in a pool with room for 4: held back until its memory
    deadline at 30 s (its prefetch deadline, 1 s, passes first)."""
    host.free = 4
    p = pending("a", 2, deadline=1.0)
    p.memory_deadline = 30.0
    reloads.track(p)


def test_a_reload_held_back_for_memory_waits_to_its_memory_deadline(machine):
    """The rule holds a reload back while other reloaded requests go first: it waits past the
    prefetch deadline, up to its memory deadline (`transfer.reload_hold_s`), then recomputes."""
    reloads, host, metrics = machine
    track_held_back_to_its_memory_deadline(reloads, host)
    host.clock = 20.0
    reloads.start_deferred(cap=1000)
    assert "a" in reloads and not metrics.fallbacks
    host.clock = 31.0
    reloads.start_deferred(cap=1000)
    assert "a" not in reloads and metrics.fallbacks == ["device_memory"]
    # Its request computes the 8 tokens too: ahead of the reloads behind it until its prefill.
    assert reloads.holders.needs == {"a": 1 + 8}


def test_a_request_probed_again_leaves_the_ledger_its_given_up_reload_put_it_in(machine):
    """A request whose reload was given up at its memory deadline is in the ledger as
    recomputing; SGLang reissues its storage lookup when its device prefix shrank, and the new
    reload's demand replaces that entry (kept, it would count the request's need twice and hold
    back its own reload with the whole pool free)."""
    reloads, host, metrics = machine
    track_held_back_to_its_memory_deadline(reloads, host)
    host.clock = 31.0
    reloads.start_deferred(cap=1000)
    assert metrics.fallbacks == ["device_memory"] and reloads.holders.needs == {"a": 9}
    host.free = 64
    reloads.track(pending("a", 2, deadline=40.0))
    assert reloads.holders.needs == {}
    reloads.start_deferred(cap=1000)
    assert [j.rid for j in host.submitted] == ["a"] and reloads.holders.needs == {"a": 1}


@pytest.mark.parametrize("prefill_tps, given_up", [(4.0, False), (16.0, True), (None, False)])
def test_a_reload_held_back_gives_up_when_reading_is_slower_than_computing(machine, prefill_tps, given_up):
    """Claim to publish is measured (8 tokens in 1 s: 8 tokens/s). A reload held back for memory
    would read only once the memory its recomputing request needs is free: it gives up when the
    prefill is measured faster than its read, waits when slower or not measured yet."""
    reloads, host, metrics = machine
    host.free, host.prefill = 9, prefill_tps
    reloads.track(pending("a", 2))
    reloads.start_deferred(cap=1000)
    host.clock = 1.0
    finish(host.submitted[-1])
    reloads.advance("wait_complete")
    assert reloads.reads.tps() == pytest.approx(8.0)
    held = pending("b", 2)  # one slot left: the pool cannot take it now
    reloads.track(held)
    reloads.start_deferred(cap=1000)
    assert ("b" not in reloads) is given_up
    assert metrics.fallbacks == (["read_slower"] if given_up else [])
    assert len(host.submitted) == 1
    # given up, its request computes the 8 tokens too: it keeps that need until its prefill
    assert reloads.holders.needs.get("b") == (1 + 8 if given_up else None)


def test_a_reload_that_can_claim_is_kept_however_slow_its_read(machine):
    """Its read runs while its request waits in the queue anyway."""
    reloads, host, metrics = machine
    host.prefill = 1000.0
    reloads.reads.add(8, 1.0)
    reloads.track(pending("a", 2))
    reloads.start_deferred(cap=1000)
    assert len(host.submitted) == 1 and not metrics.fallbacks
