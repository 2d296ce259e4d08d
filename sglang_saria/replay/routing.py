"""The fleet replay's router: which node serves each request, decided at its arrival.

Models the policies of sglang-router 0.3.2 that an operator would run in front of saria
workers (``cluster/router.py`` documents what the router does; this module follows it):

- ``round_robin``: a counter over the nodes, from node 0, one step per request.
- ``random``: uniform over the nodes, seeded (the replay's ``--seed``), so a replay is repeatable.
- ``cache_aware``: an approximate prefix tree shared by all nodes, with load-balance thresholds.
- ``session``: the launcher's session-affine policy with bounded load (``session_affinity.py``, the
  same core the cluster's session router runs), keyed by the trace's session; the only router told of
  worker deaths (``FleetSettings.outages``).

The cache_aware approximation. The router's tree holds *characters* of the request text and each
node of it the workers ("tenants") that were sent that prefix. The replay has no text: a request
is a chain of block keys (``trace.py``), and a key stands for its whole prefix. So the tree here is
a map from block key to the tenants that were sent it, and:

- match: the deepest key of the request any tenant holds; ``match_rate = matched blocks x
  block_tokens / input tokens`` (the router's matched chars / text chars, in tokens; the partial
  last block never matches, and text the trace does not key -- tool schemas -- is not counted);
- the matched tenant is the one that was most recently sent that key (the router keeps a cached
  "last tenant" per tree node; where it picks an arbitrary one of several, this picks the newest);
- balanced (not imbalanced, below): ``match_rate > cache_threshold`` (0.3) -> the matched tenant,
  else the least-loaded node (first on ties); imbalanced, i.e. ``max_load - min_load >
  balance_abs_threshold`` (64) and ``max_load > balance_rel_threshold`` (1.5) ``x min_load`` ->
  the least-loaded node (first on ties), without looking at the tree;
- either way the chosen node is inserted as a tenant of every key of the request;
- load: requests routed to a node and not finished (its in-flight slots and its queue); the
  replay's requests end at their first token, the router's at their last, so load is understated;
- eviction: every ``eviction_interval_s`` (60 s) of replay time, each tenant over
  ``max_tree_chars`` (67,108,864) loses least recently inserted keys, leaves first, until under
  it; chars are tokens x ``chars_per_token`` (4: English text and code in BPE tokens). The router's
  1-in-8 sampled refresh of matched (not inserted) nodes is not modelled: every routed request
  inserts its whole path, which refreshes it anyway.

The union of the tenants' key sets is prefix-closed (a request inserts its whole chain, and
eviction removes a tenant's keys leaf first: a key's ancestors are inserted whenever it is), so
the deepest match is found by bisection.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_saria.session_affinity import AffinityConfig, HeldPrefixes, SessionAffinity
from sglang_saria.units import ConfigError

ROUTERS = ("cache_aware", "round_robin", "random", "session")


class RoutingError(ConfigError):
    """Bad fleet or router input; the message names the flag and the value."""


@dataclass(frozen=True)
class CacheAwareConfig:
    """sglang-router 0.3.2's cache_aware defaults (what it prints at start), and the chars per token."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 60.0
    max_tree_chars: int = 67_108_864
    chars_per_token: float = 4.0


class Router(ABC):
    """Picks the node of one request; ``stats`` counts the decisions by kind."""

    name = ""

    def __init__(self, n_nodes: int) -> None:
        self.n_nodes = n_nodes
        self.stats: dict[str, int] = {}

    @abstractmethod
    def pick(self, keys: Sequence[int], input_tokens: int, loads: Sequence[int], now: float, session: int,
             wear: Sequence[float] = (), alive: Sequence[bool] = ()) -> int:
        """The node for a request of ``session`` with block ``keys`` and ``input_tokens``, given each node's load
        (requests in flight and queued), ``wear`` (bytes its drive has written; empty: not known) and whether
        it is ``alive`` (empty: every node; only ``session`` models deaths) at ``now``."""


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, n_nodes: int) -> None:
        super().__init__(n_nodes)
        self.count = 0

    def pick(self, keys: Sequence[int], input_tokens: int, loads: Sequence[int], now: float, session: int,
             wear: Sequence[float] = (), alive: Sequence[bool] = ()) -> int:
        node = self.count % self.n_nodes
        self.count += 1
        return node


class RandomRouter(Router):
    name = "random"

    def __init__(self, n_nodes: int, seed: int) -> None:
        super().__init__(n_nodes)
        self.rng = random.Random(seed)

    def pick(self, keys: Sequence[int], input_tokens: int, loads: Sequence[int], now: float, session: int,
             wear: Sequence[float] = (), alive: Sequence[bool] = ()) -> int:
        return self.rng.randrange(self.n_nodes)


def least_loaded(loads: Sequence[int]) -> int:
    """The first node with the smallest load (Rust's ``min_by_key``: first on ties)."""
    return min(range(len(loads)), key=loads.__getitem__)


