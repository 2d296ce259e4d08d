"""Shortened real agent sessions for server runs: WEKA Claude Code traces turned into token ids.

Used by the end-to-end tests and `scripts/bench_serving.py` (and its GPU check).

Each 64-token block of a trace becomes one token derived from its chained key, so equal
prefixes in the trace give equal token prefixes (and the reuse structure survives), while a
request stays small enough for a CPU server with tiny pools.
"""

from __future__ import annotations

from pathlib import Path

from sglang_saria.replay.loaders import load_trace, shared_dir

SESSIONS = ("trace_0002", "trace_0003/sub1", "trace_0003/sub2", "trace_0004")


def weka_dir() -> Path:
    path = shared_dir() / "traces" / "weka-cc"
    if not path.is_dir():
        raise FileNotFoundError(f"WEKA traces not found at {path} (set SARIA_SHARED_DIR)")
    return path


def agent_requests(
    requests_per_session: int = 5, max_tokens: int = 400, vocab: int = 1000, weka: Path | None = None
) -> list[list[int]]:
    """Requests of a few WEKA sessions, interleaved round-robin as concurrent agents would be.

    ``weka``: the weka-cc trace directory (default: ../shared/traces/weka-cc or $SARIA_SHARED_DIR).
    """
    path = weka or weka_dir()
    sessions = {s.session_id: s for s in load_trace(f"weka:{path}", block_tokens=64, max_sessions=4)}
    streams = []
    for name in SESSIONS:
        turns = sessions[name].requests[:requests_per_session]
        streams.append([[int(k % vocab) + 1 for k in r.block_keys[:max_tokens]] for r in turns])
    return [stream[i] for i in range(requests_per_session) for stream in streams if i < len(stream)]
