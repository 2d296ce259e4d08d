"""Saria store throughput and latency against the raw device, measured in the same run.

Raw baseline: fio (direct=1) when installed, else dd with oflag=direct / iflag=direct,
on a file in the same directory. Store: 4 MiB objects (one slot each) written with
put_batch and read with get_batch into aligned buffers (zero copy, O_DIRECT).
Every figure is the median of --repeats runs (a one-object latency: of every call of every
run); ratios are store / raw. ``--json`` keeps every run's figures (the raw records);
``--update-doc`` renders docs/bench-models.md's blocks ``<!-- bench-storage:NAME -->`` from
that JSON, ``--render-only`` from one committed earlier.

`--model DIR` sizes the objects as that model's stored KV pages (one page of 16 tokens x
its full-attention layers' K and V, from its config.json: 256 KiB for `make bench-models`'
models), the size the server's store reads and writes; the raw baselines use the same size.

    saria-bench-storage --dir /mnt/nvme0/bench [--dir2 /mnt/nvme1/bench] --json out.json
    saria-bench-storage --model models/qwen3-bench --size 256MiB --json out.json --update-doc docs/bench-models.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from tqdm import tqdm

from sglang_saria.bench import doc_blocks
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.buffers import aligned_empty
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import SariaStore

MiB = 1 << 20
PAGE = 16  # tokens per stored page, as the servers here run (--page-size 16)


# ---------------------------------------------------------------- raw device
def _fio(path: str, rw: str, size: int, bs: int) -> float:
    out = subprocess.run(
        [
            "fio",
            "--name=raw",
            f"--filename={path}",
            f"--rw={rw}",
            f"--bs={bs}",
            f"--size={size}",
            "--direct=1",
            "--ioengine=psync",
            "--output-format=json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    side = job["read" if "read" in rw else "write"]
    return side["io_bytes"] / (side["runtime"] / 1000.0) / 1e9


def _dd(args: List[str]) -> float:
    err = subprocess.run(["dd", *args], check=True, capture_output=True, text=True).stderr
    m = re.search(r"(\d+) bytes .* copied, ([0-9.]+) s", err)
    if not m:
        raise RuntimeError(f"cannot parse dd output: {err!r}")
    return int(m.group(1)) / float(m.group(2)) / 1e9


def raw_gbps(directory: str, size: int, bs: int, tool: str) -> Dict[str, float]:
    path = os.path.join(directory, "raw.bin")
    try:
        if tool == "fio":
            out = {
                "write": _fio(path, "write", size, bs),
                "read": _fio(path, "read", size, bs),
                "randread": _fio(path, "randread", size, bs),
            }
        else:
            n = size // bs
            out = {
                "write": _dd(["if=/dev/zero", f"of={path}", f"bs={bs}", f"count={n}", "oflag=direct"]),
                "read": _dd([f"if={path}", "of=/dev/null", f"bs={bs}", "iflag=direct"]),
            }
            out["randread"] = out["read"]  # dd has no random mode: sequential raw is the bar
        return out
    finally:
        if os.path.exists(path):
            os.unlink(path)


def raw_parallel_gbps(directory: str, size: int, bs: int, threads: int) -> Dict[str, float]:
    """O_DIRECT pwritev/preadv from `threads` threads: the device at the store's queue depth."""
    from concurrent.futures import ThreadPoolExecutor

    path = os.path.join(directory, "rawqd.bin")
    n = size // bs
    bufs = [aligned_empty(bs) for _ in range(threads)]
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT)
    try:
        with ThreadPoolExecutor(threads) as ex:

            def run(fn, order):
                list(ex.map(lambda i: fn(fd, [bufs[i % threads]], order[i] * bs), range(n)))

            seq, rnd = list(range(n)), random.Random(1).sample(range(n), n)
            return {
                "write": _timed(lambda: run(os.pwritev, seq), n * bs),
                "read": _timed(lambda: run(os.preadv, seq), n * bs),
                "randread": _timed(lambda: run(os.preadv, rnd), n * bs),
            }
    finally:
        os.close(fd)
        os.unlink(path)


