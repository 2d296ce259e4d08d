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

``--json`` keeps every timed run (the raw records); ``--update-doc`` renders
docs/bench-models.md's blocks ``<!-- bench-reload:fa -->`` / ``<!-- bench-reload:hybrid -->`` (and
their ``-summary`` sentences) from that JSON, ``--render-only`` from one committed earlier.

    saria-bench-reload [--pages 16 64] [--layers 8] [--device cuda]
    saria-bench-reload --model models/qwen3-bench --pages 16 128 --json out.json --update-doc docs/bench-models.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_saria.bench import doc_blocks
from sglang_saria.gpukit.timing import sample_seconds
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
    ap.add_argument("--json", type=Path, default=None, help="write the rows, every timed run, as JSON here")
    ap.add_argument("--update-doc", type=Path, default=None, metavar="MD",
                    help="rewrite MD's <!-- bench-reload:NAME --> blocks from --json (docs/bench-models.md)")
    ap.add_argument("--render-only", action="store_true", help="measure nothing: --update-doc from an existing --json")
    args = ap.parse_args(argv)
    if (args.update_doc or args.render_only) and not args.json:
        ap.error("--update-doc and --render-only need --json (the doc is rendered from that file)")
    if args.render_only and not args.update_doc:
        ap.error("--render-only needs --update-doc")
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
    if args.render_only:
        doc_blocks.update_file(args.update_doc, "bench-reload", render(json.loads(args.json.read_text())))
        return 0
    cuda = args.device == "cuda"
    load_start = os.getloadavg()[0]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        if not args.hybrid_only and (args.model is None or args.shape is None):
            print(f"page = {PAGE} tokens x {args.fa_layers} layers = {Pools.page_bytes(args.fa_layers) / 2**20:.2f} MiB, "
                  f"device={args.device}")
            rows += fa_rows(args, d, cuda)
        if args.shape is not None:
            print(f"hybrid: {args.shape.fa_layers} FA layers (page {Pools.page_bytes(args.shape.fa_layers) / 2**20:.2f} MiB)"
                  f" + {args.shape.gdn_layers} GDN layers, device={args.device}")
            rows += hybrid_rows(args, args.shape, d, cuda)
    doc = {"model": str(args.model) if args.model else None, "device": args.device, "repeats": args.repeats,
           "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]}, "rows": rows}
    rendered = render(doc)
    for name, text in rendered.items():
        print(f"\n{text}")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    if args.update_doc:
        doc_blocks.update_file(args.update_doc, "bench-reload", rendered)
    return 0


def ms(samples: list[float]) -> float:
    return 1e3 * statistics.median(samples)


def render(doc: dict) -> dict[str, str]:
    """Per kind of row in a ``--json`` record (fa, hybrid): its table and a summary sentence; the
    figures are medians of the timed runs, the ratios formed from those medians."""
    out = {}
    for kind in ("fa", "hybrid"):
        rows = [r for r in doc["rows"] if r["kind"] == kind]
        if not rows:
            continue
        head = ["pages", "MiB"] + (["state MiB"] if kind == "hybrid" else []) + ["raw ms", "staged ms", "direct ms", "direct / staged"]
        head += ["direct+dram ms", "direct+dram / staged"] if kind == "fa" else []
        lines = []
        for r in rows:
            raw, staged, direct = ms(r["raw_s"]), ms(r["staged_s"]), ms(r["direct_s"])
            cells = [str(r["pages"]), f"{r['pages'] * r['page_bytes'] / 2**20:.1f}"]
            cells += [f"{r['state_bytes'] / 2**20:.2f}"] if kind == "hybrid" else []
            cells += [f"{raw:.1f}", f"{staged:.1f}", f"{direct:.1f}", f"{direct / staged:.2f}"]
            if kind == "fa":
                mixed = ms(r["direct_dram_s"])
                cells += [f"{mixed:.1f}", f"{mixed / staged:.2f}"]
            lines.append(cells + [f"{staged / raw:.2f}", f"{direct / raw:.2f}"])
        head += ["staged / raw", "direct / raw"]
        out[kind] = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                              + ["| " + " | ".join(c) + " |" for c in lines])
        top = max(rows, key=lambda r: r["pages"])
        staged_raw, direct_raw = (ms(top[k]) / ms(top["raw_s"]) for k in ("staged_s", "direct_s"))
        load = doc["load_average_1min"]
        out[f"{kind}-summary"] = (
            f"Reloading {top['pages']} pages ({top['pages'] * PAGE} tokens) takes {staged_raw:.2f}x (staged) and "
            f"{direct_raw:.2f}x (direct) the raw read of its bytes; direct / staged {ms(top['direct_s']) / ms(top['staged_s']):.2f} "
            f"(medians of {doc['repeats']}, 1-minute load average {load['start']:.1f} at the start, {load['end']:.1f} at the end).")
    return out


def raw_read_s(directory: str, sizes: list[int], repeats: int) -> list[float]:
    """Seconds to read objects of ``sizes`` (one file, back to back) with O_DIRECT preadv from as
    many threads as the store reads with, ``repeats`` times: the device's time for a reload's bytes."""
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
            return sample_seconds(lambda: list(pool.map(read, range(len(bufs)))), repeats, False)
    finally:
        os.close(fd)
        os.unlink(path)


def hybrid_rows(args: argparse.Namespace, shape: ModelShape, d: str, cuda: bool) -> list[dict]:
    """Hybrid: n FA pages + the checkpoint at their end, direct vs host-staged, in one run."""
    page_bytes = Pools.page_bytes(shape.fa_layers)
    rows = []
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
            staged_s = sample_seconds(
                lambda: staged_hybrid(store, pools, reloader, keys, state_key, list(range(n)), slots, 1), args.repeats, cuda
            )
            direct_s = sample_seconds(
                lambda: reloader.load(keys, slots, state=StateLoad(2, key=state_key)), args.repeats, cuda
            )
            outcome = reloader.load(keys, slots, state=StateLoad(2, key=state_key))
            assert outcome.ok and outcome.state_loaded, outcome.reason
            raw_s = raw_read_s(d, [page_bytes] * n + [state.numel()], args.repeats)
            rows.append({"kind": "hybrid", "pages": n, "page_bytes": page_bytes, "state_bytes": state_bytes,
                         "raw_s": raw_s, "staged_s": staged_s, "direct_s": direct_s})
    return rows


def fa_rows(args: argparse.Namespace, d: str, cuda: bool) -> list[dict]:
    """Full attention: n pages, staged vs direct vs direct with half the pages in DRAM."""
    page_bytes = Pools.page_bytes(args.fa_layers)
    rows = []
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
            staged_s = sample_seconds(lambda: staged(store, pools, reloader, keys, list(range(n)), slots), args.repeats, cuda)
            direct_s = sample_seconds(lambda: reloader.load(keys, slots), args.repeats, cuda)
            half = n // 2
            host_slots = torch.arange(0, half * PAGE)
            mixed_s = sample_seconds(
                lambda: reloader.load(keys[half:], slots[half * PAGE :], host_slots, slots[: half * PAGE]),
                args.repeats,
                cuda,
            )
            raw_s = raw_read_s(d, [page_bytes] * n, args.repeats)
            rows.append({"kind": "fa", "pages": n, "page_bytes": page_bytes, "state_bytes": 0, "raw_s": raw_s,
                         "staged_s": staged_s, "direct_s": direct_s, "direct_dram_s": mixed_s})
    return rows


if __name__ == "__main__":
    sys.exit(main())
