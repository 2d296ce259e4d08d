"""The replay's core: the decision modules of ``mem_cache/`` over simulated tiers.

``SariaCore`` ties the metadata tree, admission (through the write sequencer), the planner,
promotion and the SSD victim order to the replay's DRAM and SSD ``Tier``s in two per-request
calls. Each call updates the logical state (counters, locations, tier residency) and returns
an ``Actions`` record of the data movement: the replay driver only counts bytes and times it.
The SGLang adapter does not use this class: it drives the same decision modules over its radix
tree and store (``hicache/policy.py``). Nothing here touches pools, files or wall clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container
from dataclasses import dataclass, field
from itertools import compress, islice, repeat

from sglang_saria.config import SariaConfig
from sglang_saria.mem_cache.admission import AdmissionEvent
from sglang_saria.mem_cache.admission_factory import make_admission_policy
from sglang_saria.mem_cache.eviction import make_eviction
from sglang_saria.mem_cache.metadata import DRAM, NO_CHECKPOINT, ROOT, SSD, ContextMetadata, ContextNode
from sglang_saria.mem_cache.planner import ReloadPlan, plan_nodes, plan_reload
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.mem_cache.sequencer import RuleStats, WriteSequencer
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.model_specs import ModelSpec
from sglang_saria.replay import oracle  # noqa: F401  (registers the oracle policy: the core builds policies by name)
from sglang_saria.replay.tiers import ReplayTierView, Tier

# module constants: Enum class attributes cost ~10x a global lookup on the per-block paths
_INSERT, _REUSE, _EVICT, _PREWRITE, _CLOSURE = (AdmissionEvent.INSERT, AdmissionEvent.REUSE, AdmissionEvent.EVICT,
                                                AdmissionEvent.PREWRITE, AdmissionEvent.CLOSURE)
# plan sources (bytes) -> 1 where a block loads from DRAM (from SSD): selectors for itertools.compress
_FROM_DRAM = bytes.maketrans(bytes((DRAM, SSD)), b"\x01\x00")
_FROM_SSD = bytes.maketrans(bytes((DRAM, SSD)), b"\x00\x01")
_SSD_ONLY = bytes(int(loc == SSD) for loc in range(256))  # FA location -> 1 if held by SSD alone
_GONE = ContextNode(0.0, False)  # stands in for a node reclaimed while its request ran: held nowhere
_WRITES_BY_EVENT = {_INSERT: "insert_writes", _REUSE: "reuse_writes", _EVICT: "evict_writes",
                    _PREWRITE: "prewrites", _CLOSURE: "closure_writes"}


@dataclass
class Actions:
    """Data movement decided by one core call, in execution order per list."""

    ssd_writes: list[int] = field(default_factory=list)  # persist node DRAM -> SSD (before any DRAM reclaim below)
    dram_evictions: list[int] = field(default_factory=list)  # reclaim the node's DRAM copy
    ssd_evictions: list[int] = field(default_factory=list)  # delete the node's SSD copy
    promotions: list[int] = field(default_factory=list)  # copy SSD-hit node GPU -> DRAM after prefill
    state_writes: list[int] = field(default_factory=list)  # persist only the node's GDN state DRAM -> SSD
    ssd_write_bytes: int = 0  # of ``ssd_writes`` and ``state_writes``: the drive bandwidth the driver charges
    promotion_bytes: int = 0  # of ``promotions``: the DRAM bandwidth the driver charges


@dataclass
class CoreStats(RuleStats):
    """Counters the replay reports; the adapter exports the same as Prometheus metrics."""

    dram_evictions: int = 0
    promoted_blocks: int = 0
    prewrites: int = 0
    reuse_writes: int = 0
    evict_writes: int = 0
    insert_writes: int = 0
    closure_writes: int = 0  # ancestors written with a qualifying node so its prefix is reusable (robust rule)
    state_writes: int = 0  # GDN states written beside an FA block already on SSD (``_write_state``)
    ssd_evicted_unread: int = 0  # SSD copies evicted before any read
    ssd_hit_requests: int = 0  # requests whose plan reads a block from SSD
    dram_after_ssd_requests: int = 0  # of those, plans reading a block from DRAM after one from SSD ("flat" DRAM only)


class KeySet:
    """Membership in a request's keys, the set built on the first query (most requests never ask)."""

    __slots__ = ("_keys", "_set")

    def __init__(self, keys: list[int]) -> None:
        self._keys = keys
        self._set: set[int] | None = None

    def __contains__(self, key: object) -> bool:
        if self._set is None:
            self._set = set(self._keys)
        return key in self._set


