"""Workload construction of the replay methodology (paper 5.1, DESIGN.md "Replay methodology").

Sessions keep their request order and recorded idle gaps; only session start times move.
Starts are spread over a window with Gamma(k=1) gaps, so a shorter window means more
concurrent sessions competing for DRAM without changing within-session reuse timing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sglang_saria.replay.trace import TraceSession

logger = logging.getLogger(__name__)

CONTEXT_LIMIT_TOKENS = 450_000


def session_start_times(n_sessions: int, window_s: float, seed: int) -> np.ndarray:
    """Start times (s) of n sessions: first at 0, all in [0, window), Gamma(k=1) gaps.

    Draws n exponential gaps and scales them so the n gaps sum to the window: the n-1 gaps
    between starts plus one trailing gap, which keeps the last start strictly inside.
    """
    if n_sessions < 0 or not window_s > 0:
        raise ValueError(f"need n_sessions >= 0 and window_s > 0, got {n_sessions}, {window_s}")
    if n_sessions == 0:
        return np.empty(0)
    gaps = np.random.default_rng(seed).gamma(1.0, size=n_sessions)
    starts = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) * (window_s / gaps.sum())
    return np.minimum(starts, np.nextafter(window_s, 0.0))


def session_starts(sessions: list[TraceSession], window_s: float, seed: int) -> np.ndarray:
    """Start time of every session: top-level sessions spread over the window in order,
    sub-agent sessions at their parent's start + start_offset_s (see TraceSession)."""
    top = [s for s in sessions if s.parent_id is None]
    by_id = dict(zip((s.session_id for s in top), session_start_times(len(top), window_s, seed)))
    try:
        return np.array([by_id[s.session_id] if s.parent_id is None else by_id[s.parent_id] + s.start_offset_s
                         for s in sessions])
    except KeyError as exc:
        raise ValueError(f"sub-agent session's parent {exc} is not among the sessions") from exc


def limit_context(sessions: list[TraceSession],
                  context_limit_tokens: int = CONTEXT_LIMIT_TOKENS) -> tuple[list[TraceSession], int]:
    """(sessions without requests over the limit, number of requests dropped).

    A dropped request simply disappears: its successor keeps its own recorded arrival and
    idle gap (the new first request of a session gets idle 0). A session left empty is
    dropped with its sub-agent sessions, whose requests count as dropped too.
    """
    kept: list[TraceSession] = []
    gone: set[str] = set()
    dropped = 0
    for s in sessions:
        if s.parent_id in gone:
            gone.add(s.session_id)
            dropped += len(s.requests)
            continue
        reqs = [r for r in s.requests if r.input_tokens <= context_limit_tokens]
        dropped += len(s.requests) - len(reqs)
        if not reqs:
            gone.add(s.session_id)
            continue
        if reqs[0].idle_before_s:
            reqs[0] = dataclasses.replace(reqs[0], idle_before_s=0.0)
        kept.append(dataclasses.replace(s, requests=reqs) if len(reqs) != len(s.requests) else s)
    return kept, dropped


def apply_limits(sessions: list[TraceSession],
                 context_limit_tokens: int = CONTEXT_LIMIT_TOKENS) -> list[TraceSession]:
    """Drop requests whose input exceeds the context limit (paper: 450K tokens); logs the count."""
    kept, dropped = limit_context(sessions, context_limit_tokens)
    logger.info("context limit %d tokens: dropped %d requests, %d sessions left",
                context_limit_tokens, dropped, len(kept))
    return kept


@dataclass(frozen=True)
class Truncation:
    """Which requests of a placed workload exist: ``kept[i]`` leading requests of session i."""

    kept: list[int]
    span_s: float  # recorded arrival of the last kept request: the period the workload covers

    @property
    def requests(self) -> int:
        return sum(self.kept)


def truncate(sessions: Sequence[TraceSession], starts: Sequence[float], horizon_s: float) -> Truncation:
    """The 24-hour trace truncation (paper 5.1) as a filter on the workload, never a deadline: a
    session keeps the requests recorded to arrive (its start + the recorded arrival) within
    ``horizon_s``. It depends on the trace and the start times only, so every policy replayed on
    the same workload serves the same requests, however long a slower one takes to drain them."""
    kept, span = [], 0.0
    for s, t0 in zip(sessions, starts):
        n, last = 0, 0.0
        for r in s.requests:
            arrival = float(t0) + r.t
            if arrival > horizon_s:
                break
            n, last = n + 1, arrival
        kept.append(n)
        span = max(span, last)
    return Truncation(kept, span)


