"""SGLang glue: persistence-aware SSD admission (paper 4.2) inside HiCache's radix tree.

SGLang's HiCache writes every page that reaches host memory to storage ("full
duplicate"). With the `saria` backend, patch 005 asks this policy instead at three
points of `UnifiedRadixCache`:

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

Under the robust rule (`admission.rule`, default) a threshold policy never admits more pages
than were computed (write-through's minimum), as in the core; the core's prefix-closed
chains and lost-copy evidence are not applied here yet (the store evicts on its own).

Counters live in the core's `ContextMetadata`, keyed by SGLang's page hash, so a page
that returns after eviction keeps its history. Locations are not copied here: DRAM
is the tree's `host_value`, SSD is the store's index, so nothing can drift. With tensor
parallelism, `on_ssd` and `clock` are the ranks' agreed SSD view and step clock
(`rank_agreement.py`, wired by `SariaRadixCache`), so every rank decides the same.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_saria.config import SariaConfig
from sglang_saria.mem_cache.admission import AdmissionEvent, ThresholdAdmission, make_admission_policy
from sglang_saria.hicache.host_leaf_order import eviction_head
from sglang_saria.mem_cache.metadata import ContextMetadata
from sglang_saria.hicache.metrics import SariaServingMetrics

logger = logging.getLogger(__name__)

_RECENT_REQUESTS = 65536  # request ids remembered to count a request's reuse once


def page_key(page_hash: str) -> int:
    """SGLang page hashes are hex digests; their first 64 bits key the core's metadata."""
    return int(page_hash[:16], 16)


@dataclass
class EvictionStats:
    """Host reclaims seen by the policy (admissions are counted by the policy object)."""

    host_evictions: int = 0
    deferred_evictions: int = 0  # reclaims postponed behind a write-before-reclaim


