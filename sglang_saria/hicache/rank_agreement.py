"""Rank agreement: the SSD view and the clock that tree-shaping decisions read, the same on every
attention rank.

With tensor parallelism every attention rank holds its own radix tree and its own saria store
(a rank subdirectory), and SGLang keeps the trees identical by making the same calls on every
rank: a write issued on one rank only leaves an ack the others never send, HiCache's MIN-synced
ack drain never releases its host lock, and the trees drift. The admission policy's decisions
(write at insert or reuse, the host-eviction gate, prewrite picks) and promotion's recency test
therefore must not read what differs per rank: the local store's commit timing and the wall clock.

`RankAgreement` gives the policy both inputs, changed only at a step boundary
(`check_hicache_events`, which every rank runs once per scheduler step, in the same order):

- `clock()`: the step clock, the largest `time.monotonic()` over the ranks at the last step;
- `on_ssd(page)`: the page is committed on *every* rank's store, as of the last step. Writes the
  tree issued (`requested`, an agreed list: the same calls on every rank) are pending until a
  step's MIN over the ranks says each store holds them (or they expire: a failed write); pages
  any rank's store removed (`evicted`, from the store's eviction callback, any thread) leave the
  view at the next step, on every rank (a union over the ranks; a gather only in steps where
  some store removed pages).

The same all-reduce agrees ``auto`` admission's load signal (``load_signal.py``: MAX over the ranks).

A step costs one all-reduce of ``3 + len(pending)`` floats. The view starts as the intersection
of the stores' contents (a restart on persisted stores), agreed once by a digest all-reduce.
The view may lag the stores (a page committed everywhere counts from the next step; one removal
removes it until it is written again), never differ between ranks. On one rank none of this is
built: the store and the wall clock are already the only ones.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist

from sglang_saria.hicache.tree_view import page_key

logger = logging.getLogger(__name__)

# A requested write not committed on every rank within this long (step clock) failed on some rank
# (store full, I/O error) or was never issued; it leaves the pending list, so the per-step
# vector stays bounded. A later decision may request the page again.
PENDING_TTL_S = 120.0

_DIGEST_BYTES = 6  # 48 bits: exact in the float64 all-reduce


class RankAgreement:
    """The policy's ``on_ssd`` and ``clock`` on a multi-rank server (one per attention rank).

    Construction and `step` are collectives over ``groups`` (SGLang's attention groups, CPU):
    call them at the same point on every rank, on the scheduler thread.
    """

    def __init__(
        self,
        exists: Callable[[str], bool],
        stored_pages: Callable[[], Iterable[str]],
        groups: Sequence[Any],
        pending_ttl_s: float = PENDING_TTL_S,
    ) -> None:
        if not groups:
            raise ValueError("RankAgreement needs at least one process group (one rank needs none)")
        self._exists = exists
        self._groups = list(groups)
        self._ttl = pending_ttl_s
        self._pending: OrderedDict[str, float] = OrderedDict()  # page hash -> step clock at request
        self._removed: list[str] = []  # this rank's store removals since the last step
        self._lock = threading.Lock()  # `evicted` runs on store threads
        #: told the pages some store removed, at the step that agreed it (the policy's lost copies)
        self.on_removed: Callable[[Iterable[str]], None] | None = None
        #: this rank's load signal (``load_signal.py``: seconds of prefill queued), read at each step
        self.local_load: Callable[[], float] = lambda: 0.0
        self.load = 0.0  # its MAX over the ranks at the last step
        self._agreed, self._now = self._seed(sorted(set(stored_pages())))

    # ---------------------------------------------------------------- the policy's inputs
    def clock(self) -> float:
        """The step clock (seconds, monotonic): the same value on every rank within a step."""
        return self._now

    def on_ssd(self, page_hash: str) -> bool:
        """Whether every rank's store held the page at the last step."""
        return page_key(page_hash) in self._agreed

    @property
    def agreed_pages(self) -> int:
        """Pages the view holds (committed on every rank)."""
        return len(self._agreed)

    # ---------------------------------------------------------------- events
    def requested(self, page_hashes: Sequence[str]) -> None:
        """The tree issued a storage write of these pages (scheduler thread, every rank)."""
        for h in page_hashes:
            if page_key(h) not in self._agreed:
                self._pending.setdefault(h, self._now)

    def evicted(self, page_hashes: Sequence[str]) -> None:
        """This rank's store removed these pages (any thread)."""
        with self._lock:
            self._removed.extend(page_hashes)

    def step(self) -> None:
        """Once per scheduler step on every rank: agree the clock, the pending writes every store
        committed, and the pages some store removed (in that order: a page both committed and
        removed in one step is off the view)."""
        with self._lock:
            removed, self._removed = self._removed, []
        pending = list(self._pending)
        vec = torch.empty(3 + len(pending), dtype=torch.float64)
        vec[0] = time.monotonic()
        vec[1] = len(removed)
        vec[2] = self.local_load()
        # MAX of -committed: -1 where every rank committed the page, 0 where one has not
        vec[3:] = torch.tensor([-float(self._exists(h)) for h in pending], dtype=torch.float64)
        self._all_reduce_max(vec)
        self._now = max(self._now, float(vec[0]))
        self.load = float(vec[2])
        everywhere = (vec[3:] < -0.5).tolist()
        for h, done in zip(pending, everywhere):
            if done:
                self._agreed.add(page_key(h))
                del self._pending[h]
            elif self._pending[h] < self._now - self._ttl:
                del self._pending[h]
        if vec[1] > 0:
            gone = self._combine(removed, set.union)
            self._agreed.difference_update(page_key(h) for h in gone)
            if self.on_removed is not None:
                self.on_removed(sorted(gone))  # the same order on every rank
            logger.debug("saria rank agreement: %d page(s) left some rank's store", len(gone))

    def max_over_ranks(self, values: Sequence[int]) -> list[int]:
        """Elementwise MAX of ``values`` over the ranks (a collective: same length everywhere)."""
        vec = torch.tensor(list(values), dtype=torch.int64)
        self._all_reduce_max(vec)
        return [int(v) for v in vec.tolist()]

    # ---------------------------------------------------------------- collectives
    def _seed(self, local: list[str]) -> tuple[set[int], float]:
        """The agreed view at start: the pages every store holds, and the first step clock."""
        digest = _digest(local)
        n = float(len(local))
        vec = torch.tensor([time.monotonic(), n, -n, float(digest), -float(digest)], dtype=torch.float64)
        self._all_reduce_max(vec)
        same = vec[1] == -vec[2] and vec[3] == -vec[4]
        common = local if same else sorted(self._combine(local, set.intersection))
        if not same:
            logger.warning(
                "saria rank agreement: the ranks' stores differ (%d pages here, %d on all ranks); "
                "decisions see the pages every rank holds", len(local), len(common),
            )
        return {page_key(h) for h in common}, float(vec[0])

    def _all_reduce_max(self, tensor: torch.Tensor) -> None:
        for group in self._groups:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)

    def _combine(self, pages: Iterable[str], op: Callable[..., set[str]]) -> set[str]:
        """``op`` (union, intersection) of every rank's ``pages``, group after group."""
        return self.reduce_objects(set(pages), op)

    def reduce_objects(self, value: Any, op: Callable[..., Any]) -> Any:
        """``op`` over every rank's ``value`` (picklable), group after group: the same result on
        every rank (a collective)."""
        result = value
        for group in self._groups:
            gathered: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, result, group=group)
            result = op(*gathered)
        return result

    def same_everywhere(self, items: Sequence[str]) -> bool:
        """Whether every rank holds the same ``items`` (a digest all-reduce, no gather; a collective)."""
        digest = float(_digest(items))
        vec = torch.tensor([digest, -digest], dtype=torch.float64)
        self._all_reduce_max(vec)
        return bool(vec[0] == -vec[1])


