"""Admission counters across restarts (issue 30 item 3, policy and rank level): a page evicted
once before a restart is admitted under eviction:E2 at its first eviction after it, because its
E came back from the store; counters older than the metadata window do not come back; every
attention rank restores the same counters even when their stores kept different ones.

The server-level proof is tests/e2e/test_counter_restart.py."""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import dataclass
from pathlib import Path

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.counter_log import restore_counters
from sglang_saria.hicache.policy import SariaHiCachePolicy
from sglang_saria.hicache.tree_view import page_key
from sglang_saria.storage.store import SariaStore
from tests.hicache.test_sglang_admission import PAGES, evict, insert, one_node

SCOPE = "@tiny.layer_first.bfloat16"
JOIN_TIMEOUT_S = 120


@dataclass
class Backend:
    """What `restore_counters` reads of the saria backend."""

    store: SariaStore

    def storage_key(self, key: str) -> str:
        return key + SCOPE


def make_policy(window_s: float = 7200.0, on_ssd=lambda h: False, clock=lambda: 100.0) -> SariaHiCachePolicy:
    config = SariaConfig.from_dict({"admission": {"policy": "eviction:E2"}, "metadata": {"metadata_window_s": window_s}})
    return SariaHiCachePolicy(config, page_size=16, on_ssd=on_ssd, clock=clock)


def first_run(make_store) -> SariaStore:
    """A server's life before the restart: the node is computed and evicted from host once (E = 1,
    not admitted under E2), its counters saved at the step's end and made durable."""
    store = make_store()
    policy = make_policy()
    log = restore_counters(policy, Backend(store))
    tree, node = one_node()
    assert not insert(policy, tree, node)
    assert evict(policy, node)  # E = 1: reclaimed without a write
    log.save()
    store.flush()
    store.close()
    return store


def test_page_evicted_once_before_a_restart_is_admitted_at_its_next_eviction(make_store):
    store = make_store(config=first_run(make_store).config)
    policy = make_policy()
    restore_counters(policy, Backend(store))
    assert [(policy.metadata.get(page_key(p)).E, policy.metadata.get(page_key(p)).R) for p in PAGES] == [(1, 0)] * 2
    tree, node = one_node()
    assert not insert(policy, tree, node)  # recomputed after the restart: R = 1, not written at insert
    assert not evict(policy, node)  # E + 1 = 2: written before its host copy is reclaimed
    assert policy.admission.admitted["evict"] == 1


def test_without_restored_counters_the_same_eviction_is_not_admitted(make_store):
    """The contrast: a fresh policy on the same store (nothing restored) reclaims the node unwritten."""
    make_store(config=first_run(make_store).config)
    policy = make_policy()
    tree, node = one_node()
    insert(policy, tree, node)
    assert evict(policy, node)
    assert policy.admission.admitted["evict"] == 0


def test_counters_older_than_the_window_are_dropped_at_restart(make_store):
    store = make_store()
    policy = make_policy()
    log = restore_counters(policy, Backend(store))
    tree, node = one_node()
    insert(policy, tree, node)
    evict(policy, node)
    policy.metadata.get(page_key(PAGES[0])).t_reuse = 100.0 - 600.0  # last used 10 minutes ago
    log.save()
    store.flush()
    store.close()
    again = make_store(config=store.config)
    restarted = make_policy(window_s=300.0)
    restore_counters(restarted, Backend(again))
    assert restarted.metadata.get(page_key(PAGES[0])) is None
    assert restarted.metadata.get(page_key(PAGES[1])).E == 1
    assert [row.key for row in again.load_counters(SCOPE, since=0.0)[0]] == [page_key(PAGES[1])]  # the old row is gone


def test_every_rank_restores_the_same_counters(tmp_path):
    """Two gloo ranks whose stores kept different rows (rank 1 missed the last commit, and holds a
    row rank 0 lacks): both restore the rows every rank holds, smallest counters, oldest use."""
    ctx = multiprocessing.get_context("spawn")
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_rank, args=(r, init, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN_TIMEOUT_S)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]
    assert results[0] == {str(page_key(PAGES[0])): [1, 1, 0]}  # R, E, e_spent: rank 1's older row


def _rank(rank: int, init: str, root: str) -> None:
    import time

    import torch.distributed as dist

    from sglang_saria.hicache.rank_agreement import RankAgreement
    from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
    from sglang_saria.storage.config import StoreConfig
    from sglang_saria.storage.counters import CounterRow

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    store = SariaStore(StoreConfig(data_dirs=[f"{root}/rank{rank}"], capacity="1MiB", slot_bytes="64KiB"),
                       victim_order=SSDVictimOrder())
    now = time.time()
    a, b = page_key(PAGES[0]), page_key(PAGES[1])
    rows = [CounterRow(a, 2, 2, 0, now - 5)] if rank == 0 else [CounterRow(a, 1, 1, 0, now - 50), CounterRow(b, 1, 1, 0, now)]
    store.save_counters(SCOPE, rows).result(timeout=30)
    agreement = RankAgreement(lambda h: False, lambda: [], [dist.group.WORLD])
    policy = make_policy(on_ssd=agreement.on_ssd, clock=agreement.clock)
    restore_counters(policy, Backend(store), agreement)
    restored = {str(k): [n.R, n.E, n.e_spent] for k, n in policy.metadata.nodes.items()}
    ages = {k: agreement.clock() - n.t_reuse for k, n in policy.metadata.nodes.items()}
    assert all(age >= 49 for age in ages.values()), ages  # the oldest use of the two
    Path(root, f"rank{rank}.json").write_text(json.dumps(restored))
    store.close()
    dist.destroy_process_group()
