"""One sequencer (issue 13, deliverable 4): the same events through both tier views give the same writes.

The SGLang side is the adapter's policy on a real ``UnifiedRadixCache`` (Python TreeCore, CPU)
whose nodes have host copies, with a real ``SariaStore`` in tmp_path as the SSD; the replay side
is the same ``WriteSequencer`` over ``ReplayTierView`` (metadata bitmasks, an SSD ``Tier``), fed
the same events by a mirror of the replay's execution (a write marks the node on SSD at once;
an eviction counts ``E`` and clears DRAM). Tree: ``A`` (2 pages) with children ``B`` and ``C``,
``D`` under ``B``; one replay block per tree node, so sizes and computed content agree.
"""

from __future__ import annotations

import hashlib
from array import array

import numpy as np
import pytest

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.policy import SariaHiCachePolicy
from sglang_saria.mem_cache.metadata import DRAM, ROOT, SSD, ContextMetadata, ContextNode
from sglang_saria.mem_cache.sequencer import WriteSequencer
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.replay.tiers import ReplayTierView, Tier
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import SariaStore
from tests.hicache.test_host_leaf_order import _python_tree_cache

PAGE_BYTES = 4096
PARENT = {"A": None, "B": "A", "C": "A", "D": "B"}
TOKENS = {"A": [1, 2], "B": [3, 4], "C": [5, 6], "D": [7, 8]}


def page_hashes(name: str) -> list[str]:
    return [hashlib.sha256(f"{name}{i}".encode()).hexdigest() for i in range(2)]


def path(name: str) -> list[str]:
    out = []
    while name is not None:
        out.append(name)
        name = PARENT[name]
    return out[::-1]