def _digest(items: Sequence[str]) -> int:
    """48 bits of a hash of ``items`` (exact in a float64 all-reduce)."""
    return int.from_bytes(hashlib.blake2b("\n".join(items).encode(), digest_size=_DIGEST_BYTES).digest(), "big")


def attention_groups(cache: Any) -> list[Any]:
    """The process groups SGLang's own per-step agreement reduces over in ``cache`` (a radix
    cache; none on one rank)."""
    groups = [g for g in (cache.attn_cp_group, cache.attn_tp_group) if g is not None and dist.get_world_size(g) > 1]
    if not groups and cache.tp_world_size > 1:
        groups = [cache.tp_group]
    return groups


def worker_agreement(groups: Sequence[Any]) -> Callable[[int], int]:
    """MIN over the attention ranks, for the reload worker's thread: on process groups of its
    own (a gloo group must not be used by two threads at once), created here, so call it at
    the same point of every rank's scheduler. Identity without groups (one rank)."""
    if not groups:
        return lambda value: value
    own = [dist.new_group(dist.get_process_group_ranks(g), backend="gloo") for g in groups]

    def agree(value: int) -> int:
        tensor = torch.tensor(value, dtype=torch.int64)
        for group in own:
            dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group)
        return int(tensor.item())

    return agree
