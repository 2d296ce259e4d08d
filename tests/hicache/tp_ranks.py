"""Two attention ranks on CPU (gloo), each with its own real SariaStore, driving the admission
policy through the same event sequence; one rank's store commits late.

Each spawned process plays one rank of SGLang's scheduler, reduced to what shapes the tree:

- a small radix tree (three prefix chains of two-page nodes) whose host residency changes by
  the script: a request matches its chain (`on_request_match`), computes what is missing (host
  inserts: `on_host_insert`, then `prewrite_candidates`), and host memory over its cap is
  reclaimed LRU-first through the eviction gate (`on_host_evict`), skipping nodes whose write
  holds a host lock;
- a storage write (`write_backup_storage`) holds the node's host lock until its ack; acks are
  drained with a MIN of the ranks' finish counts each step, as HiCache does: a write issued on
  one rank only is never drained (its lock leaks), and ranks that write different nodes lock
  different nodes (their trees drift);
- a backup thread per rank writes the pages into the rank's store; rank 1's writes start
  ``lag_s`` after they were issued (skewed commit timing);
- each step also computes a promotion count the way `SariaRadixCache._promotion_tokens` does
  (host headroom: leaves not reused within P_tau).

``agreed``: the policy reads `RankAgreement` (stepped at each step's start, fed every issued
write and every store removal), as `SariaRadixCache` wires it. Otherwise it reads the old
rank-local inputs: the store's `exists` and `time.monotonic`.
"""

from __future__ import annotations

import hashlib
import json
import queue
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.policy import SariaHiCachePolicy
from sglang_saria.hicache.rank_agreement import RankAgreement
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import SariaStore

PAGE_BYTES = 4096
HOST_CAP_NODES = 4
STEP_S = 0.03
P_TAU_S = 0.2


def page_hash(name: str) -> str:
    """A page hash shaped like SGLang's (64 hex digits)."""
    return hashlib.sha256(name.encode()).hexdigest()


# The step of the fixed script whose reuse-triggered write reads `on_ssd` while rank 1 lags.
SPLIT_STEP = 7

# Pages both stores hold before the run, and one page only each rank holds (a restart after a
# crash mid-write on one rank): the agreed view starts with the shared ones only.
SHARED_AT_START = [page_hash("restart-shared-0"), page_hash("restart-shared-1")]
ONLY_ON_RANK = [page_hash("restart-rank0-only"), page_hash("restart-rank1-only")]


@dataclass(eq=False)
class Node:
    """The fields of SGLang's tree node that the policy reads."""

    id: int
    hash_value: list[str]
    parent: Optional["Node"] = None
    backuped: bool = False  # a host copy


@dataclass
class Tree:
    nodes: dict[int, Node] = field(default_factory=dict)

    def node_by_id(self, node_id: int) -> Node:
        return self.nodes[node_id]


def build_tree() -> tuple[Tree, list[list[int]]]:
    """Three chains of three two-page nodes under a root; returns the tree and the chains."""
    tree = Tree()
    root = tree.nodes[0] = Node(0, [])
    chains = []
    for c in range(3):
        parent, chain = root, []
        for d in range(3):
            node_id = 1 + 3 * c + d
            node = Node(node_id, [page_hash(f"c{c}d{d}p{p}") for p in range(2)], parent)
            tree.nodes[node_id] = node
            chain.append(node_id)
            parent = node
        chains.append(chain)
    return tree, chains


def script(chains: list[list[int]], steps: int, seed: int) -> list[list[tuple[str, int]]]:
    """The per-step events (the same on every rank): ("request", chain), ("evict_all", 0) or
    ("idle", 0).

    The first steps are fixed: chain 0 is computed, reclaimed (E = 1) and computed again, so
    prewrite writes its leaf (E + 1 reaches theta_E); the next request makes the leaf's R reach
    theta_R while the lagging rank has not committed that write: a reuse-triggered write
    that reads `on_ssd`, the case the old inputs split on. Chain 1 goes the same way up to
    its prewrite; once that write is acked, chain 1 is reclaimed: the prewritten leaf goes, its
    parent (E + 1 = theta_E, not on SSD) is written before its reclaim. Then a random mix.
    """
    idle, drain = [("idle", 0)], [[("idle", 0)]] * 24  # >= 1 s: rank 1 commits and acks
    fixed = [[("request", 0)], [("evict_all", 0)], [("request", 0)]] + [idle] * 4 + [[("request", 0)]]
    assert len(fixed) - 1 == SPLIT_STEP
    fixed += drain + [[("request", 1)], [("evict_all", 0)], [("request", 1)]] + drain + [[("evict_all", 0)]]
    rng = random.Random(seed)
    rest = [
        [("request", rng.randrange(len(chains))) for _ in range(rng.randrange(3))]
        + ([("evict_all", 0)] if rng.random() < 0.15 else [])
        for _ in range(steps)
    ]
    return fixed + rest