class SGLangSide:
    """The policy on a real radix tree (host copies set as HiCache's write-through leaves them) and store."""

    def __init__(self, policy_name: str, store_dir) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        self.cache = _python_tree_cache(64)
        tree = self.cache.tree_core
        tree.set_hicache_enabled()
        alloc = self.cache.token_to_kv_pool_allocator
        for leaf in ("B", "D", "C"):  # each insert adds one node; C splits A + B
            tokens = [t for n in path(leaf) for t in TOKENS[n]]
            self.cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=alloc.alloc(len(tokens))))
        by_tokens, stack = {}, list(tree.root_node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            by_tokens[tuple(n.key.token_ids)] = n
        self.nodes = {name: by_tokens[tuple(tokens)] for name, tokens in TOKENS.items()}
        for name, n in self.nodes.items():
            parent = PARENT[name]
            assert n.parent is (tree.root_node if parent is None else self.nodes[parent]), name
            n.hash_value = page_hashes(name)
        self.names = {n.id: name for name, n in self.nodes.items()}
        self.store = SariaStore(StoreConfig(data_dirs=[str(store_dir)], capacity="1MiB", slot_bytes="4KiB",
                                            sync_writes=False), victim_order=SSDVictimOrder())
        config = SariaConfig.from_dict({"admission": {"policy": policy_name, "prewrite_depth_blocks": 4}})
        self.policy = SariaHiCachePolicy(config, page_size=1, on_ssd=self.store.exists, page_bytes=PAGE_BYTES,
                                         ssd_capacity_bytes=self.store.capacity_bytes, clock=lambda: 100.0)
        self.store.on_evict = self.policy.on_store_evict
        self._host(list(self.nodes), True)

    def _host(self, names: list[str], present: bool) -> None:
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        for name in names:
            data = self.nodes[name].component_data[ComponentType.FULL]
            data.host_value = data.value.clone() if present else None

    def _commit(self, ids: list[int]) -> list[str]:
        """HiCache's backup thread: the ordered writes land in the store."""
        names = [self.names[i] for i in ids]
        for name in names:
            for h in self.nodes[name].hash_value:
                assert self.store.put(h, np.zeros(PAGE_BYTES, np.uint8)).ok
        return names

    def insert(self, name: str) -> list[str]:
        self._host([name], True)
        return self._commit(self.policy.on_host_insert(self.cache.tree_core, self.nodes[name].id))

    def reuse(self, rid: str, name: str) -> list[str]:
        return self._commit(self.policy.on_request_match(rid, self.cache.tree_core, self.nodes[name].id))

    def evict(self, name: str) -> list[str]:
        reclaim, ids = self.policy.on_host_evict(self.nodes[name])
        written = self._commit(ids)
        if not reclaim:  # the write ran; the gate's next pass reclaims
            assert self.policy.on_host_evict(self.nodes[name]) == (True, [])
        self._host([name], False)
        return written

    def prewrite(self, order: list[str]) -> list[str]:
        rank = {name: i for i, name in enumerate(order)}
        leaves = [self.nodes[n] for n in order]
        chosen = self.policy.prewrite_candidates(leaves, lambda node: rank[self.names[node.id]])
        return self._commit([n.id for n in chosen])

    def lose(self, name: str) -> None:
        self.store.evict(self.nodes[name].hash_value)

    def close(self) -> None:
        self.store.close()


class ReplaySide:
    """The replay's execution of the same events: metadata bitmasks, one block per tree node."""

    def __init__(self, policy_name: str, capacity_pages: int) -> None:
        cfg = SariaConfig.from_dict({"admission": {"policy": policy_name, "prewrite_depth_blocks": 4}})
        from sglang_saria.mem_cache.admission_factory import make_admission_policy

        self.seq = WriteSequencer(make_admission_policy(policy_name, cfg.admission), cfg.admission.rule)
        self.md = ContextMetadata(2, None, 1e9)
        self.keys = {name: i for i, name in enumerate(PARENT)}
        self.names = {i: name for name, i in self.keys.items()}
        self.ssd = Tier(SSD, capacity_pages)
        block = (2, 2 * PAGE_BYTES)
        self.view = ReplayTierView(self.md, (block, block), self.ssd, 2 * PAGE_BYTES, 0, False)

    def _node(self, name: str) -> ContextNode:
        return self.md.nodes[self.keys[name]]

    def _execute(self, chain, event) -> list[str]:
        from sglang_saria.mem_cache.admission import AdmissionEvent

        for i, k in enumerate(chain or ()):
            self.md.nodes[k].fa_loc |= SSD
            self.ssd.insert(k, 2, 2 * PAGE_BYTES)
            self.seq.written(event if i == 0 else AdmissionEvent.CLOSURE, 2 * PAGE_BYTES)
        return [self.names[k] for k in chain or ()]

    def insert(self, name: str, first: bool) -> list[str]:
        from sglang_saria.mem_cache.admission import AdmissionEvent

        if first:  # computed for the first time: one block of two pages
            parent = PARENT[name]
            self.md.nodes[self.keys[name]] = ContextNode(0.0, False, ROOT if parent is None else self.keys[parent])
            self.md.created += 1
        node = self._node(name)
        if not first:
            node.R += 1  # recomputed
        node.fa_loc |= DRAM
        if node.fa_loc & SSD:
            return []
        return self._execute(self.seq.insert(self.view, self.keys[name], node), AdmissionEvent.INSERT)

    def reuse(self, name: str) -> list[str]:
        from sglang_saria.mem_cache.admission import AdmissionEvent

        written = []
        for n in path(name):
            node = self._node(n)
            node.R += 1
            if node.R == self.seq.admission.reuse_threshold and (node.fa_loc & (DRAM | SSD)) == DRAM:
                written += self._execute(self.seq.reuse(self.view, self.keys[n], node), AdmissionEvent.REUSE)
        return written

    def evict(self, name: str) -> list[str]:
        from sglang_saria.mem_cache.admission import AdmissionEvent

        node = self._node(name)
        chain = None if node.fa_loc & SSD else self.seq.evict(self.view, self.keys[name], node)
        node.E += 1
        written = self._execute(chain, AdmissionEvent.EVICT)
        node.fa_loc &= ~DRAM
        return written

    def prewrite(self, order: list[str]) -> list[str]:
        from sglang_saria.mem_cache.admission import AdmissionEvent

        head = [(self.keys[n], self._node(n)) for n in order]
        return [name for chain in self.seq.prewrite(self.view, head) for name in self._execute(chain, AdmissionEvent.PREWRITE)]

    def lose(self, name: str) -> None:
        node = self._node(name)
        if not node.fa_loc & SSD:  # nothing to lose (the store's evict of an absent page tells no one)
            return
        self.seq.ssd_lost(node)
        self.ssd.remove(self.keys[name])
        node.fa_loc &= ~SSD


# (event, node): the same script on both sides; "insert" after the first pass is a recomputation
SCRIPT = [
    ("evict", "D"), ("evict", "C"), ("insert", "D"), ("insert", "C"),  # E = 1 each; back on host
    ("reuse", "D"),  # R of A, B, D += 1
    ("prewrite", "D,C"),  # E + 1 = 2 reaches theta_E: D closes over B and A, C's parent is on SSD by then
    ("lose", "C"),  # the store drops C: its evictions are spent
    ("evict", "C"), ("insert", "C"), ("evict", "C"), ("insert", "C"),  # two evictions since the loss
    ("evict", "C"),  # E - e_spent + 1 = 2 >= 2 qualifies, but a rewrite would pass the computed content
]


@pytest.mark.parametrize("policy", ["eviction:E2", "combined:E2R2", "reuse:R2", "full-duplicate"])
def test_same_events_through_both_tier_views_give_the_same_writes(policy, tmp_path):
    sglang = SGLangSide(policy, tmp_path / "store")
    replay = ReplaySide(policy, sglang.store.capacity_bytes // PAGE_BYTES)
    try:
        for name in ("A", "B", "C", "D"):  # first computation: the write-through ack of every node
            assert sglang.insert(name) == replay.insert(name, first=True), name
        log = []
        for step, (event, arg) in enumerate(SCRIPT):
            if event == "insert":
                got = (sglang.insert(arg), replay.insert(arg, first=False))
            elif event == "evict":
                got = (sglang.evict(arg), replay.evict(arg))
            elif event == "reuse":
                got = (sglang.reuse(f"req-{step}", arg), replay.reuse(arg))
            elif event == "prewrite":
                got = (sglang.prewrite(arg.split(",")), replay.prewrite(arg.split(",")))
            else:
                sglang.lose(arg)
                replay.lose(arg)
                got = ([], [])
            assert got[0] == got[1], (step, event, arg, got)
            log.append((event, arg, got[0]))
        assert sglang.policy.sequencer.written_bytes == replay.seq.written_bytes
        assert sglang.policy.sequencer.stats == replay.seq.stats
        if policy == "eviction:E2":
            writes = [w for _, _, w in log if w]
            assert writes == [["D", "B", "A", "C"]], log  # a prefix-closed chain, then C (its parent on SSD)
            assert sglang.policy.sequencer.stats.credit_refused == 2  # rewrites of C after its loss (steps 9, 11)
    finally:
        sglang.close()


# ---------------------------------------------------------------------- SSD victims
def _requests():
    """Prefixes over a small tree of one-page blocks, revisited so SSD fills, evicts and is read."""
    rng = np.random.default_rng(7)
    stems = [[0, 1, 2], [0, 1, 3], [4, 5], [0, 6], [7, 8, 9], [4, 10]]
    out = []
    for i in range(40):
        stem = stems[int(rng.integers(len(stems)))]
        out.append(stem[: 1 + int(rng.integers(len(stem)))] if i % 3 else stem)
    return out


def test_same_reads_and_writes_give_the_same_ssd_victims(tmp_path):
    """The replay's core (its SSD tier) and the saria backend (a real store, its page batches and
    direct reloads reported as the server does) see the same writes and SSD reads and must evict the
    same objects in the same order: both take them from ``SSDVictimOrder``."""
    import torch

    from sglang_saria.hicache.backend import SariaStorage
    from sglang_saria.hicache.runtime import saria_policy
    from sglang_saria.mem_cache.metadata import SSD as SSD_BIT
    from tests.mem_cache.helpers import make_core
    from tests.hicache.sglang_pools import fill_random, mha_host_pool, pages, storage_config

    pool = mha_host_pool("page_first")
    fill_random(pool.get_hybrid_pool_buffer())
    page_bytes = pool.get_data_page(0, flat=True).view(torch.uint8).numel()
    backend = SariaStorage(storage_config({"data_dirs": [str(tmp_path / "ssd")], "capacity": str(6 * page_bytes)}),
                           pool)
    policy = saria_policy(backend, None)  # as the server's runtime builds it on one rank
    lost: list[str] = []
    backend.add_evict_listener(lambda pairs: lost.extend(h for h, _ in pairs))
    core = make_core("full-duplicate", dram_blocks=2, ssd_blocks=6)

    def h(key: int) -> str:
        return f"{key:016x}"

    buf = torch.empty(page_bytes, dtype=torch.uint8)
    reads = evictions = 0
    try:
        for t, keys in enumerate(_requests()):
            plan, a1 = core.begin_request(keys, float(t))
            ssd_hits = [k for k, src in zip(keys, plan.sources) if src & SSD_BIT]
            for k in ssd_hits:  # the direct reload: one read per page, head first, then its report
                assert backend.read_page_async(h(k), buf).result().ok
            if ssd_hits:
                policy.on_ssd_reload([h(k) for k in ssd_hits])
            a2 = core.finish_request(keys, plan, float(t))
            for k in a1.ssd_writes + a2.ssd_writes:  # HiCache backs up node by node, in the order decided
                assert backend.batch_set_v1([h(k)], pages(pool, k, 1)) == [True]
            want = [h(k) for k in a1.ssd_evictions + a2.ssd_evictions]
            assert lost == want, (t, keys, lost, want)
            reads += len(ssd_hits)
            evictions += len(want)
            lost.clear()
            held = [h(k) for k in core.ssd_order.order()]
            assert backend.store.keys() == [backend.storage_key(x) for x in held], t
        assert reads >= 5 and evictions >= 5  # the script exercises both events
    finally:
        backend.close()


# ---------------------------------------------------------------------- promotion sizing
@pytest.mark.parametrize("case", ["free", "old-on-ssd", "recent", "not-on-ssd"])
def test_same_host_state_gives_the_same_promotion_size(case, tmp_path):
    """``policy.promotion_pages`` (the server's ``_promotion_tokens``) and the replay's ``_promote``
    ask the same ``promotion_set`` with what each driver sees: the same host leaves (C, then D, in
    eviction order), reuse times and SSD copies must give the same count."""
    from sglang_saria.mem_cache.promotion import PromotionController

    sglang = SGLangSide("eviction:E2", tmp_path / "store")
    replay = ReplaySide("eviction:E2", 64)
    ctrl = PromotionController("saria", 1.0, 60.0, 1.0)
    try:
        for name in ("A", "B", "C", "D"):
            sglang.insert(name)
            replay.insert(name, first=True)
        recent = {"recent": 50.0}.get(case, 0.0)  # clock is 100: reused 50 s ago is within P_tau
        for side_nodes in (sglang.policy.metadata.nodes, replay.md.nodes):
            for n in side_nodes.values():
                n.t_reuse = recent
        if case != "not-on-ssd":  # C and D (and their prefix) hold SSD copies on both sides
            from sglang_saria.mem_cache.admission import AdmissionEvent

            for name in ("A", "B", "C", "D"):
                sglang._commit([sglang.nodes[name].id])
                if not replay._node(name).fa_loc & SSD:
                    replay._execute([replay.keys[name]], AdmissionEvent.INSERT)
        free = 6 if case == "free" else 0
        order = ["C", "D"]
        rank = {n: i for i, n in enumerate(order)}
        got_sglang = sglang.policy.promotion_pages(ctrl, 6, 0, 6, free, [sglang.nodes[n] for n in order],
                                                   lambda node: rank[sglang.names[node.id]])
        head = ((replay._node(n), bool(replay._node(n).fa_loc & SSD), 2) for n in order)  # 2 pages per node
        got_replay = ctrl.promotion_set(100.0, 6, 0, [1] * 6, free, head, replay.seq.robust)
        assert got_sglang == got_replay
        assert got_sglang == {"free": 6, "old-on-ssd": 4, "recent": 0, "not-on-ssd": 0}[case]
    finally:
        sglang.close()
