"""A request's direct reload from its arrival to its admission (paper 4.3, 4.5): the state machine.

    probe ──track──> deferred ──claim + submit──> running ──advance──> published
                        │                            │                  (landed pages join the tree)
                        └──deadline / stop policy────┴──release──> released (slots back, anchor unlocked)
                                                          │
                                             job still running: abandoned, freed by `reap`

The adapter probes (plans the pages, locks the anchor's host copy) and registers a
`PendingReload`; reloads start in arrival order while the in-flight cap and the device pool
allow; each scheduler step applies HiCache's prefetch stop policy and publishes the reloads
every rank has finished. A release while the worker still writes into the slots stops the
job and keeps the slots until it ends. Nothing here imports SGLang: the tree, the pools, the
locks and the ranks' agreement are the adapter's (`ReloadHost`, implemented by
`hicache/radix_cache.py::SariaRadixCache`).

One reload per page in flight: a request whose first stored page another request's reload is
reading already (the same prefix) does not read it again. It follows that reload, waiting in
the queue as the reload's own request does; when the reload ends the adapter resumes it
(`ReloadHost.resume_follower`): it matches the published pages as a device hit and reads only
the stored pages past them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from sglang_saria.mem_cache.planner import ReloadPlan
from sglang_saria.mem_cache.reload_admission import (
    Holders,
    ReloadDemand,
    Throughput,
    claim_order,
    fits_alone,
    recomputing,
    waiting_pays,
)
from sglang_saria.reload.device import StateLoad
from sglang_saria.reload.worker import ReloadJob

logger = logging.getLogger(__name__)

# Job reasons that are no store status (the others are reported as ``store_<status>``).
_OWN_REASONS = frozenset({"stopped", "peer_rank", "worker_error"})

# How long (step clock) a stall with no claim lasts before the reloads behind the first one held
# back give their locked paths up, or the first one gives up (`PendingReloads._break_hold_and_wait`): longer than the one
# step between a prefill batch and its merge into the running batch (the overlap scheduler),
# which the stall check cannot tell from an idle scheduler.
HOLD_AND_WAIT_S = 1.0
# How long such a stall lasts before the first reload held back is given up when no reload behind it
# locks a path (its request recomputes): three times the longest probe-to-claim wait measured on a
# quiet machine (0.93 s, docs/reload-admission.md), so a loaded machine's slower steps are not
# taken for a stall; still far below its 30 s memory deadline.
GIVE_UP_FIRST_S = 3.0


@dataclass
class PendingReload:
    """A request's SSD hit, from its arrival (slots allocated, job submitted) to its
    admission (the landed pages join the tree) or release (slots freed). The tree's objects
    (request handle, node ids, radix key, lock parameters) are the adapter's, opaque here."""

    request: Any  # SGLang's CacheRequestHandle (``.rid``)
    anchor: Any  # deepest tree node of the arrival match (device or host); locked meanwhile
    key: Any  # the request's radix key up to the end of the SSD pages
    start: int  # tokens before the SSD pages (device + host)
    host_tokens: int  # of those, host-only tokens (loaded back at submission, counted again there)
    page_hashes: list[str]  # the pages past ``start`` (tail DRAM pages, then SSD pages), in order
    plan: ReloadPlan
    host_lock: Any  # keeps the anchor's host copy (and so the node) from arrival on
    deadline: float  # step clock; the `timeout` prefetch policy cuts the reload here
    # Step clock: while the device-memory rule holds it back (its request could not be admitted
    # before the holders' anyway), it waits until here (`transfer.reload_hold_s`), then recomputes.
    memory_deadline: float = 0.0
    prompt_tokens: int = 0  # the request's prompt as the probe saw it (SGLang's queue says better)
    claimed_at: float = 0.0  # step clock at its claim: claim to publish is what its read cost the request
    job: Optional[ReloadJob] = None  # None while the in-flight cap holds it back
    path_lock: Any = None  # the anchor's device path, locked when the job is submitted
    anchor_lock: Any = None  # a device-only anchor (a follower resumed on published pages): its path, until released
    # Hybrid trees: the GDN checkpoint at the end of the SSD pages (the sidecar of the last
    # page) and the device mamba slot it is gathered into: the new boundary node's value.
    state_key: Optional[str] = None
    state_slot: Optional[torch.Tensor] = None
    # Hybrid trees: the leading pages past ``start`` that the tree holds in host memory
    # past its last checkpoint (FA only, no state at their end: SGLang's match stops
    # before them), planned from DRAM and gathered host -> device with the SSD pages.
    tail: tuple = ()  # PageObjects of every page past ``start``, for the re-plan at submission
    tail_dram_pages: int = 0
    tail_host_slots: Optional[torch.Tensor] = None  # their host-pool slots, page_size per page
    tail_node: Any = None  # the tree node holding the last of them, host-locked
    tail_lock: Any = None

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def ssd_hashes(self) -> list[str]:
        return self.page_hashes[self.tail_dram_pages :]


