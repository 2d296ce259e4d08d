"""Session-affine routing with bounded load: which node serves a session's next request.

One policy core, two drivers: the fleet replay (``replay/routing.py``, ``--router session``) and
the cluster launcher's session router (``cluster/session_router.py``, ``--policy session``) both
ask ``SessionAffinity.pick`` and do what it returns.

Why: a session's KV (DRAM and SSD) lives on the node that served its last turn, so a session
that changes node recomputes its prefix and, under full duplicate, writes it again to the new
node's drive. A router that keeps sessions in place but places new ones on the first idle node
(sglang-router's ``cache_aware``) piles them on few nodes, whose drives then wear first; one that
spreads requests (``round_robin``) moves nearly every request. This keeps each session on one node
and bounds every node's share of the active sessions.

The rule (the session bound of consistent hashing with bounded loads, Mirrokni, Thorup and
Zadimoghaddam, SODA 2018, with sticky assignment; by default a new or moving session takes the
least loaded node below the bound, the hash ring ordering only equals: measured on WEKA sessions,
the ring's first fit left 8-node fleets' busiest node and drive over the targets, docs/fleet.md):

- A session is *active* from a request until ``idle_s`` without one; each active session counts
  on the node that served its last request. With ``m = (A + 1) / L`` the mean, where ``A`` counts
  the other active sessions and ``L`` the live nodes, the bound is ``ceil(m) + floor(eps x m)``
  active sessions per node: at most ``(1 + eps) x m`` rounded up (the paper's bound), and the slack
  above the mean only in whole sessions, so 6 sessions on 3 nodes are held to 2 each.
- A session goes back to its node (the one that served its previous request, active or not) if
  that node is alive and below the bound; it moves only when that node is dead or at the bound
  (or, with ``wear_moves``, when its node's drive is worn out, below). With ``bound`` ``"shed"``
  (the default) the bound holds on every live node after every pick: of a node's active sessions
  and the one returning to it at the bound, the cheapest to move leaves (a guest whose dead home is
  back goes home first; then the smallest last prompt, the returning one costing nothing when its
  node does not hold its prompt), an idle one at once (it counts on its new node); and after each
  pick every live node above the bound (the mean fell as sessions went idle, or a dead node came
  back) sends off its cheapest sessions the same way. A session sent off while idle is judged again
  at its next request as a session of the node it left, which holds its context: it goes back there
  if that node has room or holds a cheaper session to send off, and takes its new node only if it
  is the cheapest (so a reassignment costs a recomputation only when the bound needs it then).
  ``"cheap"``: a session at a node at the bound stays if another active session there is smaller
  (that one leaves at its next request) or its node holds most of its prompt (``extends``, below):
  exact at placement only, a node exceeding the bound by the large sessions that keep extending
  their prompts. ``"strict"``: the returning session moves whatever it costs. Why cost-aware: a
  moved session recomputes its context on its new node and, once evicted twice there, writes it to
  that drive; on WEKA sessions the strict bound moved 400K-token contexts for a session count, and
  those moves decided which 8-node drive wrote most (docs/fleet.md).
- A new or moving session takes, of the live nodes below the session bound whose drives are not over
  the wear bound (``place_by`` ``wear`` or ``both``: written at most ``(1 + eps)`` x the live drives'
  mean, else worn out), with ``placement`` ``"least"`` (the default) the least loaded: the smallest
  of its active prompts' tokens (each session counted by its last request's ``size``) and its routed
  requests, each over its mean per node (``place_by`` ``tokens`` or ``both``; the first of equals on
  the session's ring walk); with ``"ring"``, the first on its ring walk within ``(1 + eps)`` x the
  mean tokens. The ring walk (``vnodes`` points per node) orders equals, so a dead node's sessions
  spread over the others. If no node below the session bound qualifies on wear, the same choice over
  all of them. A fleet's endurance is its busiest drive's, and a drive writes when its node's DRAM
  overflows, which a session count alone does not foresee (sessions differ in size by orders of
  magnitude); a node's requests are its busiest GPU's load, which a session count does not foresee
  either (sessions differ in request rate).
- ``wear_moves``: a session of a worn-out node leaves it, as a moving session, if some other live
  drive is not worn out, at a request whose prompt its node does not hold: with the driver's
  ``extends`` (whether the node was sent at least ``held_frac`` of the prompt's prefix by this
  session, ``HeldPrefixes``), when it is False; without it, at a prompt shorter than ``wear_shrink``
  x its previous request's (the agent compacted or restarted its context); with ``wear_shrink`` 0 and
  no ``extends``, the largest active session of a worn-out node leaves it at its next request. Why:
  a moved session recomputes what its node held of its context, and its new drive may write it
  again; a prompt the node does not hold is recomputed wherever it goes, so moving it spreads writes
  at little cost. (The shrink rule misses the prompts that grow but do not extend the previous one,
  and takes as new the branches a session interleaves, which the held prefix does not.)
- The defaults (``least`` placement by ``both``, wear moves at a held prefix below one half, the
  ``shed`` bound: of the bounds exact at every pick, the one meeting the most targets) are the fleet
  replay's choice on WEKA sessions 1-175 copied twice; docs/fleet.md has what they reach on the
  held-out sessions 176-350.
- A session that left a dead node (a guest where it went) returns to it once it is alive again, if
  it is below the bound (``shed``: the first its host sends off when the host is above the bound).
  Guests do not count against their hosts' own sessions: a host holding its sessions and the guests
  is over the bound until the guests leave, and its own sessions stay.

The key is whatever identifies a session to the driver (the saria session id, a routing-key
header, or a prefix hash); it is hashed with xxh64, so placement is the same in every process.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import xxhash


PLACE_BY = ("wear", "tokens", "both")  # AffinityConfig.place_by


class AffinityError(ValueError):
    """Bad session-affinity settings, or no live node to route to; the message names the value."""


PLACEMENT = ("least", "ring")  # AffinityConfig.placement
BOUND = ("cheap", "strict", "shed")  # AffinityConfig.bound


@dataclass(frozen=True)
class AffinityConfig:
    """The policy's constants (chosen on WEKA sessions 1-175, docs/fleet.md)."""

    eps: float = 0.25  # a node holds at most ceil(m) + floor(eps x m) active sessions, m their mean per live node
    idle_s: float = 1800.0  # a session without a request for this long stops counting as active
    # True: a session leaves a node whose drive has written more than (1 + eps) x the live drives' mean (as
    # wear_shrink says); False: a session leaves its node only at the bound or dead
    wear_moves: bool = True
    # > 0: any session of a worn-out node leaves it at a request whose size is below wear_shrink x its previous
    # request's; 0: the node's largest active session leaves it at its next request
    wear_shrink: float = 0.9
    # what a new or moving session's node must not exceed: "wear" (its drive's writes), "tokens" (its active
    # sessions' prompt tokens) or "both", each at most (1 + eps) x the live nodes' mean
    place_by: str = "both"
    # "least": a new or moving session takes the least loaded qualifying node (tokens and requests over their
    # means); "ring": the first on its ring walk within the token bound
    placement: str = "least"
    # "shed": every live node held to the bound after each pick, the cheapest of a node's sessions (and the one
    # returning to it) moving at once; "cheap": a session at a node at the bound stays if a smaller active session
    # is there or its node holds its prompt (extends), exact at placement only; "strict": it moves
    bound: str = "shed"
    # a prompt extends what its node holds when this session sent that node at least this fraction of its prefix
    # (HeldPrefixes, the drivers'); 0: drivers do not tell (the shrink rule decides wear moves)
    held_frac: float = 0.5
    vnodes: int = 64  # ring points per node
    max_sessions: int = 1_000_000  # sessions whose node is remembered (least recent forgotten first)

    def validate(self) -> "AffinityConfig":
        if not self.eps > 0:
            raise AffinityError(f"session eps {self.eps}: must be > 0")
        if not self.idle_s > 0:
            raise AffinityError(f"session idle_s {self.idle_s}: must be > 0")
        if not self.wear_shrink >= 0:
            raise AffinityError(f"session wear_shrink {self.wear_shrink}: must be >= 0 (0: the largest session moves)")
        if self.place_by not in PLACE_BY:
            raise AffinityError(f"session place_by {self.place_by!r}: choose one of {', '.join(PLACE_BY)}")
        if self.placement not in PLACEMENT:
            raise AffinityError(f"session placement {self.placement!r}: choose one of {', '.join(PLACEMENT)}")
        if self.bound not in BOUND:
            raise AffinityError(f"session bound {self.bound!r}: choose one of {', '.join(BOUND)}")
        if not 0 <= self.held_frac <= 1:
            raise AffinityError(f"session held_frac {self.held_frac}: must be in [0, 1] (0: not used)")
        if self.vnodes < 1 or self.max_sessions < 1:
            raise AffinityError(f"session vnodes {self.vnodes} / max_sessions {self.max_sessions}: must be >= 1")
        return self


