"""SGLang's radix cache with Saria's reload path (paper 4.3-4.5), for `--hicache-storage-backend saria`.

HiCache stages a storage hit through host memory: prefetch into the host pool, insert
as host nodes, then load host -> device. `SariaRadixCache` (chosen by patch 006) reads SSD
hits of full-attention and GDN hybrid models straight into the device pools instead:

- arrival (`prefetch_from_storage`, where HiCache starts its storage prefetch): beyond
  the tree's device+host match, the store's index is probed for the next pages; the
  core's planner (`planner.plan_reload`) makes one plan of DRAM and SSD pages; device
  slots are allocated for the SSD pages (at most `transfer.max_inflight_reload_tokens`
  in flight) and a job goes to the reload worker (`reload_worker.py`): reads into a
  staging buffer on the pool's device, gathers into the slots (`hicache/device_reload.py`),
  paced by the coordinator, all off the scheduler thread;
- waiting (`check_prefetch_progress`): the request stays in the waiting queue, as a
  prefetching one does, while every other request runs; HiCache's stop policies apply
  (`best_effort`, `timeout`, `wait_complete`); a cut reload keeps its leading pages;
- admission (match + `init_load_back`): the pages every rank landed are matched as a
  load-back; HiCache loads the plan's DRAM part host -> device, the SSD pages join the
  tree as device nodes, unused slots go back. A failed read (I/O error, checksum, missing
  page) or an abort publishes nothing past the last good page, the rest is recomputed,
  and failed pages leave the store index;
- promotion: the share of SSD pages the promotion controller picks at publish (leading
  pages, recency-protected host headroom) becomes a node of its own, copied device -> host
  by HiCache's write-through once the request's prefill is done (`checkpoint`).

Hybrid trees (FULL + MAMBA, issue 15): a reusable prefix ends where a GDN state is
available, so each page's checkpoint (on the mamba checkpoint grid: the node's host mamba
value, or the store's MAMBA sidecar of the page) goes into the plan (`reload_plan.py`) and
the core's planner ends it on the last one. The reload reserves a device mamba slot with
its FA slots, the worker reads the sidecar of the plan's last page with the first chunk
and gathers it with the last (`gdn_state.py`), and at publish the boundary node gets that
slot as its mamba value; the request's own copy-on-write slot comes from SGLang's device
match (`finalize_match_result_in_cache`), as for any device hit. A reload whose state did
not land publishes nothing (FA pages without the state at their end resume nothing).
Pages past the tree's match that the tree holds in host memory without a state (FA
extending beyond the last checkpoint: SGLang's hybrid match stops before them) are planned
from DRAM (`_tail_host_pages`): they go host -> device in the same gathers as the SSD pages
after them, with the state at the plan's end from the store's sidecar, and the insert at
publish revives host-only nodes with those rows (it frees the duplicate slots of nodes still
on the device). Such pages are the head of another branch: SGLang inserts a request's KV
only up to its last tracked checkpoint (`checkpoint_into_tree` takes the mamba component's
`mamba_last_track_seqlen` as the insert's length), so a node's FA pages run past a
checkpoint only where a request that left this prefix inside a checkpoint interval
continued to a state of its own further on.

Everything else (admission at host eviction, write-before-reclaim, prewrite) is the
policy's (`policy.py`, patch 005) and unchanged. With several attention ranks this
class gives the policy rank-agreed inputs (`rank_agreement.py`: an SSD view and a
step clock, agreed at each `check_hicache_events`) and times reload deadlines by that clock,
so every decision that changes the tree is the same on every rank.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from collections.abc import Callable, Sequence
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

from sglang_saria.hicache.backend import policy_of
from sglang_saria.hicache.host_leaf_order import HostLeafOrder
from sglang_saria.hicache.device_reload import DeviceReloader, StateLoad, UnsupportedPoolLayout
from sglang_saria.hicache.gdn_state import StateRows, UnsupportedStatePool
from sglang_saria.hicache.kv_audit import AUDIT_ENV as KV_AUDIT_ENV
from sglang_saria.hicache.kv_audit import KVAudit, install_transfer_audit, pool_rows_of
from sglang_saria.hicache.kv_audit import audit_enabled as kv_audit_enabled
from sglang_saria.hicache.metrics import SariaServingMetrics
from sglang_saria.hicache.policy import SariaHiCachePolicy, page_key
from sglang_saria.hicache.rank_agreement import RankAgreement
from sglang_saria.hicache.reload_worker import ReloadJob, ReloadWorker
from sglang_saria.hicache.tier_audit import AuxComponent, TierAudit, audit_tiers
from sglang_saria.hicache.unit_eviction import evict_host_units
from sglang_saria.mem_cache.budget import WriteBudgetController
from sglang_saria.storage.index import HOUR_S
from sglang_saria.mem_cache.coordinator import RealTimePacer
from sglang_saria.hicache.reload_plan import PageObjects, checkpoint_loc, plan_pages
from sglang_saria.mem_cache.planner import ReloadPlan
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.mem_cache.tiers import DRAM, SSD
from sglang_saria.hicache.reload_staging import report_staging

logger = logging.getLogger(__name__)

# Benchmark-only: the scheduler thread waits for each reload's reads, as the synchronous
# reload did before issue 12 (scripts/bench_serving.py --scenario concurrent compares them).
BLOCKING_RELOAD_ENV = "SARIA_BENCH_BLOCKING_RELOAD"


@dataclass
class _PendingReload:
    """A request's SSD hit, from its arrival (slots allocated, job submitted) to its
    admission (the landed pages join the tree) or release (slots freed)."""

    request: CacheRequestHandle
    anchor: NodeId  # deepest tree node of the arrival match (device or host); locked meanwhile
    key: RadixKey  # the request's key up to the end of the SSD pages
    start: int  # tokens before the SSD pages (device + host)
    host_tokens: int  # of those, host-only tokens (loaded back at submission, counted again there)
    page_hashes: list[str]  # the pages past ``start`` (tail DRAM pages, then SSD pages), in order
    plan: ReloadPlan
    host_lock: Any  # keeps the anchor's host copy (and so the node) from arrival on
    deadline: float  # step clock (`_now`); the `timeout` prefetch policy cuts the reload here
    job: Optional[ReloadJob] = None  # None while the in-flight cap holds it back
    path_lock: Any = None  # the anchor's device path, locked when the job is submitted
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
    tail_node: Optional[NodeId] = None  # the tree node holding the last of them, host-locked
    tail_lock: Any = None

    @property
    def ssd_hashes(self) -> list[str]:
        return self.page_hashes[self.tail_dram_pages :]


class SariaRadixCache(UnifiedRadixCache):
    """UnifiedRadixCache whose storage hits go SSD -> device pool, not SSD -> host -> device,
    read by a worker thread while the request waits in the queue."""

    def __init__(self, params: Any) -> None:
        super().__init__(params)
        self._reloads: dict[str, _PendingReload] = {}  # by request id
        self._deferred: list[str] = []  # request ids waiting for the in-flight cap, FIFO
        self._abandoned: list[_PendingReload] = []  # released while their job still runs
        self._inflight_tokens = 0  # device slots held by reload jobs
        self._inflight_states = 0  # device mamba slots held by reload jobs (hybrid trees)
        self._hybrid = False  # a FULL + MAMBA tree: plans end on checkpoints, states reload too
        self._checkpoint_grid = 0  # tokens between the positions a GDN state can be cached at
        self._published: dict[str, int] = {}  # request id -> end of its reloaded prefix
        # request id -> (node ending the promoted share, its tokens), copied after prefill
        self._promotions: dict[str, tuple[NodeId, int]] = {}
        # Locks holding freshly reloaded tails until their request locks its own path.
        self._reload_locks: list[tuple[NodeId, Any]] = []
        self._reloader: Optional[DeviceReloader] = None
        self._worker: Optional[ReloadWorker] = None
        self._direct: Optional[bool] = None  # decided once the storage backend is attached
        self._pacer: Optional[RealTimePacer] = None
        self._promotion: Optional[PromotionController] = None
        self._metrics = SariaServingMetrics.get()
        self._audit = os.environ.get("SGLANG_SARIA_AUDIT_TIERS", "0") == "1"
        self._blocking = os.environ.get(BLOCKING_RELOAD_ENV, "0") == "1"
        self._audited_state: tuple = ()
        # Installed once the storage backend is attached (after this constructor).
        self._kv_audit: Optional[KVAudit] = None
        self._kv_audit_pending = kv_audit_enabled()
        self._writes_in_flight = 0
        # Multi-rank: the policy's SSD view and clock, agreed by all attention ranks.
        self._agreement: Optional[RankAgreement] = None
        self._agreed_policy: Any = None  # the policy the agreement was made for
        self._connect_agreement()

    # ------------------------------------------------------------------ setup
    def _backend(self) -> Any:
        return getattr(self.cache_controller, "storage_backend", None)

    def _policy(self) -> Optional[SariaHiCachePolicy]:
        return policy_of(self._backend())

    def _direct_enabled(self) -> bool:
        """Direct reload runs with a saria backend, a FULL or FULL + MAMBA (hybrid) tree and
        row-addressable pools."""
        if self._direct is not None:
            return self._direct
        backend = self._backend()
        policy = policy_of(backend)
        self._direct = False
        if not getattr(self, "enable_storage", False) or policy is None or not policy.config.transfer.direct_reload:
            return False
        components = set(self.tree_components)
        hybrid = components == {ComponentType.FULL, ComponentType.MAMBA}
        if (components != {ComponentType.FULL} and not hybrid) or self.tree_core.is_eagle:
            logger.info("saria: direct reload needs a full-attention or GDN hybrid, non-EAGLE tree; using HiCache prefetch")
            return False
        host_pool = self.cache_controller.mem_pool_host
        cfg = policy.config
        try:
            state_rows = StateRows.of_pools(host_pool.entry_map[PoolName.MAMBA].host_pool) if hybrid else None
            self._reloader = DeviceReloader(
                backend.read_page_async,
                self.cache_controller.mem_pool_device,
                host_pool.layout,
                self.page_size,
                backend.page_bytes,
                chunk_pages=cfg.transfer.reload_chunk_pages,
                page_digest=backend.page_digest,
                state_rows=state_rows,
                read_state=backend.read_state_async if hybrid else None,
                # Hybrid: FA pages the tree holds in host memory past its last checkpoint go
                # host -> device in the gathers of the SSD pages (`_tail_host_pages`).
                host_pool=host_pool.entry_map[PoolName.KV].host_pool if hybrid else None,
            )
        except (UnsupportedPoolLayout, UnsupportedStatePool) as e:
            logger.warning("saria: direct reload disabled (%s); using HiCache prefetch into host memory", e)
            return False
        if hybrid:
            self._hybrid = True
            self._checkpoint_grid = self.components[ComponentType.MAMBA].mamba_checkpoint_grid
        report_staging(self._reloader.staging_bytes, str(self._reloader.device), self._reloader.state_staging_bytes)
        self._pacer = RealTimePacer(cfg.bandwidth, cfg.transfer.mode)
        self._promotion = PromotionController.from_config(cfg.promotion, cfg.bandwidth)
        self._worker = ReloadWorker(
            self._reloader, self._pacer, self._worker_agreement(), self._drop_pages, self._drop_state
        )
        self._direct = True
        if self._blocking:
            logger.warning("saria: %s=1: the scheduler waits for every reload (benchmark-only)", BLOCKING_RELOAD_ENV)
        logger.info(
            "saria: direct SSD -> device reload on%s, off the scheduler thread (transfer.mode=%s, "
            "max_inflight_reload_tokens=%d, prefetch policy %s, promotion=%s r_eff=%.2f)",
            f" for FA pages and GDN states (checkpoints every {self._checkpoint_grid} tokens)" if hybrid else "",
            cfg.transfer.mode,
            cfg.transfer.max_inflight_reload_tokens,
            self.prefetch_stop_policy,
            cfg.promotion.mode,
            self._promotion.r_eff,
        )
        return True

    def _attention_groups(self) -> list[Any]:
        """The process groups SGLang's own per-step agreement reduces over (none on one rank)."""
        dist = torch.distributed
        groups = [g for g in (self.attn_cp_group, self.attn_tp_group) if g is not None and dist.get_world_size(g) > 1]
        if not groups and self.tp_world_size > 1:
            groups = [self.tp_group]
        return groups

    def _connect_agreement(self) -> None:
        """Give the storage backend's policy rank-agreed inputs (rank_agreement.py): its
        decisions change the tree, which must stay the same on every rank. Runs where every
        rank runs it (construction, each step's `check_hicache_events`); the agreement is made
        once per policy (a backend attached at run time brings a new one). One rank: nothing."""
        backend = self._backend()
        policy = policy_of(backend)
        if policy is self._agreed_policy:
            return
        self._agreed_policy, self._agreement = policy, None
        if policy is None:
            return
        groups = self._attention_groups()
        if groups:
            agreement = RankAgreement(backend.exists, backend.kv_page_hashes, groups)
            backend.add_evict_listener(lambda pairs: agreement.evicted([h for h, pool in pairs if pool == PoolName.KV.value]))
            agreement.on_removed = policy.use_agreement(agreement.on_ssd, agreement.clock)
            self._agreement = agreement
            logger.info(
                "saria: admission and promotion decide on rank-agreed inputs (step clock, SSD view of "
                "%d pages on every store) over %d process group(s)", agreement.agreed_pages, len(groups),
            )
        self._seed_write_budget(policy, backend.store)

    def _seed_write_budget(self, policy: SariaHiCachePolicy, store: Any) -> None:
        """A ``budget:<DWPD>`` window starts with the bytes the store wrote within it before this
        process (persisted per hour), so restarts do not refill the day's budget. Whole hours
        ago, agreed (MAX) by the ranks: their controllers decide the same."""
        if not isinstance(policy.admission, WriteBudgetController):
            return
        window_s = policy.admission.params.window_s
        hours_ago = [0] * (int(window_s // HOUR_S) + 1)
        for age, nbytes in store.recent_writes(window_s):
            hours_ago[min(len(hours_ago) - 1, int(age // HOUR_S))] += nbytes
        if self._agreement is not None:
            hours_ago = self._agreement.max_over_ranks(hours_ago)
        policy.seed_budget([(k * HOUR_S, b) for k, b in reversed(list(enumerate(hours_ago))) if b])
        if any(hours_ago):
            logger.info("saria: budget:<DWPD> window starts with %.1f MiB written by earlier runs (%.0f%% of its budget left)",
                        sum(hours_ago) / (1 << 20), 100 * policy.admission.fill)

    def _now(self) -> float:
        """The clock of decisions that change the tree (reload deadlines): the agreed step clock
        on several ranks, the monotonic clock on one."""
        return self._agreement.clock() if self._agreement is not None else time.monotonic()

    def write_backup_storage(self, node_id: NodeId) -> None:
        # Every storage write the tree issues (the same on every rank) is pending in the
        # agreed SSD view until every rank's store holds it.
        if self._agreement is not None:
            self._agreement.requested(self.tree_core.get_hash_values(node_id) or [])
        super().write_backup_storage(node_id)

    def _worker_agreement(self) -> Callable[[int], int]:
        """MIN over the attention ranks, for the worker thread: on process groups of its own
        (a gloo group must not be used by two threads at once), created here, at the same
        point of every rank's scheduler. Identity on one rank."""
        dist = torch.distributed
        groups = self._attention_groups()
        if not groups:
            return lambda value: value
        own = [dist.new_group(dist.get_process_group_ranks(g), backend="gloo") for g in groups]

        def agree(value: int) -> int:
            tensor = torch.tensor(value, dtype=torch.int64)
            for group in own:
                dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group)
            return int(tensor.item())

        return agree

    def _drop_pages(self, page_hashes: Sequence[str]) -> None:
        """Pages whose read failed leave the store index (worker thread; the store locks).
        A host checksum failure is already gone (the store drops it on read); a device
        digest mismatch (GPU) is dropped here."""
        backend = self._backend()
        keys = [backend.storage_key(h) for h in page_hashes]
        backend.store.evict(keys)
        gone = sum(not backend.store.exists(k) for k in keys)
        self._metrics.pages_dropped(gone)
        logger.warning("saria: %d page(s) that failed their read left the store index", gone)

    def _drop_state(self, page_hash: str) -> None:
        """A checkpoint sidecar whose read failed leaves the store index (worker thread)."""
        backend = self._backend()
        key = backend.storage_key(page_hash, PoolName.MAMBA.value)
        backend.store.evict([key])
        logger.warning("saria: the GDN checkpoint of page %s failed its read and left the store index", page_hash)

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

    # ------------------------------------------------------------------ arrival: probe, plan, submit
    def query_storage_hit_length(self, *args: Any, **kwargs: Any) -> int:
        if self._direct_enabled():
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
        if not self._direct_enabled():
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
            self._reloads[request.rid] = pending
            self._deferred.append(request.rid)
        return None

    def _probe(
        self,
        request: CacheRequestHandle,
        anchor: NodeId,
        prefix: list[int],
        tokens: list[int],
        last_hash: Optional[str],
        extra_key: Optional[str],
        cache_salt: Optional[str],
    ) -> Optional[_PendingReload]:
        """The plan of the stored pages past ``anchor``: an in-memory index probe (no I/O,
        no collective: the worker settles what every rank loaded)."""
        page = self.page_size
        tail = len(tokens) // page * page
        if tail < page or (last_hash is None and not self.is_root(anchor)):
            return None  # an unhashed anchor would seed the chain wrongly: no match possible
        key_tail = RadixKey(array("q", tokens[:tail]), extra_key=extra_key, cache_salt=cache_salt)
        hashes = get_storage_hash_str(key_tail, last_hash, page_size=page)
        cap_pages = self._policy().config.transfer.max_inflight_reload_tokens // page
        # Hybrid: the tree may hold FA pages in host memory past the match (its last
        # checkpoint); they are planned from DRAM, the pages after them from SSD.
        # Agreed, so the probe's collectives below run on every rank or on none.
        held = self._tail_host_pages(anchor, key_tail) if self._hybrid else []
        n_held = self._agree_min(min(len(held), cap_pages)) if self._hybrid else 0
        backend = self._backend()
        n_lead = self._agree_min(min(backend.batch_exists(hashes), cap_pages))
        n_after = 0
        if n_held > n_lead:  # stored pages right after the held ones
            n_after = self._agree_min(min(backend.batch_exists(hashes[n_held:]), cap_pages - n_held))
        tail = [
            PageObjects(page_key(h), (DRAM if i < n_held else 0) | (SSD if i < n_lead or n_held <= i else 0))
            for i, h in enumerate(hashes[: max(n_lead, n_held + n_after)])
        ]
        if not tail:
            return None
        start = len(prefix)
        tail = self._with_checkpoints(tail, hashes, start)
        host_tokens = self._host_only_tokens(anchor)
        plan = self._plan(anchor, host_tokens, start, tail)
        n_tail = plan.n_blocks - host_tokens // page  # the plan's pages past the match
        tail_dram = self._tail_dram_pages(plan, host_tokens, n_tail)
        n_ssd = n_tail - tail_dram
        if n_ssd <= 0:
            return None  # no SSD page (hybrid: before the last checkpoint a tier holds) for the worker
        timeout = self.prefetch_timeout_base + n_ssd * self.prefetch_timeout_per_page
        pending = _PendingReload(
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
            deadline=self._now() + timeout,
            # The plan ends on the checkpoint of its last page, which the store's sidecar
            # holds (a tree node holding a state there would have been matched).
            state_key=hashes[n_tail - 1] if self._hybrid else None,
            tail=tuple(tail[:n_tail]),
            tail_dram_pages=tail_dram,
        )
        if tail_dram:
            node, _ = held[tail_dram - 1]
            pending.tail_host_slots = torch.cat([slots for _, slots in held[:tail_dram]])
            pending.tail_node = node
            # The node holding the last DRAM page keeps its host copy (and so every host
            # page above it: host eviction takes leaves) until the gather has run.
            pending.tail_lock = self.inc_host_lock_ref(node).to_dec_params()
        return pending

    def _with_checkpoints(self, tail: list[PageObjects], hashes: list[str], start: int) -> list[PageObjects]:
        """``tail`` with each page's checkpoint: on a hybrid tree a page ending on the grid
        carries the state the store's sidecar holds there."""
        backend = self._backend()
        out = []
        for i, p in enumerate(tail):
            page_end = start + (i + 1) * self.page_size
            ck = checkpoint_loc(page_end, self._checkpoint_grid, False, self._hybrid and backend.state_exists(hashes[i]))
            out.append(PageObjects(p.key, p.fa_loc, ck))
        return out

    def _tail_dram_pages(self, plan: ReloadPlan, host_tokens: int, n_tail: int) -> int:
        """How many leading pages past the match the plan takes from DRAM; the rest must be
        SSD pages (the tree's host pages past the match are a leading run, which every
        planner takes from DRAM first or not at all)."""
        sources = plan.sources[host_tokens // self.page_size : host_tokens // self.page_size + n_tail]
        dram = next((i for i, src in enumerate(sources) if src != DRAM), len(sources))
        if DRAM in sources[dram:]:
            raise RuntimeError(f"saria: plan interleaves DRAM pages after SSD pages past the match: {plan}")
        return dram

    def _tail_host_pages(self, anchor: NodeId, key: RadixKey) -> list[tuple[NodeId, torch.Tensor]]:
        """The pages of ``key`` (the tokens past ``anchor``) that the tree holds in host memory
        right below ``anchor``: (node holding the page, its host slots), in prefix order, up
        to the first page no host copy holds. SGLang's hybrid match ends on the last node
        with a GDN state, so FA pages past that checkpoint show up here, not in the match."""
        page = self.page_size
        node = self.tree_core.node_by_id(anchor)
        pages: list[tuple[NodeId, torch.Tensor]] = []
        offset = 0
        while offset < len(key):
            child = node.children.get(key[offset:].child_key(page))
            if child is None:
                break
            host_value = child.component_data[ComponentType.FULL].host_value
            if host_value is None:
                break
            matched = child.key.match(key[offset:], page_size=page) // page * page
            for p in range(0, matched, page):
                pages.append((child.id, host_value[p : p + page].to(torch.int64)))
            if matched < len(child.key):
                break
            offset += matched
            node = child
        return pages

    def _host_only_tokens(self, anchor: NodeId) -> int:
        """Tokens of the match that only the host pool holds (the nodes just above ``anchor``)."""
        tokens = 0
        node = self.tree_core.node_by_id(anchor)
        while node is not None and node.parent is not None and node.evicted:
            tokens += len(node.key)
            node = node.parent
        return tokens

    def _host_hashes(self, anchor: NodeId, host_tokens: int) -> list[str]:
        """Page hashes of the host-only part of the match (the pages just above ``anchor``)."""
        pages: list[str] = []
        node = self.tree_core.node_by_id(anchor)
        while len(pages) * self.page_size < host_tokens and node is not None and node.parent is not None:
            pages[:0] = node.hash_value or []
            node = node.parent
        return pages[len(pages) - host_tokens // self.page_size :] if host_tokens else []

    def _host_pages(self, anchor: NodeId, host_tokens: int, end: int) -> list[PageObjects]:
        """The host-only pages of the match (ending at token ``end``, the anchor's end), with
        their FA block in DRAM (and SSD when stored) and, on a hybrid tree, the GDN state of
        each node that ends on one of them (a node's mamba value, device or host)."""
        backend = self._backend()
        hashes = self._host_hashes(anchor, host_tokens)
        states: set[int] = set()  # page indexes (in ``hashes``) ending a node with a state
        if self._hybrid and hashes:
            node, node_end = self.tree_core.node_by_id(anchor), end
            while node is not None and node.parent is not None and node_end > end - host_tokens:
                data = node.component_data[ComponentType.MAMBA]
                if data.value is not None or data.host_value is not None:
                    states.add(len(hashes) - 1 - (end - node_end) // self.page_size)
                node_end -= len(node.key)
                node = node.parent
        start = end - host_tokens
        pages = []
        for i, h in enumerate(hashes):
            stored = backend.exists(h)
            page_end = start + (i + 1) * self.page_size
            ck = checkpoint_loc(page_end, self._checkpoint_grid, i in states, self._hybrid and backend.state_exists(h))
            pages.append(PageObjects(page_key(h), DRAM | (SSD if stored else 0), ck))
        return pages

    def _plan(self, anchor: NodeId, host_tokens: int, start: int, tail: Sequence[PageObjects]) -> ReloadPlan:
        """The core planner over the pages past the device prefix: DRAM where the host pool
        has them, SSD where only the store does. ``start``: tokens before ``tail``, the
        pages past the match (hybrid: host pages past the last checkpoint, then stored ones).
        On a hybrid tree each page ending on a checkpoint boundary carries the GDN state
        the tiers hold there (`reload_plan.py`), and the plan ends on the last one."""
        pages = self._host_pages(anchor, host_tokens, start) + list(tail)
        planner = self._policy().config.transfer.planner
        plan = plan_pages(pages, planner, hybrid=self._hybrid)
        host_pages = host_tokens // self.page_size
        if plan.sources[:host_pages].count(DRAM) != min(host_pages, plan.n_blocks):
            raise RuntimeError(f"saria: planner {planner!r} moved host-resident pages off DRAM: {plan}")
        return plan

    def _start_deferred(self) -> None:
        """Submit waiting reloads in arrival order while the in-flight cap and the device
        pool allow (one larger than the cap alone was cut to it by the probe). Each gets
        its device memory here, before the step's prefill batch is built: the plan's DRAM
        part is loaded host -> device by HiCache, slots are allocated for the SSD pages.
        A reload the pool cannot take yet waits (running requests free memory) until its
        deadline, then its request recomputes."""
        cap = self._policy().config.transfer.max_inflight_reload_tokens
        while self._deferred:
            rid = self._deferred[0]
            pending = self._reloads[rid]
            tokens = len(pending.page_hashes) * self.page_size  # tail DRAM and SSD pages
            if self._inflight_tokens and self._inflight_tokens + tokens > cap:
                return
            slots = self._claim_device(pending, tokens)
            if slots is None:
                if self._now() <= pending.deadline:
                    return
                self._deferred.pop(0)
                del self._reloads[rid]
                self._release(pending, "device_memory")
                continue
            self._deferred.pop(0)
            bytes_per_token = self._reloader.page_bytes // self.page_size
            state = None
            if pending.state_slot is not None:
                state = StateLoad(int(pending.state_slot[0]), key=pending.state_key)
            dram_tokens = pending.tail_dram_pages * self.page_size
            job = ReloadJob(
                rid, pending.ssd_hashes, slots,
                dram_bytes=(pending.host_tokens + dram_tokens) * bytes_per_token, state=state,
            )
            if dram_tokens:
                job.host_slots, job.host_device_slots = pending.tail_host_slots, slots[:dram_tokens]
            pending.job = self._worker.submit(job)
            self._held(tokens)
            if self._blocking:
                pending.job.wait()  # the pre-issue-12 stall, for scripts/bench_serving.py only

    def _claim_device(self, pending: _PendingReload, tokens: int) -> Optional[torch.Tensor]:
        """Device memory for a reload: the host-only part of the anchor's path loaded back
        (the anchor's device part may have been evicted since arrival, so the plan is made
        again), the path locked, and ``tokens`` slots for the SSD pages; None, holding
        nothing, when the pool cannot take them now."""
        anchor = pending.anchor
        host_tokens = self._host_only_tokens(anchor)
        if host_tokens:
            if not self.load_back(anchor) or self.tree_core.is_full_device_evicted(anchor):
                return None
            # Started now, not with the next prefill batch: none may come while every
            # request waits (the request is published once HiCache has acked the copy).
            self.cache_controller.start_loading()
        path_lock = self.inc_lock_ref(anchor).to_dec_params()
        slots = self._alloc_device(tokens)
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
        pending.plan = self._plan(anchor, host_tokens, pending.start, pending.tail)
        return slots

    def _alloc_state_slot(self) -> Optional[torch.Tensor]:
        """One device mamba slot for a reload's checkpoint (the boundary node's value once
        published), a mamba leaf evicted for it if none is free; None when none can be had."""
        allocator = self.req_to_token_pool.mamba_allocator
        slot = allocator.alloc(1)
        if slot is None:
            self.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))
            slot = allocator.alloc(1)
        if slot is not None:
            self._inflight_states += 1
        return slot

    def _free_state_slot(self, pending: _PendingReload) -> None:
        if pending.state_slot is not None:
            self.req_to_token_pool.mamba_allocator.free(pending.state_slot)
            pending.state_slot = None
            self._inflight_states -= 1

    def _held(self, tokens: int) -> None:
        self._inflight_tokens += tokens
        self._metrics.reload_inflight(self._inflight_tokens)

    def _alloc_device(self, tokens: int) -> Optional[torch.Tensor]:
        if self._component_available_size(ComponentType.FULL) < tokens:
            self.evict_for_alloc(
                EvictParams(num_tokens=tokens - self._component_available_size(ComponentType.FULL))
            )
        if self._component_available_size(ComponentType.FULL) < tokens:
            return None
        return self.token_to_kv_pool_allocator.alloc(tokens)

    def protected_size(self) -> int:
        # Slots held by reloads in flight are allocated but owned by no node yet: SGLang's
        # pool accounting (and its idle leak check) counts them as protected.
        return super().protected_size() + getattr(self, "_inflight_tokens", 0)

    def full_protected_size(self) -> int:
        # Hybrid pools' accounting reads the FULL component's protected size.
        return super().full_protected_size() + getattr(self, "_inflight_tokens", 0)

    def mamba_protected_size(self) -> int:
        # The mamba slots reloads in flight hold for their checkpoints (owned by no node yet).
        return super().mamba_protected_size() + getattr(self, "_inflight_states", 0)

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
        if not self._direct_enabled():
            return super().check_prefetch_progress(request)
        return request.rid not in self._reloads

    def _advance_reloads(self) -> None:
        """Once per scheduler step, before the batch is built: apply HiCache's stop policy
        (`best_effort` cuts a reload at its first step, `timeout` at its deadline,
        `wait_complete` never; a cut job ends after its chunk in flight, keeping a leading
        run of pages), then publish every reload that all ranks have finished, its DRAM
        part included (HiCache's load acked)."""
        policy = self.prefetch_stop_policy
        now = self._now()
        running = []
        for rid, pending in list(self._reloads.items()):
            cut = policy == "best_effort" or (policy == "timeout" and now > pending.deadline)
            if pending.job is None:  # held back by the in-flight cap
                if cut:
                    self._deferred.remove(rid)
                    del self._reloads[rid]
                    self._release(pending, f"policy_{policy}")
                continue
            if cut and not pending.job.done:
                pending.job.stop()
            running.append((rid, pending))
        landed = [p.job.done and p.anchor not in self.ongoing_load_back for _, p in running]
        for (rid, pending), done in zip(running, self._all_ranks_done(landed)):
            if done:
                del self._reloads[rid]
                self._publish(pending)

    def _agree_min(self, value: int) -> int:
        """The smallest ``value`` over the attention ranks (identity on one rank): a reload
        exists on every rank or on none, with the same number of pages."""
        if self.tp_world_size <= 1:
            return value
        tensor = torch.tensor(value, dtype=torch.int64)
        self._all_reduce_attn_groups(tensor, torch.distributed.ReduceOp.MIN)
        return int(tensor.item())

    def _all_ranks_done(self, done: list[bool]) -> list[bool]:
        """Ranks see their workers finish at different steps; a reload is published on all
        of them at the same step (one MIN all-reduce per step, as HiCache's own progress
        check; nothing on one rank)."""
        if self.tp_world_size <= 1 or not done:
            return done
        tensor = torch.tensor(done, dtype=torch.int64)
        self._all_reduce_attn_groups(tensor, torch.distributed.ReduceOp.MIN)
        return [bool(v) for v in tensor.tolist()]

    # ------------------------------------------------------------------ ready: publish the landed pages
    @staticmethod
    def _job_reason(job: ReloadJob) -> str:
        return f"store_{job.reason}" if job.reason not in ("stopped", "peer_rank", "worker_error") else job.reason

    def _publish(self, pending: _PendingReload) -> None:
        """The reload has ended: the landed SSD pages join the tree as device nodes after
        the plan's DRAM part (loaded back by HiCache at submission), and the
        request is admitted with all of it as a device hit. Its slots past the landed pages
        go back to the pool. (Reporting them as a host hit instead would make the scheduler
        budget fresh slots for pages that already have theirs.)"""
        request, job = pending.request, pending.job
        if job.pages == 0:
            self._release(pending, self._job_reason(job))
            return
        if pending.state_slot is not None and not (job.state_loaded and job.pages == len(job.page_hashes)):
            # A hybrid prefix is reusable only up to its checkpoint: without the state at
            # its end the landed FA pages cannot resume the GDN layers; all is recomputed.
            self._release(pending, self._job_reason(job) if job.reason else "state")
            return
        host_loaded = pending.host_tokens  # loaded back when the job was submitted
        # Tail DRAM pages (hybrid only, so all landed: a partial load was released above).
        dram_tokens = pending.tail_dram_pages * self.page_size
        ssd_tokens = job.pages * self.page_size
        published, unused = job.slots[: dram_tokens + ssd_tokens], job.slots[dram_tokens + ssd_tokens :]
        hashes = job.page_hashes[: job.pages]
        if unused.numel():
            self.token_to_kv_pool_allocator.free(unused)
        self._held(-job.tokens)
        if self._kv_audit is not None:
            self._kv_audit.store_to_device(PoolName.KV.value, hashes, published[dram_tokens:])
            if dram_tokens:
                self._kv_audit.host_to_device(PoolName.KV.value, job.host_slots, published[:dram_tokens])
            if pending.state_slot is not None and PoolName.MAMBA.value in self._kv_audit.pools:
                self._kv_audit.store_to_device(PoolName.MAMBA.value, [pending.state_key], pending.state_slot)
        self._metrics.pages_read("device", job.pages + int(pending.state_slot is not None))
        self._policy().on_ssd_reload(hashes)
        last_node = self._insert_tail(request.rid, pending, published)
        self._unlock(pending)
        # Held until the request locks its own path at admission (next step at the latest).
        self._reload_locks.append((last_node, self.inc_lock_ref(last_node).to_dec_params()))
        self._published[request.rid] = pending.start + len(published)
        # SGLang's cached-token report: the SSD part is this request's storage hit (the
        # DRAM part, loaded before admission, is reported as a device hit, as HiCache's).
        if ssd_tokens:
            self.prefetch_loaded_tokens_by_reqid[request] = ssd_tokens
            self.prefetch_loaded_storage_start_by_reqid[request] = pending.start + dram_tokens
        self._metrics.reloaded("dram", host_loaded + dram_tokens)
        self._metrics.reloaded("ssd", ssd_tokens)
        if job.pages < len(job.page_hashes):
            # The rest of the prefix is recomputed; what landed is kept.
            self._metrics.reload_fallback(self._job_reason(job))
            logger.warning(
                "saria reload %s: %d of %d SSD pages loaded (%s); recomputing the rest",
                request.rid, job.pages, len(job.page_hashes), job.reason,
            )
        logger.debug(
            "saria reload %s: %d device + %d dram + %d ssd tokens (plan %d/%d blocks), read in %.2f ms "
            "off the scheduler thread, %.2f ms from arrival to admission",
            request.rid,
            pending.start - pending.host_tokens,
            host_loaded + dram_tokens,
            ssd_tokens,
            pending.plan.dram_blocks,
            pending.plan.ssd_blocks,
            job.seconds * 1e3,
            (time.monotonic() - job.submitted) * 1e3,
        )

    def _finalize_match_result(self, params: MatchPrefixParams, result: MatchResult) -> MatchResult:
        """The match right after a publish (the scheduler's, for the same request): the
        request's own insert after prefill must not count the reloaded nodes as a reuse
        (that would fire HiCache's write-through of every reloaded page, bypassing lazy
        partial promotion)."""
        result = super()._finalize_match_result(params, result)
        req = params.req
        if req is not None and self._published:
            end = self._published.pop(req.rid, None)
            if end is not None:
                req.kv.cache_inserted_len = max(req.kv.cache_inserted_len, end)
        return result

    def init_load_back(self, params: InitLoadBackParams) -> Optional[tuple[int, NodeId]]:
        loaded = super().init_load_back(params)
        if loaded is not None and loaded[0] and self._direct:
            self._metrics.reloaded("dram", loaded[0])
            # A DRAM-only reload (HiCache's copy) shares the link too: the coordinator
            # counts it, so SSD reads admitted while it copies get their fair allowance.
            self._pacer.begin(loaded[0] * self._reloader.page_bytes // self.page_size, 0)
        return loaded

    def _release(self, pending: _PendingReload, reason: Optional[str] = None) -> None:
        """Give a reload's slots back and unlock its anchor; a job still running is stopped
        and released once the worker is done with its slots (`check_hicache_events`)."""
        if reason is not None:
            self._metrics.reload_fallback(reason)
        job = pending.job
        if job is not None and not job.done:
            job.stop()
            self._abandoned.append(pending)
            return
        if job is not None:
            self.token_to_kv_pool_allocator.free(job.slots)
            self._held(-job.tokens)
        self._free_state_slot(pending)
        self._unlock(pending)

    def _unlock(self, pending: _PendingReload) -> None:
        if pending.path_lock is not None:
            self.dec_lock_ref(pending.anchor, pending.path_lock)
        self.dec_host_lock_ref(pending.anchor, pending.host_lock)
        if pending.tail_lock is not None:
            self.dec_host_lock_ref(pending.tail_node, pending.tail_lock)
            pending.tail_lock = None

    def _insert_tail(self, rid: str, hit: _PendingReload, slots: torch.Tensor) -> NodeId:
        """Publish the SSD pages as device nodes under the anchor; the leading share chosen for
        promotion ends at a node of its own, promoted after the request's prefill."""
        path = self.path_device_indices(hit.anchor).to(torch.int64)
        assert len(path) == hit.start, (rid, len(path), hit.start)
        promote = self._promotion_tokens(hit, len(slots) // self.page_size) if len(slots) else 0
        if hit.state_slot is not None and promote < len(slots):
            # A hybrid node's FA pages and its checkpoint are promoted as one unit (paper
            # 4.3): a share of the pages without the state at their end is no reusable prefix.
            promote = 0
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
                self._promotions[rid] = (node, promote)
        if hit.state_slot is not None:
            if result.mamba_exist:  # the node had a state already: ours is a duplicate
                self.req_to_token_pool.mamba_allocator.free(hit.state_slot)
            self._inflight_states -= 1
            hit.state_slot = None
        return node

    def _promotion_tokens(self, hit: _PendingReload, pages: int) -> int:
        """Lazy partial promotion (paper 4.4): how many leading SSD tokens to copy to host. The
        sequencer's ``promotion_set`` decides, as in the replay: the tree's prefix is host-backed
        (write-through), the headroom is free host pages plus the host leaves next in eviction
        order that a promotion may displace (not reused within P_tau; robust rule: on SSD)."""
        page = self.page_size
        start = hit.start // page
        free = self.cache_controller.mem_pool_host.available_size() // page
        tree = self.tree_core
        return page * self._policy().promotion_pages(
            self._promotion, start + pages, start, pages, free,
            tree.evictable_host_leaves, tree.eviction_strategy.get_priority,
        )

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """After the request's prefill (SGLang checkpoints what it computed): promote the
        share of its SSD reload picked at publish (paper 4.4: the copy to host follows the
        prefill, so it does not compete with the reload and the prefill it serves). Before the
        request's own insert, whose write-through would take the host headroom the promotion
        was sized by at publish."""
        promotion = self._promotions.pop(req.rid, None)
        if promotion is not None:
            self._promote(*promotion)
        super().checkpoint(req, up_to=up_to, **kwargs)

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
        if self._kv_audit_pending:
            self._install_kv_audit()
        self._connect_agreement()
        if self._agreement is not None:
            self._agreement.step()
        # The requests admitted with a reload hold their own path locks by now.
        locks, self._reload_locks = self._reload_locks, []
        for node_id, lock_params in locks:
            self.dec_lock_ref(node_id, lock_params)
        if self._direct_enabled():
            self._reap_abandoned()
            self._advance_reloads()
            self._start_deferred()
        super().check_hicache_events()
        if len(self.ongoing_backup) != self._writes_in_flight:
            self._writes_in_flight = len(self.ongoing_backup)
            self._metrics.storage_writes_in_flight(self._writes_in_flight)
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
            self._policy().metadata,
            aux,
        )
        self._metrics.audited(audit.pages, len(audit.errors))
        for error in audit.errors:
            logger.error("saria tier audit: %s", error)
        return audit

    def _reap_abandoned(self) -> None:
        """Free the slots of released reloads whose worker job has ended since."""
        running = []
        for pending in self._abandoned:
            if pending.job.done:
                self.token_to_kv_pool_allocator.free(pending.job.slots)
                self._held(-pending.job.tokens)
                self._free_state_slot(pending)
                self._unlock(pending)
            else:
                running.append(pending)
        self._abandoned = running

    def release_aborted_request(self, request: CacheRequestHandle) -> None:
        self._published.pop(request.rid, None)
        self._promotions.pop(request.rid, None)
        pending = self._reloads.pop(request.rid, None)
        if pending is not None:
            if request.rid in self._deferred:
                self._deferred.remove(request.rid)
            self._release(pending, "aborted")
        super().release_aborted_request(request)

    def reset(self) -> None:
        if not hasattr(self, "_reloads"):  # the base constructor resets before ours runs
            super().reset()
            HostLeafOrder.install(self.tree_core)  # prewrite and headroom read its eviction order
            return
        # flush_cache runs with no request queued: only released jobs may still run. Wait
        # for them (a chunk's reads) so no worker writes into the pool after the reset.
        for pending in self._abandoned + list(self._reloads.values()):
            if pending.job is not None:
                pending.job.stop()
                pending.job.wait()
        self._reloads, self._deferred, self._abandoned, self._published = {}, [], [], {}
        self._promotions = {}
        self._held(-self._inflight_tokens)
        self._inflight_states = 0  # the pool's reset frees every mamba slot
        self._reload_locks = []
        super().reset()
        HostLeafOrder.install(self.tree_core)  # the tree core's reset made a plain set again
