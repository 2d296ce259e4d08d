#!/usr/bin/env python
"""Benchmark the one-launch mixed-source gather against the ways it replaces.

Workload: a batch of reloads for a hybrid model (FA layers + GDN layers). Each request's
prefix interleaves pages on SSD (already read into a staging buffer by the storage
engine) and pages in the host pool (DRAM); each request also reloads one GDN checkpoint
(conv + recurrent state per GDN layer), from SSD or DRAM. Methods, all moving the same bytes:

  loop       one `dst[row].copy_(src[row])` per row and layer (naive Python loop)
  per-group  one `dst[rows] = src[rows]` per (source, destination) pair: SGLang's
             `transfer_kv_direct` style, one op per layer and source
  reference  `gather_mixed_reference` (the CPU path; the baseline of the ratios)
  triton     `gather_mixed` kernel, one launch (timed on CUDA only: on CPU the Triton
             interpreter is a correctness tool, far too slow to time meaningfully)

Prints medians and ratios against `reference` measured in the same run.
`--check` also compares every method bit-exactly and exits 1 on any mismatch
(the GPU kit, scripts/gpu_kit.sh, runs the same checks on fp16/bf16/fp32).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from sglang_saria.gpukit.timing import median_seconds
from sglang_saria.gpukit.workloads import ModelShape, build_workload, per_group, row_loop, same_bits, snapshot
from sglang_saria.kernels.gather import (
    GatherPlan,
    gather_mixed,
    gather_mixed_reference,
    triton_interpreted,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--host-pool", default="cpu", choices=["cpu", "device"], help="where the host-pool sources live (cpu = pinned DRAM on CUDA)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: OpenMP spin-waits wreck timings on a shared, busy machine)")
    parser.add_argument("--check", action="store_true", help="compare all methods bit-exactly, print PASS/FAIL, exit 1 on FAIL")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device")
    host_device = "cpu" if args.host_pool == "cpu" else args.device
    kernel_timed = cuda
    if not kernel_timed:
        print("note: CPU run, the Triton kernel is not timed (the interpreter is a correctness tool); "
              "run with --device cuda on a GPU host for kernel numbers"
              + (" [TRITON_INTERPRET=1: --check runs it]" if triton_interpreted() else ""))

    shape = ModelShape()
    print(f"device={args.device} host-pool={host_device}{' (pinned)' if cuda and host_device == 'cpu' else ''} "
          f"torch threads={torch.get_num_threads()} {shape}")
    header = f"{'dtype':5} {'tokens':>6} {'segments':>8} {'MiB':>7} {'method':10} {'median ms':>10} {'GB/s':>7} {'vs reference':>12}"
    print(header)
    print("-" * len(header))
    failures = 0
    for label in args.dtypes:
        for tokens in tqdm(args.tokens, desc=label, leave=False, disable=not sys.stderr.isatty()):
            w = build_workload(shape, tokens, DTYPES[label], args.device, host_device, seed=tokens)
            start = time.perf_counter()
            plan = GatherPlan.from_rows(w.sources, w.destinations, w.moves)
            build_s = time.perf_counter() - start
            methods: dict[str, Callable[[], None]] = {
                "loop": lambda: row_loop(w),
                "per-group": lambda: per_group(w),
                "reference": lambda: gather_mixed_reference(plan, w.sources, w.destinations),
            }
            if kernel_timed or (args.check and triton_interpreted()):
                methods["triton"] = lambda: gather_mixed(plan, w.sources, w.destinations, backend="triton")
            results: dict[str, list[torch.Tensor]] = {}
            timings: dict[str, float] = {}
            for name, fn in methods.items():
                for t in w.destinations:
                    t.zero_()
                if name == "triton" and not kernel_timed:
                    fn()  # interpreter: correctness only
                else:
                    timings[name] = median_seconds(fn, 3 if name == "loop" else args.repeats, cuda)
                results[name] = snapshot(w)
            mib = plan.total_bytes / 2**20
            base = timings["reference"]
            for name, seconds in timings.items():
                print(f"{label:5} {tokens:>6} {plan.num_segments:>8} {mib:>7.1f} {name:10} {seconds * 1e3:>10.3f} "
                      f"{plan.total_bytes / seconds / 1e9:>7.2f} {base / seconds:>11.2f}x")
            print(f"{label:5} {tokens:>6} {plan.num_segments:>8} {mib:>7.1f} {'plan build':10} {build_s * 1e3:>10.3f} {'':>7} {'(once)':>12}")
            if args.check:
                for name, out in results.items():
                    ok = same_bits(out, results["loop"])
                    failures += not ok
                    print(f"check {label} tokens={tokens} {name} vs loop: {'PASS' if ok else 'FAIL'}")
    if args.check:
        print("ALL PASS" if failures == 0 else f"FAIL: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