def key_hash(key: Hashable) -> int:
    """A stable 64-bit hash of a session key (the same in every process, unlike ``hash``)."""
    return xxhash.xxh64_intdigest(str(key).encode())


class SessionAffinity:
    """The sticky, bounded-load placement of sessions on ``n_nodes`` nodes (module docstring).

    ``pick`` is the only entry point; ``stats`` counts its decisions: ``placed`` (a session's first
    request), ``stayed``, ``moved_bound`` (its node was at the bound), ``moved_dead`` (its node was
    dead), ``returned`` (back to the node it left when that node died: at its request, or sent home by
    the ``shed`` bound), ``shed`` (an idle session sent off by the ``shed`` bound; counted with that bound
    only; its next request may still go back to the node it left).
    """

    def __init__(self, n_nodes: int, config: AffinityConfig = AffinityConfig()) -> None:
        if n_nodes < 1:
            raise AffinityError(f"nodes {n_nodes}: must be >= 1")
        self.n_nodes = n_nodes
        self.cfg = config.validate()
        points = sorted((key_hash(f"node-{i}-{v}"), i) for i in range(n_nodes) for v in range(config.vnodes))
        self.ring_hashes = [h for h, _ in points]
        self.ring_nodes = [i for _, i in points]
        # key -> (node, last request, its size), oldest first
        self.active: OrderedDict[Hashable, tuple[int, float, float]] = OrderedDict()
        self.count = [0] * n_nodes  # active sessions per node
        self.guests = [0] * n_nodes  # of which displaced from a dead node
        # key -> (node, time, size) of its last request, least recent first
        self.home: OrderedDict[Hashable, tuple[int, float, float | None]] = OrderedDict()
        self.displaced: dict[Hashable, int] = {}  # key -> the dead node it left
        self.routed = [0] * n_nodes  # requests routed per node
        # sessions reassigned while idle -> the node they left (it holds their context; their new one nothing)
        self.shed: dict[Hashable, int] = {}
        self.stats = {"placed": 0, "stayed": 0, "moved_bound": 0, "moved_wear": 0, "moved_dead": 0, "returned": 0}
        if self.cfg.bound == "shed":
            self.stats["shed"] = 0

    def preference(self, key: Hashable) -> list[int]:
        """The nodes in the order the key's ring walk meets them."""
        i = bisect.bisect(self.ring_hashes, key_hash(key))
        order: list[int] = []
        n = len(self.ring_nodes)
        for j in range(n):
            node = self.ring_nodes[(i + j) % n]
            if node not in order:
                order.append(node)
                if len(order) == self.n_nodes:
                    break
        return order

    def expire(self, now: float) -> None:
        """Sessions idle for ``idle_s`` stop counting on their node (their node is still remembered)."""
        limit = now - self.cfg.idle_s
        while self.active:
            key, (node, t, _) = next(iter(self.active.items()))
            if t > limit:
                break
            self.active.popitem(last=False)
            self.count[node] -= 1
            self.guests[node] -= key in self.displaced

    def bound(self, alive: Sequence[bool]) -> int:
        """The most active sessions a node may hold once the session being placed is counted."""
        mean = (len(self.active) + 1) / sum(alive)
        return math.ceil(mean) + math.floor(self.cfg.eps * mean)

    def wear_limit(self, alive: Sequence[bool], wear: Sequence[float]) -> float:
        """(1 + eps) x the live drives' mean write count: above it a drive is worn out."""
        return (1.0 + self.cfg.eps) * sum(w for w, a in zip(wear, alive) if a) / sum(alive)

    def worn_out(self, node: int, size: float | None, previous: float | None, alive: Sequence[bool],
                 wear: Sequence[float] | None, extends: bool | None = None) -> bool:
        """Whether a session leaves ``node`` for wear (``wear_moves``) at a request of ``size``, its previous
        one of ``previous`` (None: not known): the drive is above ``wear_limit``, another live one is not,
        and the node does not hold the prompt (``extends`` False; not known: the prompt is shorter than
        ``wear_shrink`` x the previous one, or with ``wear_shrink`` 0 no other active session there is
        larger)."""
        if not (self.cfg.wear_moves and wear and size is not None):
            return False
        limit = self.wear_limit(alive, wear)
        if wear[node] <= limit or not any(alive[n] and wear[n] <= limit for n in range(self.n_nodes) if n != node):
            return False
        if extends is not None:
            return not extends
        if self.cfg.wear_shrink:
            return previous is not None and size < self.cfg.wear_shrink * previous
        return all(n != node or z <= size for n, _, z in self.active.values())

    def tokens(self) -> list[float]:
        """Per node, its active sessions' prompts (each its last request's ``size``)."""
        tokens = [0.0] * self.n_nodes
        for n, _, z in self.active.values():
            tokens[n] += z
        return tokens

    def place(self, key: Hashable, alive: Sequence[bool], cap: int, wear: Sequence[float] | None,
              size: float | None = None) -> int:
        """A new or moving session's node, of the live nodes below the session bound: of those within the
        wear bound, the least loaded in tokens and requests (``placement`` least) or the first on its ring
        walk within the token bound (ring); if none is within the wear bound, the same over all of them
        (module docstring)."""
        open_nodes = [n for n in self.preference(key) if alive[n] and self.count[n] < cap]
        by = self.cfg.place_by
        fits = open_nodes
        if wear and by in ("wear", "both"):
            limit = self.wear_limit(alive, wear)
            fits = [n for n in fits if wear[n] <= limit]
        if size is not None and by in ("tokens", "both"):
            tokens = self.tokens()
            limit = (1.0 + self.cfg.eps) * (sum(t for t, a in zip(tokens, alive) if a) + size) / sum(alive)
            fits_tokens = [n for n in fits if tokens[n] + size <= limit]
            if self.cfg.placement == "least":
                # each load over its mean per node, so neither unit dominates; min takes the first of equals
                mean_t = max(sum(tokens) / self.n_nodes, 1e-9)
                mean_r = max(sum(self.routed) / self.n_nodes, 1e-9)
                return min(fits_tokens or fits or open_nodes,
                           key=lambda n: max(tokens[n] / mean_t, self.routed[n] / mean_r))
            return fits_tokens[0] if fits_tokens else min(fits or open_nodes, key=tokens.__getitem__)
        if fits:
            return fits[0]
        return min(open_nodes, key=wear.__getitem__) if wear else open_nodes[0]

    def _first_to_leave(self, node: int, alive: Sequence[bool], cap: int,
                        keep: Hashable | None) -> tuple[Hashable, float] | None:
        """``shed`` bound: the active session ``node`` sends off first, other than ``keep``, with what moving it
        costs: a guest whose dead home is alive again and below ``cap`` (it goes home: -1), else the one with the
        smallest last prompt (its size); None if it holds no other."""
        cheapest = None
        for k, (n, _, z) in self.active.items():
            if n != node or k == keep:
                continue
            home = self.displaced.get(k)
            if home is not None and alive[home] and self.count[home] < cap:
                return k, -1.0
            if cheapest is None or z < cheapest[1]:
                cheapest = (k, z)
        return cheapest

    def _send_off(self, key: Hashable, alive: Sequence[bool], cap: int, wear: Sequence[float] | None) -> None:
        """``shed`` bound: active session ``key`` counts on another node from now and its next request goes there:
        a guest whose dead home is back below ``cap`` goes home (``returned``); any other to ``place``'s node
        (``shed``), remembering the node it left, which holds its context (``pick`` judges it there again)."""
        old, t, z = self.active[key]
        home = self.displaced.get(key)
        if home is not None and alive[home] and self.count[home] < cap:
            node, kind = home, "returned"
            del self.displaced[key]
            self.guests[old] -= 1
        else:
            node, kind = self.place(key, alive, cap, wear, z or None), "shed"
            self.guests[old] -= home is not None
            self.guests[node] += home is not None
            self.shed.setdefault(key, old)
        self.stats[kind] += 1
        self.active[key] = (node, t, z)
        self.count[old] -= 1
        self.count[node] += 1
        _, home_t, home_size = self.home.get(key, (node, t, z))
        self.home[key] = (node, home_t, home_size)

    def _hold_to_bound(self, alive: Sequence[bool], cap: int, wear: Sequence[float] | None, keep: Hashable) -> None:
        """``shed`` bound: every live node above ``cap`` active sessions (the mean fell as sessions went idle, or a
        dead node came back) sends off its first to leave (``_first_to_leave``), other than ``keep`` (the session
        just routed), to nodes below it."""
        for node in range(self.n_nodes):
            while alive[node] and self.count[node] > cap:
                self._send_off(self._first_to_leave(node, alive, cap, keep)[0], alive, cap, wear)

    def _sheds_other(self, node: int, alive: Sequence[bool], cap: int, size: float | None,
                     extends: bool | None, key: Hashable) -> Hashable | None:
        """``shed`` bound, session ``key`` returning to ``node`` at the bound: the node's other active session to
        move instead of it, if that costs less (``_first_to_leave``) than moving it, its prompt's size, or nothing
        when its node does not hold its prompt (``extends`` False)."""
        first = self._first_to_leave(node, alive, cap, key)
        own = 0.0 if extends is False else (size or 0.0)
        return first[0] if first is not None and first[1] < own else None

    def keeps(self, node: int, size: float | None, extends: bool | None) -> bool:
        """With the ``cheap`` bound, whether a session of ``node``, which is at the bound, stays there: its
        node holds its prompt, or another active session there is smaller (it leaves first)."""
        if self.cfg.bound != "cheap":
            return False
        if extends:
            return True
        return size is not None and any(n == node and z < size for n, _, z in self.active.values())

    def pick(self, key: Hashable, now: float, alive: Sequence[bool] | None = None,
             wear: Sequence[float] | None = None, size: float | None = None, extends: bool | None = None) -> int:
        """The node for a request of session ``key`` at ``now``; ``alive[i]`` False: node i is dead;
        ``wear[i]``: what node i's drive has written so far (any unit; None: not known); ``size``: the
        request's prompt (tokens, or any measure proportional to them; None: not known, no wear moves);
        ``extends``: whether the session's node holds the prompt (``HeldPrefixes``; None: not known)."""
        alive = alive if alive is not None else [True] * self.n_nodes
        if len(alive) != self.n_nodes:
            raise AffinityError(f"{len(alive)} liveness flags for {self.n_nodes} nodes")
        if not any(alive):
            raise AffinityError(f"no live node among {self.n_nodes}")
        self.expire(now)
        left = self.shed.pop(key, None)  # reassigned while idle: the node it left holds its context
        entry = self.active.pop(key, None)
        back = self.displaced.get(key)
        if entry is not None:
            self.count[entry[0]] -= 1
            self.guests[entry[0]] -= back is not None
        cap = self.bound(alive)
        count = self.count
        last = self.home.get(key)
        current = entry[0] if entry is not None else (last[0] if last is not None else None)
        if left is not None:
            if alive[left]:  # back to where its context is, as if it had not left
                current = left
            elif extends is not None:
                extends = False  # its new node holds nothing of its prompt
        if back is not None and alive[back] and count[back] < cap:
            node, kind = back, "returned"
            del self.displaced[key]
        elif (self.cfg.bound == "shed" and current is not None and alive[current] and count[current] >= cap
              and not self.worn_out(current, size, last[2] if last is not None else None, alive, wear, extends)
              and (other := self._sheds_other(current, alive, cap, size, extends, key)) is not None):
            self._send_off(other, alive, cap, wear)
            node, kind = current, "stayed"
        elif (current is not None and alive[current]
              and (count[current] - (back is None) * self.guests[current] < cap or self.keeps(current, size, extends))
              and not self.worn_out(current, size, last[2] if last is not None else None, alive, wear, extends)):
            node, kind = current, "stayed"
        else:
            node = self.place(key, alive, cap, wear, size)
            if current is None:
                kind = "placed"
            elif not alive[current]:
                kind = "moved_dead"
                self.displaced.setdefault(key, current)
            elif node == current:
                kind = "stayed"  # worn out, but no node below the bound has worn less
            else:
                kind = "moved_bound" if count[current] - (back is None) * self.guests[current] >= cap else "moved_wear"
        if node == back:
            self.displaced.pop(key, None)
        self.stats[kind] += 1
        self.active[key] = (node, now, size if size is not None else 0.0)
        count[node] += 1
        self.routed[node] += 1
        self.guests[node] += key in self.displaced
        self.home[key] = (node, now, size)
        self.home.move_to_end(key)
        if len(self.home) > self.cfg.max_sessions:
            old, _ = self.home.popitem(last=False)
            if old not in self.active:
                self.displaced.pop(old, None)
                self.shed.pop(old, None)
        if self.cfg.bound == "shed":
            self._hold_to_bound(alive, cap, wear, key)
        return node


