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
(scripts/gpu_check_gather.sh uses it on GPU hosts).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_saria.hybrid.gather import (  # noqa: E402
    GatherPlan,
    RowMoves,
    gather_mixed,
    gather_mixed_reference,
    triton_interpreted,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_BITS = {2: torch.int16, 4: torch.int32}


@dataclass(frozen=True)
class ModelShape:
    """Small hybrid model per TP rank (Qwen3-Next-like ratio: 3 GDN layers per FA layer)."""

    fa_layers: int = 4
    kv_heads: int = 2
    head_dim: int = 128
    gdn_layers: int = 12
    conv_dim: int = 1024
    conv_width: int = 3
    value_heads: int = 8
    state_dim: int = 64
    page_size: int = 16


@dataclass
class Workload:
    sources: list[torch.Tensor]
    destinations: list[torch.Tensor]
    moves: list[RowMoves]
    requests: int
    tokens: int


def build_workload(shape: ModelShape, tokens: int, dtype: torch.dtype, device: str, host_device: str, seed: int) -> Workload:
    """Allocate pools shaped like SGLang's and the moves of one batch of mixed reloads."""
    gen = torch.Generator().manual_seed(seed)
    s = shape
    pages = tokens // s.page_size
    requests = max(1, tokens // 512)
    pool_slots = 2 * tokens
    on_ssd = torch.rand(pages, generator=gen) < 0.5  # page-granular DRAM/SSD interleaving
    ssd_pages = on_ssd.nonzero().flatten()
    dram_pages = (~on_ssd).nonzero().flatten()

    def rand(*size: int, dt: torch.dtype = dtype, dev: str = device) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(dt).to(dev)

    staging = rand(len(ssd_pages) * s.page_size, s.fa_layers, 2, s.kv_heads, s.head_dim)
    host_kv = rand(2, s.fa_layers, pool_slots, s.kv_heads, s.head_dim, dev=host_device)
    temporal = (s.value_heads, s.state_dim, s.state_dim)
    ckpt_conv_stage = rand(requests, s.gdn_layers, s.conv_dim, s.conv_width)
    ckpt_temporal_stage = rand(requests, s.gdn_layers, *temporal, dt=torch.float32)
    host_conv = rand(s.gdn_layers, requests, s.conv_dim, s.conv_width, dev=host_device)
    host_temporal = rand(s.gdn_layers, requests, *temporal, dt=torch.float32, dev=host_device)
    if host_device == "cpu" and device == "cuda":
        host_kv, host_conv, host_temporal = (t.pin_memory() for t in (host_kv, host_conv, host_temporal))

    k_buffer = [torch.zeros(pool_slots + s.page_size, s.kv_heads, s.head_dim, dtype=dtype, device=device) for _ in range(s.fa_layers)]
    v_buffer = [torch.zeros_like(k) for k in k_buffer]
    conv_state = torch.zeros(s.gdn_layers, 2 * requests + 1, s.conv_dim, s.conv_width, dtype=dtype, device=device)
    temporal_state = torch.zeros(s.gdn_layers, 2 * requests + 1, *temporal, dtype=torch.float32, device=device)

    def page_rows(page_ids: torch.Tensor) -> torch.Tensor:
        return (page_ids[:, None] * s.page_size + torch.arange(s.page_size)).flatten()

    dst_slots = torch.randperm(pool_slots, generator=gen)[:tokens] + s.page_size
    host_slots = torch.randperm(pool_slots, generator=gen)[:tokens]
    ssd_rows, dram_rows = page_rows(ssd_pages), page_rows(dram_pages)
    sources: list[torch.Tensor] = []
    destinations: list[torch.Tensor] = []
    moves: list[RowMoves] = []
    for layer in range(s.fa_layers):
        for kv, buffers in enumerate((k_buffer, v_buffer)):
            destinations.append(buffers[layer])
            sources += [staging[:, layer, kv], host_kv[kv, layer]]
            dst = len(destinations) - 1
            moves.append(RowMoves(len(sources) - 2, torch.arange(len(ssd_rows)), dst, dst_slots[ssd_rows]))
            moves.append(RowMoves(len(sources) - 1, host_slots[dram_rows], dst, dst_slots[dram_rows]))
    from_ssd = torch.rand(requests, generator=gen) < 0.5
    slots = torch.randperm(2 * requests + 1, generator=gen)[:requests]
    for layer in range(s.gdn_layers):
        for stage, host, pool in ((ckpt_conv_stage, host_conv, conv_state), (ckpt_temporal_stage, host_temporal, temporal_state)):
            destinations.append(pool[layer])
            sources += [stage[:, layer], host[layer]]
            dst = len(destinations) - 1
            ssd_req, dram_req = from_ssd.nonzero().flatten(), (~from_ssd).nonzero().flatten()
            moves.append(RowMoves(len(sources) - 2, ssd_req, dst, slots[ssd_req]))
            moves.append(RowMoves(len(sources) - 1, dram_req, dst, slots[dram_req]))
    return Workload(sources, destinations, moves, requests, tokens)


def row_loop(w: Workload) -> None:
    for m in w.moves:
        src, dst = w.sources[m.src], w.destinations[m.dst]
        for s, d in zip(torch.as_tensor(m.src_rows).tolist(), torch.as_tensor(m.dst_rows).tolist()):
            dst[d].copy_(src[s], non_blocking=True)


def per_group(w: Workload) -> None:
    for m in w.moves:
        dst = w.destinations[m.dst]
        src_rows = torch.as_tensor(m.src_rows).to(w.sources[m.src].device)
        dst[torch.as_tensor(m.dst_rows).to(dst.device)] = w.sources[m.src][src_rows].to(dst.device)


def median_seconds(fn: Callable[[], None], repeats: int, cuda: bool) -> float:
    fn()  # warm-up (compiles the kernel on first CUDA launch)
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def snapshot(w: Workload) -> list[torch.Tensor]:
    return [t.detach().clone().cpu() for t in w.destinations]


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x.view(_BITS[x.element_size()]), y.view(_BITS[y.element_size()])) for x, y in zip(a, b))


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
