#!/usr/bin/env python3
"""Budget tracking under a load step, and the planner's parallel-sweep speed-up.

Replays one workload whose session starts step from the ``--window`` density to the
``--load-step`` density (Figure 11's 40 min -> 10 min windows as one step) against fixed
eviction thresholds and the ``budget:<DWPD>`` controller, whose cap holds over every
``--budget-window`` (default 1 h: the replay lasts hours, the serving default is a day).
Prints, per policy, writes against the budget (end of replay pro rata, and the fullest
window),
CHAR, CHAR P25-bad and mean TTFT with ratios to fixed E2 measured in the same run, and
the sweep's serial vs ``--jobs`` wall time. ``--plot`` draws cumulative writes against the
budget line (the controller's budget-tracking figure).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sglang_saria.config import AdmissionConfig, CapacityConfig, SariaConfig
from sglang_saria.units import parse_count, parse_duration_s
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.metrics import peak_window_bytes
from sglang_saria.replay.planning.sweep import load_step_starts, sweep
from sglang_saria.replay.report import plot_ssd_writes
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.workload import apply_limits

FIXED = (2, 3, 4, 6, 8, 10, 12, 16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="synthetic")
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--window", default="40m")
    ap.add_argument("--load-step", default="10m")
    ap.add_argument("--dram-tokens", default="0.5M")
    ap.add_argument("--ssd-tokens", default="5M")
    ap.add_argument("--dwpd", type=float, default=5.5)
    ap.add_argument("--budget-window", default="1h", help="the controller's sliding window (admission.budget_window_s)")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()

    spec = get_model_spec(args.model)
    cap = CapacityConfig(parse_count(args.dram_tokens, "--dram-tokens"), parse_count(args.ssd_tokens, "--ssd-tokens"))
    w1, w2 = parse_duration_s(args.window, "--window"), parse_duration_s(args.load_step, "--load-step")
    sessions = apply_limits(load_trace(args.trace, spec.default_block_tokens, max_sessions=args.sessions))
    starts = load_step_starts(sessions, w1, w2, seed=0)
    settings = ReplaySettings(window_s=w1 + w2)
    policies = [f"eviction:E{t}" for t in FIXED] + [f"budget:{args.dwpd:g}"]
    window_s = parse_duration_s(args.budget_window, "--budget-window")
    cfgs = [SariaConfig(admission=AdmissionConfig(policy=p, budget_window_s=window_s), capacity=cap).validate()
            for p in policies]
    capacity = cap.ssd_tokens * spec.kv_bytes_per_token
    rate = capacity * args.dwpd / 86400.0

    t0 = time.perf_counter()
    serial = sweep(cfgs, sessions, starts, spec, settings, jobs=1, progress=False)
    t_serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    parallel = sweep(cfgs, sessions, starts, spec, settings, jobs=args.jobs, progress=False)
    t_par = time.perf_counter() - t0
    assert parallel == serial, "parallel sweep differs from serial"  # SweepPoint equality: metrics and span

    runs = {p: replay(sessions, starts, c, spec, settings) for p, c in zip(policies, cfgs)}
    rows = []
    for p, r in runs.items():
        m = r.metrics
        peak = peak_window_bytes(r.log.done_s, r.log.ssd_bytes_written, window_s)
        rows.append({"policy": p, "writes_over_budget": m["ssd_write_bytes"] / (rate * r.end_time_s),
                     "peak_window_over_budget": peak / (rate * window_s), "char": m["char"],
                     "char_p25_bad": m["char_p25_bad"], "ttft_mean_s": m["ttft_mean_s"]})
    base = rows[0]
    peak_ok = next((r for r in rows[:-1] if r["peak_window_over_budget"] <= 1.0), None)
    print(f"{args.trace}: {len(sessions)} sessions, windows {args.window} -> {args.load_step}, {spec.name}, "
          f"DRAM {cap.dram_tokens} / SSD {cap.ssd_tokens} tokens, budget {args.dwpd:g} DWPD = {rate / 1e6:.1f} MB/s "
          f"over every {args.budget_window} window")
    print(f"{'policy':14s} {'W/budget':>8s} {'peak window':>11s} {'CHAR':>6s} {'CHAR25b':>7s} {'TTFT s':>7s} "
          f"{'W vs E2':>7s} {'TTFT vs E2':>10s}")
    for r in rows:
        mark = "  <- lowest fixed threshold within budget in every window" if r is peak_ok else ""
        print(f"{r['policy']:14s} {r['writes_over_budget']:8.2f} {r['peak_window_over_budget']:11.2f} {r['char']:6.3f} "
              f"{r['char_p25_bad']:7.3f} {r['ttft_mean_s']:7.2f} {r['writes_over_budget'] / base['writes_over_budget']:7.2f} "
              f"{r['ttft_mean_s'] / base['ttft_mean_s']:10.2f}{mark}")
    print(f"sweep of {len(cfgs)} policies: serial {t_serial:.1f} s, {args.jobs} jobs {t_par:.1f} s "
          f"(speed-up {t_serial / t_par:.2f}x, identical results)")
    if args.plot:
        shown = [rows[0]["policy"]] + ([peak_ok["policy"]] if peak_ok else []) + [rows[-1]["policy"]]
        plot_ssd_writes([runs[p].metrics for p in shown], [runs[p].log for p in shown], Path(args.plot), capacity, args.dwpd)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"rows": rows, "serial_s": t_serial, "parallel_s": t_par}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