def raw_latency_s(directory: str, bs: int, n: int) -> Dict[str, List[float]]:
    """``n`` O_DIRECT pwrites, then preads, of one object each (s): the floor under the store's latency."""
    path = os.path.join(directory, "lat.bin")
    buf = aligned_empty(bs)
    buf[:] = 7
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT)
    try:
        w, r = [], []
        for i in range(n):
            t = time.perf_counter()
            os.pwritev(fd, [buf], i * bs)
            w.append(time.perf_counter() - t)
        for i in range(n):
            t = time.perf_counter()
            os.preadv(fd, [buf], i * bs)
            r.append(time.perf_counter() - t)
        return {"write": w, "read": r}
    finally:
        os.close(fd)
        os.unlink(path)


# ---------------------------------------------------------------- store
def _fresh(dirs: List[str], capacity: int, obj: int, threads: int) -> SariaStore:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    cfg = StoreConfig(
        data_dirs=dirs,
        capacity=capacity,
        slot_bytes=obj,
        engine="posix",
        read_threads=threads,
        write_threads=threads,
    )
    return SariaStore(cfg, victim_order=SSDVictimOrder())


def _timed(fn: Callable[[], None], nbytes: int) -> float:
    t = time.perf_counter()
    fn()
    return nbytes / (time.perf_counter() - t) / 1e9


