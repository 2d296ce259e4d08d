"""The composition root of a saria server: everything that decides on one storage backend's store.

SGLang builds the storage backend inside HiCache's controller (at launch from
`UnifiedRadixCache.init_hicache`, at run time from the admin API), so nothing can be handed to
its constructor. The backend (`backend.SariaStorage`) therefore holds the store and does its
I/O only; `SariaRadixCache` calls `build_runtime` once SGLang has built the backend, at
`init_hicache` and again after each runtime attach or detach, and uses what it returns until
the backend changes. Nothing is rewired after it is built: a new backend gets a new runtime,
built whole by the same function.

Who gets what (`build_runtime`):

- `RankAgreement` (several attention ranks only; `rank_agreement.py`): the store's index
  (`exists`, its KV pages) and SGLang's attention groups; the store's removals;
- `SariaHiCachePolicy` (`policy.py`): the agreed SSD view and step clock with several ranks,
  else the store's index and the monotonic clock; the store's removals (the agreed ones with
  several ranks); the store's victim-order reports (`touch_pages`, `demote_pages`); whether a
  MAMBA pool is registered; its write budget seeded with what the store wrote before
  (`seed_write_budget`) and its counters restored from the store (`counter_log.py`), saved
  there at each step and before the store closes; a learning admission's state (``auto``)
  restored from its file beside the store's index and saved there (``admission_state.py``);
- `DirectReload` (`direct_reload/build.py`): the store's reads and drops, SGLang's pools, the
  policy's transfer settings; None where direct reload cannot run;
- the server's KV audit (`audit/kv.py`, built at the first step and kept across backends)
  checks this store's reads and writes;
- the pages the tree already holds in host memory get counters (`SariaHiCachePolicy.adopt`:
  none at launch, the tree's host pages after a runtime attach).

The replay builds its own driver over the same core (`mem_cache/`); nothing here is shared with it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from sglang.srt.mem_cache.hicache_storage import PoolName

from sglang_saria.hicache.admission_state import AdmissionStateFile, admission_state_file
from sglang_saria.hicache.audit.kv import KVAudit, attach_audit
from sglang_saria.hicache.audit.tiers import tree_nodes
from sglang_saria.hicache.backend import SariaStorage
from sglang_saria.hicache.counter_log import CounterLog, restore_counters
from sglang_saria.hicache.direct_reload.build import DirectReload, WorkerHooks, build_direct_reload
from sglang_saria.hicache.policy import SariaHiCachePolicy
from sglang_saria.hicache.rank_agreement import RankAgreement, attention_groups, worker_agreement
from sglang_saria.mem_cache.budget import WriteBudgetController
from sglang_saria.units import SECONDS_PER_HOUR

logger = logging.getLogger(__name__)


@dataclass
class SariaRuntime:
    """The policy, rank agreement, counter log and direct reload over one saria backend."""

    backend: SariaStorage
    policy: SariaHiCachePolicy
    agreement: Optional[RankAgreement]  # None on one rank
    counter_log: CounterLog
    direct: Optional[DirectReload]  # None where direct reload cannot run
    admission_state: Optional[AdmissionStateFile] = None  # None for a policy without learned state

    def clock(self) -> float:
        """The clock of decisions that change the tree: the agreed step clock on several ranks,
        the monotonic clock on one."""
        return self.policy.clock()

    def step(self) -> None:
        """At the start of each scheduler step, on every rank: agree the SSD view and the clock."""
        if self.agreement is not None:
            self.agreement.step()

    def end_step(self) -> None:
        """At the end of each scheduler step: the counters changed in it go to the store (and, at most
        every ``admission.auto_state_save_s``, a learning admission's state to its file, written off this thread)."""
        self.counter_log.save()
        if self.admission_state is not None:
            self.admission_state.save()

    def close(self) -> None:
        """The backend is replaced or detached (the scheduler is idle: no reload runs): the
        reload worker ends. The store's owner, the backend, closes the store."""
        if self.direct is not None:
            self.direct.close()


def build_runtime(cache: Any, backend: Any, kv_audit: Optional[KVAudit]) -> Optional[SariaRuntime]:
    """The runtime over ``backend`` for ``cache`` (a `SariaRadixCache` with HiCache initialised);
    None for any other backend (or none): HiCache then writes every host page through and
    stages storage hits through host memory, as without saria.

    A collective with several attention ranks (the agreement's seed, the reload worker's
    process groups): call it at the same point on every rank."""
    if not isinstance(backend, SariaStorage) or backend.store is None:
        return None
    groups = attention_groups(cache)
    agreement = None
    if groups:
        agreement = RankAgreement(backend.exists, backend.kv_page_hashes, groups)
        logger.info(
            "saria: admission and promotion decide on rank-agreed inputs (step clock, SSD view of "
            "%d pages on every store) over %d process group(s)", agreement.agreed_pages, len(groups),
        )
    policy = saria_policy(backend, agreement)
    seed_write_budget(policy, backend.store, agreement)
    counter_log = restore_counters(policy, backend, agreement)
    backend.add_close_listener(counter_log.save)  # the last step's counters go in the store's last commit
    admission_state = admission_state_file(policy.admission, backend.store.layout.data_dirs[0], policy.clock,
                                           policy.config.admission.auto_state_save_s)
    if admission_state is not None:
        backend.add_close_listener(lambda: admission_state.save(force=True))
    direct = None
    if getattr(cache, "enable_storage", False) and policy.config.transfer.direct_reload:
        hooks = WorkerHooks(lambda: worker_agreement(groups), backend.drop_failed_pages, backend.drop_failed_state)
        direct = build_direct_reload(cache, backend, policy.config, hooks)
    attach_audit(kv_audit, backend)
    policy.adopt(tree_nodes(cache.tree_core.root_node))
    return SariaRuntime(backend, policy, agreement, counter_log, direct, admission_state)


def saria_policy(backend: SariaStorage, agreement: Optional[RankAgreement]) -> SariaHiCachePolicy:
    """The admission policy over ``backend``'s store, from its extra config: it decides on
    ``agreement``'s SSD view and step clock and hears the removals the ranks agreed; without one,
    on the store's index and the monotonic clock, hearing the store's own removals."""
    kv = PoolName.KV.value
    policy = SariaHiCachePolicy(
        backend.policy_config,
        int(backend.mem_pool_host.page_size),
        backend.exists if agreement is None else agreement.on_ssd,
        page_bytes=backend.page_bytes,
        ssd_capacity_bytes=backend.store.capacity_bytes,
        clock=time.monotonic if agreement is None else agreement.clock,
        hybrid=backend.hybrid,
        on_ssd_read=backend.touch_pages,
        on_ssd_demote=backend.demote_pages,
        # the store's own victim order differs between ranks: with several, no write is compared with a victim
        ssd_victim_page=store_victim_page(backend) if agreement is None else None,
        # each rank's store holds its own sidecars: with several, no state is written beside stored pages
        state_on_ssd=backend.state_exists if backend.hybrid and agreement is None else None,
    )
    if agreement is None:
        backend.add_evict_listener(lambda pairs: policy.on_store_evict(h for h, pool in pairs if pool == kv))
    else:
        backend.add_evict_listener(lambda pairs: agreement.evicted([h for h, pool in pairs if pool == kv]))
        agreement.on_removed = policy.on_store_evict
    return policy


def store_victim_page(backend: SariaStorage) -> Callable[[int], Optional[str]]:
    """``nbytes -> page hash`` the store would evict first to make room for ``nbytes`` (None: it has
    room, or holds nothing). Read on the scheduler thread while the store's committer may reorder it:
    an order changed under the read answers None (no victim to compare with), never an error."""
    store = backend.store

    def victim(nbytes: int) -> Optional[str]:
        if store.free_bytes >= nbytes:
            return None
        try:
            skey = store.order.victim()
        except RuntimeError:  # the order changed while read
            return None
        return None if skey is None else backend.split_storage_key(skey)[0]

    return victim


def seed_write_budget(policy: SariaHiCachePolicy, store: Any, agreement: Optional[RankAgreement]) -> None:
    """A ``budget:<DWPD>`` window starts with the bytes the store wrote within it before this
    process (persisted per hour), so restarts do not refill the day's budget. Whole hours
    ago, agreed (MAX) by the ranks: their controllers decide the same."""
    if not isinstance(policy.admission, WriteBudgetController):
        return
    window_s = policy.admission.params.window_s
    hours_ago = [0] * (int(window_s // SECONDS_PER_HOUR) + 1)
    for age, nbytes in store.recent_writes(window_s):
        hours_ago[min(len(hours_ago) - 1, int(age // SECONDS_PER_HOUR))] += nbytes
    if agreement is not None:
        hours_ago = agreement.max_over_ranks(hours_ago)
    policy.seed_budget([(k * SECONDS_PER_HOUR, b) for k, b in reversed(list(enumerate(hours_ago))) if b])
    if any(hours_ago):
        logger.info("saria: budget:<DWPD> window starts with %.1f MiB written by earlier runs (%.0f%% of its budget left)",
                    sum(hours_ago) / (1 << 20), 100 * policy.admission.fill)
