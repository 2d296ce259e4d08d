"""``saria-plan``: pick the admission policy for an SSD's endurance rating (beyond the paper).

The paper shows the threshold that meets a DWPD budget depends on workload and model
and leaves the choice to the operator. The planner replays the trace once per candidate
policy (each on the identical workload, in parallel processes), draws the Pareto front
of SSD writes against CHAR P25-bad and modelled TTFT, marks the points whose writes fit
the drives' budget over the replayed period, and recommends the lowest mean TTFT among
them. It also prints the paper's Table 1 arithmetic (section 2.2) for the drives at the
replay's measured full-duplicate write rate. The SSD cache defaults to the drives'
capacity in tokens (``--ssd-tokens`` overrides it; the budget always follows the drives).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np

from sglang_saria.config import ConfigError, parse_duration_s, parse_token_count
from sglang_saria.model_specs import ModelSpec, get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.plot import pyplot, save_figure

logger = logging.getLogger(__name__)

SECONDS_PER_DAY = 86400.0
DAYS_PER_YEAR = 365.0
DEFAULT_SWEEP = [
    "none",  # DRAM-only: writes nothing, so the recommendation is never worse than not using the SSD
    "full-duplicate",
    "eviction:E2",
    "eviction:E3",
    "eviction:E4",
    "eviction:E5",
    "eviction:E6",
    "eviction:E8",
    "reuse:R4",
    "combined:E3R4",
]
POINT_KEYS = ("policy", "ssd_write_bytes", "char", "char_p25_bad", "ttft_mean_s", "within_budget")

_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class PlanError(ValueError):
    """Bad planner input; the message names the flag and value."""


# ------------------------------------------------------------------ drives
@dataclass(frozen=True)
class Drive:
    """An SSD's endurance rating: rated host writes = capacity * DWPD * 365 * years."""

    capacity_bytes: int
    dwpd: float
    years: float

    @property
    def bytes_per_day(self) -> float:
        return self.capacity_bytes * self.dwpd

    @property
    def rated_write_bytes(self) -> float:
        return self.bytes_per_day * DAYS_PER_YEAR * self.years


def parse_bytes(text: str, flag: str) -> int:
    """``1.92TB``, ``960GB``, ``4TiB`` or a byte count -> bytes (decimal units as vendors rate)."""
    m = _BYTES_RE.match(str(text))
    if not m or m.group(2).lower() not in _BYTE_UNITS:
        raise PlanError(f"{flag}={text!r}: not a size (use e.g. 1.92TB, 960GB, 4TiB)")
    n = int(float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()])
    if n <= 0:
        raise PlanError(f"{flag}={text!r}: capacity must be positive")
    return n


