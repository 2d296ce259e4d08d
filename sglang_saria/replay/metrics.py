"""Replay metrics (paper 5.1): CHAR, SSD write/read volume against the DWPD budget,
modelled transfer time and TTFT. ``P25 bad`` is the mean of the largest 25% of a
latency; for CHAR it is the hit ratio over the quarter of requests with the lowest
per-request CHAR (only requests with achievable reuse count)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

RESULT_KEYS = (
    "policy",
    "char",
    "char_p25_bad",
    "ssd_write_bytes",
    "ssd_read_bytes",
    "ssd_writes_norm",
    "ssd_reads_norm",
    "write_budget_norm",
    "writes_never_read_frac",
    "dram_only_hit_request_frac",
    "dram_evictions",
    "transfer_mean_s",
    "transfer_p25_bad_s",
    "ttft_mean_s",
    "ttft_p90_s",
    "ttft_p25_bad_s",
    "requests",
    "blocks_hit",
    "blocks_achievable",
    "drain_s",
    "queue_mean_s",
    "queue_p90_s",
    "request_set",
    "ssd_write_busy_frac",
    "promoted_bytes",
)


@dataclass
class RequestLog:
    """Per-request outcomes, appended in completion order.

    The time-series fields (completion time, hit sources, cumulative SSD bytes written)
    feed the report's source-mix and write-budget figures; they stay empty when the
    caller does not pass them.
    """

    hit_blocks: list[int] = field(default_factory=list)
    achievable_blocks: list[int] = field(default_factory=list)
    used_ssd: list[bool] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    done_s: list[float] = field(default_factory=list)
    ssd_hit_blocks: list[int] = field(default_factory=list)
    ssd_bytes_written: list[int] = field(default_factory=list)
    queue_s: list[float] = field(default_factory=list)  # waited for an in-flight slot before admission

    def add(self, hit: int, achievable: int, used_ssd: bool, transfer_s: float, ttft_s: float,
            done_s: float | None = None, ssd_hit: int = 0, ssd_bytes_written: int = 0, queue_s: float = 0.0) -> None:
        self.hit_blocks.append(hit)
        self.queue_s.append(queue_s)
        self.achievable_blocks.append(achievable)
        self.used_ssd.append(used_ssd)
        self.transfer_s.append(transfer_s)
        self.ttft_s.append(ttft_s)
        if done_s is not None:
            self.done_s.append(done_s)
            self.ssd_hit_blocks.append(ssd_hit)
            self.ssd_bytes_written.append(ssd_bytes_written)

    def __len__(self) -> int:
        return len(self.ttft_s)


def peak_window_bytes(times: np.ndarray, cumulative_bytes: np.ndarray, window_s: float) -> float:
    """Most bytes written within any ``window_s`` (a sliding DWPD window), from cumulative
    writes sampled at increasing ``times``: each sample's total minus the last one a window before."""
    t = np.asarray(times, dtype=np.float64)
    w = np.asarray(cumulative_bytes, dtype=np.float64)
    if not len(t):
        return 0.0
    before = np.searchsorted(t, t - window_s, side="right") - 1
    return float(np.max(w - np.where(before >= 0, w[np.maximum(before, 0)], 0.0)))


def p25_bad(values: np.ndarray) -> float:
    """Mean of the largest quarter (at least one sample); 0 for no samples."""
    if len(values) == 0:
        return 0.0
    k = max(1, math.ceil(len(values) / 4))
    return float(np.mean(np.sort(values)[-k:]))


def char_ratio(hits: np.ndarray, achievable: np.ndarray) -> float:
    """Hit block occurrences over achievable ones; 1.0 when nothing was achievable."""
    total = int(achievable.sum())
    return float(hits.sum() / total) if total else 1.0


def char_p25_bad(hits: np.ndarray, achievable: np.ndarray) -> float:
    """CHAR over the quarter of eligible requests with the lowest per-request CHAR."""
    eligible = achievable > 0
    h, a = hits[eligible], achievable[eligible]
    if len(a) == 0:
        return 1.0
    order = np.argsort(h / a, kind="stable")
    k = max(1, math.ceil(len(a) / 4))
    worst = order[:k]
    return char_ratio(h[worst], a[worst])


