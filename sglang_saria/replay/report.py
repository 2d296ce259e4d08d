"""``saria-replay --report DIR``: a self-contained Markdown report with PNG figures.

So a person can look instead of read: the results table, the write-vs-TTFT trade-off
(paper Figure 10), the per-request transfer-time CDF, the DRAM/SSD source mix of reused
blocks over time, and cumulative SSD writes against the DWPD budget line (the view in
which the ``budget:<DWPD>`` controller's tracking is visible). Figures are PNG files
next to ``report.md``, referenced by relative path, so the folder can be moved whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sglang_saria.replay.metrics import RequestLog, format_table
from sglang_saria.replay.plot import plot_tradeoff, pyplot, save_figure
from sglang_saria.units import SECONDS_PER_DAY

FIGURES = {
    "tradeoff": "tradeoff.png",
    "transfer_cdf": "transfer_cdf.png",
    "source_mix": "source_mix.png",
    "ssd_writes": "ssd_writes_vs_budget.png",
}
SECTIONS = ("Configuration", "Results", "Trade-off", "Transfer-time CDF", "Source mix over time", "SSD writes vs budget")




def plot_transfer_cdf(results: list[dict], logs: list[RequestLog], path: Path) -> None:
    """Empirical CDF of modelled transfer time over requests that reused cached blocks."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for r, log in zip(results, logs):
        hit = np.asarray(log.hit_blocks) > 0
        x = np.sort(np.asarray(log.transfer_s)[hit]) * 1000.0
        if len(x):
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=r["policy"])
    ax.set_xlabel("transfer time per request (ms, modelled)")
    ax.set_ylabel("fraction of requests with a hit")
    save_figure(fig, ax, path, dpi=110)


