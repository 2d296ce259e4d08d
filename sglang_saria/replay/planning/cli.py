"""``saria-plan``: pick the admission policy for an SSD's endurance rating (beyond the paper).

The paper shows the threshold that meets a DWPD budget depends on workload and model
and leaves the choice to the operator. The planner replays the trace once per candidate
policy (each on the identical workload, in parallel processes), draws the Pareto front
of SSD writes against CHAR P25-bad and modelled TTFT, marks the points whose writes fit
the drives' budget over the replayed period, and recommends the lowest mean TTFT among
them. It also prints the paper's Table 1 arithmetic (section 2.2) for the drives at the
replay's measured full-duplicate write rate. The SSD cache defaults to the drives'
capacity in tokens (``--ssd-tokens`` overrides it; the budget always follows the drives).
``--nodes N`` plans a fleet: the drives are each node's, every policy is replayed on N nodes behind
each router (or ``--router``), and the plan recommends a policy and a routing mode whose busiest
drive fits its budget (``planning/fleet.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

import numpy as np

from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.fleet import FleetSettings
from sglang_saria.replay.routing import ROUTERS
from sglang_saria.replay.driver import ReplaySettings
from sglang_saria.replay.planning.recommend import (
    DEFAULT_SWEEP,
    PlanError,
    build_plan,
    endurance_arithmetic,
    pareto_front,
    parse_drives,
)
from sglang_saria.replay.planning.fleet import build_fleet_plan, format_fleet_plan
from sglang_saria.replay.planning.sweep import load_step_starts, idle_span_s, sweep
from sglang_saria.replay.plot import pyplot, save_figure
from sglang_saria.units import DAYS_PER_YEAR, SECONDS_PER_DAY, ConfigError, DriveRating, parse_count, parse_duration_s


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
    if plan.get("auto"):
        a, f = plan["auto"]["auto"], plan["auto"]["best_fixed"]
        fixed = (f"best fixed threshold within budget: {f['policy']}, writes {f['ssd_write_bytes'] / budget:.2f} of budget, "
                 f"CHAR {f['char']:.3f}" if f else "no fixed threshold fits the budget")
        lines.append(f"auto (needs only the drives' rating): {a['policy']}, writes {a['ssd_write_bytes'] / budget:.2f} of "
                     f"budget, CHAR {a['char']:.3f}; {fixed}")
    return "\n".join(lines)


def format_endurance(drives: list[DriveRating], rows: list[tuple[str, dict[str, float]]]) -> str:
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
    p.add_argument("--no-controller", action="store_true", help="do not add the online controllers (budget:<DWPD>, auto:<DWPD>) to the sweep")
    p.add_argument("--load-step", default=None,
                   help="second session-start window after --window (e.g. --window 40m --load-step 10m): a load step")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel replay processes (default: CPU count)")
    p.add_argument("--json", dest="json_path", default=None, help="write the plan JSON here")
    p.add_argument("--plot", default=None, help="write the front with the budget band (PNG) here")
    return p


def run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(plan JSON, printed text)."""
    from sglang_saria.replay.cli import build_config, fleet_settings
    from sglang_saria.replay.loaders import load_trace
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
        policies += [f"budget:{dwpd_eff:g}", f"auto:{dwpd_eff:g}"]
    cfgs = [build_config(args, p) for p in policies]
    fleet = fleet_settings(args)
    fleets = None
    if fleet is not None:  # every policy behind every router (or the one asked for)
        routers = [fleet.router] if args.router else list(ROUTERS)
        fleets = [FleetSettings(fleet.nodes, r, fleet.seed).validate() for _ in cfgs for r in routers]
        cfgs = [cfg for cfg in cfgs for _ in routers]
    settings = ReplaySettings(
        window_s=parse_duration_s(args.window, "--window"), seed=args.seed, in_flight=args.in_flight,
        prefill_tokens_per_s=args.prefill_tps, ssd_write_gbps=args.ssd_write_gbps, hints=args.hints,
        horizon_s=parse_duration_s(args.horizon, "--horizon"),
    ).validate()
    sessions = load_trace(args.trace, cfgs[0].metadata.block_tokens, max_sessions=args.sessions)
    sessions = apply_limits(sessions, context_limit_tokens=parse_count(args.context_limit, "--context-limit"))
    if args.load_step:
        starts = load_step_starts(sessions, settings.window_s, parse_duration_s(args.load_step, "--load-step"), settings.seed)
    else:
        starts = session_starts(sessions, settings.window_s, settings.seed)
    # The plan judges every policy by the drives' budget over the replayed period, pro rata (a
    # sample of steady operation). The controller gets that budget as one window that outlasts
    # the replay: its DWPD refers to the drives, scaled from the window to a lower bound of the period.
    span_s = idle_span_s(sessions, starts, settings.horizon_s)
    for cfg in cfgs:
        cfg.admission.budget_window_s = 2 * settings.horizon_s
        cfg.admission.budget_capacity_bytes = max(1, round(pool_bytes * span_s / cfg.admission.budget_window_s))
    swept = sweep(cfgs, sessions, starts, spec, settings, args.jobs, progress=not args.no_progress, fleets=fleets)
    results = [p.metrics for p in swept]
    # The drive's budget accrues over the whole period the workload occupies: until the last
    # request of the longest run finished (requests issued before the horizon still complete and write).
    days = max(p.span_s for p in swept) / SECONDS_PER_DAY
    budget = dwpd_eff * pool_bytes * days
    head = (f"{args.trace}: {len(sessions)} sessions, window {args.window}{' -> ' + args.load_step if args.load_step else ''}, "
            f"{spec.name}, DRAM {cfgs[0].capacity.dram_tokens} / SSD {cfgs[0].capacity.ssd_tokens} tokens"
            f"{f' per node, {fleet.nodes} nodes' if fleet else ''}, replayed {days:.3f} days")
    if fleet is not None:
        plan = build_fleet_plan(swept, budget, pool_bytes, days)
        rec = plan["recommendation"]
        point = next(p for p in swept if (p.metrics["policy"], p.fleet["router"]) == (rec["policy"], rec["router"]))
        rates = [(f"recommended {rec['policy']} with {rec['router']}, busiest node",
                  endurance_arithmetic(drives, max(n["ssd_write_bytes"] for n in point.per_node) / point.span_s))]
        text = "\n".join([head, format_fleet_plan(plan, dwpd_eff), format_endurance(drives, rates)])
    else:
        plan = build_plan(results, budget)
        by_policy = {p.metrics["policy"]: p for p in swept}
        shown = dict.fromkeys(["full-duplicate", plan["recommendation"]["policy"]])
        rates = [(("full duplicate" if name == "full-duplicate" else f"recommended {name}"),
                  endurance_arithmetic(drives, by_policy[name].metrics["ssd_write_bytes"] / by_policy[name].span_s))
                 for name in shown]  # each policy's measured rate over its own replayed span
        text = "\n".join([head, format_plan(plan), format_endurance(drives, rates)])
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
