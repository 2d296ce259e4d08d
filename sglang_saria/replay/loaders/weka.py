"""WEKA Claude Code traces (`weka:DIR`): one JSON(.gz) file per agent session.

Each request lists one hash id per 64-token input block; ids are local to their file, so
keys are scoped by file id and by model (a KV cache is only reusable by the model that
computed it, as in the paper's "block identities scoped by source trace and model").

Timing rules (documented here because the replay depends on them):
- `t` of a request is seconds since its session's start.
- idle_before_s = t_k - (t_{k-1} + api_time_{k-1}), clamped at 0; when the previous request
  has no `api_time`, idle_before_s = t_k - t_{k-1}. It includes the time a parent spent
  waiting for its sub-agents, which is what the recording shows.
- A "subagent" marker carries its conversation's own `requests` (t relative to the
  sub-agent's start). A "completed" marker is stamped at the sub-agent's completion, so its
  start is `t - duration_ms/1000`; a marker without `duration_ms` ("async_launched") is
  stamped at launch. The sub-agent becomes a TraceSession "<file id>/sub<n>" (n counts
  markers in the file from 1) placed right after its parent, with `start_offset_s` = that
  start and `after_request` = the parent request just before the marker.
"""

from __future__ import annotations

import gzip
import re
import warnings
import zlib
from pathlib import Path

import msgspec
import numpy as np

from sglang_saria.replay.trace import (
    KeyChain,
    TraceFormatError,
    TraceRequest,
    TraceSession,
    regroup,
    scope_seed,
)


_MISSING = msgspec.Raw(b"")


class _Request(msgspec.Struct):
    t: float
    type: str
    in_: int | None = msgspec.field(default=None, name="in")
    out: int | None = None
    hash_ids: msgspec.Raw = _MISSING  # parsed by numpy: ~5x faster than a list of ints
    model: str = ""
    api_time: float | None = None
    duration_ms: float | None = None
    requests: list["_Request"] | None = None


class _File(msgspec.Struct):
    block_size: int
    requests: list[_Request]
    id: str | None = None


_DECODER = msgspec.json.Decoder(_File)
_REQ_PATH = re.compile(r"\$\.requests\[(\d+)\]")


def load_weka(directory: str | Path, block_tokens: int, max_sessions: int | None = None) -> list[TraceSession]:
    root = Path(directory)
    if not root.is_dir():
        raise TraceFormatError(f"weka trace directory {root} does not exist")
    files = sorted(p for p in root.iterdir() if re.fullmatch(r"trace_.*\.json(\.gz)?", p.name))
    if not files:
        raise TraceFormatError(f"{root}: no trace_*.json or trace_*.json.gz files")
    if max_sessions is not None:
        files = files[:max_sessions]
    sessions: list[TraceSession] = []
    for path in files:
        sessions.extend(load_weka_file(path, block_tokens))
    return sessions


def load_weka_file(path: Path, block_tokens: int) -> list[TraceSession]:
    """The file's session followed by its sub-agent sessions."""
    doc = _decode(path)
    file_id = doc.id or path.name.split(".")[0]
    if doc.block_size <= 0:
        raise TraceFormatError(f"{path}: block_size must be positive, got {doc.block_size}")
    if block_tokens % doc.block_size and doc.block_size % block_tokens:
        raise TraceFormatError(
            f"{path}: block_tokens={block_tokens} must be a multiple of the trace's "
            f"block_size {doc.block_size} (or divide it)"
        )
    parent_reqs: list[_Request] = []
    children: list[TraceSession] = []
    for i, req in enumerate(doc.requests):
        if req.type != "subagent":
            parent_reqs.append(req)
            continue
        if not req.requests:
            raise TraceFormatError(f"{path}: request {i}: subagent marker without `requests`")
        start = req.t - (req.duration_ms / 1000.0 if req.duration_ms is not None else 0.0)
        if req.t < 0 or start < 0:
            raise TraceFormatError(f"{path}: request {i}: subagent starts at negative time {start}")
        sid = f"{file_id}/sub{len(children) + 1}"
        sub = _session(path, f"request {i}: subagent request", sid, req.requests,
                       list(range(len(req.requests))), file_id, doc.block_size, block_tokens)
        sub.parent_id, sub.start_offset_s, sub.after_request = file_id, start, len(parent_reqs) - 1
        children.append(sub)
    positions = [i for i, r in enumerate(doc.requests) if r.type != "subagent"]
    parent = _session(path, "request", file_id, parent_reqs, positions, file_id, doc.block_size,
                      block_tokens)
    return [parent, *children]


def _decode(path: Path) -> _File:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        what = "gzip data" if path.suffix == ".gz" else "file"
        raise TraceFormatError(f"{path}: cannot read {what}: {exc}") from exc
    try:
        return _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        m = _REQ_PATH.search(str(exc))
        where = f"request {m.group(1)}: " if m else ""
        raise TraceFormatError(f"{path}: {where}{exc}") from exc
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: invalid JSON: {exc}") from exc


def _session(path: Path, what: str, sid: str, reqs: list[_Request], positions: list[int],
             file_id: str, source_tokens: int, block_tokens: int) -> TraceSession:
    """Validate and convert one conversation; `positions` are the indices in the file (for errors)."""
    chain = KeyChain()
    out: list[TraceRequest] = []
    prev: _Request | None = None
    for k, req in enumerate(reqs):
        where = f"{path}: {what} {positions[k]}"
        if req.type == "subagent":
            raise TraceFormatError(f"{where}: nested subagent markers are not supported")
        for name, value in (("in", req.in_), ("out", req.out), ("hash_ids", req.hash_ids or None)):
            if value is None:
                raise TraceFormatError(f"{where}: missing field `{name}`")
        if req.t < 0 or req.in_ < 0 or req.out < 0:
            raise TraceFormatError(f"{where}: negative value (t={req.t}, in={req.in_}, out={req.out})")
        if prev is not None and req.t < prev.t:
            raise TraceFormatError(f"{where}: time goes backwards (t={req.t} < previous {prev.t})")
        ids = _parse_ids(where, req.hash_ids)
        lo, hi = req.in_ // source_tokens, -(-req.in_ // source_tokens)
        if not lo <= ids.size <= hi:
            raise TraceFormatError(
                f"{where}: {ids.size} hash_ids for {req.in_} input tokens (expected {lo}..{hi} "
                f"blocks of {source_tokens})"
            )
        units = regroup(ids, source_tokens, block_tokens, req.in_)
        keys = chain.keys(units, scope_seed("weka", file_id, req.model))
        if prev is None:
            idle = 0.0
        elif prev.api_time is not None:
            idle = max(0.0, req.t - prev.t - prev.api_time)
        else:
            idle = req.t - prev.t
        out.append(TraceRequest(req.t, idle, req.in_, req.out, keys))
        prev = req
    return TraceSession(sid, out)


def _parse_ids(where: str, raw: msgspec.Raw) -> np.ndarray:
    text = bytes(raw)
    if not (text.startswith(b"[") and text.endswith(b"]")):
        raise TraceFormatError(f"{where}: hash_ids is not a list")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            return np.fromstring(text[1:-1], dtype=np.uint64, sep=",")
    except (ValueError, DeprecationWarning) as exc:
        raise TraceFormatError(f"{where}: hash_ids must be non-negative integers") from exc
