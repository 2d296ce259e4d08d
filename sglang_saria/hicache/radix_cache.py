"""SGLang's radix cache with Saria's reload path (paper 4.3-4.5), for `--hicache-storage-backend saria`.

HiCache stages a storage hit through host memory: prefetch into the host pool, insert
as host nodes, then load host -> device. `SariaRadixCache` (chosen by the plugin hook on `create_unified_radix_cache`) reads SSD
hits of full-attention and GDN hybrid models straight into the device pools instead:

- arrival (`prefetch_from_storage`, where HiCache starts its storage prefetch): beyond
  the tree's device+host match, the store's index is probed for the next pages; the
  core's planner (`planner.plan_reload`) makes one plan of DRAM and SSD pages; device
  slots are allocated for the SSD pages (at most `transfer.max_inflight_reload_tokens`
  in flight) and a job goes to the reload worker (`reload/worker.py`): reads into a
  staging buffer on the pool's device, gathers into the slots (`reload/device.py`),
  paced by the coordinator, all off the scheduler thread;
- waiting (`check_prefetch_progress`): the request stays in the waiting queue, as a
  prefetching one does, while every other request runs; HiCache's stop policies apply
  (`best_effort`, `timeout`, `wait_complete`); a cut reload keeps its leading pages;
- admission (match + `init_load_back`): the pages every rank landed are matched as a
  load-back; the plan's DRAM part (the host-only run of the match, planned from its device
  end by `_probe`) went host -> device in the worker's gathers at the coordinator's rates,
  and joins the tree with the SSD pages as device nodes; unused slots go back. A failed read (I/O error, checksum, missing
  page) or an abort publishes nothing past the last good page, the rest is recomputed,
  and failed pages leave the store index;
- promotion: the share of SSD pages the promotion controller picks at publish (leading
  pages, recency-protected host headroom) becomes a node of its own, copied device -> host
  by HiCache's write-through once the request's prefill is done (`checkpoint`).

Hybrid trees (FULL + MAMBA): plans end on the last GDN checkpoint a tier holds,
the state lands in a reserved mamba slot with the last FA chunk and becomes the boundary
node's value; README.md ("Hybrid trees in the direct reload") says how.

Everything else (admission at host eviction, write-before-reclaim, prewrite) is the
policy's (`policy.py`, at this class's write points and the tree core's gate) and unchanged. With several attention ranks this
class gives the policy rank-agreed inputs (`rank_agreement.py`: an SSD view and a
step clock, agreed at each `check_hicache_events`) and times reload deadlines by that clock,
so every decision that changes the tree is the same on every rank.

A reload's states (deferred, running, published, released, abandoned) are
`reload/pending.py`'s; this class executes them on SGLang's tree and pools (its
`ReloadHost` methods). Its policy, rank agreement, reloader, worker and pacer are the saria
runtime's (`runtime.py`), built once SGLang has built the storage backend and again, whole,
when a runtime attach or detach changes it.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from typing import Any, Optional

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    CacheRequestHandle,
    EvictParams,
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import NodeId, UnifiedRadixCache
from sglang.srt.mem_cache.utils import get_storage_hash_str

from sglang_saria.hicache.audit.kv import KVAudit, install_kv_audit
from sglang_saria.hicache.audit.kv import audit_enabled as kv_audit_enabled
from sglang_saria.hicache.audit.tiers import AuxComponent, TierAudit, audit_tiers
from sglang_saria.hicache.direct_reload.build import DirectReload
from sglang_saria.hicache.direct_reload.follow import Follower, resume
from sglang_saria.hicache.direct_reload.holds import Hold, PrefillWatch, ReloadHolds, decode_reserve, reload_demands
from sglang_saria.hicache.direct_reload.report import audit_reload, report_reload
from sglang_saria.hicache.hints import HintsIntakeMixin
from sglang_saria.hicache.host_leaf_order import HostLeafOrder
from sglang_saria.hicache.load_signal import LoadSignalMixin
from sglang_saria.hicache.metrics import SariaServingMetrics
from sglang_saria.hicache.policy import SariaHiCachePolicy
from sglang_saria.hicache.rank_agreement import RankAgreement
from sglang_saria.hicache.runtime import SariaRuntime, build_runtime
from sglang_saria.hicache.tree_core import NAME as SARIA_TREE_CORE
from sglang_saria.hicache.unit_eviction import evict_host_units
from sglang_saria.mem_cache.reload_admission import ReloadDemand, admits
from sglang_saria.reload.pending import PendingReload, PendingReloads, reload_job
from sglang_saria.reload.worker import ReloadJob

logger = logging.getLogger(__name__)


class SariaRadixCache(LoadSignalMixin, HintsIntakeMixin, UnifiedRadixCache):
    """UnifiedRadixCache whose storage hits go SSD -> device pool, not SSD -> host -> device,
    read by a worker thread while the request waits in the queue."""

    # The policy, agreement and direct reload over the saria backend (`runtime.py`): built by
    # `init_hicache` once SGLang has built the backend, again whole when the backend changes.
    _runtime: Optional[SariaRuntime] = None

    def __init__(self, params: Any) -> None:
        params.tree_core_backend = SARIA_TREE_CORE  # the Python core with a host eviction gate
        super().__init__(params)
        self.tree_core.host_eviction_gate = self._host_eviction_gate
        self._metrics = SariaServingMetrics.get()
        self._reloads = PendingReloads(self, self._metrics, self.page_size)
        self._published: dict[str, int] = {}  # request id -> end of its reloaded prefix
        # request id -> (node ending the promoted share, its tokens), copied after prefill
        self._promotions: dict[str, tuple[NodeId, int]] = {}
        self._holds = ReloadHolds()  # published tails, locked until their request's prefill
        self._prefill_watch = PrefillWatch()  # what a reload held back for memory is weighed against
        self._audit = os.environ.get("SGLANG_SARIA_AUDIT_TIERS", "0") == "1"
        self._audited_state: tuple = ()
        # Installed once the storage backend is attached (after this constructor).
        self._kv_audit: Optional[KVAudit] = None
        self._kv_audit_pending = kv_audit_enabled()
        self._writes_pending = (0, 0)  # (store writes, write-throughs) last reported
        # The stall check (`_stalled`): whether the last admission pass formed a prefill batch,
        # and the requests whose tails were held before it.
        self._prefill_formed: Optional[bool] = None
        self._held_before: set[str] = set()
        self._stall_logged: Optional[str] = None  # the held-back reload last logged as stalled

    # ------------------------------------------------------------------ setup
    def _backend(self) -> Any:
        return getattr(self.cache_controller, "storage_backend", None)

    def _policy(self) -> Optional[SariaHiCachePolicy]:
        """The runtime's admission policy; None without a saria backend (HiCache writes every host page through)."""
        return None if self._runtime is None else self._runtime.policy

    @property
    def _agreement(self) -> Optional[RankAgreement]:
        """The ranks' agreement on the policy's inputs; None on one rank or without a saria backend."""
        return None if self._runtime is None else self._runtime.agreement

    @property
    def _direct(self) -> Optional[DirectReload]:
        """The direct reload; None where it cannot run (storage hits go through HiCache's prefetch)."""
        return None if self._runtime is None else self._runtime.direct

    def init_hicache(self, server_args: Any, params: Any) -> None:
        """HiCache's controller and the storage backend are up: build the saria runtime over it."""
        super().init_hicache(server_args, params)
        self._build_runtime()

    def attach_storage_backend(self, *args: Any, **kwargs: Any) -> tuple[bool, str]:
        """Runtime attach (admin API, idle scheduler, every rank): a new backend gets a new runtime."""
        return self._rebuilt_if_changed(super().attach_storage_backend, *args, **kwargs)

    def detach_storage_backend(self) -> tuple[bool, str]:
        """Runtime detach: without a backend, no runtime (HiCache's own paths, storage off)."""
        return self._rebuilt_if_changed(super().detach_storage_backend)

    def _rebuilt_if_changed(self, change: Any, *args: Any, **kwargs: Any) -> tuple[bool, str]:
        """SGLang's attach or detach; the runtime is built again where it changed the backend (a
        refused or failed one leaves the backend, and so the runtime, as they were)."""
        before = self._backend()
        result = change(*args, **kwargs)
        if self._backend() is not before:
            self._build_runtime()
        return result

    def _build_runtime(self) -> None:
        """The runtime over the backend SGLang holds now (`runtime.build_runtime`), replacing the
        old one, whose reload worker ends. Runs where every rank runs it (`init_hicache`, the admin
        API's attach and detach, with the scheduler idle): the build is a collective."""
        self._reloads.reset()  # none in flight: the scheduler is idle
        if self._runtime is not None:
            self._runtime.close()
        self._runtime = build_runtime(self, self._backend(), self._kv_audit)

    def step_clock(self) -> float:
        """The clock of decisions that change the tree (reload deadlines): the agreed step clock
        on several ranks, the monotonic clock on one."""
        return self._runtime.clock() if self._runtime is not None else time.monotonic()

    # ------------------------------------------------------------------ admission: the cache's write points
    def write_backup_storage(self, node_id: NodeId) -> None:
        """HiCache's write-through of a node just backed up to host memory: written to storage
        only if the policy admits it on insert, with the unwritten prefix its write closes over
        (without a saria policy: every node, as HiCache does)."""
        policy = self._policy()
        for write_id in [node_id] if policy is None else policy.on_host_insert(self.tree_core, node_id):
            self._write_to_storage(write_id)

    def _write_to_storage(self, node_id: NodeId) -> None:
        # Every storage write the tree issues (the same on every rank) is pending in the
        # agreed SSD view until every rank's store holds it.
        if self._agreement is not None:
            self._agreement.requested(self.tree_core.get_hash_values(node_id) or [])
        super().write_backup_storage(node_id)

    def _track_write_through_node(self, node_id: NodeId, lock_params: Any, publish_node_ids: list[NodeId]) -> None:
        """A device -> host copy starts (HiCache's write-through): reported at once, before the
        request's response leaves, so whoever waits for the store's writes sees it pending."""
        super()._track_write_through_node(node_id, lock_params, publish_node_ids)
        self._report_writes_pending()

    def _report_writes_pending(self) -> None:
        """Gauges of the writes not in the store yet: store writes requested and not
        acknowledged, and write-throughs not acknowledged (at its ack one asks the store for its
        nodes' writes). The store writes are set first: a reader never sees both at 0 while an
        ack is turning a write-through into store writes."""
        pending = (len(self.ongoing_backup), len(self.ongoing_write_through))
        if pending != self._writes_pending:
            self._writes_pending = pending
            self._metrics.storage_writes_in_flight(pending[0])
            self._metrics.write_through_in_flight(pending[1])

    def _finish_write_through_ack(self, ack_id: int) -> None:
        """After a write-through: prewrite the host leaves next in line for eviction that would
        qualify then, so their writes start before the eviction needs the space."""
        super()._finish_write_through_ack(ack_id)
        policy = self._policy() if self.enable_storage else None
        if policy is not None:
            for node in policy.prewrite_candidates(self.tree_core.evictable_host_leaves,
                                                   self.tree_core.eviction_strategy.get_priority):
                self._write_to_storage(node.id)

    # ------------------------------------------------------------------ arrival: probe, plan, track
    def query_storage_hit_length(self, *args: Any, **kwargs: Any) -> int:
        if self._direct is not None:
            return 0
        return super().query_storage_hit_length(*args, **kwargs)

    def prefetch_from_storage(
        self,
        request: CacheRequestHandle,
        last_host_node_id: NodeId,
        new_input_tokens: list[int],
        last_hash: Optional[str] = None,
        prefix_keys: Optional[list[str]] = None,
        matched_prefix_tokens: Optional[list[int]] = None,
        extra_key: Optional[str] = None,
        cache_salt: Optional[str] = None,
        storage_hit_end: Optional[int] = None,
    ) -> Optional[bool]:
        """At a request's arrival (as HiCache's prefetch): with direct reload, start reading
        the SSD pages past its tree match into device slots; the request waits in the queue
        (`check_prefetch_progress`) while everyone else runs."""
        if self._direct is None:
            return super().prefetch_from_storage(
                request, last_host_node_id, new_input_tokens, last_hash, prefix_keys,
                matched_prefix_tokens, extra_key, cache_salt, storage_hit_end,
            )
        if request.rid in self._reloads:
            return None
        prefix = list(matched_prefix_tokens or [])
        pending = self._probe(request, last_host_node_id, prefix, list(new_input_tokens), last_hash, extra_key, cache_salt)
        if pending is not None:
            # Slots are allocated (and the device evicted for them) at the next step's
            # check_hicache_events, never here: the scheduler also calls this from inside
            # its prefill loop (a request whose device prefix shrank), where an allocation
            # would break the budget of the batch being built (prefill OOM).
            self._reloads.track(pending)
        return None

    def probe_past_reloaded(self, req: Any) -> None:
        """After SGLang's own prefetch decision for ``req`` (plugin hook after
        ``Scheduler._prefetch_kvcache``). SGLang prefetches only from a host-backed match end or
        the root: write-through backs up every computed node at once, so a device-only end means
        nothing past it is stored. A reload's published nodes are device-only (a share is
        promoted to host after their request's prefill) while they and what follows them are in
        the store: a request whose match ends on one is probed from there at the next step, as
        a resumed follower is (not here: this may run inside a prefill batch being built, where
        locking the device anchor would change the batch's budget)."""
        if self._direct is None or req.rid in self._reloads:
            return
        anchor = req.last_host_node
        if self.is_root(anchor) or self.is_backuped(anchor):
            return  # SGLang has probed from this match end
        last_hash = self.get_last_hash_value(anchor)
        start, page = req.prefix_len + req.host_hit_length, self.page_size
        end = start + (req._compute_max_prefix_len(len(req.full_untruncated_fill_ids)) - start) // page * page
        if last_hash is None or end <= start:
            return
        tokens = req.full_untruncated_fill_ids[:end]
        key = RadixKey(array("q", tokens[start:]), extra_key=req.extra_key, cache_salt=req.cache_salt)
        hashes = get_storage_hash_str(key, last_hash, page_size=page)
        self._reloads.reprobe(req.rid, Follower(req.cache_request_handle, tuple(tokens), start, tuple(hashes),
                                                last_hash, req.extra_key, req.cache_salt))

    def _probe(self, request: CacheRequestHandle, anchor: NodeId, prefix: list[int], tokens: list[int],
               last_hash: Optional[str], extra_key: Optional[str], cache_salt: Optional[str]) -> Optional[PendingReload]:
        """The plan of the stored pages past ``anchor``: an in-memory index probe (no I/O,
        no collective: the worker settles what every rank loaded). Where the reloader moves
        host pages, a match ending in host-only nodes is planned from its device end: the
        host-only run is the plan's DRAM part, copied in the SSD part's gathers at the rates
        the coordinator allocates (paper 4.5), not by HiCache's unpaced load_back."""
        page, probe = self.page_size, self._direct.probe
        moved = probe.device_anchor(anchor) if probe.host_tail else None
        if moved is not None:
            cut = len(prefix) - moved.host_tokens
            anchor, last_hash, prefix, tokens = moved.node, moved.last_hash, prefix[:cut], prefix[cut:] + tokens
        tail = len(tokens) // page * page
        if tail < page or (last_hash is None and not self.is_root(anchor)):
            return None  # an unhashed anchor would seed the chain wrongly: no match possible
        key_tail = RadixKey(array("q", tokens[:tail]), extra_key=extra_key, cache_salt=cache_salt)
        hashes = get_storage_hash_str(key_tail, last_hash, page_size=page)
        held, pages = probe.past_match(anchor, key_tail, hashes, self._direct.max_inflight_tokens // page, self._agree_min)
        if not pages:
            return None
        start = len(prefix)
        pages = probe.with_checkpoints(pages, hashes, start)
        host_tokens = probe.host_only_tokens(anchor)
        plan = probe.plan(anchor, host_tokens, start, pages)
        n_tail = plan.n_blocks - host_tokens // page  # the plan's pages past the match
        tail_dram = probe.tail_dram_pages(plan, host_tokens, n_tail)
        n_ssd = n_tail - tail_dram
        if n_ssd <= 0:
            return None  # no SSD page (hybrid: before the last checkpoint a tier holds) for the worker
        leader = self._reloads.leader_of(hashes[tail_dram:n_tail], whole=probe.hybrid)
        if leader is not None:  # another request's reload reads these pages: wait for it (direct_reload/follow.py)
            context = Follower(request, tuple(prefix + tokens[:tail]), start, tuple(hashes), last_hash, extra_key, cache_salt)
            self._reloads.follow(request.rid, leader, context)
            self.note_storage_span(request.rid, start, len(prefix) + n_tail * page)  # the leader reads them
            self._metrics.reload_followed()
            return None
        timeout = self.prefetch_timeout_base + n_ssd * self.prefetch_timeout_per_page
        pending = PendingReload(
            request=request,
            anchor=anchor,
            key=RadixKey(array("q", prefix + tokens[: n_tail * page]), extra_key=extra_key, cache_salt=cache_salt),
            start=start,
            host_tokens=host_tokens,
            page_hashes=hashes[:n_tail],
            plan=plan,
            # Only the host copy is locked here: a device lock would shrink the evictable
            # size under a prefill batch being built (this may run inside that loop).
            host_lock=self.inc_host_lock_ref(anchor).to_dec_params(),
            deadline=self.step_clock() + timeout,
            memory_deadline=self.step_clock() + self._direct.hold_s,
            prompt_tokens=len(prefix) + len(tokens),
            # The plan ends on the checkpoint of its last page, which the store's sidecar
            # holds (a tree node holding a state there would have been matched).
            state_key=hashes[n_tail - 1] if probe.hybrid else None,
            tail=tuple(pages[:n_tail]),
            tail_dram_pages=tail_dram,
        )
        if tail_dram:
            self._lock_tail(pending, held[:tail_dram])
        return pending

    def _lock_tail(self, pending: PendingReload, held: list[tuple[NodeId, torch.Tensor]]) -> None:
        """The tail DRAM pages' host slots go with the reload; the node holding the last of
        them keeps its host copy (and so every host page above it: host eviction takes
        leaves) until the gather has run."""
        node, _ = held[-1]
        pending.tail_host_slots = torch.cat([slots for _, slots in held])
        pending.tail_node = node
        pending.tail_lock = self.inc_host_lock_ref(node).to_dec_params()

    # ------------------------------------------------------------------ claim and submit (`ReloadHost`)
    def reload_demands(self, pendings: list[PendingReload], tokens: list[int]) -> list[ReloadDemand]:
        return reload_demands(pendings, tokens, self._inquirer(), self.page_size,
                              lambda rid: rid in self._reloads or rid in self._reloads.holders)

    def device_capacity(self) -> int:
        return self.token_to_kv_pool_allocator.size

    def prefill_tps(self) -> Optional[float]:
        """None on several attention ranks: each measures its own prefill, and a reload given up
        on one rank but claimed on another would pair different jobs in the workers' collectives."""
        inquirer = self._inquirer()
        if inquirer is None or self._agreement is not None:
            return None
        return self._prefill_watch.tps(inquirer)

    def _inquirer(self) -> Any:
        return None if self._scheduler_load is None else self._scheduler_load.inquirer

    def claim_reload(self, pending: PendingReload, demand: ReloadDemand, held_need: int) -> Optional[torch.Tensor]:
        """Device memory for a reload: the host-only part of the anchor's path loaded back
        (the anchor's device part may have been evicted since arrival, so the plan is made
        again), the path locked, and ``demand.tokens`` slots for the SSD pages if the room
        left (free + evictable less the running requests' decode reserve) still admits every
        holder's request and this one (`reload_admission.admits`); None, holding nothing, when
        the pool cannot take them now."""
        tokens = demand.tokens
        anchor, probe = pending.anchor, self._direct.probe
        host_tokens = probe.host_only_tokens(anchor)
        if host_tokens:
            if not self.load_back(anchor) or self.tree_core.is_full_device_evicted(anchor):
                return None
            # Started now, not with the next prefill batch: none may come while every
            # request waits (the request is published once HiCache has acked the copy).
            self.cache_controller.start_loading()
        path_lock = self.inc_lock_ref(anchor).to_dec_params()
        inquirer = self._inquirer()
        room = self._component_available_size(ComponentType.FULL) + self.full_evictable_size()
        room -= decode_reserve(inquirer) if inquirer is not None else 0
        slots = self._alloc_device(tokens) if admits(room, held_need, demand) else None
        if slots is None:
            self.dec_lock_ref(anchor, path_lock)
            return None
        state_slot = None
        if pending.state_key is not None:
            state_slot = self._alloc_state_slot()
            if state_slot is None:
                self.token_to_kv_pool_allocator.free(slots)
                self.dec_lock_ref(anchor, path_lock)
                return None
        pending.path_lock = path_lock
        pending.host_tokens = host_tokens
        pending.state_slot = state_slot
        pending.plan = probe.plan(anchor, host_tokens, pending.start, pending.tail)
        return slots

    def submit_reload(self, pending: PendingReload, slots: torch.Tensor) -> ReloadJob:
        job = reload_job(pending, slots, self.page_size, self._direct.reloader.page_bytes)
        return self._direct.worker.submit(job)

    def _alloc_state_slot(self) -> Optional[torch.Tensor]:
        """One device mamba slot for a reload's checkpoint (the boundary node's value once
        published), a mamba leaf evicted for it if none is free; None when none can be had."""
        allocator = self.req_to_token_pool.mamba_allocator
        slot = allocator.alloc(1)
        if slot is None:
            self.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))
            slot = allocator.alloc(1)
        return slot

    def _alloc_device(self, tokens: int) -> Optional[torch.Tensor]:
        if self._component_available_size(ComponentType.FULL) < tokens:
            self.evict_for_alloc(
                EvictParams(num_tokens=tokens - self._component_available_size(ComponentType.FULL))
            )
        if self._component_available_size(ComponentType.FULL) < tokens:
            return None
        return self.token_to_kv_pool_allocator.alloc(tokens)

    def free_reload_slots(self, slots: torch.Tensor) -> None:
        self.token_to_kv_pool_allocator.free(slots)

    def free_reload_state(self, slot: torch.Tensor) -> None:
        self.req_to_token_pool.mamba_allocator.free(slot)

    def unlock_reload(self, pending: PendingReload) -> None:
        for lock in (pending.path_lock, pending.anchor_lock):
            if lock is not None:
                self.dec_lock_ref(pending.anchor, lock)
        self.dec_host_lock_ref(pending.anchor, pending.host_lock)
        if pending.tail_lock is not None:
            self.dec_host_lock_ref(pending.tail_node, pending.tail_lock)
            pending.tail_lock = None

    def _reload_tokens(self, field: str) -> int:
        # The base constructor sizes the pools before ours has made the reloads.
        reloads = getattr(self, "_reloads", None)
        return 0 if reloads is None else getattr(reloads, field)

    def protected_size(self) -> int:
        # Slots held by reloads in flight are allocated but owned by no node yet: SGLang's
        # pool accounting (and its idle leak check) counts them as protected.
        return super().protected_size() + self._reload_tokens("inflight_tokens")

    def full_protected_size(self) -> int:
        # Hybrid pools' accounting reads the FULL component's protected size.
        return super().full_protected_size() + self._reload_tokens("inflight_tokens")

    def mamba_protected_size(self) -> int:
        # The mamba slots reloads in flight hold for their checkpoints (owned by no node yet).
        return super().mamba_protected_size() + self._reload_tokens("inflight_states")

    def _host_eviction_gate(self, node: Any) -> bool:
        """The tree core's host eviction gate (`tree_core.py`): True reclaims ``node`` now, False
        keeps it while it is written to storage first. Write-before-reclaim per page (paper 4.2): a full-attention host leaf whose deepest
        admitted page is not its last (`SariaHiCachePolicy.admitted_prefix_pages`) is split
        there first. The suffix is reclaimed now (dropped, as the policy decides for it); the
        prefix becomes a host leaf of its own, asked next by the same eviction, and is written
        before its reclaim."""
        policy = self._policy() if self.enable_storage else None
        if policy is not None and set(self.tree_components) == {ComponentType.FULL}:
            pages = policy.admitted_prefix_pages(node)
            if pages:
                _, action = self.tree_core._split_node(node.key, node, pages * self.page_size)
                if action is not None:
                    self._apply_cache_actions([action])
                self._metrics.host_leaf_split()
        if policy is None:
            return True
        reclaim, writes = policy.on_host_evict(node)
        for node_id in writes:
            self._write_to_storage(node_id)
        return reclaim

    def evict_host(self, num_tokens: int, component_type: ComponentType = ComponentType.FULL) -> int:
        # State space under the policy: whole host units (FA pages + state) through the gate.
        if (component_type != ComponentType.MAMBA or self.host_memory_mode == "buffer_only"
                or not self.enable_storage or self._policy() is None):
            return super().evict_host(num_tokens, component_type)
        result = evict_host_units(self.tree_core, num_tokens)
        self._apply_eviction_result(result)
        return result.tracker.get(component_type, 0)

    # ------------------------------------------------------------------ waiting: HiCache's prefetch policies
    def check_prefetch_progress(self, request: CacheRequestHandle) -> bool:
        """Whether a request may leave the waiting queue: its reload has ended and been
        published (or released) by `check_hicache_events`. Only reports: the scheduler
        calls this inside its prefill loop, whose token budget a device allocation or a
        host -> device load here would break."""
        if self._direct is None:
            return super().check_prefetch_progress(request)
        return request.rid not in self._reloads

    def reload_loading(self, pending: PendingReload) -> bool:
        return pending.anchor in self.ongoing_load_back

    def resume_follower(self, rid: str, context: Follower) -> None:
        self.note_storage_span(rid, 0, resume(self, context))

    def _agree_min(self, value: int) -> int:
        """The smallest ``value`` over the attention ranks (identity on one rank): a reload
        exists on every rank or on none, with the same number of pages."""
        if self.tp_world_size <= 1:
            return value
        tensor = torch.tensor(value, dtype=torch.int64)
        self._all_reduce_attn_groups(tensor, torch.distributed.ReduceOp.MIN)
        return int(tensor.item())

    def all_ranks_done(self, done: list[bool]) -> list[bool]:
        """Ranks see their workers finish at different steps; a reload is published on all
        of them at the same step (one MIN all-reduce per step, as HiCache's own progress
        check; nothing on one rank)."""
        if self.tp_world_size <= 1 or not done:
            return done
        tensor = torch.tensor(done, dtype=torch.int64)
        self._all_reduce_attn_groups(tensor, torch.distributed.ReduceOp.MIN)
        return [bool(v) for v in tensor.tolist()]

    # ------------------------------------------------------------------ ready: publish the landed pages
    def publish_reload(self, pending: PendingReload) -> None:
        """The reload has ended with pages to use: the landed SSD pages join the tree as
        device nodes after the plan's DRAM part (loaded back by HiCache at submission), and
        the request is admitted with all of it as a device hit. Its slots past the landed
        pages go back to the pool. (Reporting them as a host hit instead would make the
        scheduler budget fresh slots for pages that already have theirs.)"""
        request, job = pending.request, pending.job
        # Tail DRAM pages (hybrid only, so all landed: a partial load was released).
        dram_tokens = pending.tail_dram_pages * self.page_size
        ssd_tokens = job.pages * self.page_size
        published, unused = job.slots[: dram_tokens + ssd_tokens], job.slots[dram_tokens + ssd_tokens :]
        hashes = job.page_hashes[: job.pages]
        if unused.numel():
            self.token_to_kv_pool_allocator.free(unused)
        if self._kv_audit is not None:
            audit_reload(self._kv_audit, pending, hashes, published, dram_tokens)
        self._metrics.pages_read("device", job.pages + int(pending.state_slot is not None))
        self._policy().on_ssd_reload(hashes)
        last_node = self._insert_tail(request.rid, pending, published)
        self.unlock_reload(pending)
        # Held until the request's prefill (`checkpoint`), its abort or the hold's deadline.
        hold = Hold(last_node, self.inc_lock_ref(last_node).to_dec_params(), pending.start + len(published),
                    self.step_clock() + self._direct.hold_s)
        self._unhold(self._holds.add(request.rid, hold))
        self._published[request.rid] = pending.start + len(published)
        # SGLang's cached-token report: the SSD part is this request's storage hit (the
        # DRAM part, loaded before admission, is reported as a device hit, as HiCache's).
        if ssd_tokens:
            self.prefetch_loaded_tokens_by_reqid[request] = ssd_tokens
            self.prefetch_loaded_storage_start_by_reqid[request] = pending.start + dram_tokens
        report_reload(self._metrics, pending, dram_tokens, ssd_tokens)

    def _finalize_match_result(self, params: MatchPrefixParams, result: MatchResult) -> MatchResult:
        """A request's prefix match: the policy counts its reuse (threshold writes), and the
        match right after a publish (the scheduler's, for the same request): the
        request's own insert after prefill must not count the reloaded nodes as a reuse
        (that would fire HiCache's write-through of every reloaded page, bypassing lazy
        partial promotion)."""
        policy = self._policy()
        if policy is not None and params.req is not None:
            # The request's reuse counts once; nodes whose reuse count reached theta_R are written.
            for node_id in policy.on_request_match(params.req.rid, self.tree_core, result.last_host_node):
                self._write_to_storage(node_id)
        result = super()._finalize_match_result(params, result)
        req = params.req
        if req is not None and self._published:
            end = self._published.pop(req.rid, None)
            if end is not None:
                req.kv.cache_inserted_len = max(req.kv.cache_inserted_len, end)
        return result

    def init_load_back(self, params: InitLoadBackParams) -> Optional[tuple[int, NodeId]]:
        loaded = super().init_load_back(params)
        if loaded is not None and loaded[0] and self._direct is not None:
            self._metrics.reloaded("dram", loaded[0])
            # A DRAM-only reload (HiCache's copy) shares the link too: the coordinator
            # counts it, so SSD reads admitted while it copies get their fair allowance.
            self._direct.pacer.begin(loaded[0] * self._direct.reloader.page_bytes // self.page_size, 0)
        return loaded

    def _insert_tail(self, rid: str, hit: PendingReload, slots: torch.Tensor) -> NodeId:
        """Publish the SSD pages as device nodes under the anchor; the leading share chosen for
        promotion ends at a node of its own, promoted after the request's prefill."""
        path = self.path_device_indices(hit.anchor).to(torch.int64)
        assert len(path) == hit.start, (rid, len(path), hit.start)
        dram = hit.tail_dram_pages * self.page_size  # the plan's DRAM part: in host memory already
        promoted = self._promotion_tokens(hit, (len(slots) - dram) // self.page_size) if len(slots) > dram else 0
        promote = dram + promoted if promoted else 0  # tokens past hit.start ending the promoted node
        if hit.state_slot is not None and promote < len(slots):
            # A hybrid node's FA pages and its checkpoint are promoted as one unit (paper
            # 4.3): a share of the pages without the state at their end is no reusable prefix.
            promoted = promote = 0
        node = hit.anchor
        cuts = [hit.start + promote] if 0 < promote < len(slots) else []
        for end in cuts + [hit.start + len(slots)]:
            done = len(path)
            path = torch.cat([path, slots[done - hit.start : end - hit.start].to(torch.int64)])
            # inserted_len = end: these nodes hold reloaded KV, not a computed reuse, so
            # no hit is counted and HiCache's write-through to host does not fire for them.
            # Hybrid: the boundary node gets the reloaded checkpoint as its mamba value.
            result = self.insert(
                InsertParams(
                    key=hit.key[:end],
                    value=path,
                    mamba_value=hit.state_slot,
                    prev_prefix_len=done,
                    inserted_len=end,
                )
            )
            node = result.last_device_node
            if end == hit.start + promote:
                self._promotions[rid] = (node, promoted)
        if hit.state_slot is not None and result.mamba_exist:
            # The node had a state already: ours is a duplicate.
            self.req_to_token_pool.mamba_allocator.free(hit.state_slot)
        return node

    def _promotion_tokens(self, hit: PendingReload, pages: int) -> int:
        """Lazy partial promotion (paper 4.4): how many leading SSD tokens to copy to host.
        ``PromotionController.promotion_set`` decides, as in the replay: the tree's prefix is
        host-backed (write-through), the headroom is free host pages plus the host leaves next in eviction
        order that a promotion may displace (not reused within P_tau; robust rule: on SSD)."""
        page = self.page_size
        start = hit.start // page + hit.tail_dram_pages  # the prefix DRAM holds before the SSD pages
        free = self.cache_controller.mem_pool_host.available_size() // page
        tree = self.tree_core
        return page * self._policy().promotion_pages(
            self._direct.promotion, start + pages, start, pages, free,
            tree.evictable_host_leaves, tree.eviction_strategy.get_priority,
        )

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """After the request's prefill (SGLang checkpoints what it computed): promote the
        share of its SSD reload picked at publish (paper 4.4: the copy to host follows the
        prefill, so it does not compete with the reload and the prefill it serves). Before the
        request's own insert, whose write-through would take the host headroom the promotion
        was sized by at publish."""
        hold = self._holds.take(req.rid)
        if hold is not None:  # admitted: what it did not match was reloaded for nothing
            self._metrics.reload_wasted(hold.end - req.kv.cache_protected_len)
        self._unhold(hold, req.rid)  # and a reload given up for the prefill leaves the ledger
        promotion = self._promotions.pop(req.rid, None)
        if promotion is not None:
            self._promote(*promotion)
        super().checkpoint(req, up_to=up_to, **kwargs)

    def note_prefill_batch(self, batch: Any = None) -> None:
        super().note_prefill_batch(batch)
        self._prefill_formed = batch is not None

    def _stalled(self) -> bool:
        """Whether the scheduler is stuck: the last admission pass formed no prefill batch,
        nothing runs and no reload is reading. Only a deadline would change that state (a hold's,
        or a held-back reload's memory deadline): a request ahead in SGLang's queue that does not
        fit stops its admission loop, and reloads held back for its room never get it; the claim
        rule prevents the case it can see (`mem_cache/reload_admission.py`), not every one. One
        rank only: on several the deadlines stay the bound (ranks must decide alike)."""
        formed, self._prefill_formed = self._prefill_formed, None
        inquirer = self._inquirer()
        return (formed is False and self._agreement is None and inquirer is not None
                and not self._reloads.inflight_tokens and inquirer.get_running_batch().is_empty())

    def _release_stalled_holds(self) -> None:
        """Stuck (`_stalled`): the tails held before the last pass become evictable, so the
        request they block is admitted; logged with the room and the queue's first request."""
        inquirer = self._inquirer()
        head = next((req for req in inquirer.get_waiting_queue() if req.rid not in self._reloads), None)
        room = self._component_available_size(ComponentType.FULL) + self.full_evictable_size()
        why = f"was not admitted: the scheduler stalled behind the held reloads (device room {room} tokens" + (
            ")" if head is None else f"; first in its queue: {head.rid}, {len(head.full_untruncated_fill_ids)} prompt "
            f"tokens, {head.prefix_len} matched on the device at its last admission pass)")
        for rid in self._held_before & self._holds.locked():
            self._release_hold(rid, self._holds.by_rid[rid], "stalled", why)

    def _log_held_back_while_stalled(self, demand: ReloadDemand) -> None:
        """A reload the device-memory rule holds back while nothing runs (`_stalled`): only its
        memory deadline moves it; logged once per reload with what the rule weighed."""
        if demand.rid == self._stall_logged:
            return
        self._stall_logged = demand.rid
        inquirer = self._inquirer()
        room = self._component_available_size(ComponentType.FULL) + self.full_evictable_size()
        queue = [
            f"{req.rid[:8]}({len(req.full_untruncated_fill_ids)} tok, device {req.prefix_len}, "
            f"{'reload' if req.rid in self._reloads else 'holder' if req.rid in self._reloads.holders else 'plain'})"
            for req in inquirer.get_waiting_queue()[:6]
        ]
        logger.info(
            "saria: reload of request %s held back while the scheduler is idle: device room %d tokens, "
            "its claim %d + need %d, requests ahead %d, holders %s; queue: %s",
            demand.rid, room, demand.tokens, demand.need, demand.ahead, self._reloads.holders.needs, ", ".join(queue),
        )

    def _release_hold(self, rid: str, hold: Hold, reason: str, why: str) -> None:
        """Unlock a held tail before its request's prefill: evictable now, as a request ahead of
        it in the queue may need the room; its request is admitted with what is left of it."""
        logger.warning("saria: request %s %s; its reloaded prefix is evictable now", rid, why)
        self._metrics.hold_released(reason)
        self._unhold(hold, rid)

    def _unhold(self, hold: Optional[Hold], rid: Optional[str] = None) -> None:
        """A published tail's hold ends (``rid``: its request's claim on the room with it)."""
        if hold is not None and hold.lock is not None:
            self.dec_lock_ref(hold.node, hold.lock)
            hold.lock = None
        if rid is not None:
            self._reloads.holders.release(rid)

    def _promote(self, node_id: NodeId, tokens: int) -> None:
        """Copy a reloaded node device -> host with HiCache's write-through (async D2H);
        nothing if it left the device since (its request was not admitted in time)."""
        try:
            if self.tree_core.is_full_device_evicted(node_id):
                return
        except KeyError:  # the node left the tree
            return
        if self._execute_and_commit_kv_backup(self.tree_core.build_backup_kv_action(node_id)):
            self._metrics.promoted(tokens)

    # ------------------------------------------------------------------ lifecycle
    def check_hicache_events(self) -> None:
        if self._kv_audit_pending:  # the first step, before any page moves
            self._kv_audit_pending = False
            self._kv_audit = install_kv_audit(self.cache_controller, self._backend(), self._metrics.kv_audited)
        if self._runtime is not None:
            self._runtime.step()
        for rid, hold in self._holds.expired(self.step_clock()):
            self._release_hold(rid, hold, "deadline", f"was not admitted within transfer.reload_hold_s="
                               f"{self._direct.hold_s:.0f} s of its reload")
        if self._direct is not None:
            stalled = self._stalled()
            if stalled:
                self._release_stalled_holds()
            self._reloads.reap()
            self._reloads.advance(self.prefetch_stop_policy)
            self._reloads.resume_reprobes()
            held_back = self._reloads.start_deferred(self._direct.max_inflight_tokens, wait=self._direct.blocking,
                                                     stalled=stalled)
            if stalled and held_back is not None:
                self._log_held_back_while_stalled(held_back)
        super().check_hicache_events()
        if self._runtime is not None:
            self._runtime.end_step()  # counters changed since the last step go to the store
        self._report_writes_pending()
        self._held_before = self._holds.locked()
        if self._audit and self._policy() is not None:
            # Audit when the pools changed since the last audit (the scheduler polls idle too).
            state = (
                self.token_to_kv_pool_allocator.available_size(),
                self.cache_controller.mem_pool_host.available_size(),
                self._backend().store.stats().objects,
            )
            if state != self._audited_state:
                self._audited_state = state
                self.audit_tiers()

    def audit_tiers(self) -> TierAudit:
        """Check every node's device/host/SSD locations and counters (audit/tiers.py)."""
        backend = self._backend()
        host_pool = self.cache_controller.mem_pool_host
        aux = ()
        if ComponentType.MAMBA in self.tree_components:
            mamba_allocator = getattr(self.req_to_token_pool, "mamba_allocator", None)
            aux = (AuxComponent("mamba", int(ComponentType.MAMBA), getattr(mamba_allocator, "free_slots", None)),)
        audit = audit_tiers(
            self.tree_core.root_node,
            self.page_size,
            getattr(self.token_to_kv_pool_allocator, "get_all_free_pages", lambda: None)(),
            getattr(host_pool, "slot_used", None),
            backend.exists,
            self._policy().metadata,
            aux,
        )
        self._metrics.audited(audit.pages, len(audit.errors))
        for error in audit.errors:
            logger.error("saria tier audit: %s", error)
        return audit

    def release_aborted_request(self, request: CacheRequestHandle) -> None:
        self._published.pop(request.rid, None)
        self._promotions.pop(request.rid, None)
        self._unhold(self._holds.take(request.rid), request.rid)
        self._reloads.abort(request.rid)
        super().release_aborted_request(request)

    def reset(self) -> None:
        if hasattr(self, "_reloads"):  # the base constructor resets before ours runs
            # flush_cache runs with no request queued: only released jobs may still run;
            # they are waited for (a chunk's reads) so no worker writes into the reset pool.
            self._reloads.reset()
            self._published, self._promotions = {}, {}
            self._holds.clear()
        super().reset()
        HostLeafOrder.install(self.tree_core)  # prewrite and headroom read its eviction order
