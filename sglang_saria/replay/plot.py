"""Write-vs-TTFT trade-off figure (paper Figure 10): one point per policy, with the
SSD write budget (1 DWPD x capacity x days) as a band from the session-start window
to the replayed span."""

from __future__ import annotations

from typing import Any

from sglang_saria.units import SECONDS_PER_DAY


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display on servers or CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, ax: Any, path: Any, legend_loc: str = "best", dpi: int = 120) -> None:
    """Common finish of every figure: legend, grid, tight layout, PNG, release memory."""
    if ax is not None:
        ax.legend(fontsize=7, loc=legend_loc)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def plot_tradeoff(out: dict[str, Any], path: str) -> None:
    plt = pyplot()
    results = out["results"]
    if not results:
        raise ValueError("plot: no results to draw")
    window_days = out["config"]["window_s"] / SECONDS_PER_DAY
    span_days = max(r["write_budget_norm"] for r in results)
    lo, hi = sorted((window_days, span_days))
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    ax.axhspan(lo, hi, color="tab:green", alpha=0.15, label=f"write budget ({lo:.2f}-{hi:.2f} C)")
    for r in results:
        ax.scatter(r["ttft_mean_s"], r["ssd_writes_norm"], s=36)
        ax.annotate(r["policy"], (r["ttft_mean_s"], r["ssd_writes_norm"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("mean TTFT (s, modelled)")
    ax.set_ylabel("SSD writes / SSD capacity")
    ax.set_title(f"{out['config']['trace']}  {out['config']['model']}", fontsize=9)
    save_figure(fig, ax, path, legend_loc="upper right")
