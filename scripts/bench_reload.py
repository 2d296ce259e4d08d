#!/usr/bin/env python
"""Reload path benchmark: direct SSD -> device pool vs HiCache's staging through host memory.

Both paths read the same stored KV pages from a real Saria store (O_DIRECT files) into a
device KV pool shaped like SGLang's MHATokenToKVPool (per-layer K/V buffers):

- `staged` (HiCache): store -> host pool pages (page_first_direct, zero-copy reads), then
  the host -> device copy (the reloader's host-pool gather: pinned memory over UVA on CUDA,
  as SGLang's transfer kernels read it; row copies on CPU);
- `direct` (Saria): store -> staging buffer on the pool's device -> one gather per chunk
  into the pool slots (`reload/device.py`), no host pool involved;
- `direct+dram`: a plan with half its pages in the host pool and half on SSD, moved in the
  same gathers (vs `staged`, which copies the host half and stages the SSD half).

Hybrid rows (a Qwen3-Next-like model per rank, `gpukit.workloads.ModelShape`: 4 FA layers
behind the hybrid pool's layer mapping, 12 GDN layers): the FA pages plus the GDN
checkpoint at their end (one MAMBA sidecar page, fp32 recurrent + bf16 conv state):
- `staged`: store -> host KV pool and host mamba pool, then one host -> device gather;
- `direct`: store -> device staging -> one gather per chunk into the FA layers and a mamba
  slot, the checkpoint in the last chunk's launch (`reload/gdn_state.py`).

Medians of --repeats runs, with ratios against `staged` measured in the same run. On a CPU
host the "device" pool is host memory too, so this measures the path's overhead; on a GPU
(`--device cuda`) the staged path also crosses PCIe twice.

    python scripts/bench_reload.py [--pages 16 64] [--layers 8] [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_saria.gpukit.timing import median_seconds  # noqa: E402
from sglang_saria.gpukit.workloads import PAGE, HybridPools, ModelShape, Pools, staged, staged_hybrid  # noqa: E402
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder  # noqa: E402
from sglang_saria.reload.device import DeviceReloader, StateLoad  # noqa: E402
from sglang_saria.reload.gdn_state import StateRows  # noqa: E402
from sglang_saria.storage.config import StoreConfig  # noqa: E402
from sglang_saria.storage.store import SariaStore  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dir", default=None, help="store directory (default: a temp dir)")
    ap.add_argument("--hybrid-only", action="store_true", help="only the hybrid rows")
    args = ap.parse_args()
    cuda = args.device == "cuda"

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        if not args.hybrid_only:
            fa_rows(args, d, cuda)
        hybrid_rows(args, d, cuda)
    return 0


def hybrid_rows(args: argparse.Namespace, d: str, cuda: bool) -> None:
    """Hybrid: n FA pages + the checkpoint at their end, direct vs host-staged, in one run."""
    shape = ModelShape()
    page_bytes = Pools.page_bytes(shape.fa_layers)
    print(f"hybrid: {shape.fa_layers} FA layers (page {page_bytes / 2**20:.2f} MiB) + {shape.gdn_layers} GDN layers, device={args.device}")
    print(f"{'pages':>6} {'MiB':>7} {'state MiB':>10} {'staged ms':>10} {'direct ms':>10} {'x staged':>9}")
    for n in tqdm(args.pages, desc="hybrid sizes", leave=False):
        pools = HybridPools(n, shape, args.device)
        state_bytes = pools.get_size_per_token()
        capacity = 2 * (n * page_bytes + state_bytes) + (64 << 20)
        cfg = StoreConfig(data_dirs=[f"{d}/hybrid{n}"], capacity=str(capacity), slot_bytes=str(page_bytes))
        with SariaStore(cfg, victim_order=SSDVictimOrder()) as store:
            keys = [f"h{n}-{i}" for i in range(n)]
            for k in keys:
                assert store.put(k, torch.randn(page_bytes // 2).to(torch.bfloat16)).ok
            state_key = f"h{n}.mamba"
            state = torch.cat([torch.randn(pools.temporal_buffer[0].numel()).view(torch.uint8),
                               torch.randn(pools.conv_buffer[0][0].numel()).to(torch.bfloat16).view(torch.uint8)])
            assert store.put(state_key, state).ok
            reloader = DeviceReloader(
                store.get_async, pools, "page_first_direct", PAGE, page_bytes, host_pool=pools.full_kv_pool,
                state_rows=StateRows.of_pools(pools), read_state=store.get_async,
            )
            slots = torch.arange(PAGE, (n + 1) * PAGE)
            t_staged = median_seconds(
                lambda: staged_hybrid(store, pools, reloader, keys, state_key, list(range(n)), slots, 1), args.repeats, cuda
            )
            t_direct = median_seconds(
                lambda: reloader.load(keys, slots, state=StateLoad(2, key=state_key)), args.repeats, cuda
            )
            outcome = reloader.load(keys, slots, state=StateLoad(2, key=state_key))
            assert outcome.ok and outcome.state_loaded, outcome.reason
            mib = n * page_bytes / 2**20
            tqdm.write(
                f"{n:>6} {mib:>7.1f} {state_bytes / 2**20:>10.2f} {t_staged * 1e3:>10.1f} {t_direct * 1e3:>10.1f}"
                f" {t_direct / t_staged:>9.2f}"
            )


def fa_rows(args: argparse.Namespace, d: str, cuda: bool) -> None:
    """Full attention: n pages, staged vs direct vs direct with half the pages in DRAM."""
    page_bytes = Pools.page_bytes(args.layers)
    print(f"page = {PAGE} tokens x {args.layers} layers = {page_bytes / 2**20:.2f} MiB, device={args.device}")
    print(f"{'pages':>6} {'MiB':>7} {'staged ms':>10} {'direct ms':>10} {'x staged':>9} {'direct+dram ms':>15} {'x staged':>9}")
    for n in tqdm(args.pages, desc="sizes", leave=False):
        capacity = 2 * n * page_bytes + (64 << 20)
        cfg = StoreConfig(data_dirs=[f"{d}/ssd{n}"], capacity=str(capacity), slot_bytes=str(page_bytes))
        with SariaStore(cfg, victim_order=SSDVictimOrder()) as store:
            pools = Pools(n, args.layers, args.device)
            keys = [f"p{n}-{i}" for i in range(n)]
            for k in keys:
                assert store.put(k, torch.randn(page_bytes // 2).to(torch.bfloat16)).ok
            slots = torch.arange(PAGE, (n + 1) * PAGE)
            reloader = DeviceReloader(store.get_async, pools, "page_first_direct", PAGE, page_bytes, host_pool=pools)
            t_staged = median_seconds(lambda: staged(store, pools, reloader, keys, list(range(n)), slots), args.repeats, cuda)
            t_direct = median_seconds(lambda: reloader.load(keys, slots), args.repeats, cuda)
            half = n // 2
            host_slots = torch.arange(0, half * PAGE)
            t_mixed = median_seconds(
                lambda: reloader.load(keys[half:], slots[half * PAGE :], host_slots, slots[: half * PAGE]),
                args.repeats,
                cuda,
            )
            mib = n * page_bytes / 2**20
            tqdm.write(
                f"{n:>6} {mib:>7.1f} {t_staged * 1e3:>10.1f} {t_direct * 1e3:>10.1f} {t_direct / t_staged:>9.2f}"
                f" {t_mixed * 1e3:>15.1f} {t_mixed / t_staged:>9.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())
