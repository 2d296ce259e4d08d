#!/usr/bin/env python
"""Replay speed benchmark: seconds per policy replay and block events per second.

Replays the same sessions with each policy ``--repeat`` times (median reported) and
prints a table with ratios against the first policy measured in the same run. The
target from the issue: 350 WEKA sessions of one policy in under 60 s on one core.

    python scripts/bench_replay.py --trace weka:../shared/traces/weka-cc --sessions 350 --json bench.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sglang_saria.config import AdmissionConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.trace import load_trace
from sglang_saria.replay.workload import apply_limits, session_starts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="weka:../shared/traces/weka-cc")
    p.add_argument("--sessions", type=int, default=350)
    p.add_argument("--policy", action="append", default=None, help="default: full-duplicate, eviction:E2")
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--repeat", type=int, default=1, help="replays per policy (median reported)")
    p.add_argument("--json", dest="json_path", default=None)
    args = p.parse_args(argv)
    policies = args.policy or ["full-duplicate", "eviction:E2"]
    spec = get_model_spec(args.model)
    block_tokens = spec.default_block_tokens

    t0 = time.perf_counter()
    sessions = apply_limits(load_trace(args.trace, block_tokens, max_sessions=args.sessions))
    load_s = time.perf_counter() - t0
    settings = ReplaySettings()
    starts = session_starts(sessions, settings.window_s, settings.seed)

    rows = []
    for policy in policies:
        cfg = SariaConfig(admission=AdmissionConfig(policy=policy), metadata=MetadataConfig(block_tokens=block_tokens))
        times, events = [], 0
        for _ in range(args.repeat):
            t = time.perf_counter()
            res = replay(sessions, starts, cfg, spec, settings)
            times.append(time.perf_counter() - t)
            events = res.block_events
        rows.append((policy, statistics.median(times), events, res.metrics["requests"]))

    base = rows[0][1]
    print(f"trace={args.trace} sessions={len(sessions)} load={load_s:.1f}s model={spec.name} block_tokens={block_tokens}")
    print(f"{'policy':<16} {'s/replay':>9} {'ratio':>6} {'requests':>9} {'block events':>13} {'events/s':>10}")
    for policy, s, ev, reqs in rows:
        print(f"{policy:<16} {s:9.2f} {s / base:6.2f} {reqs:9d} {ev:13d} {ev / s:10.0f}")
    total_ev = sum(r[2] for r in rows)
    total_s = sum(r[1] for r in rows)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"block_events_per_s": total_ev / total_s, "seconds_per_replay": {r[0]: r[1] for r in rows}}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