def summarize(
    policy: str,
    log: RequestLog,
    *,
    ssd_write_bytes: int,
    ssd_read_bytes: int,
    ssd_capacity_bytes: int,
    writes_never_read_frac: float,
    dram_evictions: int,
    days_replayed: float,
    dwpd: float = 1.0,
    drain_s: float = 0.0,
    request_set: str = "",
    ssd_write_busy_s: float = 0.0,
    promoted_bytes: int = 0,
) -> dict[str, float | int | str]:
    """The result record of one policy, with exactly ``RESULT_KEYS``. ``request_set`` names the
    requests scored (``same_requests`` compares it); ``drain_s`` is when the last one finished."""
    hits = np.asarray(log.hit_blocks, dtype=np.int64)
    ach = np.asarray(log.achievable_blocks, dtype=np.int64)
    used_ssd = np.asarray(log.used_ssd, dtype=bool)
    transfer = np.asarray(log.transfer_s, dtype=np.float64)
    ttft = np.asarray(log.ttft_s, dtype=np.float64)
    queue = np.asarray(log.queue_s, dtype=np.float64)
    hit_req = hits > 0
    xfer = transfer[hit_req]
    cap = ssd_capacity_bytes
    out = {
        "policy": policy,
        "char": char_ratio(hits, ach),
        "char_p25_bad": char_p25_bad(hits, ach),
        "ssd_write_bytes": int(ssd_write_bytes),
        "ssd_read_bytes": int(ssd_read_bytes),
        "ssd_writes_norm": ssd_write_bytes / cap if cap else 0.0,
        "ssd_reads_norm": ssd_read_bytes / cap if cap else 0.0,
        "write_budget_norm": dwpd * days_replayed,
        "writes_never_read_frac": float(writes_never_read_frac),
        "dram_only_hit_request_frac": float(np.mean(~used_ssd[hit_req])) if hit_req.any() else 0.0,
        "dram_evictions": int(dram_evictions),
        "transfer_mean_s": float(xfer.mean()) if len(xfer) else 0.0,
        "transfer_p25_bad_s": p25_bad(xfer),
        "ttft_mean_s": float(ttft.mean()) if len(ttft) else 0.0,
        "ttft_p90_s": float(np.percentile(ttft, 90)) if len(ttft) else 0.0,
        "ttft_p25_bad_s": p25_bad(ttft),
        "requests": len(log),
        "blocks_hit": int(hits.sum()),
        "blocks_achievable": int(ach.sum()),
        "drain_s": float(drain_s),
        "queue_mean_s": float(queue.mean()) if len(queue) else 0.0,
        "queue_p90_s": float(np.percentile(queue, 90)) if len(queue) else 0.0,
        "request_set": request_set,
        "ssd_write_busy_frac": ssd_write_busy_s / drain_s if drain_s else 0.0,  # the drive's time spent writing
        "promoted_bytes": int(promoted_bytes),
    }
    assert tuple(out) == RESULT_KEYS
    return out


class DifferentRequestsError(ValueError):
    """Policies of one comparison were scored over different requests."""


def same_requests(results: list[dict]) -> list[dict]:
    """``results`` if every one was scored over the same requests, else an error naming them.

    A comparison of policies means the same requests: a policy that served fewer (a cut workload,
    an interrupted replay) has not cut its writes or its TTFT by as much as its totals say."""
    sets = {(r["request_set"], r["requests"]) for r in results}
    if len(sets) > 1:
        rows = ", ".join(f"{r['policy']}: {r['requests']} requests (set {r['request_set'] or '?'})" for r in results)
        raise DifferentRequestsError(f"policies scored over different requests: {rows}")
    return results


def format_table(results: list[dict]) -> str:
    """Fixed-width table of the headline metrics, one row per policy."""
    cols = [
        ("policy", "policy", "{}"),
        ("CHAR", "char", "{:.3f}"),
        ("CHAR25b", "char_p25_bad", "{:.3f}"),
        ("SSD W/C", "ssd_writes_norm", "{:.3f}"),
        ("budget", "write_budget_norm", "{:.3f}"),
        ("W unread", "writes_never_read_frac", "{:.3f}"),
        ("SSD R/C", "ssd_reads_norm", "{:.3f}"),
        ("DRAM-only", "dram_only_hit_request_frac", "{:.3f}"),
        ("DRAM ev", "dram_evictions", "{}"),
        ("xfer ms", "transfer_mean_s", "{:.1f}", 1000.0),
        ("xfer25b ms", "transfer_p25_bad_s", "{:.1f}", 1000.0),
        ("TTFT s", "ttft_mean_s", "{:.3f}"),
        ("P90 s", "ttft_p90_s", "{:.3f}"),
        ("P25b s", "ttft_p25_bad_s", "{:.3f}"),
        ("reqs", "requests", "{}"),
        ("drain h", "drain_s", "{:.1f}", 1 / 3600.0),
        ("queue s", "queue_mean_s", "{:.1f}"),
    ]
    rows = [[c[0] for c in cols]]
    for r in results:
        row = []
        for c in cols:
            v = r[c[1]]
            if len(c) == 4:
                v = v * c[3]
            row.append(c[2].format(v))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
    return "\n".join(lines)