def _positive(text: str, flag: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise PlanError(f"{flag}={text!r}: not a number") from None
    if not (v > 0 and np.isfinite(v)):
        raise PlanError(f"{flag}={text!r}: must be a positive number (a zero or negative rating is an impossible budget)")
    return v


def parse_drives(capacities: list[str] | None, dwpds: list[str] | None, years: list[str] | None, copies: int = 1) -> list[Drive]:
    """Drives from repeatable ``--ssd-capacity/--dwpd/--years`` (one value applies to all), times ``--drives``."""
    given = {"--ssd-capacity": capacities or [], "--dwpd": dwpds or [], "--years": years or []}
    missing = [f for f, v in given.items() if not v]
    if missing:
        raise PlanError(f"drive rating is missing {', '.join(missing)} (each drive needs --ssd-capacity, --dwpd and --years, e.g. --ssd-capacity 1.92TB --dwpd 1 --years 5)")
    n = len(given["--ssd-capacity"])
    for f in ("--dwpd", "--years"):
        if len(given[f]) not in (1, n):
            raise PlanError(f"{f} given {len(given[f])} times for {n} --ssd-capacity values: give it once (all drives) or once per drive")
    if copies < 1:
        raise PlanError(f"--drives={copies}: must be >= 1")
    drives = []
    for i, cap in enumerate(given["--ssd-capacity"]):
        d = _positive(given["--dwpd"][i if len(given["--dwpd"]) > 1 else 0], "--dwpd")
        y = _positive(given["--years"][i if len(given["--years"]) > 1 else 0], "--years")
        drives.append(Drive(parse_bytes(cap, "--ssd-capacity"), d, y))
    return drives * copies


def endurance_arithmetic(drives: list[Drive], write_bytes_per_s: float) -> dict[str, float]:
    """Paper 2.2 / Table 1 for a pool striped in proportion to capacity.

    Lifetime: rated writes over the write rate (``1,825C/(86.4B)`` days for 1 DWPD, 5 years);
    the pool wears out with its first drive. Minimum capacity to sustain the rate over the
    rating: daily writes over DWPD (``86.4B`` TB at 1 DWPD, whatever the years).
    """
    total = sum(d.capacity_bytes for d in drives)
    dwpd_eff = sum(d.bytes_per_day for d in drives) / total
    if write_bytes_per_s <= 0:
        life_days = float("inf")
    else:
        life_days = min(d.dwpd * DAYS_PER_YEAR * d.years * total / (write_bytes_per_s * SECONDS_PER_DAY) for d in drives)
    return {
        "write_gb_per_s": write_bytes_per_s / 1e9,
        "lifetime_days": life_days,
        "c_min_bytes": write_bytes_per_s * SECONDS_PER_DAY / dwpd_eff,
        "years": min(d.years for d in drives),
        "dwpd": dwpd_eff,
        "capacity_bytes": total,
    }


# --------------------------------------------------------------- workload
def load_step_starts(sessions: list, window_s: float, step_window_s: float, seed: int) -> np.ndarray:
    """Start times with a load step: the first half of the top-level sessions spread over
    ``window_s``, the second half over ``step_window_s`` right after it (Figure 11's windows
    as a step inside one replay: e.g. 40 min then 10 min is a 4x jump in session arrivals).
    Sub-agent sessions follow their parent as in ``workload.session_starts``."""
    from sglang_saria.replay.workload import session_start_times

    top = [s for s in sessions if s.parent_id is None]
    half = len(top) // 2
    first = session_start_times(half, window_s, seed) if half else np.empty(0)
    second = window_s + session_start_times(len(top) - half, step_window_s, seed + 1)
    by_id = dict(zip((s.session_id for s in top), np.concatenate([first, second])))
    return np.array([by_id[s.session_id] if s.parent_id is None else by_id[s.parent_id] + s.start_offset_s for s in sessions])


# ------------------------------------------------------------------- sweep
_WORK: dict[str, Any] = {}


def _init_worker(sessions: list, starts: np.ndarray, spec: ModelSpec, settings: ReplaySettings) -> None:
    """Process initializer: the workload reaches each worker once (inherited under fork)."""
    _WORK.update(sessions=sessions, starts=starts, spec=spec, settings=settings)


@dataclass(frozen=True)
class SweepPoint:
    """One replayed policy: its ``saria-replay`` result record and the logical time its last request finished."""

    metrics: dict
    span_s: float


def _run_point(index: int, cfg) -> tuple[int, SweepPoint]:
    w = _WORK
    res = replay(w["sessions"], w["starts"], cfg, w["spec"], w["settings"], progress=False, label=cfg.admission.policy)
    return index, SweepPoint(res.metrics, res.end_time_s)


def sweep(cfgs: list, sessions: list, starts: np.ndarray, spec: ModelSpec, settings: ReplaySettings,
          jobs: int, progress: bool = True) -> list[SweepPoint]:
    """Replay every config on the identical workload; results in ``cfgs`` order.

    ``jobs > 1`` runs points in worker processes; each replay is deterministic, so the
    results equal a serial run's.
    """
    from tqdm import tqdm

    results: list[SweepPoint | None] = [None] * len(cfgs)
    with tqdm(total=len(cfgs), desc="sweep", unit="policy", disable=not progress) as bar:
        if jobs <= 1:
            _init_worker(sessions, starts, spec, settings)
            for i, cfg in enumerate(cfgs):
                results[i] = _run_point(i, cfg)[1]
                bar.update(1)
        else:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
            with ProcessPoolExecutor(max_workers=min(jobs, len(cfgs)), mp_context=ctx, initializer=_init_worker,
                                     initargs=(sessions, starts, spec, settings)) as pool:
                futures = [pool.submit(_run_point, i, cfg) for i, cfg in enumerate(cfgs)]
                for fut in as_completed(futures):
                    i, point = fut.result()
                    results[i] = point
                    bar.set_postfix_str(point.metrics["policy"])
                    bar.update(1)
    return results  # type: ignore[return-value]


# ------------------------------------------------------------- decisions
def pareto_front(points: list[dict]) -> list[bool]:
    """Non-dominated points: fewer SSD writes, higher CHAR P25-bad, lower mean TTFT."""

    def dominates(a: dict, b: dict) -> bool:
        no_worse = (a["ssd_write_bytes"] <= b["ssd_write_bytes"] and a["char_p25_bad"] >= b["char_p25_bad"]
                    and a["ttft_mean_s"] <= b["ttft_mean_s"])
        better = (a["ssd_write_bytes"] < b["ssd_write_bytes"] or a["char_p25_bad"] > b["char_p25_bad"]
                  or a["ttft_mean_s"] < b["ttft_mean_s"])
        return no_worse and better

    return [not any(dominates(q, p) for q in points if q is not p) for p in points]


def recommend(points: list[dict]) -> tuple[dict, bool]:
    """(point, feasible): the lowest mean TTFT within budget (ties: fewer writes); with no
    feasible point, the one closest to the budget (fewest writes) and ``False``."""
    feasible = [p for p in points if p["within_budget"]]
    if feasible:
        return min(feasible, key=lambda p: (p["ttft_mean_s"], p["ssd_write_bytes"], p["policy"])), True
    return min(points, key=lambda p: (p["ssd_write_bytes"], p["ttft_mean_s"], p["policy"])), False


def build_plan(results: list[dict], budget_bytes: float) -> dict[str, Any]:
    """The ``--json`` document: budget, recommendation, points (sorted by SSD writes)."""
    if not budget_bytes > 0:
        raise PlanError(f"write budget {budget_bytes!r} bytes: must be positive")
    points = sorted(
        ({"policy": r["policy"], "ssd_write_bytes": int(r["ssd_write_bytes"]), "char": float(r["char"]),
          "char_p25_bad": float(r["char_p25_bad"]), "ttft_mean_s": float(r["ttft_mean_s"]),
          "within_budget": bool(r["ssd_write_bytes"] <= budget_bytes)} for r in results),
        key=lambda p: (p["ssd_write_bytes"], p["policy"]),
    )
    best, _ = recommend(points)
    rec = {k: best[k] for k in ("policy", "ssd_write_bytes", "within_budget", "char_p25_bad", "ttft_mean_s")}
    return {"budget_bytes": float(budget_bytes), "recommendation": rec, "points": points}


# ----------------------------------------------------------------- output
def _tb(n: float) -> str:
    return f"{n / 1e12:.2f}"


def format_plan(plan: dict[str, Any]) -> str:
    """Table of the sweep (front and budget marked) and the recommendation line."""
    front = pareto_front(plan["points"])
    budget = plan["budget_bytes"]
    rows = [["policy", "SSD W TB", "W/budget", "CHAR", "CHAR25b", "TTFT s", "front", "fits"]]
    for p, f in zip(plan["points"], front):
        rows.append([p["policy"], _tb(p["ssd_write_bytes"]), f"{p['ssd_write_bytes'] / budget:.2f}", f"{p['char']:.3f}",
                     f"{p['char_p25_bad']:.3f}", f"{p['ttft_mean_s']:.3f}", "*" if f else "", "yes" if p["within_budget"] else "no"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    rec = plan["recommendation"]
    lines.append(f"write budget over the replayed period: {_tb(budget)} TB  (* = Pareto front: writes, CHAR P25-bad, TTFT)")
    if rec["within_budget"]:
        lines.append(f"recommendation: {rec['policy']} (lowest mean TTFT within budget: {rec['ttft_mean_s']:.3f} s, "
                     f"writes {rec['ssd_write_bytes'] / budget:.2f} of budget, CHAR P25-bad {rec['char_p25_bad']:.3f})")
    else:
        lines.append(f"no policy fits the write budget; closest: {rec['policy']} writes {_tb(rec['ssd_write_bytes'])} TB = "
                     f"{rec['ssd_write_bytes'] / budget:.2f}x the budget (raise thresholds, add drives or a higher DWPD rating)")
    return "\n".join(lines)


def format_endurance(drives: list[Drive], rows: list[tuple[str, dict[str, float]]]) -> str:
    """Table 1 arithmetic lines for the drive pool at each named write rate."""
    pool = ", ".join(f"{_tb(d.capacity_bytes)} TB {d.dwpd:g} DWPD {d.years:g} y" for d in drives)
    out = [f"Table 1 arithmetic (paper 2.2) for {len(drives)} drive(s): {pool}; rated writes {_tb(sum(d.rated_write_bytes for d in drives))} TB"]
    for name, e in rows:
        life = "never" if e["lifetime_days"] == float("inf") else f"{e['lifetime_days']:.0f} days ({e['lifetime_days'] / DAYS_PER_YEAR:.2f} y)"
        out.append(f"  {name}: B = {e['write_gb_per_s']:.3f} GB/s -> lifetime {life}; "
                   f"minimum capacity for {e['years']:g} years at {e['dwpd']:g} DWPD: C_min = {_tb(e['c_min_bytes'])} TB "
                   f"({e['c_min_bytes'] / e['capacity_bytes']:.2f}x the configured {_tb(e['capacity_bytes'])} TB)")
    return "\n".join(out)


def plot_front(plan: dict[str, Any], path: str, band: tuple[float, float], title: str) -> None:
    """SSD writes vs mean TTFT (colour: CHAR P25-bad), the front as a line, the budget as a band."""
    plt = pyplot()
    pts = plan["points"]
    front = pareto_front(pts)
    x = np.array([p["ssd_write_bytes"] for p in pts]) / 1e12
    y = np.array([p["ttft_mean_s"] for p in pts])
    c = np.array([p["char_p25_bad"] for p in pts])
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    lo, hi = sorted(b / 1e12 for b in band)
    ax.axvspan(lo, hi, color="tab:green", alpha=0.15, label=f"write budget band ({lo:.2f}-{hi:.2f} TB)")
    ax.axvline(plan["budget_bytes"] / 1e12, color="tab:green", lw=1.2, label="budget over replayed period")
    sc = ax.scatter(x, y, c=c, cmap="viridis", vmin=0, vmax=1, s=40, zorder=3)
    order = [i for i in np.argsort(x) if front[i]]
    ax.plot(x[order], y[order], color="tab:red", lw=1, zorder=2, label="Pareto front")
    for i, p in enumerate(pts):
        ax.annotate(p["policy"], (x[i], y[i]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    rec = plan["recommendation"]
    ax.scatter([rec["ssd_write_bytes"] / 1e12], [rec["ttft_mean_s"]], marker="*", s=220, facecolors="none",
               edgecolors="black", zorder=4, label=f"recommended: {rec['policy']}")
    fig.colorbar(sc, ax=ax, label="CHAR P25-bad")
    ax.set_xlabel("SSD writes over the replay (TB)")
    ax.set_ylabel("mean TTFT (s, modelled)")
    ax.set_title(title, fontsize=9)
    save_figure(fig, ax, path)


# -------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    from sglang_saria.replay.cli import add_replay_args

    p = argparse.ArgumentParser(prog="saria-plan", description=__doc__.splitlines()[0])
    add_replay_args(p)
    p.set_defaults(ssd_tokens=None)  # default: the drives' capacity in tokens
    p.add_argument("--policy", action="append", default=None,
                   help=f"candidate policy, repeatable (default {' '.join(DEFAULT_SWEEP)}; full-duplicate is always added)")
    p.add_argument("--ssd-capacity", action="append", default=None, help="drive capacity (1.92TB); repeatable, one per drive")
    p.add_argument("--dwpd", action="append", default=None, help="drive writes per day rating; once, or once per drive")
    p.add_argument("--years", action="append", default=None, help="rating period in years; once, or once per drive")
    p.add_argument("--drives", type=int, default=1, help="number of copies of the drive list in the pool")
    p.add_argument("--no-controller", action="store_true", help="do not add the budget:<DWPD> online controller to the sweep")
    p.add_argument("--load-step", default=None,
                   help="second session-start window after --window (e.g. --window 40m --load-step 10m): a load step")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel replay processes (default: CPU count)")
    p.add_argument("--json", dest="json_path", default=None, help="write the plan JSON here")
    p.add_argument("--plot", default=None, help="write the front with the budget band (PNG) here")
    return p


def run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(plan JSON, printed text)."""
    from sglang_saria.replay.cli import build_config
    from sglang_saria.replay.trace import load_trace
    from sglang_saria.replay.workload import apply_limits, session_starts

    drives = parse_drives(args.ssd_capacity, args.dwpd, args.years, args.drives)
    if args.jobs < 1:
        raise PlanError(f"--jobs={args.jobs}: must be >= 1")
    spec = get_model_spec(args.model)
    pool_bytes = sum(d.capacity_bytes for d in drives)
    dwpd_eff = sum(d.bytes_per_day for d in drives) / pool_bytes
    if args.ssd_tokens is None:
        args.ssd_tokens = str(pool_bytes // spec.kv_bytes_per_token)
    policies = list(dict.fromkeys(["full-duplicate", *(args.policy or DEFAULT_SWEEP)]))
    if not args.no_controller:
        policies.append(f"budget:{dwpd_eff:g}")
    cfgs = [build_config(args, p) for p in policies]
    for cfg in cfgs:
        cfg.admission.budget_capacity_bytes = pool_bytes  # the controller's DWPD refers to the drives
    settings = ReplaySettings(
        window_s=parse_duration_s(args.window, "--window"), seed=args.seed, in_flight=args.in_flight,
        prefill_tokens_per_s=args.prefill_tps, horizon_s=parse_duration_s(args.horizon, "--horizon"),
    ).validate()
    sessions = load_trace(args.trace, cfgs[0].metadata.block_tokens, max_sessions=args.sessions)
    sessions = apply_limits(sessions, context_limit_tokens=parse_token_count(args.context_limit, "--context-limit"))
    if args.load_step:
        starts = load_step_starts(sessions, settings.window_s, parse_duration_s(args.load_step, "--load-step"), settings.seed)
    else:
        starts = session_starts(sessions, settings.window_s, settings.seed)
    swept = sweep(cfgs, sessions, starts, spec, settings, args.jobs, progress=not args.no_progress)
    results = [p.metrics for p in swept]
    # The drive's budget accrues over the whole period the workload occupies: until the last
    # request of the longest run finished (requests issued before the horizon still complete and write).
    days = max(p.span_s for p in swept) / SECONDS_PER_DAY
    budget = dwpd_eff * pool_bytes * days
    plan = build_plan(results, budget)
    by_policy = {p.metrics["policy"]: p for p in swept}
    shown = dict.fromkeys(["full-duplicate", plan["recommendation"]["policy"]])
    rates = [(("full duplicate" if name == "full-duplicate" else f"recommended {name}"),
              endurance_arithmetic(drives, by_policy[name].metrics["ssd_write_bytes"] / by_policy[name].span_s))
             for name in shown]  # each policy's measured rate over its own replayed span
    text = "\n".join([
        f"{args.trace}: {len(sessions)} sessions, window {args.window}{' -> ' + args.load_step if args.load_step else ''}, "
        f"{spec.name}, DRAM {cfgs[0].capacity.dram_tokens} / SSD {cfgs[0].capacity.ssd_tokens} tokens, replayed {days:.3f} days",
        format_plan(plan),
        format_endurance(drives, rates),
    ])
    if args.plot:
        window_budget = dwpd_eff * pool_bytes * min(settings.window_s, settings.horizon_s) / SECONDS_PER_DAY
        plot_front(plan, args.plot, (window_budget, budget), f"{args.trace}  {spec.name}  window {args.window}")
    return plan, text


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        plan, text = run(args)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"saria-plan: error: {e}", file=sys.stderr)
        return 2
    print(text)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(plan, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
