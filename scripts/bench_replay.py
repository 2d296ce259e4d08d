#!/usr/bin/env python
"""Replay speed benchmark: seconds per policy replay and block events per second.

Each policy is replayed ``--repeat`` times, each replay in a fresh process, and the medians
are reported: wall seconds, CPU seconds of the replay process (steadier than wall time on a
shared machine) and block events per CPU second. ``--baseline SRC`` times the same replays
with another source tree (e.g. ``git archive main | tar -x -C /tmp/base``) in the same run,
alternating with this one, and prints the speed ratio. The targets (issue 13): >= 600K block
events/s on one core; the paper's E3 on 350 WEKA sessions (qwen3.5-9b) in under 15 s.

    python scripts/bench_replay.py --sessions 350 --repeat 3 --baseline /tmp/base
    python scripts/bench_replay.py --model qwen3.5-9b --policy eviction:E3 --sessions 350 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = "this tree"


def time_one(trace: str, sessions: int, model: str, policy: str) -> dict:
    """One replay in this process: wall and CPU seconds of ``replay`` alone (the load is not timed)."""
    from sglang_saria.config import AdmissionConfig, MetadataConfig, SariaConfig
    from sglang_saria.model_specs import get_model_spec
    from sglang_saria.replay.driver import ReplaySettings, replay
    try:
        from sglang_saria.replay.loaders import load_trace
    except ImportError:  # a --baseline tree from before the package layout of issue 24
        from sglang_saria.replay.trace import load_trace
    from sglang_saria.replay.workload import apply_limits, session_starts

    spec = get_model_spec(model)
    bt = spec.default_block_tokens
    loaded = apply_limits(load_trace(trace, bt, max_sessions=sessions))
    settings = ReplaySettings()
    cfg = SariaConfig(admission=AdmissionConfig(policy=policy), metadata=MetadataConfig(block_tokens=bt))
    starts = session_starts(loaded, settings.window_s, settings.seed)
    wall, cpu = time.perf_counter(), time.process_time()
    res = replay(loaded, starts, cfg, spec, settings)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    m = res.metrics
    return {"wall_s": wall, "cpu_s": cpu, "block_events": res.block_events, "requests": m["requests"],
            "ssd_write_bytes": m["ssd_write_bytes"], "char": m["char"], "ttft_mean_s": m["ttft_mean_s"]}


def run_in(src: Path, args: argparse.Namespace, policy: str) -> dict:
    """``time_one`` in a fresh interpreter importing ``sglang_saria`` from ``src``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--trace", args.trace,
           "--sessions", str(args.sessions), "--model", args.model, "--policy", policy]
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"replay of {policy} with {src} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=f"weka:{REPO.parent / 'shared' / 'traces' / 'weka-cc'}")
    p.add_argument("--sessions", type=int, default=350)
    p.add_argument("--policy", action="append", default=None, help="default: full-duplicate, eviction:E2")
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--repeat", type=int, default=1, help="replays per policy and tree (medians reported)")
    p.add_argument("--baseline", type=Path, default=None, help="another source tree, timed in the same run")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    policies = args.policy or ["full-duplicate", "eviction:E2"]
    if args.worker:
        print(json.dumps(time_one(args.trace, args.sessions, args.model, policies[0])))
        return 0

    trees = [(HERE, REPO)] + ([(str(args.baseline), args.baseline)] if args.baseline else [])
    runs: dict[tuple[str, str], list[dict]] = {}
    for policy in policies:
        for _ in range(args.repeat):
            for name, src in trees:  # alternate, so both see the same machine load
                runs.setdefault((name, policy), []).append(run_in(src, args, policy))

    rows = []
    for (name, policy), rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s")}
        ev = rs[0]["block_events"]
        same = all(r["ssd_write_bytes"] == rs[0]["ssd_write_bytes"] and r["requests"] == rs[0]["requests"] for r in rs)
        rows.append({"tree": name, "policy": policy, **med, "block_events": ev, "events_per_cpu_s": ev / med["cpu_s"],
                     "requests": rs[0]["requests"], "ssd_write_bytes": rs[0]["ssd_write_bytes"],
                     "ttft_mean_s": rs[0]["ttft_mean_s"], "repeatable": same, "cpu_s_all": [r["cpu_s"] for r in rs]})
    print(f"trace={args.trace} sessions={args.sessions} model={args.model} repeat={args.repeat} (medians)")
    print(f"{'tree':<14} {'policy':<16} {'wall s':>7} {'cpu s':>7} {'events/cpu s':>13} {'speed vs base':>13} "
          f"{'requests':>9} {'SSD bytes written':>18} {'same outputs':>12}")
    base = {r["policy"]: r for r in rows if r["tree"] != HERE}
    for r in rows:
        b = base.get(r["policy"])
        ratio = f"{b['cpu_s'] / r['cpu_s']:.2f}x" if b else "-"
        same = "-" if not b else ("yes" if (b["ssd_write_bytes"], b["requests"], b["ttft_mean_s"]) ==
                                  (r["ssd_write_bytes"], r["requests"], r["ttft_mean_s"]) else "NO")
        print(f"{r['tree'][-14:]:<14} {r['policy']:<16} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} {r['events_per_cpu_s']:13.0f} "
              f"{ratio:>13} {r['requests']:9d} {r['ssd_write_bytes']:18d} {same:>12}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
