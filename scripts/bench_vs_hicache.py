#!/usr/bin/env python
"""Head-to-head: stock SGLang HiCache (`file` storage backend) vs saria, same agent workload.

One multi-turn agent workload, WEKA Claude Code sessions shortened to fit the tiny model
(`sglang_saria.agents.weka_chat`), replayed by SGLang's own client (`python -m
sglang.bench_serving --backend sglang-oai-chat --dataset-name agentic-trace`) against one
fresh server and store per configuration, same pools (device, host = ratio x device),
same write-through from device to host (SGLang's default):

- `hicache-file`: stock HiCache, `file` backend: every page that enters host memory is
  written to storage (the baseline every ratio refers to, measured in the same run);
- `saria/full-duplicate`: the saria store writing every page too (same admission as stock);
- `saria/eviction:E2`: saria's default, persisting a node at its second host eviction.

Reported per configuration: SSD bytes written (stock: the page files' bytes; saria: the
store's `sglang:saria_ssd_bytes_written_total`), cached tokens by tier (SGLang's cache
report), TTFT mean and P90, each also as a ratio to stock. With `--repeats N`, medians over
N runs. The configurations, the run and the table are `sglang_saria.bench.configs`'s,
shared with `saria-fig10` (every admission policy, think times, the replay).

    python scripts/bench_vs_hicache.py [--repeats 3] [--turns 10] [--markdown]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from sglang_saria.bench.configs import (
    HICACHE_FILE,
    BenchError,
    Pools,
    RunResult,
    Workload,
    fail_if_unclean,
    median_result,
    parse_config,
    prepare,
    private_work_dir,
    results_table,
    run_config,
)
from sglang_saria.tiny_models import FULL_ATTENTION, build

CONFIGS = (HICACHE_FILE, "saria/full-duplicate", "saria/eviction:E2")
# Device 1024 tokens, host 2048, pages of 16; the saria store 64 MiB of the tiny model's KV
# (256 bytes a token): the run stays below it, as it stays below the `file` backend's (no) bound.
POOLS = Pools(page_size=16, device_tokens=1024, hicache_ratio=2.0, store_tokens=(64 << 20) // 256, server_warmup=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="model dir (default: build models/qwen3-tiny)")
    ap.add_argument("--weka", type=Path, default=None, help="weka-cc trace dir (default: ../shared/traces/weka-cc)")
    ap.add_argument("--turns", type=int, default=10, help="turns per WEKA session (default 10)")
    ap.add_argument("--max-chars", type=int, default=700, help="longest conversation, in tokens (default 700)")
    ap.add_argument("--output-len", type=int, default=4, help="tokens per reply (default 4)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per configuration; medians reported (default 1)")
    ap.add_argument("--audit", action="store_true", help="saria servers with the KV audit on (fails on a mismatch)")
    ap.add_argument("--markdown", action="store_true", help="(kept for compatibility: the table is Markdown)")
    ap.add_argument("--work-dir", type=Path, default=None, help="stores, logs, client output (default: a private temp dir)")
    args = ap.parse_args()
    for flag in ("turns", "max_chars", "output_len", "repeats"):
        if getattr(args, flag) <= 0:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be > 0")

    model = args.model or build(FULL_ATTENTION, Path("models"))
    work = args.work_dir or private_work_dir("saria-vs-hicache-")
    work.mkdir(parents=True, exist_ok=True)
    # SGLang's client warms up with one conversation, as this benchmark always has.
    workload = Workload(turns=args.turns, max_chars=args.max_chars, output_len=args.output_len, weka=args.weka, client_warmup=1)
    prepared = prepare(workload, work)
    print(f"{len(prepared.conversations)} WEKA agent sessions, {prepared.requests} turns, "
          f"{args.repeats} run(s) per configuration; work dir {work}")
    configs = [parse_config(c) for c in CONFIGS]
    runs: dict[str, list[RunResult]] = {c.name: [] for c in configs}
    jobs = [(c, i) for i in range(args.repeats) for c in configs]
    try:
        for config, i in tqdm(jobs, desc="servers"):
            result, _ = run_config(config, model, prepared, POOLS, work / f"{config.name.replace('/', '_')}-{i}", args.audit)
            runs[config.name].append(result)
        print(results_table({name: median_result(rs) for name, rs in runs.items()}, bases=(HICACHE_FILE,)))
        fail_if_unclean(runs)
    except BenchError as e:
        print(f"FAIL: {e} (see {work}/*/client/bench_serving.log)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
