#!/usr/bin/env python
"""Prefill throughput of the tiny hybrid (GDN + full attention) model on CPU against the
tiny full-attention model, both through a real SGLang server in the same run.

Why: the hybrid path runs the pure-torch GDN ops (the CPU rig's patches 020-022) on CPU; this checks
that it stays within a small factor of the full-attention path (target: 3x) so CPU
end-to-end tests of hybrid checkpoints remain practical.

Each request is a fresh random prompt with max_new_tokens=1 on a server started with
--disable-radix-cache, so the measured time is one full prefill (plus the HTTP round
trip, identical for both models). Reported: median tokens/s over the repeats, after one
unmeasured request per length.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from sglang_saria.launcher import SGLangServer, ServerConfig
from sglang_saria.tiny_models import FULL_ATTENTION, HYBRID, build


@dataclass(frozen=True)
class BenchConfig:
    lengths: tuple[int, ...]
    repeats: int
    dtype: str
    models_dir: Path
    threads: int


def measure(model: Path, config: BenchConfig, seed: int) -> dict[int, float]:
    """Median prefill tokens/s per prompt length for one model."""
    args = ["--dtype", config.dtype, "--disable-radix-cache",
            "--max-total-tokens", str(max(config.lengths) * 2 + 64),
            "--max-prefill-tokens", str(max(config.lengths) + 64),
            "--chunked-prefill-size", str(max(config.lengths) + 64)]
    rng = random.Random(seed)
    results: dict[int, float] = {}
    env = {"OMP_NUM_THREADS": str(config.threads)}
    with SGLangServer(ServerConfig(model, args=args, env=env)) as server:
        for length in tqdm(config.lengths, desc=model.name, unit="len"):
            # The first prefill of a new length pays one-off costs (allocator growth,
            # kernel selection for new shapes): one unmeasured request per length.
            rates = []
            for repeat in range(config.repeats + 1):
                prompt = [rng.randrange(1, 1000) for _ in range(length)]
                start = time.perf_counter()
                server.post("/generate", {"input_ids": prompt,
                                          "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
                if repeat:
                    rates.append(length / (time.perf_counter() - start))
            results[length] = statistics.median(rates)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP threads per server (default 1: on a shared 2-core host, OpenMP "
                             "spin-waiting under contention swamps both models' timings)")
    args = parser.parse_args(argv)
    if min(args.lengths) < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--lengths, --repeats and --threads must be positive")
    config = BenchConfig(tuple(args.lengths), args.repeats, args.dtype, args.models, args.threads)

    full = measure(build(FULL_ATTENTION, config.models_dir), config, seed=0)
    hybrid = measure(build(HYBRID, config.models_dir), config, seed=0)

    print(f"\nprefill tokens/s on CPU, median of {config.repeats}, dtype {config.dtype}, "
          f"{config.threads} thread(s) per server")
    print(f"{'prompt':>8} {FULL_ATTENTION + ' (2 attn)':>22} {HYBRID + ' (3 GDN+1 attn)':>34} {'slowdown':>9}")
    worst = 0.0
    for length in config.lengths:
        slowdown = full[length] / hybrid[length]
        worst = max(worst, slowdown)
        print(f"{length:>8} {full[length]:>22.0f} {hybrid[length]:>34.0f} {slowdown:>8.2f}x")
    verdict = "within" if worst <= 3.0 else "NOT within"
    print(f"worst slowdown {worst:.2f}x: {verdict} the 3x target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