#: ``on_write(key, node, event, parent_on_ssd)``: diagnostics hook called for every SSD write decided
WriteHook = Callable[[int, ContextNode, AdmissionEvent, bool], None]


class SariaCore:
    """Engine-agnostic Saria policy state for one model and one cache configuration."""

    def __init__(self, cfg: SariaConfig, spec: ModelSpec, dram_eviction: str = "lru", ssd_eviction: str = "lru") -> None:
        cfg.validate()
        self.cfg = cfg
        self.spec = spec
        bt = cfg.metadata.block_tokens
        self.hybrid = spec.is_hybrid
        placement = cfg.metadata.checkpoint_placement
        on_grid = placement == "grid"
        # "sglang" places states on SGLang's grid; the others on checkpoint_tokens
        state_grid = cfg.metadata.sglang_state_grid_tokens if placement == "sglang" else cfg.metadata.checkpoint_tokens
        self.metadata = ContextMetadata(bt, state_grid if self.hybrid else None, cfg.metadata.metadata_window_s, on_grid)
        # the owner of the states' placement on a hybrid (None: the metadata's grid places them)
        self._place_states = None if on_grid or not self.hybrid else (
            self._place_sglang_states if placement == "sglang" else self._place_prefix_checkpoint)
        self._chunk_blocks = cfg.metadata.prefill_chunk_tokens // bt
        self.admission = make_admission_policy(cfg.admission.policy, cfg.admission, cfg.capacity.ssd_tokens * spec.kv_bytes_per_token)
        self.promotion = PromotionController.from_config(cfg.promotion, cfg.bandwidth)
        self.planner = cfg.transfer.planner
        self._tree = cfg.metadata.dram_residency == "tree"  # DRAM holds every resident block's ancestors
        state_slots = cfg.capacity.dram_checkpoints if self.hybrid else 0
        self.dram = Tier(DRAM, cfg.capacity.dram_tokens, make_eviction(dram_eviction), state_slots)
        # the SSD victim order shared with the server's store (mem_cache/ssd_order.py)
        self.ssd_order = SSDVictimOrder(ssd_eviction)
        self.ssd = Tier(SSD, cfg.capacity.ssd_tokens, self.ssd_order)
        self.block_tokens = bt
        self.block_bytes = spec.kv_bytes_per_token * bt
        self.ckpt_bytes = spec.checkpoint_bytes
        self.ckpt_tokens = spec.checkpoint_token_equiv
        # (tokens, bytes) of a node without / with a GDN checkpoint, indexed by bool
        self._sizes = ((bt, self.block_bytes), (bt + self.ckpt_tokens, self.block_bytes + self.ckpt_bytes))
        # the same in DRAM: with a pool of its own for checkpoints, a checkpoint takes a slot there instead
        self._dram_sizes = ((bt, self.block_bytes), (bt, self.block_bytes + self.ckpt_bytes)) if state_slots else self._sizes
        self.stats = CoreStats()
        self._prewrite = cfg.admission.prewrite and self.admission.uses_eviction_count
        self._prewrite_depth = cfg.admission.prewrite_depth_blocks
        # every write is decided by the sequencer, which reads these tiers through the view (the SGLang
        # adapter drives the same sequencer over its tree and store)
        self.sequencer = WriteSequencer(self.admission, cfg.admission.rule, self.stats)
        self.view = ReplayTierView(self.metadata, self._sizes, self.ssd, self.block_bytes, self.ckpt_bytes, self.hybrid)
        self._hbm: Container[int] = ()
        # the sequencer's write floors by event as (R, E, least ck_loc), kept until a clock tick or a write
        # that retunes the admission (budget)
        self._floors: dict[AdmissionEvent, tuple[float, float, int]] = {}
        self.robust = self.sequencer.robust
        self.on_write: WriteHook | None = None

    # ---------------------------------------------------------------- lookup
    def lookup(self, keys: list[int]) -> ReloadPlan:
        """Pure: the reload plan for a request's block keys (no state change)."""
        return plan_reload(keys, self.metadata.nodes, self.planner, self.hybrid)

    def plan_bytes(self, plan: ReloadPlan) -> tuple[int, int]:
        """(DRAM bytes, SSD bytes) the plan loads, checkpoint included."""
        d = plan.dram_blocks * self.block_bytes
        s = plan.ssd_blocks * self.block_bytes
        if plan.ckpt_source == DRAM:
            d += self.ckpt_bytes
        elif plan.ckpt_source == SSD:
            s += self.ckpt_bytes
        return d, s

    # ---------------------------------------------------------- request path
    def begin_request(self, keys: list[int], now: float) -> tuple[ReloadPlan, Actions]:
        """A request arrives: plan its reload, count reuse, refresh hit recency.

        Reuse-triggered writes (``R`` reached ``theta_R`` while in DRAM) are returned
        as asynchronous SSD writes. O(len(keys)).
        """
        self._tick(now)
        md = self.metadata
        nodes = md.nodes
        found = list(map(nodes.get, keys))  # one lookup per key for the plan (``lookup``) and the reuse count
        plan = plan_nodes(found, self.planner, self.hybrid)
        acts = Actions()
        reached = md.record_use(keys, now, self.admission.reuse_threshold, found)
        dram, ssd = self.dram, self.ssd
        # deepest block first, so a prefix's head is the most recent (see _refresh_prefix)
        hit = keys[plan.n_blocks - 1 :: -1] if plan.n_blocks else []
        ssd_hits: list[int] = []
        if plan.ssd_blocks == 0:
            dram.access_many(hit)
        else:
            src = bytes(plan.sources)  # DRAM or SSD per block: C loops select each source's blocks
            self.stats.ssd_hit_requests += 1
            if src.find(DRAM, src.find(SSD)) >= 0:
                self.stats.dram_after_ssd_requests += 1
            dram.access_many(compress(hit, src[::-1].translate(_FROM_DRAM)))
            ssd_hits = list(compress(keys, src.translate(_FROM_SSD)))  # head first
            ssd.count_reads(ssd_hits, self.block_bytes)
            self.ssd_order.touch_prefix(ssd_hits)  # the SSD order's read rule: deepest first
        if plan.ckpt_source == SSD:  # the node's SSD entry was marked read with its FA block
            ssd.bytes_read += self.ckpt_bytes
        if self.admission.learns:  # what this request wanted from below DRAM: read from SSD or recomputed
            below = set(keys[plan.n_blocks:])
            below.update(ssd_hits)
            self.admission.on_missed(below)
        if reached:
            reading = frozenset(ssd_hits)  # the blocks this request reloads from SSD stay put while it reads them
            hbm = KeySet(keys) if self.robust else ()
            seq, view = self.sequencer, self.view
            for k in reached:
                node = nodes[k]
                if node.fa_loc & DRAM and not node.fa_loc & SSD:
                    self._execute(seq.reuse(view, k, node, hbm), _REUSE, acts, reading)
        return plan, acts

    def finish_request(self, keys: list[int], plan: ReloadPlan, now: float) -> Actions:
        """Prefill done: newly computed blocks enter DRAM, SSD hits may be promoted.

        DRAM evictions run admission (write-before-reclaim); then prewrite examines the
        eviction end of DRAM; finally stale metadata is reclaimed. Which blocks DRAM takes
        follows ``metadata.dram_residency`` (``_enter_dram_flat`` / ``_enter_dram_tree``).
        """
        self._tick(now)
        acts = Actions()
        self._hbm = KeySet(keys) if self.robust else ()  # on the GPU until this call returns: a write source
        cached = self._place_states(keys, plan) if self._place_states is not None else len(keys)
        if self._tree:
            self._enter_dram_tree(keys, plan, cached, now, acts)
        else:
            self._enter_dram_flat(keys, plan, cached, now, acts)
        if self._prewrite:
            self._prewrite_scan(acts)
        self._hbm = ()
        self.metadata.reclaim(now)
        return acts

    def _enter_dram_flat(self, keys: list[int], plan: ReloadPlan, cached: int, now: float, acts: Actions) -> None:
        """``dram_residency = "flat"``: each computed block of ``keys[n_hit:cached]`` enters DRAM (deepest
        first), whatever its ancestors; then the promotion's share of the SSD hits. A block may so sit in
        DRAM behind an SSD-only ancestor, and a later request read DRAM after SSD."""
        nodes = self.metadata.nodes
        dram = self.dram
        sizes = self._dram_sizes
        admit = self.admission.writes_ssd
        dram_cap = dram.capacity_tokens
        state_pool = dram.capacity_states > 0
        n_hit = plan.n_blocks
        for k in reversed(keys[n_hit:cached]):  # deepest first: tails age before heads
            node = nodes.get(k)
            if node is None:  # reclaimed while the request ran; it is recomputed as new
                continue
            if node.fa_loc & DRAM:
                dram.access(k)
                continue
            state = node.ck_loc >= 0
            tokens, nbytes = sizes[state]  # _dram_size, inline: once per computed block
            if tokens <= dram_cap:  # else (e.g. GDS-only) it passes from HBM straight to admission
                if dram.used_tokens + tokens > dram_cap or (state and dram.states_full):
                    self._evict_dram(tokens, acts, state)
                dram.insert(k, tokens, nbytes, state and state_pool)
                node.fa_loc |= DRAM
                if node.ck_loc >= 0:
                    node.ck_loc |= DRAM
            if admit and not node.fa_loc & SSD:
                self._admit_computed(k, node, acts)
        if n_hit:
            self._refresh_prefix(keys, n_hit)
        if plan.uses_ssd and self.promotion.r_eff > 0:
            self._promote(keys, plan, now, acts)

    def _enter_dram_tree(self, keys: list[int], plan: ReloadPlan, cached: int, now: float, acts: Actions) -> None:
        """``dram_residency = "tree"``: DRAM takes the request's blocks as SGLang 0.5.23's host tier does,
        so every DRAM block's ancestors are in DRAM and no request reads DRAM after SSD.

        - The promotion's share of the SSD hits first (``SariaRadixCache.checkpoint`` promotes before the
          request's insert); then, if the request computed blocks, ``keys[:cached]`` head first, each block
          not in DRAM entering it: write-through of a new leaf backs up its unbacked ancestors with it,
          ancestors first (``UnifiedTreeCore._build_backup_kv_action``), so SSD hits the promotion left
          out are copied too (counted as promotions: the same GPU -> DRAM copy).
        - The request's blocks are never DRAM victims (in the server they are on the GPU and locked, and
          host eviction takes only blocks off the GPU, ``UnifiedTreeCore._is_host_leaf``): they are made
          the most recent first, so victims are other requests' blocks; when only the request's are left,
          the chain stops there, as a backup chain stops at the first block host memory has no room for
          (``UnifiedRadixCache._execute_and_commit_kv_backup``).
        - Every touch of a block is followed by touches of its ancestors (deepest first, here and in
          ``begin_request``), so a block is never older than its descendants and the LRU victim has no
          DRAM child: DRAM evicts leaves, as ``UnifiedTreeCore`` does.
        """
        dram = self.dram
        n_hit = plan.n_blocks
        pinned = KeySet(keys)
        dram.access_resident(keys[::-1])  # deepest first: the request's blocks, most recent, head last
        if plan.uses_ssd and self.promotion.r_eff > 0:
            self._promote(keys, plan, now, acts, pinned)
        if cached > n_hit:
            self._chain_into_dram(keys, n_hit, cached, acts, pinned)
        dram.access_resident(keys[cached - 1 :: -1] if cached else [])  # head most recent (_refresh_prefix)

    def _chain_into_dram(self, keys: list[int], n_hit: int, cached: int, acts: Actions, pinned: Container[int]) -> None:
        """Put ``keys[:cached]`` in DRAM head first (``_enter_dram_tree``): a block of the reused prefix
        (``< n_hit``) not in DRAM is copied from the GPU as a promotion, a computed one enters and meets
        admission. Stops at the first block DRAM has no room for (only ``pinned`` blocks left to evict);
        blocks past it that DRAM holds (a hybrid node re-entering at a new size, ``_keep_states``) are
        reclaimed, deepest first, so none sits behind a missing ancestor."""
        nodes = self.metadata.nodes
        dram = self.dram
        admit = self.admission.writes_ssd
        dram_cap = dram.capacity_tokens
        for i in range(cached):
            k = keys[i]
            node = nodes.get(k)
            if node is None:  # reclaimed while the request ran (held nowhere): nothing past it is held either
                return
            if node.fa_loc & DRAM:
                continue
            tokens = self._dram_sizes[node.ck_loc >= 0][0]
            if tokens <= dram_cap:  # else (e.g. GDS-only) DRAM holds nothing: straight to admission
                nbytes = self._dram_insert(k, node, acts, pinned)
                if nbytes is None:
                    for j in range(cached - 1, i, -1):
                        deeper = nodes.get(keys[j])
                        if deeper is not None and deeper.fa_loc & DRAM:
                            self._reclaim_dram(keys[j], deeper, acts)
                    return
                node.fa_loc |= DRAM
                if node.ck_loc >= 0:
                    node.ck_loc |= DRAM
                if i < n_hit:
                    acts.promotions.append(k)
                    acts.promotion_bytes += nbytes
                    self.stats.promoted_blocks += 1
                    continue
            if admit and i >= n_hit and not node.fa_loc & SSD:
                self._admit_computed(k, node, acts)

    def _admit_computed(self, key: int, node: ContextNode, acts: Actions) -> None:
        """Admission of a block the request computed, not on SSD (``INSERT``): the sequencer is asked
        only when the node clears its write floor."""
        r_min, e_min, ck_min = self._floors.get(_INSERT) or self._write_floor(_INSERT)
        if (node.R >= r_min or node.E >= e_min) and node.ck_loc >= ck_min:
            chain = self.sequencer.insert(self.view, key, node, self._hbm)
            if chain:
                self._execute(chain, _INSERT, acts)

    # ------------------------------------------------------------- internals
    def _tick(self, now: float) -> None:
        """The clock moved: time-driven admission (budget) may retune, so the write floors go."""
        self.admission.on_clock(now)
        self._floors.clear()

    def _write_floor(self, event: AdmissionEvent) -> tuple[float, float, int]:
        """The sequencer's ``write_floor`` for ``event`` as ``(R, E, ck)``: it may write a node only
        if ``(node.R >= R or node.E >= E) and node.ck_loc >= ck``. Read ``self._floors`` first:
        this refills it after a write or a clock tick cleared it."""
        r_min, e_min, ckpt_only = self.sequencer.write_floor(self.view, event)
        floor = self._floors[event] = (r_min, e_min, 0 if ckpt_only else NO_CHECKPOINT)
        return floor

    def _size(self, node: ContextNode) -> tuple[int, int]:
        """(tokens, bytes) of a node's objects; boundary nodes carry their GDN checkpoint."""
        return self._sizes[node.ck_loc >= 0]

    def _dram_insert(self, key: int, node: ContextNode, acts: Actions, pinned: Container[int] = ()) -> int | None:
        """Make room for ``node`` in DRAM (write-before-reclaim) and insert it; returns its bytes, or None
        when only ``pinned`` blocks were left to evict (nothing inserted)."""
        state = node.ck_loc >= 0
        tokens, nbytes = self._dram_sizes[state]
        dram = self.dram
        if dram.free_tokens < tokens or (state and dram.states_full):
            if not self._evict_dram(tokens, acts, state, pinned):
                return None
        dram.insert(key, tokens, nbytes, state and dram.capacity_states > 0)
        return nbytes

    def _place_prefix_checkpoint(self, keys: list[int], plan: ReloadPlan) -> int:
        """``checkpoint_placement = "prefix-end"``: the prefill of ``keys[n_hit:]`` leaves one GDN state,
        at the last grid-aligned block of the request (SGLang's ``extra_buffer`` for a prefill in one
        chunk and no branching point); the blocks past it are not cached. Returns the blocks cached."""
        stride = self.metadata.checkpoint_stride
        end = len(keys) // stride * stride
        return self._keep_states(keys, plan.n_blocks, (end,) if end > plan.n_blocks else ())

    def _place_sglang_states(self, keys: list[int], plan: ReloadPlan) -> int:
        """``checkpoint_placement = "sglang"``: the states SGLang 0.5.23's ``extra_buffer`` strategy
        leaves in its tree after the prefill of ``keys[n_hit:]``, in blocks:

        - the prefill runs in chunks of ``prefill_chunk_tokens`` from ``n_hit`` on; each chunk of at
          least one grid step tracks one state, at its start plus whole grid steps
          (``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``), and the tree takes the
          prefix up to it with the state (``cache_unfinished_req`` / ``cache_finished_req``, whose
          length ``MambaComponent.prepare_for_caching_req`` cuts to the tracked state);
        - a full-attention hit past the last state (``plan.fa_blocks``) sets a branching point, its
          last grid-aligned block (``MambaComponent.finalize_match_result_in_tree_core``): the chunk
          it falls in tracks it instead of its own end;
        - a last chunk shorter than a grid step tracks nothing and adds nothing to the tree.

        Decode-time states (``--mamba-track-interval``) are not modelled: the replay ends a request
        at its first token. Returns the blocks cached (the deepest state)."""
        stride, chunk = self.metadata.checkpoint_stride, self._chunk_blocks
        n_hit, n = plan.n_blocks, len(keys)
        branch = plan.fa_blocks // stride * stride
        ends: list[int] = []
        start = n_hit
        while start < n:
            stop = min(start + chunk, n)
            if stop - start >= stride:
                end = start + (stop - start) // stride * stride
                if start < branch <= end and (branch - start) % stride == 0:
                    end = branch
                ends.append(end)
            start = stop
        return self._keep_states(keys, n_hit, ends)

    def _keep_states(self, keys: list[int], n_hit: int, ends: Collection[int]) -> int:
        """The prefill of ``keys[n_hit:]`` leaves GDN states at the prefix lengths ``ends`` (blocks,
        ascending): their nodes become checkpoint boundaries. A boundary inside the span whose state
        no tier holds any more stops being one: recomputing the span does not bring it back. Returns
        the blocks cached, up to the deepest state (``n_hit`` if none)."""
        md = self.metadata
        nodes = md.nodes
        for i in range(n_hit, len(keys)):
            node = nodes.get(keys[i])
            if node is None:
                continue
            if i + 1 not in ends:
                if node.ck_loc == 0:
                    node.ck_loc = NO_CHECKPOINT
            elif node.ck_loc == NO_CHECKPOINT:
                if node.fa_loc & DRAM:  # resident without a checkpoint: re-enters DRAM at its new size
                    self.dram.remove(keys[i], evicted=False)
                    node.fa_loc &= ~DRAM
                md.place_checkpoint(node)
        return max(ends, default=n_hit)

    def _refresh_prefix(self, keys: list[int], n_hit: int) -> None:
        """Make the reused prefix more recent than the blocks computed after it.

        A radix cache evicts leaves first: a prefix's tail goes before its head, since a
        missing head makes everything behind it unusable. Touching deepest-first keeps that
        order in a flat LRU (the head ends up most recent).
        """
        self.dram.access_resident(keys[n_hit - 1 :: -1])

    def _execute(self, chain: list[int] | None, event: AdmissionEvent, acts: Actions,
                 pinned: Collection[int] = frozenset()) -> bool:
        """Write a chain the sequencer decided (the node, then the ancestors it closes over); True if
        the node was written. A chain whose SSD room runs out stops there: ancestors written so far
        stay (``_write``)."""
        if not chain:
            return False
        nodes = self.metadata.nodes
        if len(chain) == 1:
            return self._write(chain[0], nodes[chain[0]], acts, event, pinned)
        pin = set(pinned)
        pin.update(chain)  # the chain's own prefix is never a victim of its writes
        for i, k in enumerate(chain):
            if not self._write(k, nodes[k], acts, event if i == 0 else _CLOSURE, pin):
                return i > 0
        return True

    def _write(
        self, key: int, node: ContextNode, acts: Actions, event: AdmissionEvent, pinned: Collection[int] = frozenset()
    ) -> bool:
        """Persist a node (from DRAM, or HBM right after prefill) to SSD, evicting SSD LRU nodes for room.

        ``pinned`` SSD blocks are being read by the current request (or are this write's own
        prefix) and are never victims; when only they are left, the write is skipped (False).
        """
        ssd = self.ssd
        tokens, nbytes = self._size(node)
        if tokens > ssd.capacity_tokens:
            return False
        if not self._make_ssd_room(tokens, pinned, acts):
            return False
        nodes = self.metadata.nodes
        seq = self.sequencer
        if self.on_write is not None:
            pn = nodes.get(node.parent)
            self.on_write(key, node, event, pn is not None and bool(pn.fa_loc & SSD))
        ssd.insert(key, tokens, nbytes)
        node.fa_loc |= SSD
        if node.ck_loc >= 0:
            node.ck_loc |= SSD
        acts.ssd_writes.append(key)
        acts.ssd_write_bytes += nbytes
        seq.written(event, nbytes)
        if self.admission.retunes_on_write:
            self._floors.clear()  # the write may have moved the thresholds
        counter = _WRITES_BY_EVENT[event]
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        return True

    def _make_ssd_room(self, tokens: int, pinned: Collection[int], acts: Actions) -> bool:
        """Evict SSD copies from the victim order's end until ``tokens`` are free; False when only
        ``pinned`` copies are left (some may have gone already)."""
        ssd = self.ssd
        nodes = self.metadata.nodes
        while ssd.free_tokens < tokens:
            victim = self.ssd_order.victim(pinned)
            if victim is None:
                return False
            vn = nodes[victim]
            if ssd.unread(victim):
                self.stats.ssd_evicted_unread += 1
            self.sequencer.ssd_lost(vn)
            ssd.remove(victim)
            vn.fa_loc &= ~SSD
            if vn.ck_loc >= 0:
                vn.ck_loc &= ~SSD
            acts.ssd_evictions.append(victim)
        return True

    def _evict_dram(self, need_tokens: int, acts: Actions, need_state: bool = False,
                    pinned: Container[int] = ()) -> bool:
        """Free ``need_tokens`` of DRAM (and a state slot if ``need_state`` and DRAM has a state pool)
        from the eviction end; write-before-reclaim. False (room not made) when the next victim is
        ``pinned``: the blocks of the request being served under ``dram_residency = "tree"``.

        The sequencer decides with this eviction counted; the eviction is counted (``E += 1``) before
        the write runs, as the reclaim follows at once (SGLang counts it at its deferred reclaim).
        Most victims are on SSD already or below the sequencer's floor (``_write_floor``): they are
        reclaimed without asking it, so an eviction costs few Python calls."""
        dram = self.dram
        nodes = self.metadata.nodes
        max_used = dram.capacity_tokens - need_tokens  # at most this many used tokens leave room
        while (dram.used_tokens > max_used or (need_state and dram.states_full)) and dram.used_tokens:  # entries: > 0 tokens
            k = dram.victim()
            if k in pinned:
                return False
            self._reclaim_dram(k, nodes[k], acts)
        return True

    def _reclaim_dram(self, key: int, node: ContextNode, acts: Actions) -> None:
        """Evict ``key`` from DRAM: admission decides on a write first if it is not on SSD (the
        sequencer's floor asked inline), then its DRAM copy goes. A node on SSD whose GDN state only
        DRAM holds has that state written first (``_write_state``)."""
        chain = None
        if not node.fa_loc & SSD:
            r_min, e_min, ck_min = self._floors.get(_EVICT) or self._write_floor(_EVICT)
            if (node.R >= r_min or node.E >= e_min) and node.ck_loc >= ck_min:
                chain = self.sequencer.evict(self.view, key, node, self._hbm)
        elif node.ck_loc > 0 and node.ck_loc & (DRAM | SSD) == DRAM:
            self._write_state(key, node, acts)
        node.E += 1
        if chain:
            self._execute(chain, _EVICT, acts)
        self.dram.remove(key)
        node.fa_loc &= ~DRAM
        if node.ck_loc >= 0:
            node.ck_loc &= ~DRAM
        acts.dram_evictions.append(key)
        self.stats.dram_evictions += 1

    def _write_state(self, key: int, node: ContextNode, acts: Actions) -> None:
        """Write the GDN state of a node whose FA block SSD already holds without it (the state was placed
        after the block was written, ``_keep_states``) as the node leaves DRAM. Admission is not asked:
        it admitted the block, and the block's state is what lets a later hit end there instead of at
        an earlier stored state. Only the state's bytes are written; without SSD room (only pinned
        victims) the state is lost, as any write that finds no room."""
        ssd = self.ssd
        if not self._make_ssd_room(self.ckpt_tokens, {key}, acts):
            return
        ssd.grow(key, self.ckpt_tokens, self.ckpt_bytes)
        node.ck_loc |= SSD
        acts.state_writes.append(key)
        acts.ssd_write_bytes += self.ckpt_bytes
        self.sequencer.written(_EVICT, self.ckpt_bytes)
        if self.admission.retunes_on_write:
            self._floors.clear()
        self.stats.state_writes += 1

    def _promote(self, keys: list[int], plan: ReloadPlan, now: float, acts: Actions,
                 pinned: Container[int] | None = None) -> None:
        """Replicate leading SSD-hit nodes into DRAM up to ``r_eff`` of the reused prefix.

        ``pinned`` (``dram_residency = "tree"``): these blocks are never victims, and the promoted nodes
        go in head first, stopping where DRAM has no room, so each one's parent is in DRAM before it;
        else deepest first (the head most recent)."""
        nodes = self.metadata.nodes
        prefix = keys[: plan.n_blocks]
        # FA locations now (0: reclaimed while the request ran); C calls count and select them
        locs = bytes([node.fa_loc for node in map(nodes.get, prefix, repeat(_GONE))])
        in_dram = locs.count(DRAM) + locs.count(DRAM | SSD)
        candidates = list(compress(prefix, locs.translate(_SSD_ONLY)))  # SSD hits not in DRAM, head first
        # promotion chooses among the first ``target_blocks`` only (its own cut): size just those
        candidates = candidates[: self.promotion.target_blocks(plan.n_blocks, in_dram, len(candidates))]
        if not candidates:
            return
        dram = self.dram
        if self.hybrid:
            sizes = [self._dram_sizes[nodes[k].ck_loc >= 0][0] for k in candidates]
        else:  # no node carries a checkpoint
            sizes = [self.block_tokens] * len(candidates)
        # DRAM's eviction end, read lazily (promotion's rule decides, as for SGLang's host leaves)
        head = ((nodes[k], bool(nodes[k].fa_loc & SSD), dram.size_of(k)[0]) for k in dram.victims())
        n = self.promotion.promotion_set(now, plan.n_blocks, in_dram, sizes, dram.free_tokens, head, self.robust)
        for k in reversed(candidates[:n]) if pinned is None else candidates[:n]:  # flat: deepest first, as everywhere
            node = nodes[k]
            if pinned is not None and node.parent != ROOT and not nodes[node.parent].fa_loc & DRAM:
                return  # its parent left DRAM while the request ran (held nowhere now): no copy past the gap
            nbytes = self._dram_insert(k, node, acts, () if pinned is None else pinned)
            if nbytes is None:
                return
            node.fa_loc |= DRAM
            if node.ck_loc >= 0:
                node.ck_loc |= DRAM
            acts.promotions.append(k)
            acts.promotion_bytes += nbytes
            self.stats.promoted_blocks += 1

    def _prewrite_scan(self, acts: Actions) -> None:
        """Start writes for LRU-end DRAM nodes that would qualify at their next eviction (each
        written before the next is decided)."""
        keys = list(islice(self.dram.victims(), self._prewrite_depth))
        head = zip(keys, map(self.metadata.nodes.__getitem__, keys))
        for chain in self.sequencer.prewrite(self.view, head, self._hbm):
            self._execute(chain, _PREWRITE, acts)