def source_mix(log: RequestLog, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin edges in hours, rows [DRAM hits, SSD hits, missed reuse] in blocks per bin)."""
    t = np.asarray(log.done_s) / 3600.0
    hit = np.asarray(log.hit_blocks)
    ssd = np.asarray(log.ssd_hit_blocks)
    missed = np.maximum(0, np.asarray(log.achievable_blocks) - hit)
    edges = np.linspace(0.0, float(t.max()) if len(t) else 1.0, bins + 1)
    rows = [np.histogram(t, edges, weights=w)[0] for w in (hit - ssd, ssd, missed)]
    return edges, np.array(rows)


def plot_source_mix(results: list[dict], logs: list[RequestLog], path: Path, bins: int = 48) -> None:
    """Where reused blocks came from over time, one panel per policy (stacked shares)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(results), 1, figsize=(6.0, 1.8 * len(results) + 0.6), sharex=True, squeeze=False)
    for ax, r, log in zip(axes[:, 0], results, logs):
        edges, rows = source_mix(log, bins)
        total = rows.sum(axis=0)
        share = np.divide(rows, total, out=np.zeros_like(rows, dtype=float), where=total > 0)
        ax.stackplot(edges[:-1], share, step="post", labels=["DRAM hit", "SSD hit", "missed reuse"],
                     colors=["tab:blue", "tab:orange", "lightgray"])
        ax.set_ylim(0, 1)
        ax.set_ylabel("share", fontsize=8)
        ax.set_title(r["policy"], fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("time (h, logical)")
    save_figure(fig, None, path, dpi=110)


def plot_ssd_writes(results: list[dict], logs: list[RequestLog], path: Path, capacity_bytes: int, dwpd: float) -> None:
    """Cumulative SSD writes (in drive capacities) against the ``dwpd * t`` budget line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    t_end = 0.0
    for r, log in zip(results, logs):
        t = np.asarray(log.done_s) / 3600.0
        if len(t):
            ax.step(t, np.asarray(log.ssd_bytes_written) / capacity_bytes, where="post", label=r["policy"])
            t_end = max(t_end, float(t[-1]))
    ax.plot([0, t_end], [0, dwpd * t_end / 24.0], "k--", lw=1.2, label=f"budget ({dwpd:g} DWPD)")
    ax.set_xlabel("time (h, logical)")
    ax.set_ylabel("cumulative SSD writes / capacity")
    save_figure(fig, ax, path, dpi=110)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of already formatted cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _md_table(results: list[dict]) -> str:
    cols = [("policy", "policy", "{}"), ("CHAR", "char", "{:.3f}"), ("CHAR P25-bad", "char_p25_bad", "{:.3f}"),
            ("SSD writes / C", "ssd_writes_norm", "{:.3f}"), ("budget / C", "write_budget_norm", "{:.3f}"),
            ("writes never read", "writes_never_read_frac", "{:.3f}"), ("SSD reads / C", "ssd_reads_norm", "{:.3f}"),
            ("mean transfer ms", "transfer_mean_s", "{:.1f}"), ("mean TTFT s", "ttft_mean_s", "{:.3f}"),
            ("P90 TTFT s", "ttft_p90_s", "{:.3f}"), ("requests", "requests", "{}")]
    return md_table([c[0] for c in cols],
                    [[c[2].format(r[c[1]] * 1000.0 if c[1] == "transfer_mean_s" else r[c[1]]) for c in cols] for r in results])


def write_report(out: dict[str, Any], logs: list[RequestLog], directory: str, dwpd: float = 1.0) -> Path:
    """Write ``report.md`` and its figures into ``directory``; returns the Markdown path."""
    results = out["results"]
    if not results or len(logs) != len(results):
        raise ValueError(f"report: need one request log per result, got {len(logs)} logs for {len(results)} results")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cfg = out["config"]
    capacity = cfg["capacity"]["ssd_tokens"] * cfg["kv_bytes_per_token"]
    plot_tradeoff(out, str(d / FIGURES["tradeoff"]))
    plot_transfer_cdf(results, logs, d / FIGURES["transfer_cdf"])
    plot_source_mix(results, logs, d / FIGURES["source_mix"])
    if capacity:
        plot_ssd_writes(results, logs, d / FIGURES["ssd_writes"], capacity, dwpd)
    keys = ("trace", "sessions", "requests", "window_s", "seed", "model", "in_flight", "prefill_tokens_per_s", "horizon_s")
    conf = "\n".join(f"| {k} | {cfg[k]} |" for k in keys if k in cfg)
    cap = cfg["capacity"]
    md = [
        "# Saria replay report",
        "",
        f"Trace `{cfg['trace']}`, model `{cfg['model']}`; policies replayed on the identical workload."
        + (" **Interrupted: partial results.**" if cfg.get("interrupted") else ""),
        "",
        "## Configuration",
        "",
        "| key | value |",
        "|---|---|",
        conf,
        f"| DRAM / SSD tokens | {cap['dram_tokens']} / {cap['ssd_tokens']} |",
        f"| SSD capacity C | {capacity / 1e12:.3f} TB |",
        "",
        "## Results",
        "",
        _md_table(results),
        "",
        "```",
        format_table(results),
        "```",
        "",
        "## Trade-off",
        "",
        "Mean TTFT against SSD writes (in capacities), one point per policy; the band spans the write budget "
        "from the session-start window to the replayed period (paper Figure 10).",
        "",
        f"![trade-off]({FIGURES['tradeoff']})",
        "",
        "## Transfer-time CDF",
        "",
        "Per-request modelled transfer time (DRAM and SSD reloads), requests that reused cached blocks.",
        "",
        f"![transfer CDF]({FIGURES['transfer_cdf']})",
        "",
        "## Source mix over time",
        "",
        "Share of achievable reused blocks served from DRAM, from SSD, or recomputed (missed), per time bin.",
        "",
        f"![source mix]({FIGURES['source_mix']})",
        "",
        "## SSD writes vs budget",
        "",
        f"Cumulative SSD writes against the {dwpd:g}-DWPD budget line (capacity x DWPD x elapsed days).",
        "",
        f"![SSD writes vs budget]({FIGURES['ssd_writes']})" if capacity else "No SSD tier (capacity 0): no write budget.",
        "",
    ]
    path = d / "report.md"
    path.write_text("\n".join(md))
    return path
