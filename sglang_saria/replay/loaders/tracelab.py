"""TraceLab round traces (`tracelab:FILE`, round_trace.jsonl): token counts and timestamps only.

TraceLab records no prompt content, so prefixes are rebuilt from within-session lengths
(paper 5.1). Each round extends a per-session token stream: round i's stream is its input
followed by its output (the output is context of the next round). Round i shares its first
min(prefix_tokens_i, input_{i-1} + output_{i-1}) tokens with round i-1's stream; everything
after is content new to round i. Blocks inside the shared prefix keep round i-1's keys; a
later block j gets the deterministic content row (round i, block j) chained on its
predecessor, so it is new content and every following block of the round is too. Round 0's
`prefix_tokens` refers to cache state from before the recorded session: we do not invent
cross-session sharing for it, and all of round 0 is session-local content.

Timing: a round's request is sent when its last input event (user message or tool result)
is in -- the model cannot start before every tool result of that round arrived -- or at its
first event if it has none. t is that instant relative to the session's first event;
idle_before_s is the time from the previous round's last event (its completion) to it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import numpy as np

from sglang_saria.replay.trace import TraceFormatError, TraceRequest, TraceSession, chain_keys, scope_seed

_INPUT_EVENTS = {"user_message", "tool_result"}
_FIELDS = ("session_id", "round_index", "input_tokens_total", "prefix_tokens", "output_tokens",
           "timing_events")


def load_tracelab(path: str | Path, block_tokens: int, max_sessions: int | None = None) -> list[TraceSession]:
    """Sessions in order of their first event (the paper selects TraceLab sessions by start time)."""
    path = Path(path)
    rows: dict[str, list[tuple[int, int, dict]]] = defaultdict(list)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc}") from exc
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{path}:{lineno}: bad JSON: {exc}") from exc
        missing = [f for f in _FIELDS if not isinstance(row, dict) or row.get(f) is None]
        if missing:
            raise TraceFormatError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
        rows[str(row["session_id"])].append((row["round_index"], lineno, row))
    sessions = [_session(path, sid, sorted(rs, key=lambda r: r[0]), block_tokens)
                for sid, rs in rows.items()]
    sessions.sort(key=lambda s: s[0])
    return [s for _, s in sessions[:max_sessions]]


def _session(path: Path, sid: str, rounds: list[tuple[int, int, dict]],
             block_tokens: int) -> tuple[float, TraceSession]:
    """(epoch seconds of the first event, session)."""
    seed = scope_seed("tracelab", sid)
    origin: float | None = None
    prev_end = 0.0
    prev_t = 0.0
    prev_stream = 0
    prev_keys = np.empty(0, dtype=np.uint64)
    out: list[TraceRequest] = []
    for k, (index, lineno, row) in enumerate(rounds):
        where = f"{path}:{lineno}: session {sid} round {index}"
        if k and index == rounds[k - 1][0]:
            raise TraceFormatError(f"{where}: duplicate round_index")
        n_in, n_out, prefix = row["input_tokens_total"], row["output_tokens"], row["prefix_tokens"]
        if min(n_in, n_out, prefix) < 0:
            raise TraceFormatError(f"{where}: negative token count")
        times = _event_times(where, row["timing_events"])
        if origin is None:
            origin = times[0][1]
        inputs = [ts for kind, ts in times if kind in _INPUT_EVENTS]
        t = (inputs[-1] if inputs else times[0][1]) - origin
        if t < prev_t:
            raise TraceFormatError(f"{where}: round arrives before the previous one ({t:.3f} s < {prev_t:.3f} s)")
        idle = max(0.0, t - prev_end) if k else 0.0
        shared = min(prefix, prev_stream) if k else 0
        reuse = min(shared // block_tokens, prev_keys.size)
        stream_blocks = (n_in + n_out) // block_tokens
        new = np.empty((max(0, stream_blocks - reuse), 2), dtype=np.uint64)
        new[:, 0] = index
        new[:, 1] = np.arange(reuse, reuse + new.shape[0], dtype=np.uint64)
        start = int(prev_keys[reuse - 1]) if reuse else seed
        keys = np.concatenate([prev_keys[:reuse], chain_keys(new, start)])
        out.append(TraceRequest(t, idle, n_in, n_out, keys[: n_in // block_tokens]))
        prev_t, prev_end = t, max(ts for _, ts in times) - origin
        prev_stream, prev_keys = n_in + n_out, keys
    return origin or 0.0, TraceSession(sid, out)


def _event_times(where: str, events: list) -> list[tuple[str, float]]:
    if not events:
        raise TraceFormatError(f"{where}: no timing_events")
    try:
        return [(e.get("event_type", ""), datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp())
                for e in events]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise TraceFormatError(f"{where}: bad timing_events timestamp: {exc}") from exc
