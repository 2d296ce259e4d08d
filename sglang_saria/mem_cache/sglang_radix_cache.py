"""SGLang's radix cache with Saria's reload path (paper 4.3-4.5), for `--hicache-storage-backend saria`.

HiCache stages a storage hit through host memory: prefetch into the host pool, insert
as host nodes, then load host -> device. `SariaRadixCache` (chosen by patch 006 for
FULL-attention models) reads SSD hits straight into the device KV pool instead:

- match: beyond the tree's device+host prefix, the store is probed for the next
  pages; the core's planner (`planner.plan_reload`) turns the locations into one plan
  (DRAM pages from the host pool, SSD pages from the store) reported to the scheduler
  as load-back tokens;
- load (`init_load_back`): SSD pages are read into fresh device slots through a
  staging buffer on the pool's device, and each chunk goes with the DRAM pages due by
  then in one gather from staging + host pool (`storage/device_reload.py`), paced by the
  coordinator (`RealTimePacer`: coordinated spreads the DRAM copy over the SSD reads);
  the host nodes get their device values as after HiCache's load-back, the SSD tail
  joins the tree as device nodes. A store failure returns nothing loaded, so the
  scheduler recomputes (counted as a fallback), never serving wrong KV;
- promotion: the share of SSD pages the promotion controller picks (leading pages,
  recency-protected host headroom) is copied device -> host by HiCache's write-through.

Everything else (admission at host eviction, write-before-reclaim, prewrite) is the
adapter's (`sglang_adapter.py`, patch 005) and unchanged.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
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
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import NodeId, UnifiedRadixCache
from sglang.srt.mem_cache.utils import get_storage_hash_str

from sglang_saria.mem_cache.coordinator import RealTimePacer
from sglang_saria.mem_cache.kv_audit import AUDIT_ENV as KV_AUDIT_ENV
from sglang_saria.mem_cache.kv_audit import KVAudit, install_transfer_audit, pool_rows_of
from sglang_saria.mem_cache.kv_audit import audit_enabled as kv_audit_enabled
from sglang_saria.mem_cache.metadata import ContextNode
from sglang_saria.mem_cache.planner import ReloadPlan, plan_reload
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.mem_cache.sglang_adapter import page_key
from sglang_saria.mem_cache.sglang_metrics import SariaServingMetrics
from sglang_saria.mem_cache.tier_audit import AuxComponent, audit_tiers
from sglang_saria.mem_cache.tiers import DRAM, SSD
from sglang_saria.storage.device_reload import DeviceReloader, UnsupportedPoolLayout

logger = logging.getLogger(__name__)


@dataclass
class _SSDHit:
    """What a request's match found past the tree, consumed by its `init_load_back`."""

    anchor: NodeId  # deepest tree node of the match (device or host); the SSD pages follow it
    key: RadixKey  # the request's key up to the end of the SSD pages
    start: int  # tokens before the SSD pages (device + host)
    host_tokens: int  # of those, tokens to load from the host pool
    page_hashes: list[str]  # the SSD pages, in order
    plan: ReloadPlan


