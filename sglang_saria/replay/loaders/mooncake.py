"""Mooncake-style traces (`mooncake:FILE`): jsonl of timestamp (ms), input/output length, hash_ids.

hash_ids are global to the file (one per `source_block_tokens` input block, 512 in the
published Mooncake traces, the last one covering a partial block), so all requests chain
from one file-scoped seed and shared prefixes across requests share keys. The format has no
sessions: every request is its own session starting at its timestamp (start_offset_s,
relative to the first request) unless rows carry `session_id` or `session`, in which case
rows are grouped into sessions in order of their first row, t is relative to the session's
first row and idle_before_s is the recorded inter-arrival gap (no durations are recorded).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sglang_saria.replay.trace import (
    KeyChain,
    TraceFormatError,
    TraceRequest,
    TraceSession,
    regroup,
    scope_seed,
)

MOONCAKE_BLOCK_TOKENS = 512


def load_mooncake(path: str | Path, block_tokens: int, max_sessions: int | None = None,
                  source_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[TraceSession]:
    path = Path(path)
    if block_tokens % source_block_tokens and source_block_tokens % block_tokens:
        raise TraceFormatError(
            f"{path}: block_tokens={block_tokens} must be a multiple of the trace's block size "
            f"{source_block_tokens} (or divide it)"
        )
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc}") from exc
    seed = scope_seed("mooncake", path.name)
    groups: dict[str, list[tuple[float, int, int, np.ndarray]]] = {}
    t0: float | None = None
    prev_ts = float("-inf")
    index = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno} (request {index})"
        row = _row(where, line)
        ts = row["timestamp"] / 1000.0
        if ts < prev_ts:
            raise TraceFormatError(f"{where}: timestamp goes backwards ({row['timestamp']} ms)")
        t0 = ts if t0 is None else t0
        prev_ts = ts
        ids = np.asarray(row["hash_ids"], dtype=np.uint64)
        n_in = row["input_length"]
        if ids.size < -(-n_in // source_block_tokens) - 1 or ids.size > -(-n_in // source_block_tokens):
            raise TraceFormatError(
                f"{where}: {ids.size} hash_ids for {n_in} input tokens (blocks of {source_block_tokens})"
            )
        sid = row.get("session_id", row.get("session"))
        key = f"{path.stem}/{index}" if sid is None else str(sid)
        units = regroup(ids, source_block_tokens, block_tokens, n_in)
        groups.setdefault(key, []).append((ts, n_in, row["output_length"], units))
        index += 1
    sessions = []
    for sid, reqs in list(groups.items())[:max_sessions]:
        chain = KeyChain()
        start = reqs[0][0]
        out = [TraceRequest(ts - start, ts - reqs[k - 1][0] if k else 0.0, n_in, n_out, chain.keys(units, seed))
               for k, (ts, n_in, n_out, units) in enumerate(reqs)]
        sessions.append(TraceSession(sid, out, start_offset_s=start - t0))
    return sessions


def _row(where: str, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: bad JSON: {exc}") from exc
    if not isinstance(row, dict):
        raise TraceFormatError(f"{where}: expected a JSON object")
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if name not in row:
            raise TraceFormatError(f"{where}: missing field `{name}`")
    if not isinstance(row["hash_ids"], list) or not all(isinstance(h, int) and h >= 0 for h in row["hash_ids"]):
        raise TraceFormatError(f"{where}: hash_ids must be a list of non-negative integers")
    for name in ("timestamp", "input_length", "output_length"):
        if not isinstance(row[name], (int, float)) or row[name] < 0:
            raise TraceFormatError(f"{where}: `{name}` must be a non-negative number, got {row[name]!r}")
    return row
