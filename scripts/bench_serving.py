#!/usr/bin/env python
"""Serving benchmark: Saria policies on a real SGLang server, TTFT and SSD writes per policy.

Replays a few WEKA agent sessions (shortened: one token per 64-token block) through
`/generate` of one server per configuration, with small device and host pools so
prefixes are evicted and come back from host memory and from the SSD store:

- `cold`: `--disable-radix-cache`, the baseline every ratio refers to (same run);
- `<admission>/<reload>`: HiCache + the saria store, admission policy (full-duplicate,
  eviction:E2, ...) and reload path (`direct`: SSD -> device pool; `staged`: HiCache's
  prefetch into host memory).

TTFT is the latency of a one-token request (median over requests; also over the requests
that hit storage). `--check` fails unless every configuration returns the cold server's
greedy tokens with logprobs within `launcher.LOGPROB_TOLERANCE` and a clean KV audit
(every moved page keeps its bytes; the servers run with `AUDIT_ENV`). Runs on CPU (`--device cpu`, default) or GPU
(`--device cuda`: kvikio GDS engine, compiled Triton gather), see scripts/gpu_check.sh.

    python scripts/bench_serving.py [--device cuda] [--admission full-duplicate eviction:E2] --check
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from make_tiny_models import FULL_ATTENTION, build  # noqa: E402

from sglang_saria.launcher import (  # noqa: E402
    AUDIT_ENV,
    LOGPROB_TOLERANCE,
    SGLangServer,
    ServerConfig,
    cached_tokens,
    logprob_diff,
    logprob_trace,
    saria_hicache_args,
    saria_metrics,
)
from sglang_saria.replay.agent_prompts import agent_requests  # noqa: E402

POOLS = ["--page-size", "16", "--max-total-tokens", "512", "--dtype", "bfloat16"]
GPU_FLAGS = ["--skip-tokenizer-init", "--mem-fraction-static", "0.2"]


@dataclass
class Run:
    name: str
    ttft_s: list[float] = field(default_factory=list)
    storage_ttft_s: list[float] = field(default_factory=list)
    traces: list = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=lambda: {"device": 0, "host": 0, "storage": 0})
    metrics: dict[str, float] = field(default_factory=dict)


def serve(
    name: str, model: Path, args: list[str], prompts: list[list[int]], device: str, log_dir: Path, audit: bool = False
) -> Run:
    """Serve ``prompts`` one by one; ``audit``: with the KV and tier audits on (they wait
    for every copy, so TTFTs of an audited run are not the product's)."""
    run = Run(name)
    flags = POOLS + (GPU_FLAGS if device == "cuda" else []) + args
    config = ServerConfig(
        model, args=flags, cpu=device == "cpu", log_path=log_dir / f"{name.replace('/', '_')}.log",
        env=AUDIT_ENV if audit else {},
    )
    with SGLangServer(config) as server:
        for prompt in tqdm(prompts, desc=name, leave=False):
            t = time.perf_counter()
            result = server.generate(prompt, max_new_tokens=1)
            ttft = time.perf_counter() - t
            tiers = cached_tokens(result)
            run.ttft_s.append(ttft)
            if tiers["storage"]:
                run.storage_ttft_s.append(ttft)
            for tier, n in tiers.items():
                run.tiers[tier] += n
            run.traces.append(logprob_trace(result))
        if "--enable-metrics" in args:
            run.metrics = saria_metrics(server.metrics())
    return run


def saria_args(admission: str, reload: str, data_dir: Path) -> list[str]:
    extra = {"data_dirs": [str(data_dir)], "admission": admission, "capacity": "64MiB"}
    if reload == "staged":
        extra["transfer"] = {"direct_reload": False}
    return saria_hicache_args(extra)


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3 if xs else float("nan")


def print_table(runs: list[Run], cold: Run) -> None:
    base = statistics.median(cold.ttft_s)
    head = (
        f"{'config':<28}{'TTFT ms':>9}{'x cold':>8}{'TTFT storage-hit ms':>21}"
        f"{'cached dev/host/ssd':>22}{'SSD MB written':>16}{'pages read dev/host':>21}{'promoted':>10}"
    )
    print(head)
    print("-" * len(head))
    for run in [cold, *runs]:
        m = run.metrics
        pages = f"{m.get('sglang:saria_store_pages_read_total/device', 0):.0f}/{m.get('sglang:saria_store_pages_read_total/host', 0):.0f}"
        cached = f"{run.tiers['device']}/{run.tiers['host']}/{run.tiers['storage']}"
        print(
            f"{run.name:<28}{median_ms(run.ttft_s):>9.1f}{statistics.median(run.ttft_s) / base:>8.2f}"
            f"{median_ms(run.storage_ttft_s):>21.1f}{cached:>22}"
            f"{m.get('sglang:saria_ssd_bytes_written_total', 0) / 1e6:>16.3f}{pages:>21}"
            f"{m.get('sglang:saria_promoted_tokens_total', 0):>10.0f}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", type=Path, default=None, help="model dir (default: build models/qwen3-tiny)")
    ap.add_argument("--weka", type=Path, default=None, help="weka-cc trace dir (default: ../shared/traces/weka-cc)")
    ap.add_argument("--admission", nargs="+", default=["full-duplicate", "eviction:E2"])
    ap.add_argument("--reload", nargs="+", choices=["direct", "staged"], default=["direct", "staged"])
    ap.add_argument("--requests-per-session", type=int, default=5)
    ap.add_argument(
        "--check", action="store_true",
        help="audited servers: fail unless tokens and logprobs match the cold server's and the KV audit is clean",
    )
    ap.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a temp dir)")
    args = ap.parse_args()

    model = args.model or build(FULL_ATTENTION, REPO / "models")
    prompts = agent_requests(args.requests_per_session, weka=args.weka)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="saria-bench-serving-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{len(prompts)} requests of 4 WEKA sessions, device={args.device}, logs in {log_dir}")
    cold = serve("cold", model, ["--disable-radix-cache"], prompts, args.device, log_dir)
    runs = []
    for admission in args.admission:
        for reload in args.reload:
            with tempfile.TemporaryDirectory(prefix="saria-bench-store-") as data_dir:
                name = f"{admission}/{reload}"
                args_ = saria_args(admission, reload, Path(data_dir))
                runs.append(serve(name, model, args_, prompts, args.device, log_dir, audit=args.check))
    print_table(runs, cold)
    if args.check:
        worst = {run.name: max(logprob_diff(t, c).max_abs for t, c in zip(run.traces, cold.traces)) for run in runs}
        bad = [run.name for run in runs if not all(logprob_diff(t, c).within() for t, c in zip(run.traces, cold.traces))]
        bad += [run.name for run in runs if any(v for k, v in run.metrics.items() if k.startswith("sglang:saria_kv_audit_errors"))]
        if bad:
            print(f"FAIL: tokens, logprobs (tolerance {LOGPROB_TOLERANCE}) or KV audit differ from the cold server in {sorted(set(bad))}")
            return 1
        print(f"PASS: {len(runs)} configurations return the cold server's tokens, logprobs within "
              f"{LOGPROB_TOLERANCE} (worst {max(worst.values()):.1e}), KV audit clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