class CacheAware(Router):
    """cache_aware over block keys (module docstring).

    Per node, a dict from each key it was sent to its recency: the stamp of its last insert in the
    high bits, ``MAX_DEPTH`` minus its depth in the low ones, so ordering a node's keys by recency
    gives least recent first and, within one insert, leaf first. An insert is one C-level
    ``dict.update`` per request (a Python loop per key cost a third of a replay). The eviction order
    is built when a node first exceeds the limit and then kept: each eviction appends the keys
    inserted since the last one (all newer than anything before), and skips entries whose key was
    refreshed or evicted since (their recency no longer matches).
    """

    name = "cache_aware"
    MAX_DEPTH = 1 << 24  # blocks per request, far above any context limit

    def __init__(self, n_nodes: int, block_tokens: int, config: CacheAwareConfig = CacheAwareConfig()) -> None:
        super().__init__(n_nodes)
        self.cfg = config
        self.block_tokens = block_tokens
        self.max_tree_tokens = config.max_tree_chars / config.chars_per_token
        self.held: list[dict[int, int]] = [{} for _ in range(n_nodes)]  # per node: key -> recency
        # per node while it is over the limit: (recency, key) oldest first, and the requests' keys since
        self.order: list[deque[tuple[int, int]] | None] = [None] * n_nodes
        self.recent: list[list[Sequence[int]]] = [[] for _ in range(n_nodes)]
        self.stamp = 0
        self.next_eviction_s = config.eviction_interval_s
        self.stats = {"imbalanced": 0, "matched": 0, "unmatched": 0, "evicted_keys": 0}

    def is_imbalanced(self, loads: Sequence[int]) -> bool:
        hi, lo = max(loads), min(loads)
        return hi - lo > self.cfg.balance_abs_threshold and hi > lo * self.cfg.balance_rel_threshold

    def holds(self, key: int) -> bool:
        return any(key in h for h in self.held)

    def match(self, keys: Sequence[int]) -> tuple[int, int]:
        """(matched blocks, the newest tenant of the deepest matched key, or -1)."""
        lo, hi = 0, len(keys)  # keys[:lo] are held; find the largest such lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.holds(keys[mid - 1]):
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return 0, -1
        k = keys[lo - 1]
        return lo, max((h[k], node) for node, h in enumerate(self.held) if k in h)[1]

    def pick(self, keys: Sequence[int], input_tokens: int, loads: Sequence[int], now: float, session: int,
             wear: Sequence[float] = (), alive: Sequence[bool] = ()) -> int:
        if now >= self.next_eviction_s:
            self.evict(now)
        if self.is_imbalanced(loads):
            self.stats["imbalanced"] += 1
            node = least_loaded(loads)
        else:
            depth, tenant = self.match(keys)
            rate = depth * self.block_tokens / input_tokens if input_tokens > 0 else 0.0
            if rate > self.cfg.cache_threshold:
                self.stats["matched"] += 1
                node = tenant
            else:
                self.stats["unmatched"] += 1
                node = least_loaded(loads)
        self.insert(keys, node)
        return node

    def insert(self, keys: Sequence[int], node: int) -> None:
        """``node`` becomes the newest tenant of every key of the request."""
        self.stamp += 1
        top = self.stamp * self.MAX_DEPTH + self.MAX_DEPTH - 1
        self.held[node].update(zip(keys, range(top, top - len(keys), -1)))
        if self.order[node] is not None:
            self.recent[node].append(keys)

    def tree_tokens(self, node: int) -> int:
        return len(self.held[node]) * self.block_tokens

    def evict(self, now: float) -> None:
        """The periodic eviction: each node over the size limit loses its least recent keys, leaves first."""
        interval = self.cfg.eviction_interval_s
        self.next_eviction_s = (now // interval + 1) * interval
        keep = int(self.max_tree_tokens // self.block_tokens)
        for node, h in enumerate(self.held):
            excess = len(h) - keep
            if excess <= 0:
                self.order[node], self.recent[node] = None, []
                continue
            self.stats["evicted_keys"] += excess
            order = self._order(node)
            while excess:
                value, k = order.popleft()
                if h.get(k) == value:
                    del h[k]
                    excess -= 1

    def _order(self, node: int) -> deque[tuple[int, int]]:
        """Node's keys as (recency, key), least recent first; stale entries (recency changed) are skipped by the caller."""
        h, order = self.held[node], self.order[node]
        if order is None or len(order) > 4 * len(h):  # first time over the limit, or mostly stale: sort anew
            order = deque(sorted(zip(h.values(), h.keys())))
        else:
            fresh = {k: h[k] for keys in self.recent[node] for k in keys if k in h}
            order.extend(sorted(zip(fresh.values(), fresh.keys())))
        self.order[node], self.recent[node] = order, []
        return order


class SessionRouter(Router):
    """``session``: the trace's session id is the key; stats are the core's decisions."""

    name = "session"

    def __init__(self, n_nodes: int, config: AffinityConfig = AffinityConfig()) -> None:
        super().__init__(n_nodes)
        self.core = SessionAffinity(n_nodes, config)
        self.stats = self.core.stats
        self.held = HeldPrefixes(config.held_frac, config.max_sessions)  # the request's block keys are its prefixes

    def pick(self, keys: Sequence[int], input_tokens: int, loads: Sequence[int], now: float, session: int,
             wear: Sequence[float] = (), alive: Sequence[bool] = ()) -> int:
        extends = self.held.extends(session, keys)
        node = self.core.pick(session, now, alive or None, wear or None, input_tokens, extends)
        self.held.record(session, node, keys)
        return node


def make_router(name: str, n_nodes: int, block_tokens: int, seed: int = 0,
                cache_aware: CacheAwareConfig = CacheAwareConfig(),
                session: AffinityConfig = AffinityConfig()) -> Router:
    """The router model by name; errors name the flag and the value."""
    if n_nodes < 1:
        raise RoutingError(f"--nodes {n_nodes}: must be >= 1")
    if name == "round_robin":
        return RoundRobin(n_nodes)
    if name == "random":
        return RandomRouter(n_nodes, seed)
    if name == "cache_aware":
        return CacheAware(n_nodes, block_tokens, cache_aware)
    if name == "session":
        return SessionRouter(n_nodes, session)
    raise RoutingError(f"--router {name!r}: choose one of {', '.join(ROUTERS)}")