def job_reason(job: ReloadJob) -> str:
    """The fallback reason of a job that landed fewer pages than planned."""
    return job.reason if job.reason in _OWN_REASONS else f"store_{job.reason}"


def reload_job(pending: PendingReload, slots: torch.Tensor, page_size: int, page_bytes: int) -> ReloadJob:
    """The worker's job for a claimed reload: its SSD pages into ``slots`` after the tail DRAM
    pages' (gathered host -> device with them), the checkpoint into its mamba slot, and the
    plan's whole DRAM part (loaded back by HiCache, modelled by the pacer)."""
    state = None
    if pending.state_slot is not None:
        state = StateLoad(int(pending.state_slot[0]), key=pending.state_key)
    dram_tokens = pending.tail_dram_pages * page_size
    job = ReloadJob(
        pending.rid, pending.ssd_hashes, slots,
        dram_bytes=(pending.host_tokens + dram_tokens) * (page_bytes // page_size), state=state,
    )
    if dram_tokens:
        job.host_slots, job.host_device_slots = pending.tail_host_slots, slots[:dram_tokens]
    return job


def publishable(pending: PendingReload) -> Optional[str]:
    """None when an ended reload's landed pages may join the tree, else why all is recomputed.
    A full-attention plan's DRAM part is published even when no SSD page landed: it comes
    first, and the worker moves all of it whenever the load ran."""
    job = pending.job
    if pending.state_slot is not None and not (job.state_loaded and job.pages == len(job.page_hashes)):
        # A hybrid prefix is reusable only up to its checkpoint: without the state at its
        # end the landed FA pages cannot resume the GDN layers.
        return job_reason(job) if job.reason else "state"
    if job.pages == 0 and not (pending.tail_dram_pages and job.host_pages == pending.tail_dram_pages):
        return job_reason(job)
    return None


class ReloadHost(Protocol):
    """What the state machine asks of the adapter: SGLang's tree, pools, locks and ranks."""

    def reload_demands(self, pendings: list[PendingReload], tokens: list[int]) -> list[ReloadDemand]:
        """What each reload asks of the device pool (``tokens`` slots each), in SGLang's terms."""

    def device_capacity(self) -> int:
        """Device tokens of the KV pool."""

    def prefill_tps(self) -> Optional[float]:
        """The scheduler's measured prefill rate (tokens per second) over the prefill batches
        since the last call; None while unknown, or where the ranks would not agree on it."""

    def claim_reload(self, pending: PendingReload, demand: ReloadDemand, held_need: int) -> Optional[torch.Tensor]:
        """Device memory for a reload (path locked, ``demand.tokens`` slots, a state slot on
        hybrid trees) if `reload_admission.admits` it with the holders' ``held_need``; None,
        holding nothing, when the pool cannot take it now."""

    def submit_reload(self, pending: PendingReload, slots: torch.Tensor) -> ReloadJob:
        """Start the worker on a claimed reload."""

    def publish_reload(self, pending: PendingReload) -> None:
        """The landed pages join the tree; the slots past them go back to the pool."""

    def free_reload_slots(self, slots: torch.Tensor) -> None: ...

    def free_reload_state(self, slot: torch.Tensor) -> None: ...

    def unlock_reload(self, pending: PendingReload) -> None:
        """Drop the anchor's (and a tail node's) locks."""

    def reload_loading(self, pending: PendingReload) -> bool:
        """Whether the plan's DRAM part is still being loaded host -> device."""

    def all_ranks_done(self, done: list[bool]) -> list[bool]:
        """``done`` agreed by every attention rank (MIN), so all publish at the same step."""

    def step_clock(self) -> float:
        """The step clock reload deadlines are timed by."""

    def resume_follower(self, rid: str, context: Any) -> None:
        """Request ``rid`` followed a reload that has ended: probe it again (``context``: what
        it gave `follow`); what it still needs from the store is read by a reload of its own."""


class ReloadMetrics(Protocol):
    def reload_fallback(self, reason: str) -> None: ...

    def reload_inflight(self, tokens: int) -> None: ...


class PendingReloads:
    """Every request's reload between arrival and admission, and the device slots they hold."""

    def __init__(self, host: ReloadHost, metrics: ReloadMetrics, page_size: int) -> None:
        self.host = host
        self.metrics = metrics
        self.page_size = page_size
        self.by_rid: dict[str, PendingReload] = {}
        self.deferred: list[str] = []  # request ids waiting for the in-flight cap, FIFO
        self.abandoned: list[PendingReload] = []  # released while their job still runs
        self.inflight_tokens = 0  # device slots held by reload jobs
        self.inflight_states = 0  # device mamba slots held by reload jobs (hybrid trees)
        self.reading: dict[str, str] = {}  # SSD page hash -> the request whose reload reads it
        # Reloads from their claim to their request's admission (the adapter ends a published
        # one's hold at the request's prefill, abort or hold deadline): what they will need then.
        self.holders = Holders()
        # Reads from claim to publish (step clock): what a reload held back would add to its wait.
        self.reads = Throughput()
        # request -> (request, resume context) of those waiting for its reload's pages; and the reverse
        self.followers: dict[str, list[tuple[str, Any]]] = {}
        self.following: dict[str, str] = {}
        self.stuck_since: Optional[float] = None  # step clock: stalled passes with no claim since
        # request -> resume context of those probed again at the next step (`reprobe`)
        self.reprobing: dict[str, Any] = {}

    def __contains__(self, rid: str) -> bool:
        return rid in self.by_rid or rid in self.following or rid in self.reprobing

    def track(self, pending: PendingReload) -> None:
        """A probed reload waits for its device memory (claimed at the next `start_deferred`).
        A request probed again (SGLang reissues its storage lookup when its device prefix shrank)
        leaves the ledger: its new reload's demand states what it needs now, and an entry kept
        from its earlier reload would count its need twice, holding back the reloads behind it
        (and its own) while nothing runs."""
        self.holders.release(pending.rid)
        self.by_rid[pending.rid] = pending
        self.deferred.append(pending.rid)
        for h in pending.ssd_hashes:
            self.reading.setdefault(h, pending.rid)

    def leader_of(self, page_hashes: list[str], whole: bool = False) -> Optional[str]:
        """The request whose reload reads the first of these SSD pages already (None: none does).
        ``whole`` (hybrid trees, whose prefixes end on a GDN state): only a reload that reads every
        one of them and ends on the same page, whose state the published prefix ends with."""
        rid = self.reading.get(page_hashes[0]) if page_hashes else None
        if rid is None or not whole:
            return rid
        if any(self.reading.get(h) != rid for h in page_hashes) or self.by_rid[rid].ssd_hashes[-1] != page_hashes[-1]:
            return None
        return rid

    def follow(self, rid: str, leader: str, context: Any = None) -> None:
        """Request ``rid`` waits for ``leader``'s reload instead of reading the same pages;
        ``context`` (the adapter's) goes back to the adapter when it resumes."""
        self.following[rid] = leader
        self.followers.setdefault(leader, []).append((rid, context))

    def reprobe(self, rid: str, context: Any) -> None:
        """Request ``rid`` waits one step and is then probed as a resumed follower is
        (`resume_reprobes`): its probe needs the adapter's step context, not the caller's."""
        self.reprobing[rid] = context

    def resume_reprobes(self) -> None:
        reprobing, self.reprobing = self.reprobing, {}
        for rid, context in reprobing.items():
            self.host.resume_follower(rid, context)

    def _leave(self, rid: str) -> PendingReload:
        """A reload leaves the tracked set: its pages are no longer being read for others."""
        pending = self.by_rid.pop(rid)
        for h in pending.ssd_hashes:
            if self.reading.get(h) == rid:
                del self.reading[h]
        return pending

    def _wake(self, rid: str) -> None:
        """A reload has ended (published or released): its followers resume (probe again)."""
        for follower, context in self.followers.pop(rid, []):
            del self.following[follower]
            self.host.resume_follower(follower, context)

    def start_deferred(self, cap: int, wait: bool = False, stalled: bool = False) -> Optional[ReloadDemand]:
        """Submit waiting reloads while at most ``cap`` tokens are in flight (one larger than
        the cap alone was cut to it by the probe) and the device-memory rule admits them
        (`mem_cache/reload_admission.py`: every holder's request stays admissible), in SGLang's
        queue order: the first one the rule holds back stops the claims (a later one would
        delay it), unless the scheduler is ``stalled`` (nothing runs, nothing reads, its last
        admission pass formed no batch): then only a deadline would free what it waits for,
        which reloads behind it may hold (a follower locks the device path it resumed on until
        its own reload ends, `hicache/direct_reload/follow.py`), so those the rule admits claim
        past it. One that could not fit even in an empty pool is released at once
        (`device_capacity`); one the pool cannot take yet is released when its read is measured
        to be slower than computing its tokens (`reload_admission.waiting_pays`: its request is
        served sooner recomputing), else it waits until its deadline or memory deadline,
        whichever is later, then its request recomputes (`device_memory`). Stalled passes that
        claim nothing for `HOLD_AND_WAIT_S` break a hold and wait, or for `GIVE_UP_FIRST_S` give
        the first one up (`_break_hold_and_wait`).
        Returns the demand of the first reload the rule holds back (None: none is).
        ``wait``: the scheduler waits for each job (benchmark-only, `transfer.blocking_reload`)."""
        held_back = self._claim_deferred(cap, wait, stalled)
        if held_back is None or not stalled or self.inflight_tokens:
            self.stuck_since = None
        elif self.stuck_since is None:
            self.stuck_since = self.host.step_clock()
        elif self._break_hold_and_wait(held_back, self.host.step_clock() - self.stuck_since):
            self.stuck_since = None
        return held_back

    def _claim_deferred(self, cap: int, wait: bool, stalled: bool) -> Optional[ReloadDemand]:
        """One pass of `start_deferred`'s claims; returns the first reload held back."""
        if not self.deferred:
            return None
        held_back: Optional[ReloadDemand] = None
        pendings = [self.by_rid[rid] for rid in self.deferred]
        tokens = [len(p.page_hashes) * self.page_size for p in pendings]  # tail DRAM and SSD pages
        capacity = self.host.device_capacity()
        for demand in claim_order(self.host.reload_demands(pendings, tokens)):
            rid, pending = demand.rid, self.by_rid[demand.rid]
            if self.inflight_tokens and self.inflight_tokens + demand.tokens > cap:
                return held_back
            if not fits_alone(capacity, demand):
                self._give_up(rid, "device_capacity")
                continue
            slots = self.host.claim_reload(pending, demand, self.holders.held_need())
            if slots is None:
                if not waiting_pays(demand.tokens, self.reads.tps(), self.host.prefill_tps()):
                    self._recompute(demand, "read_slower")
                    continue
                if self.host.step_clock() <= max(pending.deadline, pending.memory_deadline):
                    if not stalled:
                        return demand
                    held_back = held_back or demand
                    continue
                logger.warning(
                    "saria: reload of request %s waited out its memory deadline (transfer.reload_hold_s): its claim "
                    "%d + need %d, requests ahead %d, holders %s, scheduler stalled %s; its request recomputes",
                    rid, demand.tokens, demand.need, demand.ahead, self.holders.needs, stalled,
                )
                self._recompute(demand, "device_memory")
                continue
            self.deferred.remove(rid)
            self.holders.hold(demand)
            pending.claimed_at = self.host.step_clock()
            self.inflight_states += pending.state_slot is not None
            pending.job = self.host.submit_reload(pending, slots)
            self.hold(demand.tokens)
            if wait:
                pending.job.wait()
        return held_back

    def _break_hold_and_wait(self, first: ReloadDemand, stuck_s: float) -> bool:
        """A stall no claim ends, for ``stuck_s``: ``first`` waits for device room that the waiting
        reloads behind it lock (a follower locks the path it resumed on,
        `hicache/direct_reload/follow.py`), while none of them fits either. After `HOLD_AND_WAIT_S`
        those reloads are given up (`stalled`): their requests are admitted with the device prefix
        they match (unlocked now, so evictable) and compute the rest. They stay out of the ledger:
        behind ``first`` in the queue, their need must not hold it back. When none of them locks a
        path, only ``first``'s memory deadline would end the stall (30 s of an idle scheduler):
        after `GIVE_UP_FIRST_S` ``first`` is given up instead (`stalled`), its request recomputing,
        as at that deadline. True: the stall was broken."""
        lockers = [rid for rid in self.deferred if rid != first.rid and self.by_rid[rid].anchor_lock is not None]
        if lockers and stuck_s >= HOLD_AND_WAIT_S:
            for rid in lockers:
                self._give_up(rid, "stalled")
            return True
        if not lockers and stuck_s >= GIVE_UP_FIRST_S:
            self._recompute(first, "stalled")
            return True
        return False

    def _recompute(self, demand: ReloadDemand, reason: str) -> None:
        """A reload the rule held back is given up: its request now needs the reload's tokens
        too, ahead of the reloads behind it in the queue (claims later in this pass would not
        see it), so it stays in the ledger until its prefill or abort."""
        self._give_up(demand.rid, reason)
        self.holders.hold(recomputing(demand))

    def _give_up(self, rid: str, reason: str) -> None:
        """A deferred reload is released: its request recomputes, its followers resume."""
        self.deferred.remove(rid)
        self.release(self._leave(rid), reason)
        self._wake(rid)

    def advance(self, stop_policy: str) -> None:
        """Once per scheduler step: apply HiCache's stop policy (`best_effort` cuts a reload at
        its first step, `timeout` at its deadline, `wait_complete` never; a cut job ends after
        its chunk in flight, keeping a leading run of pages), then end every reload all ranks
        have finished, its DRAM part included."""
        now = self.host.step_clock()
        running = []
        for rid, pending in list(self.by_rid.items()):
            cut = stop_policy == "best_effort" or (stop_policy == "timeout" and now > pending.deadline)
            if pending.job is None:  # held back by the in-flight cap or the device-memory rule
                if cut:
                    self._give_up(rid, f"policy_{stop_policy}")
                continue
            if cut and not pending.job.done:
                pending.job.stop()
            running.append(pending)
        landed = [p.job.done and not self.host.reload_loading(p) for p in running]
        for pending, done in zip(running, self.host.all_ranks_done(landed)):
            if done:
                self._end(self._leave(pending.rid))
                self._wake(pending.rid)

    def _end(self, pending: PendingReload) -> None:
        """Publish an ended reload's landed pages, or release it when none can be used."""
        reason = publishable(pending)
        if reason is not None:
            self.release(pending, reason)
            return
        had_state = pending.state_slot is not None
        if not pending.job.reason:  # a whole read (a cut one's time says little about its rate)
            self.reads.add(pending.job.tokens, self.host.step_clock() - pending.claimed_at)
        self.hold(-pending.job.tokens)
        self.host.publish_reload(pending)
        if had_state:  # the boundary node's value now (or freed as a duplicate)
            self.inflight_states -= 1
            pending.state_slot = None

    def release(self, pending: PendingReload, reason: Optional[str] = None) -> None:
        """Give a reload's slots back and unlock its anchor; a job still running is stopped
        and freed once the worker is done with its slots (`reap`)."""
        if reason is not None:
            self.metrics.reload_fallback(reason)
        self.holders.release(pending.rid)
        job = pending.job
        if job is not None and not job.done:
            job.stop()
            self.abandoned.append(pending)
            return
        self._free(pending)

    def _free(self, pending: PendingReload) -> None:
        if pending.job is not None:
            self.host.free_reload_slots(pending.job.slots)
            self.hold(-pending.job.tokens)
        if pending.state_slot is not None:
            self.host.free_reload_state(pending.state_slot)
            pending.state_slot = None
            self.inflight_states -= 1
        self.host.unlock_reload(pending)

    def reap(self) -> None:
        """Free the slots of released reloads whose worker job has ended since."""
        running = []
        for pending in self.abandoned:
            if pending.job.done:
                self._free(pending)
            else:
                running.append(pending)
        self.abandoned = running

    def abort(self, rid: str) -> None:
        """The request left (abort): its reload, waiting or running, is released (its followers
        resume); a follower or a request waiting to be probed again stops waiting."""
        self.reprobing.pop(rid, None)
        leader = self.following.pop(rid, None)
        if leader is not None:
            self.followers[leader] = [f for f in self.followers[leader] if f[0] != rid]
        if rid in self.by_rid:
            if rid in self.deferred:
                self._give_up(rid, "aborted")
            else:
                self.release(self._leave(rid), "aborted")
                self._wake(rid)

    def reset(self) -> None:
        """Forget every reload (the pools are reset with the tree): jobs still running are
        stopped and waited for (a chunk's reads), so no worker writes into a reset pool."""
        for pending in self.abandoned + list(self.by_rid.values()):
            if pending.job is not None:
                pending.job.stop()
                pending.job.wait()
        self.by_rid, self.deferred, self.abandoned = {}, [], []
        self.reading, self.followers, self.following, self.reprobing = {}, {}, {}, {}
        self.holders.reset()
        self.hold(-self.inflight_tokens)
        self.inflight_states = 0
        self.stuck_since = None

    def hold(self, tokens: int) -> None:
        self.inflight_tokens += tokens
        self.metrics.reload_inflight(self.inflight_tokens)