def dense_keys(sessions: list[TraceSession]) -> tuple[list[list[np.ndarray]], list[list[int]], int]:
    """Every request's block keys renumbered 0..n-1 (the same key, the same number), per session; per
    request, how many leading keys equal its predecessor's in the session (0 for a first request); and n.

    Why: the policy core hashes each key several times per request (metadata, tiers, recency
    lists); trace keys are 64-bit values that Python holds as multi-digit ints, small dense ints
    hash and compare faster. Renumbering is injective and keys are only compared for identity,
    so every decision is unchanged (``tests/replay/test_replay_outputs_pinned.py``). A request
    mostly repeats its predecessor's prefix, so only the rest is looked up (sorting every key of
    350 WEKA sessions would take a tenth of the replay); the replay reuses that prefix's key objects.
    """
    shared: list[int] = []  # per request: leading keys equal to the previous request's of the session
    tails: list[np.ndarray] = []
    for s in sessions:
        prev = None
        for r in s.requests:
            keys = r.block_keys
            n = 0
            if prev is not None:
                m = min(len(keys), len(prev))
                same = keys[:m] == prev[:m]
                n = m if same.all() else int(same.argmin())
            shared.append(n)
            tails.append(keys[n:])
            prev = keys
    if not tails:
        return [[] for _ in sessions], [[] for _ in sessions], 0
    distinct, first, sorted_ids = np.unique(np.concatenate(tails), return_index=True, return_inverse=True)
    # numbered in order of first appearance: a request's keys are then mostly consecutive numbers, so the
    # core's dict slots, key objects and nodes it touches per request lie close together in memory
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(distinct))
    tail_ids = rank[sorted_ids]
    out: list[list[np.ndarray]] = []
    out_shared: list[list[int]] = []
    pos = i = 0
    for s in sessions:
        per: list[np.ndarray] = []
        for r in s.requests:
            n_tail = len(r.block_keys) - shared[i]
            ids = tail_ids[pos : pos + n_tail]
            if shared[i]:
                ids = np.concatenate([per[-1][: shared[i]], ids])
            per.append(ids)
            pos += n_tail
            i += 1
        out.append(per)
        out_shared.append(shared[i - len(s.requests) : i])
    return out, out_shared, len(distinct)


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _salted(keys: np.ndarray, salt: int) -> np.ndarray:
    """A bijection of 64-bit keys per salt (splitmix64's finaliser of key ^ salt): distinct keys stay
    distinct, and a salted key meets an existing one with probability ~ n^2 / 2^64."""
    with np.errstate(over="ignore"):
        z = keys ^ (np.uint64(salt) * _MIX)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def replicate(sessions: list[TraceSession], copies: int, seed: int) -> list[TraceSession]:
    """Each session group (a top-level session with its sub-agents) ``copies`` times, the groups in a
    seeded random order: a workload of the same sessions at ``copies`` x their load.

    Why: a held-out part of a trace has fewer sessions than the load a target is stated at; copies
    of unseen sessions reach that load without a session any constant was chosen on. A copy is a new
    conversation with the same shape (requests, sizes, recorded timing): the keys only its group has
    are salted per copy (so copies share nothing a real second conversation would not), while the
    keys its group shares with another group (common system prompts, tool schemas) are kept, so
    cross-session prefix sharing stays as recorded. Copy c > 0 of session ``x`` is ``x#c{c}``.
    ``copies == 1`` returns the sessions unchanged.
    """
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    if copies == 1:
        return sessions
    groups: dict[str, list[TraceSession]] = {}
    for s in sessions:
        groups.setdefault(s.parent_id or s.session_id, []).append(s)
    per_group = [np.unique(np.concatenate([r.block_keys for s in g for r in s.requests] or [np.empty(0, np.uint64)]))
                 for g in groups.values()]
    keys, n_groups = np.unique(np.concatenate(per_group), return_counts=True)
    shared = keys[n_groups > 1]

    def copy(s: TraceSession, c: int) -> TraceSession:
        reqs = []
        for r in s.requests:
            k = r.block_keys
            private = ~np.isin(k, shared)
            reqs.append(dataclasses.replace(r, block_keys=np.where(private, _salted(k, c), k)))
        return dataclasses.replace(s, session_id=f"{s.session_id}#c{c}", requests=reqs,
                                   parent_id=None if s.parent_id is None else f"{s.parent_id}#c{c}")

    out = [list(g) if c == 0 else [copy(s, c) for s in g] for c in range(copies) for g in groups.values()]
    order = np.random.default_rng(seed).permutation(len(out))
    return [s for i in order for s in out[i]]