class SariaRadixCache(UnifiedRadixCache):
    """UnifiedRadixCache whose storage hits go SSD -> device pool, not SSD -> host -> device."""

    def __init__(self, params: Any) -> None:
        super().__init__(params)
        self._ssd_hits: dict[str, _SSDHit] = {}
        # Locks holding freshly reloaded tails until their request locks its own path.
        self._reload_locks: list[tuple[NodeId, Any]] = []
        self._reloader: Optional[DeviceReloader] = None
        self._direct: Optional[bool] = None  # decided once the storage backend is attached
        self._pacer: Optional[RealTimePacer] = None
        self._promotion: Optional[PromotionController] = None
        self._metrics = SariaServingMetrics.get()
        self._audit = os.environ.get("SGLANG_SARIA_AUDIT_TIERS", "0") == "1"
        self._audited_state: tuple = ()
        # Installed once the storage backend is attached (after this constructor).
        self._kv_audit: Optional[KVAudit] = None
        self._kv_audit_pending = kv_audit_enabled()
        self._writes_in_flight = 0

    # ------------------------------------------------------------------ setup
    def _backend(self) -> Any:
        return getattr(self.cache_controller, "storage_backend", None)

    def _direct_enabled(self) -> bool:
        """Direct reload runs with a saria backend, a FULL-only tree and a row-addressable pool."""
        if self._direct is not None:
            return self._direct
        backend = self._backend()
        policy = getattr(backend, "saria_policy", None)
        self._direct = False
        if not getattr(self, "enable_storage", False) or policy is None or not policy.config.transfer.direct_reload:
            return False
        if set(self.tree_components) != {ComponentType.FULL} or self.tree_core.is_eagle:
            logger.info("saria: direct reload needs a full-attention, non-EAGLE tree; using HiCache prefetch")
            return False
        host_pool = self.cache_controller.mem_pool_host
        try:
            self._reloader = DeviceReloader(
                backend.read_page_async,
                self.cache_controller.mem_pool_device,
                host_pool.layout,
                self.page_size,
                backend.page_bytes,
                host_pool=host_pool,
            )
        except UnsupportedPoolLayout as e:
            logger.warning("saria: direct reload disabled (%s); using HiCache prefetch into host memory", e)
            return False
        cfg = policy.config
        self._pacer = RealTimePacer(cfg.bandwidth, cfg.transfer.mode)
        self._promotion = PromotionController.from_config(cfg.promotion, cfg.bandwidth)
        self._direct = True
        logger.info(
            "saria: direct SSD -> device reload on (transfer.mode=%s, promotion=%s r_eff=%.2f)",
            cfg.transfer.mode,
            cfg.promotion.mode,
            self._promotion.r_eff,
        )
        return True

    def _install_kv_audit(self) -> None:
        """SGLANG_SARIA_AUDIT_KV=1: check the bytes of every page moved between device,
        host and store (kv_audit.py): HiCache's copies, the store's reads and writes, and
        the direct reload's. Runs at the first scheduler step, before any page moves."""
        self._kv_audit_pending = False
        backend = self._backend()
        if self.cache_controller is None or getattr(backend, "store", None) is None:
            logger.warning("saria: %s=1 needs HiCache with the saria store; KV audit off", KV_AUDIT_ENV)
            return
        audit = KVAudit(
            pool_rows_of(self.cache_controller),
            self._metrics.kv_audited,
            log_dir=backend.store.config.data_dirs[0],
        )
        install_transfer_audit(self.cache_controller, audit)
        backend.kv_audit = self._kv_audit = audit
        logger.info("saria: KV audit on for pools %s", sorted(audit.pools))

    # ------------------------------------------------------------------ HiCache's staging path, off
    def query_storage_hit_length(self, *args: Any, **kwargs: Any) -> int:
        if self._direct_enabled():
            return 0
        return super().query_storage_hit_length(*args, **kwargs)

    def prefetch_from_storage(self, *args: Any, **kwargs: Any) -> Optional[bool]:
        if self._direct_enabled():
            return None
        return super().prefetch_from_storage(*args, **kwargs)

    # ------------------------------------------------------------------ match: plan DRAM + SSD
    def _finalize_match_result(self, params: MatchPrefixParams, result: MatchResult) -> MatchResult:
        result = super()._finalize_match_result(params, result)
        req = params.req
        if req is None or not self._direct_enabled():
            return result
        self._ssd_hits.pop(req.rid, None)
        hit = self._probe_ssd(params.key, result)
        if hit is None:
            return result
        self._ssd_hits[req.rid] = hit
        end = hit.start + len(hit.page_hashes) * self.page_size
        return result._replace(
            host_hit_length=end - result.device_prefix_len,
            full_kv_hit_length=max(result.full_kv_hit_length, end),
        )

    def _probe_ssd(self, key: RadixKey, result: MatchResult) -> Optional[_SSDHit]:
        page = self.page_size
        start = result.device_prefix_len + result.host_hit_length
        tail = (len(key) - start) // page * page
        anchor = result.best_match_node
        # Any page past the DRAM part is worth a read: unlike HiCache's asynchronous prefetch
        # (gated by prefetch_threshold), a direct read is one in-memory index probe and the
        # SSD pages join the same plan as the DRAM pages before them.
        if tail < page or (result.host_hit_length and anchor != result.last_host_node):
            return None
        last_hash = None if self.is_root(anchor) else self.get_last_hash_value(anchor)
        if last_hash is None and not self.is_root(anchor):
            return None  # an unhashed anchor would seed the chain wrongly: no match possible
        hashes = get_storage_hash_str(key[start : start + tail], last_hash, page_size=page)
        n_ssd = self._agree_min(self._backend().batch_exists(hashes))
        if n_ssd == 0:
            return None
        hashes = hashes[:n_ssd]
        host_hashes = self._host_hashes(anchor, result.host_hit_length)
        plan = self._plan(host_hashes, hashes)
        if plan.ssd_blocks == 0:
            return None
        n_ssd = plan.ssd_blocks
        return _SSDHit(
            anchor=anchor,
            key=key[: start + n_ssd * page],
            start=start,
            host_tokens=result.host_hit_length,
            page_hashes=hashes[:n_ssd],
            plan=plan,
        )

    def _host_hashes(self, anchor: NodeId, host_tokens: int) -> list[str]:
        """Page hashes of the host-only part of the match (the pages just above ``anchor``)."""
        pages: list[str] = []
        node = self.tree_core.node_by_id(anchor)
        while len(pages) * self.page_size < host_tokens and node is not None and node.parent is not None:
            pages[:0] = node.hash_value or []
            node = node.parent
        return pages[len(pages) - host_tokens // self.page_size :] if host_tokens else []

    def _plan(self, host_hashes: list[str], ssd_hashes: list[str]) -> ReloadPlan:
        """The core planner over the pages past the device prefix: DRAM where the host pool
        has them, SSD where only the store does."""
        backend = self._backend()
        nodes: dict[int, ContextNode] = {}
        keys = []
        for h in host_hashes:
            node = nodes[page_key(h)] = ContextNode(0.0, has_checkpoint=False)
            node.fa_loc = DRAM | (SSD if backend.exists(h) else 0)
            keys.append(page_key(h))
        for h in ssd_hashes:
            node = nodes[page_key(h)] = ContextNode(0.0, has_checkpoint=False)
            node.fa_loc = SSD
            keys.append(page_key(h))
        planner = backend.saria_policy.config.transfer.planner
        plan = plan_reload(keys, nodes, planner)
        if plan.sources[: len(host_hashes)].count(DRAM) != len(host_hashes):
            raise RuntimeError(f"saria: planner {planner!r} moved host-resident pages off DRAM: {plan}")
        return plan

    # ------------------------------------------------------------------ load: one plan, two sources
    def init_load_back(self, params: InitLoadBackParams) -> Optional[tuple[int, NodeId]]:
        req = params.req
        hit = self._ssd_hits.pop(req.rid, None) if req is not None else None
        if hit is None:
            loaded = super().init_load_back(params)
            if loaded is not None and loaded[0] and self._direct:
                self._metrics.reloaded("dram", loaded[0])
                # A DRAM-only reload (HiCache's copy) shares the link too: the coordinator
                # counts it, so SSD reads admitted while it copies get their fair allowance.
                self._pacer.begin(loaded[0] * self._reloader.page_bytes // self.page_size, 0)
            return loaded
        if hit.anchor != params.best_match_node:
            return self._fallback(req, "stale_match")
        ssd_tokens = len(hit.page_hashes) * self.page_size
        host_lock = self.inc_host_lock_ref(hit.anchor).to_dec_params()
        path_lock = self.inc_lock_ref(hit.anchor).to_dec_params()
        try:
            return self._load_plan(req, hit, params, ssd_tokens)
        finally:
            self.dec_lock_ref(hit.anchor, path_lock)
            self.dec_host_lock_ref(hit.anchor, host_lock)

    def _load_plan(
        self, req: Any, hit: _SSDHit, params: InitLoadBackParams, ssd_tokens: int
    ) -> tuple[int, NodeId]:
        t0 = time.perf_counter()
        if params.mem_quota is not None and hit.host_tokens + ssd_tokens > params.mem_quota:
            return self._fallback(req, "mem_quota")
        # The plan's DRAM pages go in the same gathers as its SSD pages when the host pool
        # allows (its MHA layouts); otherwise HiCache's host -> device copy loads them after.
        host_xfer = None
        if hit.host_tokens and self._reloader.moves_host_pages:
            host_xfer, comp_xfers = self.tree_core.build_load_back_spec(hit.anchor, req=req)
            if comp_xfers or len(host_xfer.host_indices) != hit.host_tokens:
                return self._fallback(req, "host_spec")
        joint_host = hit.host_tokens if host_xfer is not None else 0
        slots = self._alloc_device(ssd_tokens + joint_host)
        if slots is None:
            return self._fallback(req, "device_memory")
        ssd_slots, host_dev = slots[:ssd_tokens], slots[ssd_tokens:]
        bytes_per_token = self._reloader.page_bytes // self.page_size
        ticket = self._pacer.begin(hit.host_tokens * bytes_per_token, ssd_tokens * bytes_per_token)
        try:
            outcome = self._reloader.load(
                hit.page_hashes,
                ssd_slots,
                host_xfer.host_indices if host_xfer is not None else None,
                host_dev,
                lambda done: self._pacer.pace_ssd(ticket, done),
            )
        finally:
            self._pacer.end(ticket)
        if not self._agree_min(int(outcome.ok)) and outcome.ok:
            outcome.ok, outcome.reason = False, "peer_rank"
        if not outcome.ok:
            self.token_to_kv_pool_allocator.free(slots)
            return self._fallback(req, f"store_{outcome.reason}")
        self._metrics.pages_read("device", outcome.pages)
        self._backend().saria_policy.on_ssd_reload(hit.page_hashes)
        if self._kv_audit is not None:
            self._kv_audit.store_to_device(PoolName.KV.value, hit.page_hashes, ssd_slots)
            if host_xfer is not None:
                self._kv_audit.host_to_device(PoolName.KV.value, host_xfer.host_indices, host_dev)

        if host_xfer is not None:
            # The copy is done: commit the host nodes' device values as HiCache's ack would.
            self._apply_cache_actions(self.tree_core.commit_load_back(hit.anchor, host_dev, host_xfer, {}))
            self.tree_core.finish_load_back(hit.anchor)
            host_loaded = hit.host_tokens
        elif hit.host_tokens:
            loaded = super().init_load_back(
                InitLoadBackParams(hit.anchor, hit.host_tokens, params.mem_quota, req)
            )
            host_loaded = loaded[0] if loaded is not None else 0
            if host_loaded < hit.host_tokens:
                self.token_to_kv_pool_allocator.free(slots)
                return self._fallback(req, "host_load")
        else:
            host_loaded = 0

        last_node = self._insert_tail(req, hit, ssd_slots)
        # The request's own insert after prefill must not count these nodes again either.
        req.kv.cache_inserted_len = max(req.kv.cache_inserted_len, hit.start + ssd_tokens)
        self._reload_locks.append((last_node, self.inc_lock_ref(last_node).to_dec_params()))
        # SGLang's cached-token report: the SSD part is this request's storage hit.
        req.storage_hit_start = hit.start
        req.storage_hit_length = ssd_tokens
        req.host_hit_is_storage = False
        self._metrics.reloaded("dram", host_loaded)
        self._metrics.reloaded("ssd", ssd_tokens)
        logger.debug(
            "saria reload %s: %d device + %d dram + %d ssd tokens (plan %d/%d blocks, %s) in %.2f ms",
            req.rid,
            hit.start - hit.host_tokens,
            host_loaded,
            ssd_tokens,
            hit.plan.dram_blocks,
            hit.plan.ssd_blocks,
            "dram by HiCache's copy" if hit.host_tokens and host_xfer is None else "one gather plan",
            (time.perf_counter() - t0) * 1e3,
        )
        return host_loaded + ssd_tokens, last_node

    def _agree_min(self, value: int) -> int:
        """The minimum over the attention ranks (each TP rank has its own store): every rank
        takes the same plan and the same success/fallback branch, as HiCache's hit query."""
        tensor = torch.tensor(value, dtype=torch.int64)
        self._all_reduce_attn_groups(tensor, torch.distributed.ReduceOp.MIN)
        return int(tensor.item())

    def _alloc_device(self, tokens: int) -> Optional[torch.Tensor]:
        if self._component_available_size(ComponentType.FULL) < tokens:
            self.evict_for_alloc(
                EvictParams(num_tokens=tokens - self._component_available_size(ComponentType.FULL))
            )
        if self._component_available_size(ComponentType.FULL) < tokens:
            return None
        return self.token_to_kv_pool_allocator.alloc(tokens)

    def _fallback(self, req: Any, reason: str) -> tuple[int, NodeId]:
        """Nothing loaded: the scheduler re-admits the request without its cached tail."""
        self._metrics.reload_fallback(reason)
        logger.warning("saria reload %s abandoned (%s): recomputing its prefix", req.rid, reason)
        return 0, req.last_node

    def _insert_tail(self, req: Any, hit: _SSDHit, slots: torch.Tensor) -> NodeId:
        """Publish the SSD pages as device nodes under the anchor; promote the chosen leading share."""
        path = self.path_device_indices(hit.anchor).to(torch.int64)
        assert len(path) == hit.start, (req.rid, len(path), hit.start)
        promote = self._promotion_tokens(hit) if len(slots) else 0
        node = hit.anchor
        cuts = [hit.start + promote] if 0 < promote < len(slots) else []
        for end in cuts + [hit.start + len(slots)]:
            done = len(path)
            path = torch.cat([path, slots[done - hit.start : end - hit.start].to(torch.int64)])
            # inserted_len = end: these nodes hold reloaded KV, not a computed reuse, so
            # no hit is counted and HiCache's write-through to host does not fire for them.
            result = self.insert(
                InsertParams(
                    key=hit.key[:end],
                    value=path,
                    prev_prefix_len=done,
                    inserted_len=end,
                    priority=req.priority or 0,
                )
            )
            node = result.last_device_node
            if end == hit.start + promote:
                self._promote(node, promote)
        return node

    def _promotion_tokens(self, hit: _SSDHit) -> int:
        """Lazy partial promotion (paper 4.4): how many leading SSD tokens to copy to host."""
        page = self.page_size
        ctrl = self._promotion
        reused = hit.start // page + len(hit.page_hashes)
        in_dram = hit.start // page  # the tree's prefix is host-backed (write-through)
        want = ctrl.target_blocks(reused, in_dram, len(hit.page_hashes))
        if want == 0:
            return 0
        return min(want, self._host_headroom_pages(ctrl)) * page

    def _host_headroom_pages(self, ctrl: PromotionController) -> int:
        """Free host pages plus evictable host leaves not reused within P_tau."""
        host_pool = self.cache_controller.mem_pool_host
        free = host_pool.available_size() // self.page_size
        policy = self._backend().saria_policy
        now = policy.clock()
        for leaf in self.tree_core.evictable_host_leaves:
            hashes = leaf.hash_value or []
            info = policy.metadata.get(page_key(hashes[-1])) if hashes else None
            if info is None or ctrl.evictable(now, info.t_reuse):
                free += len(hashes)
        return free

    def _promote(self, node_id: NodeId, tokens: int) -> None:
        """Copy a reloaded node device -> host with HiCache's write-through (async D2H)."""
        if self._execute_and_commit_kv_backup(self.tree_core.build_backup_kv_action(node_id)):
            self._metrics.promoted(tokens)

    # ------------------------------------------------------------------ lifecycle
    def check_hicache_events(self) -> None:
        if self._kv_audit_pending:
            self._install_kv_audit()
        # The requests admitted with a reload hold their own path locks by now.
        locks, self._reload_locks = self._reload_locks, []
        for node_id, lock_params in locks:
            self.dec_lock_ref(node_id, lock_params)
        super().check_hicache_events()
        if len(self.ongoing_backup) != self._writes_in_flight:
            self._writes_in_flight = len(self.ongoing_backup)
            self._metrics.storage_writes_in_flight(self._writes_in_flight)
        if self._audit and getattr(self._backend(), "saria_policy", None) is not None:
            # Audit when the pools changed since the last audit (the scheduler polls idle too).
            state = (
                self.token_to_kv_pool_allocator.available_size(),
                self.cache_controller.mem_pool_host.available_size(),
                self._backend().store.stats().objects,
            )
            if state != self._audited_state:
                self._audited_state = state
                self.audit_tiers()

    def audit_tiers(self) -> None:
        """Check every node's device/host/SSD locations and counters (tier_audit.py)."""
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
            backend.saria_policy.metadata,
            aux,
        )
        self._metrics.audited(audit.pages, len(audit.errors))
        for error in audit.errors:
            logger.error("saria tier audit: %s", error)

    def release_aborted_request(self, request: CacheRequestHandle) -> None:
        self._ssd_hits.pop(request.rid, None)
        super().release_aborted_request(request)

    def reset(self) -> None:
        self._ssd_hits = {}
        self._reload_locks = []
        super().reset()
