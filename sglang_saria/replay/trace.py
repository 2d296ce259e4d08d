"""Replay trace model: sessions of requests whose inputs are chains of block keys.

Every loader reduces its source format to the same shape (paper 5.1): a session keeps its
request order, recorded arrival times and idle gaps, and each request's input is the list
of chained keys of its FULL `block_tokens` blocks. A key hashes the previous key together
with the block's content ids, so equal prefixes share keys and a key stands for its whole
prefix -- exactly what a radix tree of block-aligned nodes needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import xxhash

_xxh3 = xxhash.xxh3_64_intdigest


class TraceFormatError(ValueError):
    """A trace file that cannot be loaded; the message names the file, request and line."""


@dataclass(frozen=True)
class TraceRequest:
    t: float  # recorded arrival, seconds since the session's start
    idle_before_s: float  # recorded idle gap between the previous request's completion and this one (0 for the first)
    input_tokens: int
    output_tokens: int
    block_keys: np.ndarray  # uint64 chained context keys, one per FULL block of block_tokens input tokens


@dataclass
class TraceSession:
    """One agent conversation.

    Sub-agent conversations (WEKA "subagent" markers) are sessions of their own with
    `parent_id` set. The replay places a child at its parent's replay start plus
    `start_offset_s` (its recorded launch time on the parent's timeline), then runs it like
    any session (one active request, recorded idle gaps), concurrently with the parent --
    the way the recording tool replays them. `after_request` is the index in the parent's
    `requests` of the request whose completion launched the child (-1: before any), for a
    driver that prefers to release children on that completion instead. For a top-level
    session `start_offset_s` is informational (its recorded start relative to the trace's
    first session, where the format has one): the replay's window placement replaces it.
    """

    session_id: str
    requests: list[TraceRequest]
    parent_id: str | None = None
    start_offset_s: float = 0.0
    after_request: int = -1


def scope_seed(*parts: str) -> int:
    """Seed of a key chain: keys of different scopes (trace file, model) never collide."""
    return _xxh3("\x1f".join(parts).encode())


def chain_keys(units: np.ndarray, start_key: int) -> np.ndarray:
    """Chained keys of `units` (one row of uint64 content ids per block) after `start_key`.

    key_i = xxh3_64(content of block i, seed=key_{i-1}); the chain is inherently serial, so
    the speed comes from callers reusing keys over shared prefixes (see KeyChain).
    """
    n = units.shape[0]
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    stride = units.shape[1] * 8
    view = memoryview(np.ascontiguousarray(units, dtype=np.uint64)).cast("B")
    out = []
    key = start_key
    for off in range(0, n * stride, stride):
        key = _xxh3(view[off : off + stride], key)
        out.append(key)
    return np.array(out, dtype=np.uint64)


@dataclass
class KeyChain:
    """Per-session chaining that reuses the previous request's keys over the shared prefix.

    Keys are a pure function of (seed, block contents), so the reuse is only a speed-up:
    agent requests mostly extend the previous request, and re-hashing the whole context per
    request would cost O(context) hashes instead of O(new blocks).
    """

    _seed: int | None = None
    _units: np.ndarray = field(default_factory=lambda: np.empty((0, 1), dtype=np.uint64))
    _keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))

    def keys(self, units: np.ndarray, seed: int) -> np.ndarray:
        reuse = 0
        if seed == self._seed and units.shape[1] == self._units.shape[1]:
            reuse = _common_rows(self._units, units)
        start = int(self._keys[reuse - 1]) if reuse else seed
        keys = np.concatenate([self._keys[:reuse], chain_keys(units[reuse:], start)])
        self._seed, self._units, self._keys = seed, units, keys
        return keys


def _common_rows(a: np.ndarray, b: np.ndarray) -> int:
    """Number of leading rows equal in a and b."""
    m = min(a.shape[0], b.shape[0])
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m].ravel() != b[:m].ravel())
    return m if diff.size == 0 else int(diff[0]) // a.shape[1]


def regroup(ids: np.ndarray, source_tokens: int, block_tokens: int, input_tokens: int) -> np.ndarray:
    """Content rows of the full `block_tokens` blocks of an input recorded as per-block ids.

    block_tokens a multiple of the source block size: each row holds the ids of the source
    blocks it covers. A divisor: each source block splits into (id, part) rows. The trailing
    partial block is dropped, as a prefix cache never stores it.
    """
    n = input_tokens // block_tokens
    if block_tokens % source_tokens == 0:
        g = block_tokens // source_tokens
        return ids[: n * g].reshape(n, g)
    if source_tokens % block_tokens == 0:
        k = source_tokens // block_tokens
        rows = np.empty((n, 2), dtype=np.uint64)
        rows[:, 0] = np.repeat(ids, k)[:n]
        rows[:, 1] = np.arange(n, dtype=np.uint64) % k
        return rows
    raise ValueError(
        f"block_tokens={block_tokens} must be a multiple or a divisor of the trace's "
        f"block size {source_tokens}"
    )


@dataclass(frozen=True)
class TraceStats:
    """Summary used to compare workloads (e.g. synthetic vs the paper's TraceLab numbers)."""

    sessions: int
    requests: int
    requests_per_session: float
    mean_input_tokens: float
    max_input_tokens: int
    mean_gap_s: float  # mean within-session inter-arrival time
    mean_idle_s: float
    subagent_sessions: int


def describe(sessions: list[TraceSession]) -> TraceStats:
    inputs = np.array([r.input_tokens for s in sessions for r in s.requests], dtype=np.float64)
    gaps = np.array([b.t - a.t for s in sessions for a, b in zip(s.requests, s.requests[1:])])
    idles = np.array([r.idle_before_s for s in sessions for r in s.requests[1:]])
    n_req = int(inputs.size)
    return TraceStats(
        sessions=len(sessions),
        requests=n_req,
        requests_per_session=n_req / len(sessions) if sessions else 0.0,
        mean_input_tokens=float(inputs.mean()) if n_req else 0.0,
        max_input_tokens=int(inputs.max()) if n_req else 0,
        mean_gap_s=float(gaps.mean()) if gaps.size else 0.0,
        mean_idle_s=float(idles.mean()) if idles.size else 0.0,
        subagent_sessions=sum(s.parent_id is not None for s in sessions),
    )
