"""SGLang glue: persistence-aware SSD admission (paper 4.2) inside HiCache's radix tree.

SGLang's HiCache writes every page that reaches host memory to storage ("full
duplicate"). With the `saria` backend, `SariaRadixCache` asks this policy instead at four
points of `UnifiedRadixCache`, and writes the tree nodes it names:

- a request matched cached pages (once per request): `R += 1`, and a node whose `R`
  just reached `theta_R` is written asynchronously (reuse-triggered write);
- a node's write-through to host finished: pages seen before were recomputed
  (`R += 1`); the node is written now only if the policy admits it on insert
  (full-duplicate always does);
- a host leaf is about to be reclaimed: if it is not on SSD and would qualify with
  this eviction counted (`E + 1`), it is written first and reclaimed on a later pass
  (write-before-reclaim: the write holds a host lock); otherwise `E += 1` and it goes;
- after each write-through, the leaves next in line for host eviction that would
  qualify at that eviction start writing early (prewrite).

Every decision is the replay's: the same `WriteSequencer` (`mem_cache/sequencer.py`) decides,
reading the tree and the store through `TreeTierView` (`tree_view.py`). Under the robust rule
(`admission.rule`, default) a threshold policy's write closes over the node's ancestors not on
SSD (SSD content stays prefix-closed), starts only at nodes holding a Mamba checkpoint on hybrid
models, needs `theta_E` evictions since the node's SSD copy was lost (the store tells the policy
what it dropped: `on_store_evict`), and total writes stay within the pages computed.

Counters live in the core's `ContextMetadata`, keyed by SGLang's page hash, so a page
that returns after eviction keeps its history (and after a restart: `counter_log.py` keeps them
with the store, saved at each step by `SariaRuntime.end_step`); a node's decisions read its last page's.
Locations are not copied here: DRAM is the tree's `host_value`, SSD is the store's index, so
nothing can drift. With tensor parallelism, `on_ssd` and `clock` are the ranks' agreed SSD view
and step clock (`rank_agreement.py`), given at construction (`runtime.py`), so every rank decides the same.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.hints import NodeHints
from sglang_saria.hicache.host_leaf_order import eviction_head
from sglang_saria.hicache.metrics import SariaServingMetrics
from sglang_saria.hicache.tree_view import TreeTierView, page_key
from sglang_saria.mem_cache.admission import AdmissionEvent
from sglang_saria.mem_cache.admission_factory import make_admission_policy
from sglang_saria.mem_cache.budget import WriteBudgetController
from sglang_saria.mem_cache.metadata import DRAM, SSD, ContextMetadata, ContextNode
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.mem_cache.sequencer import WriteSequencer

logger = logging.getLogger(__name__)

_RECENT_REQUESTS = 65536  # request ids remembered to count a request's reuse once


@dataclass
class EvictionStats:
    """Host reclaims seen by the policy (admissions are counted by the policy object)."""

    host_evictions: int = 0
    deferred_evictions: int = 0  # reclaims postponed behind a write-before-reclaim
    state_writes: int = 0  # of which: a GDN state written beside pages the store held (``_write_state``)


class SariaHiCachePolicy:
    """Admission decisions for SGLang tree nodes; returns the nodes the tree is to write."""

    def __init__(
        self,
        config: SariaConfig,
        page_size: int,
        on_ssd: Callable[[str], bool],
        page_bytes: int = 0,
        ssd_capacity_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
        hybrid: bool = False,
        on_ssd_read: Callable[[Sequence[str]], None] | None = None,
        on_ssd_demote: Callable[[Sequence[str]], None] | None = None,
        ssd_victim_page: Callable[[int], str | None] | None = None,
        state_on_ssd: Callable[[str], bool] | None = None,
    ) -> None:
        """``on_ssd(page hash)`` and ``clock()``: the SSD view and the clock every decision reads (with
        several ranks, their agreed ones: ``rank_agreement.py``); ``on_ssd_read(hashes)``: told the
        pages an SSD reload read (the store's victim order); ``on_ssd_demote(hashes)``: told an ended
        session's pages (agents' hints: the store's first victims); ``hybrid``: writes start at nodes
        holding a Mamba checkpoint; ``ssd_victim_page(nbytes)``: the page the store would evict first
        for a write of ``nbytes`` (None: room), for policies that compare a write with its victim (``auto``);
        ``state_on_ssd(page hash)``: whether the store holds that page's GDN state sidecar (None: never
        asked, a node whose last page is stored counts as stored whole)."""
        self.config = config
        # budget:<DWPD> needs the drive capacity and the bytes of each admitted node.
        self.admission = make_admission_policy(config.admission.policy, config.admission, ssd_capacity_bytes)
        self.page_bytes = page_bytes
        self.metadata = ContextMetadata(page_size, None, config.metadata.metadata_window_s)
        self.view = TreeTierView(self.metadata, page_size, page_bytes, ssd_capacity_bytes, on_ssd, clock, hybrid,
                                 ssd_victim_page)
        self.sequencer = WriteSequencer(self.admission, config.admission.rule)
        # agents' hints (``auto``, ``loadaware``): kept by page, asked about tree nodes by their last page (hints.py)
        self.hints = self.admission.hints
        if self.hints is not None:
            self.sequencer.hints = NodeHints(self.hints, lambda node: page_key(node.hash_value[-1]))
        self.stats = EvictionStats()
        self._requests_seen: OrderedDict[str, None] = OrderedDict()
        self._deferred: set[str] = set()  # nodes (last page hash) whose reclaim waits for a write
        self._lost: deque[str] = deque()  # page hashes the store dropped (any thread), applied at the next event
        self._metrics = SariaServingMetrics.get()
        self.on_ssd_read = on_ssd_read
        self.on_ssd_demote = on_ssd_demote
        self.state_on_ssd = state_on_ssd

    @property
    def on_ssd(self) -> Callable[[str], bool]:
        return self.view.on_ssd

    @property
    def clock(self) -> Callable[[], float]:
        return self.view.clock

    @property
    def writes_ssd(self) -> bool:
        return self.admission.writes_ssd

    @property
    def pages_admitted(self) -> int:
        return self.sequencer.written_bytes // self.view.unit

    def _counters(self, node: Any) -> ContextNode | None:
        hashes = node.hash_value
        return self.metadata.get(page_key(hashes[-1])) if hashes else None

    def _begin(self) -> float:
        """Every event: the store's removals since the last one, then the clock."""
        lost = self._lost
        if lost:
            n = len(lost)
            hashes = [lost.popleft() for _ in range(n)]
            self.view.forget(hashes)
            for h in hashes:
                node = self.metadata.get(page_key(h))
                if node is not None:
                    self.sequencer.ssd_lost(node)
            self.metadata.note_changed(map(page_key, hashes))
        now = self.clock()
        self.admission.on_clock(now)
        if isinstance(self.admission, WriteBudgetController):
            self._metrics.budget(self.admission.theta_E, self.admission.fill)
        return now

    def seed_budget(self, written: list[tuple[float, int]]) -> None:
        """A ``budget:<DWPD>`` window starts with what the store wrote before this process,
        (seconds ago, bytes) oldest first, so a restart does not refill the day's budget."""
        if isinstance(self.admission, WriteBudgetController):
            self.admission.seed(written, self.clock())
            self._metrics.budget(self.admission.theta_E, self.admission.fill)

    def _order(self, chain: list[Any] | None, event: AdmissionEvent) -> list[Any]:
        """Count a decided chain's writes (the node's event, then closures) and mark them in flight."""
        if not chain:
            return []
        unit = self.view.unit
        for i, node in enumerate(chain):
            ev = event if i == 0 else AdmissionEvent.CLOSURE
            self.sequencer.written(ev, len(node.hash_value) * unit)
            self._metrics.admitted(ev.value)
        self.view.ordered(chain)
        logger.debug("saria: write %d node(s) to SSD at %s", len(chain), event.value)
        return chain

    # ------------------------------------------------------------------ events
    def on_store_evict(self, page_hashes: Iterable[str]) -> None:
        """The store dropped these pages (evicted for space, failed checksum), from any thread; applied
        at the next event. With several ranks: the removals they agreed (``RankAgreement.on_removed``),
        never one rank's own, which another rank's store did not see."""
        self._lost.extend(page_hashes)

    def on_request_match(self, request_id: str, tree_core: Any, node_id: int) -> list[int]:
        """A request matched the path ending at ``node_id``: count its reuse once.

        Returns the ids of nodes to write now (``R`` reached theta_R; with their unwritten prefix).
        """
        if request_id in self._requests_seen:
            return []
        self._requests_seen[request_id] = None
        if len(self._requests_seen) > _RECENT_REQUESTS:
            self._requests_seen.popitem(last=False)
        now = self._begin()
        view, seq, to_write = self.view, self.sequencer, []
        first = None  # the path's first page: new pages further down link to it (``metadata.bypassed``)
        for i, node in enumerate(reversed(_path_to_root(tree_core, node_id))):  # root first, as the replay counts
            keys = [page_key(h) for h in node.hash_value]
            if self.hints is not None:
                self.hints.used(keys)  # reused: an end hint on these pages no longer holds
            reached = self.metadata.record_use(keys, now, r_watch=self.admission.reuse_threshold,
                                               path_first=first, from_root=i == 0)
            if i == 0:
                first = self.metadata.get(keys[0])
            if reached and self.writes_ssd and (view.location(node) & (DRAM | SSD)) == DRAM:
                to_write += self._order(seq.reuse(view, node, self._counters(node)), AdmissionEvent.REUSE)
        return [n.id for n in to_write]

    def on_host_insert(self, tree_core: Any, node_id: int) -> list[int]:
        """A node's pages reached host memory; returns the ids of nodes to write now.

        A node already on SSD is not written again. An SSD hit promoted to host was counted
        at its reload; stored pages recomputed instead (the prompt's last page, the rest
        of a reload cut short, a store recovered at restart) get their counters now.
        """
        node = tree_core.node_by_id(node_id)
        hashes = node.hash_value
        if not hashes:
            return []
        now = self._begin()
        keys = [page_key(h) for h in hashes]
        if self.admission.learns:  # recomputed pages were wanted from below DRAM (new ones are not in its ghost)
            self.admission.on_missed(keys)
        path = _path_to_root(tree_core, node_id)
        first_key = page_key(path[-1].hash_value[0]) if path else keys[0]  # the path's first page
        first = self.metadata.get(first_key)
        if self.on_ssd(hashes[-1]):
            uncounted = [k for k in keys if self.metadata.get(k) is None]
            if uncounted:
                self.metadata.record_use(uncounted, now, path_first=first, from_root=uncounted[0] == first_key)
            return []
        self.metadata.record_use(keys, now, path_first=first, from_root=keys[0] == first_key)
        if not self.writes_ssd or self.view.location(node) & SSD:
            return []
        return [n.id for n in self._order(self.sequencer.insert(self.view, node, self._counters(node)),
                                          AdmissionEvent.INSERT)]

    def on_ssd_reload(self, hashes: Sequence[str]) -> None:
        """Pages came back from SSD for a request: a reuse (R += 1, t_reuse = now) like a tree hit,
        and an SSD read for the store's victim order (``SSDVictimOrder.touch_prefix``, as the replay)."""
        keys = [page_key(h) for h in hashes]
        self.metadata.record_use(keys, self._begin(), from_root=False)  # a later part of a path (first page unknown)
        if self.admission.learns:  # wanted from below DRAM
            self.admission.on_missed(keys)
        if self.hints is not None:
            self.hints.used(keys)
        if self.on_ssd_read is not None:
            self.on_ssd_read(hashes)

    def adopt(self, nodes: Iterable[Any]) -> None:
        """Attached at run time to a tree already holding pages: those in host memory without
        counters get them now (a first use), as stored pages recomputed at insert do; what
        they saw before this policy is unknown."""
        now = self._begin()
        keys = [page_key(h) for node in nodes if node.backuped for h in node.hash_value or ()]
        uncounted = [k for k in keys if self.metadata.get(k) is None]
        if uncounted:
            self.metadata.record_use(uncounted, now, from_root=False)  # pages of many paths: first pages unknown

    def prewrite_candidates(self, host_leaves: Iterable[Any], priority: Callable[[Any], Any]) -> list[Any]:
        """Prewrite (paper 4.2): host leaves holding the next ``prewrite_depth_blocks`` pages to be
        evicted that would be admitted with this eviction counted (``E + 1``) start writing now,
        so the write is off the reclaim path. Returns the nodes to write (with their unwritten prefix)."""
        cfg = self.config.admission
        if not (cfg.prewrite and self.admission.uses_eviction_count and self.writes_ssd):
            return []
        self._begin()
        head, pages = [], 0
        # The head of the eviction order only: an indexed tree (HostLeafOrder) reads it without
        # visiting every host leaf, so a prewrite per write-through ack stays off O(leaves).
        for node in eviction_head(host_leaves, priority, cfg.prewrite_depth_blocks):
            hashes = node.hash_value
            if pages >= cfg.prewrite_depth_blocks:
                break
            pages += len(hashes or ())
            counters = self._counters(node)
            if counters is not None and hashes[-1] not in self._deferred:
                head.append((node, counters))
        chosen: list[Any] = []
        for chain in self.sequencer.prewrite(self.view, head):  # each marked in flight before the next decision
            chosen += self._order(chain, AdmissionEvent.PREWRITE)
        return chosen

    def admitted_prefix_pages(self, node: Any) -> int:
        """Pages of a host leaf up to its deepest page this eviction would admit, when that is
        not its last page (0 otherwise). The paper decides per block (4.2), as the replay does;
        an SGLang node may join pages evicted a different number of times (a turn recomputed
        after its prefix left host memory joins the old pages, E >= 1, with the new, E = 0), and
        judged by its last page such a node would never be written. The adapter splits the leaf
        there; the prefix is then asked as a leaf of its own (`on_host_evict`)."""
        hashes = node.hash_value or []
        if len(hashes) < 2 or not self.writes_ssd or not self.admission.uses_eviction_count:
            return 0
        r_min, e_min, checkpoint_only = self.sequencer.write_floor(self.view, AdmissionEvent.EVICT)
        if checkpoint_only:
            return 0
        for i in range(len(hashes) - 1, -1, -1):
            counters = self.metadata.get(page_key(hashes[i]))
            if counters is not None and (counters.R >= r_min or counters.E >= e_min):
                return 0 if i == len(hashes) - 1 or self.view.page_on_ssd(hashes[i]) else i + 1
        return 0

    def on_host_evict(self, node: Any) -> tuple[bool, list[int]]:
        """A host leaf is the next to reclaim: (reclaim now?, ids of nodes to write first)."""
        hashes = node.hash_value or []
        counters = self._counters(node)
        if not hashes or not self.writes_ssd or counters is None:
            self._count_eviction(hashes)
            self._metrics.host_reclaim("dropped")
            return True, []
        last = hashes[-1]
        self._begin()
        if last in self._deferred:
            # The write had its chance (done, or failed: store full, I/O error); never block the reclaim twice.
            self._deferred.discard(last)
            gate = "after_write"
        elif not self.view.location(node) & SSD:
            chain = self._order(self.sequencer.evict(self.view, node, counters), AdmissionEvent.EVICT)
            if chain:
                self._deferred.add(last)
                self.stats.deferred_evictions += 1
                self._metrics.host_reclaim("deferred")
                return False, [n.id for n in chain]
            gate = "dropped"
        else:  # written before its reclaim asked (prewrite, insert, reuse), or still being written
            stored = self.on_ssd(last)
            if stored and self._state_unstored(node, last):
                return self._write_state(node, last)
            gate = "stored" if stored else "in_flight"
        self._metrics.host_reclaim(gate)
        self._count_eviction(hashes)
        return True, []

    def _state_unstored(self, node: Any, last: str) -> bool:
        """A hybrid host leaf holds a GDN state the store lacks beside its stored pages: the state was
        placed after they were written (a node split at a later request's end, its pages written
        with the longer node)."""
        return self.state_on_ssd is not None and self.view.has_checkpoint(node) and not self.state_on_ssd(last)

    def _write_state(self, node: Any, last: str) -> tuple[bool, list[int]]:
        """Write-before-reclaim of the node's state alone (its pages are touches in the store), asked of
        no admission: the pages were admitted, and the state is what lets a later hit end at this
        node instead of an earlier stored state (the replay's ``SariaCore._write_state``). The
        sequencer's write credit and budget count KV pages here, as the content computed is counted
        in pages: the state's bytes are spent from neither."""
        self._deferred.add(last)
        self.stats.deferred_evictions += 1
        self.stats.state_writes += 1
        self._metrics.admitted("state")
        self._metrics.host_reclaim("deferred")
        return False, [node.id]

    def may_displace(self, promotion: PromotionController, leaf: Any) -> bool:
        """Whether a promotion may displace this host leaf (``promotion.py``'s rule, as in the replay)."""
        loc = self.view.location(leaf)
        counters = self._counters(leaf)
        if loc is None or counters is None:
            return True
        return promotion.may_displace(self.clock(), counters, bool(loc & SSD), self.sequencer.robust)

    def promotion_pages(self, promotion: PromotionController, reused: int, in_dram: int, pages: int, free: int,
                        host_leaves: Iterable[Any], priority: Callable[[Any], Any]) -> int:
        """Pages of an SSD hit (``pages``, leading ones first) to promote to host: ``promotion_set``
        (``mem_cache/promotion.py``), as the replay asks it, over the host leaves in eviction order (read off
        the index, at most ``pages`` of them: each frees a page or more)."""
        view = self.view

        def head() -> Iterator[tuple[ContextNode | None, bool, int]]:
            for leaf in eviction_head(host_leaves, priority, max(0, pages - free)):
                loc = view.location(leaf)
                counters = None if loc is None else self._counters(leaf)
                yield counters, bool(loc and loc & SSD), len(leaf.hash_value or ())

        return promotion.promotion_set(self.clock(), reused, in_dram, [1] * pages, free, head(), self.sequencer.robust)

    def _count_eviction(self, hashes: Sequence[str]) -> None:
        now = self.clock()
        keys = [page_key(h) for h in hashes]
        for key in keys:
            node = self.metadata.get(key)
            if node is not None:
                node.E += 1
        self.metadata.note_changed(keys)
        self.stats.host_evictions += 1
        self._metrics.host_evicted()
        self.metadata.reclaim(now)


def _path_to_root(tree_core: Any, node_id: int) -> list[Any]:
    """Nodes from ``node_id`` up to (not including) the root that carry page hashes."""
    path = []
    node = tree_core.node_by_id(node_id)
    while node is not None and node.parent is not None:
        if node.hash_value:
            path.append(node)
        node = node.parent
    return path