class SariaHiCachePolicy:
    """Admission decisions for SGLang nodes, given as lists of page hashes."""

    def __init__(
        self,
        config: SariaConfig,
        page_size: int,
        on_ssd: Callable[[str], bool],
        page_bytes: int = 0,
        ssd_capacity_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        # budget:<DWPD> needs the drive capacity and the bytes of each admitted node.
        self.admission = make_admission_policy(config.admission.policy, config.admission, ssd_capacity_bytes)
        self.page_bytes = page_bytes
        self.metadata = ContextMetadata(page_size, None, config.metadata.metadata_window_s)
        self.on_ssd = on_ssd
        self.clock = clock
        self.stats = EvictionStats()
        self._requests_seen: OrderedDict[str, None] = OrderedDict()
        self._deferred: set[str] = set()  # nodes (last page hash) whose reclaim waits for a write
        # robust rule (docs/fidelity.md): a threshold policy never admits more pages than were computed
        self._capped = config.admission.rule == "robust" and isinstance(self.admission, ThresholdAdmission)
        self.pages_admitted = 0
        self._metrics = SariaServingMetrics.get()

    @property
    def writes_ssd(self) -> bool:
        return self.admission.writes_ssd

    def _admit(self, hashes: Sequence[str], event: AdmissionEvent, extra_evictions: int = 0) -> bool:
        nodes = [self.metadata.get(page_key(h)) for h in hashes]
        nodes = [n for n in nodes if n is not None]
        if not nodes:
            return False
        self.admission.on_clock(self.clock())
        if self._capped and self.pages_admitted + len(hashes) > self.metadata.created:
            return False
        admit = self.admission.should_admit(
            max(n.E for n in nodes) + extra_evictions, max(n.R for n in nodes), event
        )
        if admit:
            self.pages_admitted += len(hashes)
            self.admission.on_admitted(event, len(hashes) * self.page_bytes)
            self._metrics.admitted(event.value)
            logger.debug("saria: write %d pages to SSD at %s (E=%d R=%d)", len(hashes), event.value,
                         max(n.E for n in nodes), max(n.R for n in nodes))
        return admit

    def on_request_match(self, request_id: str, tree_core: Any, node_id: int) -> list[int]:
        """A request matched the path ending at ``node_id``: count its reuse once.

        Returns the ids of path nodes to write now (their ``R`` just reached theta_R).
        """
        if request_id in self._requests_seen:
            return []
        self._requests_seen[request_id] = None
        if len(self._requests_seen) > _RECENT_REQUESTS:
            self._requests_seen.popitem(last=False)
        now = self.clock()
        to_write = []
        for node in _path_to_root(tree_core, node_id):
            hashes = node.hash_value
            reached = self.metadata.record_use(
                [page_key(h) for h in hashes], now, r_watch=self.admission.reuse_threshold
            )
            if reached and not self.on_ssd(hashes[-1]) and self._admit(hashes, AdmissionEvent.REUSE):
                to_write.append(node.id)
        return to_write

    def on_host_insert(self, hashes: Sequence[str]) -> bool:
        """A node's pages reached host memory; True: write it to storage now.

        A node already on SSD is not written again. An SSD hit promoted to host was counted
        at its reload; stored pages recomputed instead (the prompt's last page, the rest
        of a reload cut short, a store recovered at restart) get their counters now.
        """
        if not hashes:
            return False
        keys = [page_key(h) for h in hashes]
        if self.on_ssd(hashes[-1]):
            uncounted = [k for k in keys if self.metadata.get(k) is None]
            if uncounted:
                self.metadata.record_use(uncounted, self.clock())
            return False
        self.metadata.record_use(keys, self.clock())
        return self._admit(hashes, AdmissionEvent.INSERT)

    def on_ssd_reload(self, hashes: Sequence[str]) -> None:
        """Pages came back from SSD for a request: a reuse (R += 1, t_reuse = now) like a tree hit."""
        self.metadata.record_use([page_key(h) for h in hashes], self.clock())

    def prewrite_candidates(self, host_leaves: Iterable[Any], priority: Callable[[Any], Any]) -> list[Any]:
        """Prewrite (paper 4.2): host leaves holding the next ``prewrite_depth_blocks`` pages to be
        evicted that would be admitted with this eviction counted (``E + 1``) start writing now,
        so the write is off the reclaim path."""
        cfg = self.config.admission
        if not (cfg.prewrite and self.admission.uses_eviction_count and self.writes_ssd):
            return []
        chosen, pages = [], 0
        # The head of the eviction order only: an indexed tree (HostLeafOrder) reads it without
        # visiting every host leaf, so a prewrite per write-through ack stays off O(leaves).
        for node in eviction_head(host_leaves, priority, cfg.prewrite_depth_blocks):
            hashes = node.hash_value
            if pages >= cfg.prewrite_depth_blocks:
                break
            pages += len(hashes or ())
            if hashes and hashes[-1] not in self._deferred and not self.on_ssd(hashes[-1]):
                if self._admit(hashes, AdmissionEvent.PREWRITE):
                    chosen.append(node)
        return chosen

    def on_host_evict(self, hashes: Sequence[str]) -> bool:
        """A host leaf is the next to reclaim. True: reclaim now; False: write it first."""
        if not hashes or not self.writes_ssd:
            self._count_eviction(hashes)
            return True
        last = hashes[-1]
        if last in self._deferred:
            # The write had its chance (done, or failed: store full, I/O error); never block the reclaim twice.
            self._deferred.discard(last)
        elif not self.on_ssd(last) and self._admit(hashes, AdmissionEvent.EVICT, extra_evictions=1):
            self._deferred.add(last)
            self.stats.deferred_evictions += 1
            return False
        self._count_eviction(hashes)
        return True

    def _count_eviction(self, hashes: Sequence[str]) -> None:
        now = self.clock()
        for h in hashes:
            node = self.metadata.get(page_key(h))
            if node is not None:
                node.E += 1
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