class BackupThread:
    """HiCache's backup thread for one rank: writes each operation's pages into the store, in
    issue order, starting ``lag_s`` after the operation was issued (a latency, not a backlog)."""

    def __init__(self, store: SariaStore, lag_s: float) -> None:
        self.store, self.lag_s = store, lag_s
        self.finished = 0
        self._queue: queue.Queue[Optional[tuple[float, list[str]]]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def submit(self, hashes: list[str]) -> None:
        self._queue.put((time.monotonic() + self.lag_s, hashes))

    @property
    def idle(self) -> bool:
        return self._queue.unfinished_tasks == 0

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            due, hashes = item
            time.sleep(max(0.0, due - time.monotonic()))
            for h in hashes:
                self.store.put(h, np.full(PAGE_BYTES, hash(h) & 0xFF, np.uint8))
            self.finished += 1
            self._queue.task_done()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


@dataclass
class RankLog:
    """What one rank decided, step by step; compared across ranks by the test."""

    writes: list[list[Any]] = field(default_factory=list)  # [step, why, node id]
    gate: list[list[Any]] = field(default_factory=list)  # [step, node id, reclaim now?]
    promotions: list[int] = field(default_factory=list)
    clocks: list[float] = field(default_factory=list)
    views: list[list[bool]] = field(default_factory=list)  # on_ssd of every page, per step
    start_view: list[bool] = field(default_factory=list)  # on_ssd of SHARED_AT_START + ONLY_ON_RANK
    leaked_locks: int = 0  # writes never drained: their host locks would never be released
    lost_page_seen_on_ssd: bool = True  # a page one rank's store removed, after the next step


def _store(root: Path, rank: int) -> SariaStore:
    cfg = StoreConfig(
        data_dirs=[str(root / f"rank{rank}")], capacity="96KiB", slot_bytes="4KiB", sync_writes=False
    )
    return SariaStore(cfg, victim_order=SSDVictimOrder())


def _min(value: int) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


class Rank:
    """One rank's scheduler loop over the script."""

    def __init__(self, rank: int, root: Path, agreed: bool, lag_s: float) -> None:
        self.rank = rank
        self.tree, self.chains = build_tree()
        # Before the run: the shared pages, and this rank's own one (a partial write).
        seeded = _store(root, rank)
        for h in SHARED_AT_START + [ONLY_ON_RANK[rank]]:
            assert seeded.put(h, np.zeros(PAGE_BYTES, np.uint8)).ok
        seeded.close()
        self.store = _store(root, rank)
        # rule "paper": no cap on admitted pages, so decisions keep coming through the run
        admission = {"policy": "combined:E2R2", "rule": "paper", "prewrite_depth_blocks": 4}
        config = SariaConfig.from_dict({"admission": admission})
        # Wired as `runtime.saria_policy` wires it: agreed inputs and removals with the agreement.
        self.agreement: Optional[RankAgreement] = None
        if agreed:
            self.agreement = RankAgreement(self.store.exists, self.store.keys, [dist.group.WORLD])
            self.policy = SariaHiCachePolicy(config, page_size=16, on_ssd=self.agreement.on_ssd,
                                             page_bytes=PAGE_BYTES, clock=self.agreement.clock)
            self.store.on_evict = self.agreement.evicted
            self.agreement.on_removed = self.policy.on_store_evict
        else:
            self.policy = SariaHiCachePolicy(config, page_size=16, on_ssd=self.store.exists, page_bytes=PAGE_BYTES)
            self.store.on_evict = self.policy.on_store_evict
        self.promotion = PromotionController("saria", 0.4, P_TAU_S, 1.0)
        self.backup = BackupThread(self.store, lag_s if rank == 1 else 0.0)
        self.issued: list[int] = []  # node of each write operation, in issue order
        self.drained = 0
        self.host: dict[int, int] = {}  # host-resident node -> last use (step)
        self.log = RankLog()
        self.pages = [h for n in self.tree.nodes.values() for h in n.hash_value]

    # ------------------------------------------------------------ the tree's calls
    def write(self, step: int, why: str, node_id: int) -> None:
        hashes = self.tree.node_by_id(node_id).hash_value
        if self.agreement is not None:
            self.agreement.requested(hashes)  # SariaRadixCache.write_backup_storage
        self.issued.append(node_id)
        self.backup.submit(hashes)
        self.log.writes.append([step, why, node_id])

    def locked(self) -> set[int]:
        return set(self.issued[self.drained :])

    def evictable_leaves(self) -> list[Node]:
        locked = self.locked()
        parents = {self.tree.node_by_id(n).parent.id for n in self.host}
        return [self.tree.node_by_id(n) for n in self.host if n not in parents and n not in locked]

    def priority(self, node: Node) -> tuple[int, int]:
        return self.host[node.id], node.id

    def request(self, step: int, chain: list[int]) -> None:
        hit = 0  # host residency is prefix-closed: leaves are reclaimed first
        while hit < len(chain) and chain[hit] in self.host:
            hit += 1
        if hit:
            for node_id in self.policy.on_request_match(f"req-{step}-{chain[0]}", self.tree, chain[hit - 1]):
                self.write(step, "reuse", node_id)
        for node_id in chain:
            self.host[node_id] = step
            self.tree.node_by_id(node_id).backuped = True
        for node_id in chain[hit:]:
            for write_id in self.policy.on_host_insert(self.tree, node_id):
                self.write(step, "insert", write_id)
        for node in self.policy.prewrite_candidates(self.evictable_leaves(), self.priority):
            self.write(step, "prewrite", node.id)

    def evict(self, step: int, cap: int) -> None:
        """Reclaim host nodes LRU-first through the gate until at most ``cap`` remain."""
        asked: set[int] = set()
        while len(self.host) > cap:
            leaves = [n for n in self.evictable_leaves() if n.id not in asked]
            if not leaves:
                return
            node = min(leaves, key=self.priority)
            asked.add(node.id)
            reclaim, writes = self.policy.on_host_evict(node)
            self.log.gate.append([step, node.id, reclaim])
            if reclaim:
                del self.host[node.id]
                node.backuped = False
            for write_id in writes:
                self.write(step, "before_reclaim", write_id)

    def promotion_count(self) -> int:
        """`SariaRadixCache._promotion_tokens` over this tree: target capped by host headroom."""
        headroom = HOST_CAP_NODES * 2 - 2 * len(self.host)
        for leaf in self.evictable_leaves():
            if self.policy.may_displace(self.promotion, leaf):
                headroom += len(leaf.hash_value)
        return min(self.promotion.target_blocks(12, 2, 10), max(0, headroom))

    # ------------------------------------------------------------ the scheduler loop
    def begin_step(self) -> None:
        """`check_hicache_events`: the agreement's step, then HiCache's MIN-synced ack drain."""
        if self.agreement is not None:
            self.agreement.step()
        self.drained = min(_min(self.backup.finished), len(self.issued))

    def run(self, steps: list[list[tuple[str, int]]]) -> RankLog:
        self.log.start_view = [self.policy.on_ssd(h) for h in SHARED_AT_START + ONLY_ON_RANK]
        for step, events in enumerate(steps):
            self.begin_step()
            if self.rank == 1:
                time.sleep(STEP_S / 3)  # this rank reaches each step a little later
            for kind, arg in events:
                if kind == "request":
                    self.request(step, self.chains[arg])
                elif kind == "evict_all":
                    self.evict(step, 0)
            self.evict(step, HOST_CAP_NODES)
            self.log.promotions.append(self.promotion_count())
            self.log.clocks.append(self.policy.clock())
            self.log.views.append([self.policy.on_ssd(h) for h in self.pages])
            time.sleep(STEP_S)
        self.finish(len(steps))
        return self.log

    def finish(self, step: int) -> None:
        """Idle steps until both backup threads are done; then count the writes never drained,
        and check that a page one rank's store loses leaves the view of every rank."""
        while _min(int(self.backup.idle)) == 0:
            self.begin_step()
            time.sleep(STEP_S)
        self.begin_step()
        self.begin_step()  # the last commits reach the agreed view
        self.log.leaked_locks = len(self.issued) - self.drained
        stored = [h for h in self.pages if self.policy.on_ssd(h)]
        victim = sorted(stored)[0] if stored else self.pages[0]
        if self.rank == 1:
            self.store.evict([victim])
        self.begin_step()
        self.log.lost_page_seen_on_ssd = self.policy.on_ssd(victim)
        self.backup.close()
        self.store.close()


def run_rank(rank: int, world: int, init_method: str, root: str, agreed: bool, lag_s: float, out: str) -> None:
    """Entry point of a spawned rank: writes its RankLog as JSON to ``out``."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        r = Rank(rank, Path(root), agreed, lag_s)
        log = r.run(script(r.chains, steps=40, seed=7))
        Path(out).write_text(json.dumps(asdict(log)))
    finally:
        dist.destroy_process_group()
