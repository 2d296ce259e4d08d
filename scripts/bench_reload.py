#!/usr/bin/env python
"""Reload path benchmark: direct SSD -> device pool vs HiCache's staging through host memory.

Both paths read the same stored KV pages from a real Saria store (O_DIRECT files) into a
device KV pool shaped like SGLang's MHATokenToKVPool (per-layer K/V buffers):

- `staged` (HiCache): store -> host pool pages (page_first_direct, zero-copy reads), then
  the host -> device copy HiCache runs per layer (`sglang_saria/cpu/kvcacheio.py` on CPU);
- `direct` (Saria): store -> staging buffer on the pool's device -> one gather per chunk
  into the pool slots (`storage/device_reload.py`), no host pool involved;
- `direct+dram`: a plan with half its pages in the host pool and half on SSD, moved in the
  same gathers (vs `staged`, which copies the host half and stages the SSD half).

Medians of --repeats runs, with ratios against `staged` measured in the same run. On a CPU
host the "device" pool is host memory too, so this measures the path's overhead; on a GPU
(`--device cuda`) the staged path also crosses PCIe twice.

    python scripts/bench_reload.py [--pages 16 64] [--layers 8] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_saria.cpu.kvcacheio import transfer_kv_per_layer_direct_pf_lf  # noqa: E402
from sglang_saria.storage.config import StoreConfig  # noqa: E402
from sglang_saria.storage.device_reload import DeviceReloader  # noqa: E402
from sglang_saria.storage.store import SariaStore  # noqa: E402

PAGE, HEADS, DIM = 16, 8, 128


class Pools:
    """A device pool (per-layer K/V) and a page_first_direct host pool, as SGLang lays them out."""

    def __init__(self, pages: int, layers: int, device: str) -> None:
        slots = (pages + 1) * PAGE
        self.k_buffer = [torch.zeros(slots, HEADS, DIM, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.v_buffer = [torch.zeros(slots, HEADS, DIM, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.kv_buffer = torch.zeros(2, pages, layers, PAGE, HEADS, DIM, dtype=torch.bfloat16)
        if device == "cuda":
            self.kv_buffer = self.kv_buffer.pin_memory()
        self.layers = layers


def staged(store: SariaStore, pools: Pools, keys: list[str], host_pages: list[int], slots: torch.Tensor) -> None:
    """HiCache: read each page into its host pool page, then copy host -> device layer by layer."""
    futures = [store.get_async(k, [pools.kv_buffer[0, p].view(-1), pools.kv_buffer[1, p].view(-1)]) for k, p in zip(keys, host_pages)]
    assert all(f.result().ok for f in futures)
    host_slots = torch.cat([torch.arange(PAGE) + p * PAGE for p in host_pages])
    for layer in range(pools.layers):
        transfer_kv_per_layer_direct_pf_lf(
            [pools.kv_buffer[0], pools.kv_buffer[1]], [pools.k_buffer[layer], pools.v_buffer[layer]],
            host_slots, slots, layer, PAGE,
        )
    if slots.device.type == "cuda" or pools.k_buffer[0].is_cuda:
        torch.cuda.synchronize()


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dir", default=None, help="store directory (default: a temp dir)")
    args = ap.parse_args()

    page_bytes = 2 * args.layers * PAGE * HEADS * DIM * 2
    print(f"page = {PAGE} tokens x {args.layers} layers = {page_bytes / 2**20:.2f} MiB, device={args.device}")
    print(f"{'pages':>6} {'MiB':>7} {'staged ms':>10} {'direct ms':>10} {'x staged':>9} {'direct+dram ms':>15} {'x staged':>9}")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        for n in tqdm(args.pages, desc="sizes", leave=False):
            capacity = 2 * n * page_bytes + (64 << 20)
            cfg = StoreConfig(data_dirs=[f"{d}/ssd{n}"], capacity=str(capacity), slot_bytes=str(page_bytes))
            with SariaStore(cfg) as store:
                pools = Pools(n, args.layers, args.device)
                keys = [f"p{n}-{i}" for i in range(n)]
                for k in keys:
                    assert store.put(k, torch.randn(page_bytes // 2).to(torch.bfloat16)).ok
                slots = torch.arange(PAGE, (n + 1) * PAGE)
                reloader = DeviceReloader(store.get_async, pools, "page_first_direct", PAGE, page_bytes, host_pool=pools)
                t_staged = timed(lambda: staged(store, pools, keys, list(range(n)), slots), args.repeats)
                t_direct = timed(lambda: reloader.load(keys, slots), args.repeats)
                half = n // 2
                host_slots = torch.arange(0, half * PAGE)
                t_mixed = timed(
                    lambda: reloader.load(keys[half:], slots[half * PAGE :], host_slots, slots[: half * PAGE]),
                    args.repeats,
                )
                mib = n * page_bytes / 2**20
                tqdm.write(
                    f"{n:>6} {mib:>7.1f} {t_staged * 1e3:>10.1f} {t_direct * 1e3:>10.1f} {t_direct / t_staged:>9.2f}"
                    f" {t_mixed * 1e3:>15.1f} {t_mixed / t_staged:>9.2f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
