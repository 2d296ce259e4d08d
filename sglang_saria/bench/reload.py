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

Raw baseline (`raw ms`): the same objects' bytes (pages, and the checkpoint) read from one
file with O_DIRECT preadv from as many threads as the store reads with, into aligned host
buffers: what the device alone needs for the bytes a reload reads.

Medians of --repeats runs, with ratios against `staged` and against `raw` measured in the
same run. On a CPU host the "device" pool is host memory too, so this measures the path's
overhead; on a GPU (`--device cuda`) the staged path also crosses PCIe twice.

`--model DIR` runs at that model's page size (its config.json: 16 tokens x the K and V of its
full-attention layers): a full-attention model gives the full-attention rows, a hybrid the
hybrid rows with its GDN checkpoint. The pools keep SGLang's layer layout of 8 KV heads x 128
per layer, so a model's KV per token maps to that many pool layers (4 for 16 KiB per token,
whatever its real heads x head_dim): the bytes moved are the model's exactly.

    saria-bench-reload [--pages 16 64] [--layers 8] [--device cuda]
    saria-bench-reload --model models/qwen3-bench --pages 16 128
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_saria.gpukit.timing import median_seconds
from sglang_saria.gpukit.workloads import DIM, HEADS, PAGE, HybridPools, ModelShape, Pools, staged, staged_hybrid
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.reload.device import DeviceReloader, StateLoad
from sglang_saria.reload.gdn_state import StateRows
from sglang_saria.storage.buffers import aligned_empty, round_up
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import SariaStore


LAYER_BYTES = 2 * HEADS * DIM * 2  # K and V of one token in one pool layer (bf16)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="saria-bench-reload", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, nargs="+", default=[16, 64])
    sizes = ap.add_mutually_exclusive_group()
    sizes.add_argument("--layers", type=int, default=None, help="pool layers of the full-attention rows (default 8)")
    sizes.add_argument("--model", type=Path, default=None, help="run at this model dir's page size (see above)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dir", default=None, help="parent of the private store directory (default: the temp dir)")
    ap.add_argument("--hybrid-only", action="store_true", help="only the hybrid rows")
    args = ap.parse_args(argv)
    if min(args.pages) < 1 or args.repeats < 1 or (args.layers is not None and args.layers < 1):
        ap.error("--pages, --repeats and --layers must be at least 1")
    args.shape, args.fa_layers = ModelShape(), args.layers or 8
    if args.model is not None:
        try:
            args.fa_layers, args.shape = model_pools(args.model)
        except (ValueError, KeyError) as e:
            ap.error(f"--model {args.model}: {e}")
        if args.hybrid_only and args.shape is None:
            ap.error(f"--hybrid-only: {args.model} is a full-attention model")
    return args


def model_pools(model: Path) -> tuple[int, ModelShape | None]:
    """Pool layers holding ``model``'s KV per token, and its hybrid shape (None: full attention)."""
    from sglang_saria.tiny_models import kv_geometry

    g = kv_geometry(model)
    if g.bytes_per_token % LAYER_BYTES:
        raise ValueError(f"{g.bytes_per_token} B of KV per token is not a whole number of pool layers of {LAYER_BYTES} B")
    layers = g.bytes_per_token // LAYER_BYTES
    if g.gdn is None:
        return layers, None
    if g.gdn.key_dim != g.gdn.value_dim:
        raise ValueError("the hybrid pools need GDN key and value head dims alike")
    # The pools' conv state is 16-bit: a float32 model's conv rows are mapped to twice the width
    # (the bytes moved are exact, as for the KV layers).
    conv_dim = g.gdn.conv_dim * g.gdn.dtype_bytes // 2
    return layers, ModelShape(fa_layers=layers, gdn_layers=g.gdn.layers, conv_dim=conv_dim,
                              conv_width=g.gdn.conv_width, value_heads=g.gdn.value_heads, state_dim=g.gdn.key_dim)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = args.device == "cuda"
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        if not args.hybrid_only and (args.model is None or args.shape is None):
            fa_rows(args, d, cuda)
        if args.shape is not None:
            hybrid_rows(args, args.shape, d, cuda)
    return 0


