"""The Saria policy core: the tree decides, a driver executes.

``SariaCore`` ties the metadata tree, admission, tiers, planner and promotion into
two per-request calls. Each call updates the logical state (counters, locations,
tier residency) and returns an ``Actions`` record of the data movement a driver must
perform: the replay driver only counts bytes and times; the SGLang adapter copies
real pages. Nothing here touches pools, files or wall clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container
from dataclasses import dataclass, field
from itertools import compress, islice

from sglang_saria.config import SariaConfig
from sglang_saria.mem_cache.admission import AdmissionEvent, ThresholdAdmission, make_admission_policy
from sglang_saria.mem_cache.eviction import make_eviction
from sglang_saria.mem_cache.metadata import ROOT, ContextMetadata, ContextNode
from sglang_saria.mem_cache.planner import ReloadPlan, plan_reload
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.mem_cache.tiers import DRAM, SSD, Tier
from sglang_saria.model_specs import ModelSpec

# module constants: Enum class attributes cost ~10x a global lookup on the per-block paths
_INSERT, _REUSE, _EVICT, _PREWRITE, _CLOSURE = (AdmissionEvent.INSERT, AdmissionEvent.REUSE, AdmissionEvent.EVICT,
                                                AdmissionEvent.PREWRITE, AdmissionEvent.CLOSURE)


@dataclass
class Actions:
    """Data movement decided by one core call, in execution order per list."""

    ssd_writes: list[int] = field(default_factory=list)  # persist node DRAM -> SSD (before any DRAM reclaim below)
    dram_evictions: list[int] = field(default_factory=list)  # reclaim the node's DRAM copy
    ssd_evictions: list[int] = field(default_factory=list)  # delete the node's SSD copy
    promotions: list[int] = field(default_factory=list)  # copy SSD-hit node GPU -> DRAM after prefill


@dataclass
class CoreStats:
    """Counters the replay reports; the adapter exports the same as Prometheus metrics."""

    dram_evictions: int = 0
    promoted_blocks: int = 0
    prewrites: int = 0
    reuse_writes: int = 0
    evict_writes: int = 0
    insert_writes: int = 0
    closure_writes: int = 0  # ancestors written with a qualifying node so its prefix is reusable (robust rule)
    unusable_skipped: int = 0  # qualifying nodes not written: an ancestor is on no tier (robust rule)
    ssd_evicted_unread: int = 0  # SSD copies evicted before any read
    credit_refused: int = 0  # admitted writes refused: total writes would pass the computed content (robust rule)


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
        self.metadata = ContextMetadata(bt, cfg.metadata.checkpoint_tokens if self.hybrid else None, cfg.metadata.metadata_window_s)
        self.admission = make_admission_policy(cfg.admission.policy, cfg.admission, cfg.capacity.ssd_tokens * spec.kv_bytes_per_token)
        self.promotion = PromotionController.from_config(cfg.promotion, cfg.bandwidth)
        self.planner = cfg.transfer.planner
        self.dram = Tier(DRAM, cfg.capacity.dram_tokens, make_eviction(dram_eviction))
        self.ssd = Tier(SSD, cfg.capacity.ssd_tokens, make_eviction(ssd_eviction))
        self.block_tokens = bt
        self.block_bytes = spec.kv_bytes_per_token * bt
        self.ckpt_bytes = spec.checkpoint_bytes
        self.ckpt_tokens = spec.checkpoint_token_equiv
        # (tokens, bytes) of a node without / with a GDN checkpoint, indexed by bool
        self._sizes = ((bt, self.block_bytes), (bt + self.ckpt_tokens, self.block_bytes + self.ckpt_bytes))
        self.stats = CoreStats()
        self._prewrite = cfg.admission.prewrite and self.admission.uses_eviction_count
        self._prewrite_depth = cfg.admission.prewrite_depth_blocks
        # robust rule (docs/fidelity.md): threshold policies write prefix-closed chains, hybrid writes start at
        # checkpoint nodes, and a copy lost from SSD spends the eviction evidence that admitted it
        self._hbm: Container[int] = ()
        self.robust = cfg.admission.rule == "robust" and isinstance(self.admission, ThresholdAdmission)
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
        self.admission.on_clock(now)
        plan = self.lookup(keys)
        acts = Actions()
        md = self.metadata
        reached = md.record_use(keys, now, self.admission.reuse_threshold)
        nodes = md.nodes
        dram, ssd = self.dram, self.ssd
        # deepest block first, so a prefix's head is the most recent (see _refresh_prefix)
        hit = keys[plan.n_blocks - 1 :: -1] if plan.n_blocks else []
        ssd_hits: list[int] = []
        if plan.ssd_blocks == 0:
            dram.access_many(hit)
        else:
            src_rev = plan.sources[::-1]  # DRAM or SSD per block: C loops select each source's blocks
            dram.access_many(compress(hit, map(DRAM.__and__, src_rev)))
            ssd_hits = list(compress(hit, map(SSD.__and__, src_rev)))
            ssd.read_many(ssd_hits, self.block_bytes)
        if plan.ckpt_source == SSD:  # the node's SSD entry was marked read with its FA block
            ssd.bytes_read += self.ckpt_bytes
        if reached:
            reading = frozenset(ssd_hits)  # the blocks this request reloads from SSD stay put while it reads them
            hbm = KeySet(keys) if self.robust else ()
            for k in reached:
                node = nodes[k]
                if node.fa_loc & DRAM and not node.fa_loc & SSD:
                    self._admit(k, node, _REUSE, acts, pinned=reading, hbm=hbm)
        return plan, acts

    def finish_request(self, keys: list[int], plan: ReloadPlan, now: float) -> Actions:
        """Prefill done: newly computed blocks enter DRAM, SSD hits may be promoted.

        DRAM evictions run admission (write-before-reclaim); then prewrite examines the
        eviction end of DRAM; finally stale metadata is reclaimed.
        """
        self.admission.on_clock(now)
        acts = Actions()
        nodes = self.metadata.nodes
        dram = self.dram
        writes_ssd = self.admission.writes_ssd
        self._hbm = KeySet(keys) if self.robust else ()  # on the GPU until this call returns: a write source
        n_hit = plan.n_blocks
        for k in keys[: n_hit - 1 if n_hit else None : -1]:  # deepest first: tails age before heads
            node = nodes.get(k)
            if node is None:  # reclaimed while the request ran; it is recomputed as new
                continue
            if node.fa_loc & DRAM:
                dram.access(k)
                continue
            tokens, nbytes = self._size(node)
            if tokens <= dram.capacity_tokens:  # else (e.g. GDS-only) it passes from HBM straight to admission
                if dram.free_tokens < tokens:
                    self._evict_dram(tokens, acts)
                dram.insert(k, tokens, nbytes)
                node.fa_loc |= DRAM
                if node.ck_loc >= 0:
                    node.ck_loc |= DRAM
            if writes_ssd and not node.fa_loc & SSD:
                self._admit(k, node, _INSERT, acts)
        if n_hit:
            self._refresh_prefix(keys, n_hit)
        if plan.uses_ssd and self.promotion.r_eff > 0:
            self._promote(keys, plan, now, acts)
        if self._prewrite:
            self._prewrite_scan(acts)
        self._hbm = ()
        self.metadata.reclaim(now)
        return acts

    # ------------------------------------------------------------- internals
    def _size(self, node: ContextNode) -> tuple[int, int]:
        """(tokens, bytes) of a node's objects; boundary nodes carry their GDN checkpoint."""
        return self._sizes[node.ck_loc >= 0]

    def _refresh_prefix(self, keys: list[int], n_hit: int) -> None:
        """Make the reused prefix more recent than the blocks computed after it.

        A radix cache evicts leaves first: a prefix's tail goes before its head, since a
        missing head makes everything behind it unusable. Touching deepest-first keeps that
        order in a flat LRU (the head ends up most recent).
        """
        self.dram.access_resident(keys[n_hit - 1 :: -1])

    def _admit(
        self, key: int, node: ContextNode, event: AdmissionEvent, acts: Actions,
        pinned: Collection[int] = frozenset(), hbm: Container[int] | None = None,
    ) -> bool:
        """Ask the policy about a node not on SSD and persist it if admitted; True if written.

        Paper rule: the node alone. Robust rule: total SSD writes stay within the KV content
        computed so far (write-through's minimum); on a hybrid model only checkpoint nodes start
        a write (a block is reusable only up to a checkpoint); evictions before its last SSD
        copy was evicted do not count again (a rewrite needs theta_E new ones); and the node is
        written with every ancestor not yet on SSD (deepest first), so SSD content stays
        prefix-closed. If an ancestor is on no tier, nothing is written: no request could reload it.
        """
        if not self.robust:
            if not self.admission.should_admit(node.E, node.R, event):
                return False
            return self._write(key, node, acts, event, pinned)
        if self.hybrid and node.ck_loc < 0:
            return False
        if not self.admission.should_admit(node.E - node.e_spent, node.R, event):
            return False
        chain = self._missing_prefix(key, node, self._hbm if hbm is None else hbm)
        if chain is None:
            self.stats.unusable_skipped += 1
            return False
        nodes = self.metadata.nodes
        tokens, nbytes = self._size(node)
        extra = 0
        if len(chain) > 1:
            sizes = [self._size(nodes[k]) for k in chain[1:]]
            if sum(t for t, _ in sizes) + tokens > self.ssd.capacity_tokens:
                self.stats.unusable_skipped += 1
                return False
            extra = sum(b for _, b in sizes)
            if not self.admission.affords(extra):
                return False
        if self.ssd.bytes_written + nbytes + extra > self._computed_bytes():
            self.stats.credit_refused += 1
            return False
        pin = set(pinned)
        pin.update(chain)
        for i, k in enumerate(chain):
            ev = event if i == 0 else _CLOSURE
            if not self._write(k, nodes[k], acts, ev, pin):
                return i > 0
        return True

    def _computed_bytes(self) -> int:
        """Bytes of the distinct KV content computed so far: what write-through writes at least once.

        Robust threshold policies never write more in total, so a policy that saves writes cannot
        out-write full duplicate even when load makes its SSD churn (docs/fidelity.md).
        """
        md = self.metadata
        return md.created * self.block_bytes + md.created_checkpoints * self.ckpt_bytes

    def _missing_prefix(self, key: int, node: ContextNode, hbm: Container[int]) -> list[int] | None:
        """``key`` and its ancestors up to the first one on SSD, deepest first; None if one of
        them has no copy to write from (neither DRAM nor the current request's GPU blocks)."""
        nodes = self.metadata.nodes
        chain = [key]
        p = node.parent
        while p != ROOT:
            pn = nodes.get(p)
            if pn is None:
                return None
            loc = pn.fa_loc
            if loc & SSD:
                break
            if not loc & DRAM and p not in hbm:
                return None
            chain.append(p)
            p = pn.parent
        return chain

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
        nodes = self.metadata.nodes
        robust = self.robust
        while ssd.free_tokens < tokens:
            victim = next((v for v in ssd.victims() if v not in pinned), None) if pinned else ssd.victim()
            if victim is None:
                return False
            vn = nodes[victim]
            if ssd.unread(victim):
                self.stats.ssd_evicted_unread += 1
            if robust:
                vn.e_spent = vn.E
            ssd.remove(victim)
            vn.fa_loc &= ~SSD
            if vn.ck_loc >= 0:
                vn.ck_loc &= ~SSD
            acts.ssd_evictions.append(victim)
        if self.on_write is not None:
            pn = nodes.get(node.parent)
            self.on_write(key, node, event, pn is not None and bool(pn.fa_loc & SSD))
        ssd.insert(key, tokens, nbytes)
        node.fa_loc |= SSD
        if node.ck_loc >= 0:
            node.ck_loc |= SSD
        acts.ssd_writes.append(key)
        self.admission.on_admitted(event, nbytes)
        st = self.stats
        if event is _EVICT:
            st.evict_writes += 1
        elif event is _REUSE:
            st.reuse_writes += 1
        elif event is _PREWRITE:
            st.prewrites += 1
        elif event is _CLOSURE:
            st.closure_writes += 1
        else:
            st.insert_writes += 1
        return True

    def _evict_dram(self, need_tokens: int, acts: Actions) -> None:
        """Free ``need_tokens`` of DRAM from the eviction end; write-before-reclaim."""
        dram = self.dram
        nodes = self.metadata.nodes
        writes_ssd = self.admission.writes_ssd
        while dram.used_tokens and dram.free_tokens < need_tokens:  # entries are never 0 tokens
            k = dram.victim()
            node = nodes[k]
            node.E += 1
            if writes_ssd and not node.fa_loc & SSD:
                self._admit(k, node, _EVICT, acts)
            dram.remove(k)
            node.fa_loc &= ~DRAM
            if node.ck_loc >= 0:
                node.ck_loc &= ~DRAM
            acts.dram_evictions.append(k)
            self.stats.dram_evictions += 1

    def _promote(self, keys: list[int], plan: ReloadPlan, now: float, acts: Actions) -> None:
        """Replicate leading SSD-hit nodes into DRAM up to ``r_eff`` of the reused prefix."""
        nodes = self.metadata.nodes
        prefix = keys[: plan.n_blocks]
        in_dram = 0
        candidates: list[int] = []
        for k, node in zip(prefix, map(nodes.get, prefix)):
            if node is None:
                continue
            loc = node.fa_loc
            if loc & DRAM:
                in_dram += 1
            elif loc & SSD:
                candidates.append(k)
        n = self.promotion.target_blocks(plan.n_blocks, in_dram, len(candidates))
        if n == 0:
            return
        chosen = candidates[:n]
        need = sum(self._size(nodes[k])[0] for k in chosen)
        budget = self.dram.free_tokens
        if budget < need:
            # headroom: LRU-end blocks that promotion may displace (not reused within P_tau)
            # robust rule: a replica of an SSD block never displaces a block SSD does not hold
            need_ssd = SSD if self.robust else 0
            for k in self.dram.victims():
                node = nodes[k]
                if not self.promotion.evictable(now, node.t_reuse) or (node.fa_loc & need_ssd) != need_ssd:
                    break
                budget += self.dram.size_of(k)[0]
                if budget >= need:
                    break
        fitting = []
        for k in chosen:
            tokens = self._size(nodes[k])[0]
            if tokens > budget:
                break
            budget -= tokens
            fitting.append(k)
        for k in reversed(fitting):  # deepest first, as everywhere (head most recent)
            node = nodes[k]
            tokens, nbytes = self._size(node)
            if self.dram.free_tokens < tokens:
                self._evict_dram(tokens, acts)
            self.dram.insert(k, tokens, nbytes)
            node.fa_loc |= DRAM
            if node.ck_loc >= 0:
                node.ck_loc |= DRAM
            acts.promotions.append(k)
            self.stats.promoted_blocks += 1

    def _prewrite_scan(self, acts: Actions) -> None:
        """Start writes for LRU-end DRAM nodes that would qualify at their next eviction.

        Most LRU-end nodes are below the policy's thresholds at every scan, so those are left out
        first. Such a node stays out of reach for the whole scan (its ``E`` and ``R`` do not
        change, writes only lower a budget): ``_admit`` would refuse it anyway.
        """
        nodes = self.metadata.nodes
        r_min, e_min = self.admission.thresholds(_PREWRITE)  # E bounds the robust rule's E - e_spent too
        due = [k for k in islice(self.dram.victims(), self._prewrite_depth)
               if not (node := nodes[k]).fa_loc & SSD and (node.R >= r_min or node.E >= e_min)]
        for k in due:  # asked one by one: a write budget may run out mid-scan, a closure may cover later ones
            node = nodes[k]
            if not node.fa_loc & SSD:
                self._admit(k, node, _PREWRITE, acts)
