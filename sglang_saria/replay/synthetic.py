"""Built-in synthetic agent sessions (`synthetic[:SEED]`), calibrated to the paper's TraceLab
workload (section 3 / Table 2): 18.4 requests per session, 83.7K mean prompt tokens, ~112 s
mean within-session request interval.

Why these shapes: reuse in agent traffic comes from (1) a system prompt + tool schema
prefix shared by every session of the same agent, and (2) each request extending the
previous one (history + last output + new tool results / user message), broken by
occasional compaction (context replaced by a summary) or a user reset. Sizes and idle gaps
are heavy-tailed (lognormal). Everything derives from one numpy Generator per seed, so a
seed always yields the same sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from sglang_saria.replay.trace import TraceRequest, TraceSession, chain_keys, scope_seed

DEFAULT_SEED = 0
_NORMAL = NormalDist()
_STRATUM = 40


@dataclass(frozen=True)
class SyntheticConfig:
    n_sessions: int = 40
    mean_requests: float = 18.4
    requests_sigma: float = 0.9  # lognormal sigma of requests per session
    # Agent profiles: tokens of system prompt + tool schema; sessions pick one (Zipf-like).
    profile_tokens: tuple[int, ...] = (24_000, 18_000, 31_000, 12_000)
    first_message_tokens: float = 6_000.0  # mean of the first user message (+ project notes)
    mean_append_tokens: float = 5_000.0  # mean new tool results / user text per round
    append_sigma: float = 1.1
    max_append_tokens: int = 60_000  # tools truncate huge results
    mean_output_tokens: float = 450.0
    compact_above_tokens: int = 250_000  # history compaction when the context grows past this
    summary_tokens: float = 9_000.0  # mean size of a compaction summary
    reset_prob: float = 0.02  # per round: user starts over (new task in the same session)
    mean_idle_s: float = 103.0  # mean idle between a completion and the next request
    idle_sigma: float = 1.3
    decode_tokens_per_s: float = 60.0  # recorded duration of a request = 1 s + output / rate


def _lognormal(rng: np.random.Generator, mean: float, sigma: float) -> float:
    """Lognormal draw with the given mean (not median)."""
    return float(rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma))


def generate(seed: int = DEFAULT_SEED, block_tokens: int = 512, max_sessions: int | None = None,
             config: SyntheticConfig = SyntheticConfig()) -> list[TraceSession]:
    """Sessions 0..n-1 of the seed's stream: the first N never depend on how many follow."""
    n_sessions = config.n_sessions if max_sessions is None else max_sessions
    chain_seed = scope_seed("synthetic", str(seed))
    weights = 1.0 / np.arange(1, len(config.profile_tokens) + 1)
    weights /= weights.sum()
    # Profile prefixes are the same content for every session of the profile: same keys.
    profile_keys = [chain_keys(_rows(0, p, 0, n // block_tokens), chain_seed)
                    for p, n in enumerate(config.profile_tokens)]
    # Session lengths are stratified in groups of _STRATUM sessions, so even a demo-sized
    # sample matches the mean length instead of hinging on a few long sessions.
    strata = [np.random.default_rng([seed, 0, b]).permutation(_STRATUM)
              for b in range(-(-n_sessions // _STRATUM))]
    sigma = config.requests_sigma
    sessions = []
    for i in range(n_sessions):
        rng = np.random.default_rng([seed, 1, i])
        q = (strata[i // _STRATUM][i % _STRATUM] + rng.random()) / _STRATUM
        n_requests = max(1, round(np.exp(np.log(config.mean_requests) - sigma * sigma / 2
                                         + sigma * _NORMAL.inv_cdf(q))))
        profile = int(rng.choice(len(weights), p=weights))
        sessions.append(_session(rng, config, i, n_requests, profile, profile_keys, chain_seed, block_tokens))
    return sessions


def _rows(owner: int, part: int, first: int, last: int) -> np.ndarray:
    """Content ids of blocks first..last-1 written by `owner` (0: a profile) in round `part`."""
    rows = np.empty((max(0, last - first), 3), dtype=np.uint64)
    rows[:, 0], rows[:, 1] = owner, part
    rows[:, 2] = np.arange(first, first + rows.shape[0], dtype=np.uint64)
    return rows


def _session(rng: np.random.Generator, cfg: SyntheticConfig, index: int, n_requests: int, profile: int,
             profile_keys: list[np.ndarray], chain_seed: int, block_tokens: int) -> TraceSession:
    prefix = cfg.profile_tokens[profile]
    stream = 0  # tokens of context carried from the previous request (its input + output)
    keys = np.empty(0, dtype=np.uint64)  # keys of that context's full blocks
    t = 0.0
    out: list[TraceRequest] = []
    for k in range(n_requests):
        if k and stream > cfg.compact_above_tokens:  # compaction: history -> summary
            keys, shared, new = profile_keys[profile], prefix, _lognormal(rng, cfg.summary_tokens, 0.6)
        elif k == 0 or rng.random() < cfg.reset_prob:  # new task: prefix + user message
            keys, shared, new = profile_keys[profile], prefix, _lognormal(rng, cfg.first_message_tokens, 0.6)
        else:  # agent loop: previous context + output + tool results
            shared, new = stream, min(cfg.max_append_tokens, _lognormal(rng, cfg.mean_append_tokens, cfg.append_sigma))
        n_in = shared + max(1, int(new))
        n_out = max(1, int(_lognormal(rng, cfg.mean_output_tokens, 0.9)))
        idle = _lognormal(rng, cfg.mean_idle_s, cfg.idle_sigma) if k else 0.0
        if k:
            t += 1.0 + out[-1].output_tokens / cfg.decode_tokens_per_s + idle
        reuse = shared // block_tokens
        stream_blocks = (n_in + n_out) // block_tokens
        start = int(keys[reuse - 1]) if reuse else chain_seed
        keys = np.concatenate([keys[:reuse], chain_keys(_rows(index + 1, k, reuse, stream_blocks), start)])
        out.append(TraceRequest(t, idle, n_in, n_out, keys[: n_in // block_tokens]))
        stream = n_in + n_out
    return TraceSession(f"synthetic_{index:04d}", out)