class HeldPrefixes:
    """Per session, the prefixes its requests sent to its current node: whether the node holds a new
    request's prompt (``extends``: at least ``frac`` of it, by weight, is a prefix the node was sent).

    A driver names a request's prefixes by ids, each standing for the whole prompt up to it (the replay:
    its block keys; the launcher: digests of its messages so far), in order, with weights (None: 1 each).
    It asks ``extends`` before ``SessionAffinity.pick`` and calls ``record`` with the node it picked; a
    session that changes node starts an empty set there. ``frac`` 0: ``extends`` is always None.
    """

    def __init__(self, frac: float, max_sessions: int = 1_000_000) -> None:
        self.frac = frac
        self.max_sessions = max_sessions
        self.held: OrderedDict[Hashable, tuple[int, set]] = OrderedDict()

    def extends(self, key: Hashable, prefixes: Sequence[Hashable],
                weights: Sequence[float] | None = None) -> bool | None:
        entry = self.held.get(key)
        if not self.frac or entry is None or not prefixes:
            return None
        held = entry[1]
        m = 0
        for p in prefixes:
            if p not in held:
                break
            m += 1
        if weights is None:
            return m >= self.frac * len(prefixes)
        return sum(weights[:m]) >= self.frac * sum(weights)

    def record(self, key: Hashable, node: int, prefixes: Sequence[Hashable]) -> None:
        if not self.frac:
            return
        entry = self.held.get(key)
        if entry is None or entry[0] != node:
            entry = self.held[key] = (node, set())
        entry[1].update(prefixes)
        self.held.move_to_end(key)
        if len(self.held) > self.max_sessions:
            self.held.popitem(last=False)