def store_gbps(dirs: List[str], size: int, obj: int, threads: int) -> Dict[str, object]:
    """GB/s per phase (write, read, randread, randwrite) and 15 one-object put/get times (s)."""
    n = size // obj
    data = [aligned_empty(obj) for _ in range(min(n, 16))]
    for i, d in enumerate(data):
        d[:] = np.random.default_rng(i).integers(0, 256, obj, dtype=np.uint8)
    dests = [aligned_empty(obj) for _ in range(n)]
    # Room for the random-write phase: fill, free a random half, rewrite into the holes.
    store = _fresh(dirs, int(size * 1.25) // obj * obj + obj, obj, threads)
    keys = [f"obj{i}" for i in range(n)]
    try:

        def put_all(ks):
            assert all(
                f.result().ok for f in store.put_batch([(k, data[i % len(data)]) for i, k in enumerate(ks)])
            )

        def get_all(ks):
            assert all(f.result().ok for f in store.get_batch(ks, dests[: len(ks)]))

        out = {"write": _timed(lambda: put_all(keys), n * obj)}
        out["read"] = _timed(lambda: get_all(keys), n * obj)
        shuffled = random.Random(0).sample(keys, n)
        out["randread"] = _timed(lambda: get_all(shuffled), n * obj)
        store.evict(shuffled[: n // 2])
        store.flush()
        fresh = [f"new{i}" for i in range(n // 2)]
        out["randwrite"] = _timed(lambda: put_all(fresh), (n // 2) * obj)
        lat_w, lat_r = [], []
        for i in range(15):
            t = time.perf_counter()
            assert store.put(f"lat{i}", data[0]).ok
            lat_w.append(time.perf_counter() - t)
            t = time.perf_counter()
            assert store.get(f"lat{i}", dests[0]).ok
            lat_r.append(time.perf_counter() - t)
        out["lat_write"], out["lat_read"] = lat_w, lat_r
        return out
    finally:
        store.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def median_of(runs: List[Dict[str, object]]) -> Dict[str, float]:
    """Per figure, the median over runs; a list of timed calls (latency) pools every run's calls."""
    return {k: statistics.median([x for r in runs for x in r[k]] if isinstance(runs[0][k], list) else [r[k] for r in runs])
            for k in runs[0]}


def figures(doc: dict) -> Dict[str, Dict[str, float]]:
    """The medians the tables print, from a ``to_json`` record."""
    return {name: median_of(runs) for name, runs in doc["runs"].items()}


def _span(values: List[float]) -> str:
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def render(doc: dict) -> Dict[str, str]:
    """The tables and the summary sentence, from a ``to_json`` record (docs/bench-models.md's blocks)."""
    f = figures(doc)
    s1, raw, qd, lat, s2 = f["store"], f["raw"], f["raw_qd"], f["raw_latency"], f["store_2dirs"]
    q = f"raw-qd{doc['threads']}"
    rows = [
        [name, f"{s1[a]:.3f}", f"{raw[b]:.3f}", f"{s1[a] / raw[b]:.2f}", f"{qd[b]:.3f}", f"{s1[a] / qd[b]:.2f}"]
        for name, a, b in (("seq write GB/s", "write", "write"), ("seq read GB/s", "read", "read"),
                           ("rand write GB/s", "randwrite", "write"), ("rand read GB/s", "randread", "randread"))
    ] + [
        [name, f"{s1[a] * 1e3:.3f}", f"{lat[b] * 1e3:.3f}", f"{s1[a] / lat[b]:.2f}", "", ""]
        for name, a, b in (("1-object write ms", "lat_write", "write"), ("1-object read ms", "lat_read", "read"))
    ]
    table = md_table(["metric", "store", "raw", "store/raw", q, f"store/{q}"], rows)
    stripe = md_table(["metric", "2 dirs", "1 dir", "2 dirs / 1 dir"], [
        [name, f"{s2[k]:.3f}", f"{s1[k]:.3f}", f"{s2[k] / s1[k]:.2f}"]
        for name, k in (("seq read GB/s", "read"), ("seq write GB/s", "write"), ("rand read GB/s", "randread"))])
    reads = [s1["read"] / raw["read"], s1["read"] / qd["read"], s1["randread"] / raw["randread"], s1["randread"] / qd["randread"]]
    writes = [s1["write"] / raw["write"], s1["write"] / qd["write"], s1["randwrite"] / raw["write"], s1["randwrite"] / qd["write"]]
    load = doc["load_average_1min"]
    summary = (f"At one page per object the store reaches {_span(reads)} of the raw device on reads and "
               f"{_span(writes)} on writes (against both raw baselines; medians of {doc['repeats']}, 1-minute "
               f"load average {load['start']:.1f} at the start, {load['end']:.1f} at the end). Striping over two "
               f"dirs{' on this one disk' if doc['same_device'] else ''} gave {s2['read'] / s1['read']:.2f}x (seq read), "
               f"{s2['write'] / s1['write']:.2f}x (seq write), {s2['randread'] / s1['randread']:.2f}x (rand read).")
    return {"table": table, "stripe": stripe, "summary": summary}


def md_table(head: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def object_size(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Tuple[int, str]:
    """The object size and how it was chosen: one KV page of --model, else --object (4 MiB)."""
    from sglang_saria.units import parse_bytes

    if args.model is None:
        obj = parse_bytes(args.object or "4MiB", "--object")
        return obj, f"{_size_text(obj)} objects"
    from sglang_saria.tiny_models import kv_geometry

    try:
        geometry = kv_geometry(args.model)
    except (ValueError, KeyError) as e:
        ap.error(f"--model {args.model}: {e}")
    obj = geometry.page_bytes(PAGE)
    return obj, (f"{_size_text(obj)} objects = one KV page of {args.model.name} ({PAGE} tokens x "
                 f"{geometry.bytes_per_token // 1024} KiB)")


def _size_text(nbytes: int) -> str:
    return f"{nbytes / MiB:g} MiB" if nbytes >= MiB else f"{nbytes / 1024:g} KiB"


def parse_args(argv: Optional[List[str]]) -> Tuple[argparse.Namespace, int, int, str]:
    """The arguments, the bytes per phase, the object size and its description."""
    ap = argparse.ArgumentParser(prog="saria-bench-storage", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="bench directory on the SSD (default: a private temp dir under /tmp)")
    ap.add_argument("--dir2", default=None, help="second SSD for the striping run (default: --dir/second)")
    ap.add_argument("--size", default="1GiB", help="bytes per phase")
    sizes = ap.add_mutually_exclusive_group()
    sizes.add_argument("--object", default=None, help="object size (default 4MiB)")
    sizes.add_argument("--model", type=Path, default=None, help="objects of one KV page of this model dir (its config.json)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=4, help="store read and write threads")
    ap.add_argument("--json", default=None, help="write every run's figures (the raw records) as JSON here")
    ap.add_argument("--update-doc", type=Path, default=None, metavar="MD",
                    help="rewrite MD's <!-- bench-storage:NAME --> blocks from --json (docs/bench-models.md)")
    ap.add_argument("--render-only", action="store_true", help="measure nothing: --update-doc from an existing --json")
    args = ap.parse_args(argv)
    if (args.update_doc or args.render_only) and not args.json:
        ap.error("--update-doc and --render-only need --json (the doc is rendered from that file)")
    if args.render_only:
        if not args.update_doc:
            ap.error("--render-only needs --update-doc")
        return args, 0, 0, ""

    from sglang_saria.units import parse_bytes

    size = parse_bytes(args.size, "--size")
    obj, described = object_size(ap, args)
    if size < 2 * obj:
        ap.error(f"--size {args.size} must hold at least 2 objects of {obj} bytes")
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be at least 1")
    return args, size, obj, described


def main(argv: Optional[List[str]] = None) -> int:
    args, size, obj, described = parse_args(argv)
    if args.render_only:
        with open(args.json) as f:
            doc_blocks.update_file(args.update_doc, "bench-storage", render(json.load(f)))
        return 0
    load_start = os.getloadavg()[0]
    base = args.dir or tempfile.mkdtemp(prefix="saria-bench-", dir="/tmp")
    os.makedirs(base, exist_ok=True)
    second = args.dir2 or os.path.join(base, "second")
    tool = "fio" if shutil.which("fio") else "dd"
    one, two = [os.path.join(base, "s1")], [os.path.join(base, "s2a"), os.path.join(second, "s2b")]

    runs: Dict[str, list] = {"raw": [], "raw_qd": [], "raw_latency": [], "store": [], "store_2dirs": []}
    with tqdm(total=args.repeats * 3, desc="bench", unit="phase") as bar:
        for _ in range(args.repeats):
            runs["raw"].append(raw_gbps(base, size, obj, tool))
            runs["raw_qd"].append(raw_parallel_gbps(base, size, obj, args.threads))
            runs["raw_latency"].append(raw_latency_s(base, obj, 15))
            bar.update()
            runs["store"].append(store_gbps(one, size, obj, args.threads))
            bar.update()
            runs["store_2dirs"].append(store_gbps(two, size, obj, args.threads))
            bar.update()
    same_dev = os.stat(base).st_dev == os.stat(second if os.path.exists(second) else base).st_dev
    doc = {"object_bytes": obj, "objects": described, "model": str(args.model) if args.model else None,
           "size_bytes": size, "repeats": args.repeats, "threads": args.threads, "raw_tool": tool,
           "same_device": same_dev, "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]}, "runs": runs}
    tables = render(doc)
    print(f"\nSaria store vs raw device, {described}, {size / 2**30:.2f} GiB per phase, median of {args.repeats}; "
          f"raw = {tool} (direct, 1 stream), raw-qd{args.threads} = O_DIRECT from {args.threads} threads "
          f"(the store's queue depth), 1-object raw = one O_DIRECT call\n")
    print(tables["table"])
    print(f"\nstriping, 2 dirs vs 1 ({two[0]} + {two[1]}):\n")
    print(tables["stripe"])
    if same_dev:
        print("note: both striping dirs are on one device here, so the speed-up shows overhead, not a 2nd SSD")
    print("\n" + tables["summary"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    if args.update_doc:
        doc_blocks.update_file(args.update_doc, "bench-storage", tables)
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