def raw_read_s(directory: str, sizes: list[int], repeats: int) -> float:
    """Median seconds to read objects of ``sizes`` (one file, back to back) with O_DIRECT preadv
    from as many threads as the store reads with: the device's time for a reload's bytes."""
    spans = [round_up(n) for n in sizes]
    offsets = list(itertools.accumulate([0, *spans[:-1]]))
    bufs = [aligned_empty(n) for n in spans]
    path = os.path.join(directory, "raw.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        for buf, offset in zip(bufs, offsets):
            buf[:] = 7
            os.pwritev(fd, [buf], offset)
        os.fsync(fd)
        with ThreadPoolExecutor(StoreConfig.read_threads) as pool:
            read = lambda i: os.preadv(fd, [bufs[i]], offsets[i])  # noqa: E731
            return median_seconds(lambda: list(pool.map(read, range(len(bufs)))), repeats, False)
    finally:
        os.close(fd)
        os.unlink(path)


def hybrid_rows(args: argparse.Namespace, shape: ModelShape, d: str, cuda: bool) -> None:
    """Hybrid: n FA pages + the checkpoint at their end, direct vs host-staged, in one run."""
    page_bytes = Pools.page_bytes(shape.fa_layers)
    print(f"hybrid: {shape.fa_layers} FA layers (page {page_bytes / 2**20:.2f} MiB) + {shape.gdn_layers} GDN layers, device={args.device}")
    print(f"{'pages':>6} {'MiB':>7} {'state MiB':>10} {'raw ms':>8} {'staged ms':>10} {'direct ms':>10} {'x staged':>9}"
          f" {'staged/raw':>11} {'direct/raw':>11}")
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
            t_raw = raw_read_s(d, [page_bytes] * n + [state.numel()], args.repeats)
            mib = n * page_bytes / 2**20
            tqdm.write(
                f"{n:>6} {mib:>7.1f} {state_bytes / 2**20:>10.2f} {t_raw * 1e3:>8.1f} {t_staged * 1e3:>10.1f}"
                f" {t_direct * 1e3:>10.1f} {t_direct / t_staged:>9.2f} {t_staged / t_raw:>11.2f} {t_direct / t_raw:>11.2f}"
            )


def fa_rows(args: argparse.Namespace, d: str, cuda: bool) -> None:
    """Full attention: n pages, staged vs direct vs direct with half the pages in DRAM."""
    page_bytes = Pools.page_bytes(args.fa_layers)
    print(f"page = {PAGE} tokens x {args.fa_layers} layers = {page_bytes / 2**20:.2f} MiB, device={args.device}")
    print(f"{'pages':>6} {'MiB':>7} {'raw ms':>8} {'staged ms':>10} {'direct ms':>10} {'x staged':>9} {'direct+dram ms':>15}"
          f" {'x staged':>9} {'staged/raw':>11} {'direct/raw':>11}")
    for n in tqdm(args.pages, desc="sizes", leave=False):
        capacity = 2 * n * page_bytes + (64 << 20)
        cfg = StoreConfig(data_dirs=[f"{d}/ssd{n}"], capacity=str(capacity), slot_bytes=str(page_bytes))
        with SariaStore(cfg, victim_order=SSDVictimOrder()) as store:
            pools = Pools(n, args.fa_layers, args.device)
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
            t_raw = raw_read_s(d, [page_bytes] * n, args.repeats)
            mib = n * page_bytes / 2**20
            tqdm.write(
                f"{n:>6} {mib:>7.1f} {t_raw * 1e3:>8.1f} {t_staged * 1e3:>10.1f} {t_direct * 1e3:>10.1f} {t_direct / t_staged:>9.2f}"
                f" {t_mixed * 1e3:>15.1f} {t_mixed / t_staged:>9.2f} {t_staged / t_raw:>11.2f} {t_direct / t_raw:>11.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())
