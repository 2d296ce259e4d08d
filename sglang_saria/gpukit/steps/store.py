"""Step store: the Saria store on the kvikio engine, objects to and from CUDA tensors.

Read GB/s is set against a raw read of the same slab bytes by the same engine family in
the same run (kvikio ``CuFile.pread`` on GPU, ``preadv`` on CPU), so the ratio is the
store's own overhead (striping, pools, xxh3 checks), whatever the disk.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from sglang_saria.gpukit.steps.common import StepContext, check, drop_page_cache, kvikio_mode, random_bytes, require_cuda
from sglang_saria.gpukit.timing import gbps, median_seconds, sig
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import GetStatus, SariaStore

DIRS = 2


def open_store(ctx: StepContext, name: str, object_bytes: int, objects: int) -> SariaStore:
    """A fresh two-dir store sized for ``objects`` of ``object_bytes`` on the step's engine."""
    cfg = StoreConfig(
        data_dirs=[str(ctx.workdir / name / f"ssd{j}") for j in range(DIRS)],
        capacity=str(2 * objects * object_bytes + (8 << 20)),
        slot_bytes=str(object_bytes),
        engine=ctx.engine,
        read_threads=8,
        write_threads=4,
    )
    return SariaStore(cfg, victim_order=SSDVictimOrder())


def slab_paths(store: SariaStore) -> list[str]:
    return [store.layout.slab_path(j) for j in range(len(store.layout.data_dirs))]


def raw_read_seconds(store: SariaStore, objects: int, device: str, repeats: int) -> float:
    """Median time to read the first ``objects`` slots' bytes of every slab, one call per file
    (kvikio into CUDA memory on GPU, plain reads on CPU): the same bytes the store read."""
    nbytes = objects * store.layout.unit
    paths = slab_paths(store)
    if device == "cuda":
        import kvikio

        files = [kvikio.CuFile(p, "r") for p in paths]
        bufs = [torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in paths]

        def read() -> None:
            drop_page_cache(paths)
            for fut in [f.pread(b, nbytes, 0) for f, b in zip(files, bufs)]:
                check(fut.get() == nbytes, "raw kvikio read came back short")

        try:
            return median_seconds(read, repeats, cuda=True)
        finally:
            for f in files:
                f.close()
    bufs = [np.empty(nbytes, dtype=np.uint8) for _ in paths]

    def read_posix() -> None:
        drop_page_cache(paths)
        for p, b in zip(paths, bufs):
            with open(p, "rb", buffering=0) as f:
                check(f.readinto(memoryview(b)) == nbytes, f"raw read of {p} came back short")

    return median_seconds(read_posix, repeats, cuda=False)


def run(ctx: StepContext) -> dict:
    objects, object_bytes, repeats = (64, 4 << 20, 5) if ctx.cuda else (8, 256 << 10, 3)
    if ctx.cuda:
        require_cuda()
        figures = kvikio_mode()
    else:
        figures = {"io_mode": "posix (dry run)"}
        ctx.log("dry run: POSIX engine into CPU tensors; on a GPU host this step times 64 x 4 MiB -> CUDA through kvikio")
    with open_store(ctx, "store", object_bytes, objects) as store:
        check(store.engine.name == ctx.engine, f"store engine is {store.engine.name}, expected {ctx.engine}")
        keys = [f"obj{i}" for i in range(objects)]
        src = [random_bytes((object_bytes,), ctx.device, seed=i) for i in range(objects)]
        start = time.perf_counter()
        puts = [f.result() for f in store.put_batch(list(zip(keys, src)))]
        write_s = time.perf_counter() - start
        check(all(p.ok for p in puts), f"puts failed: {[p.error for p in puts if not p.ok][:3]}")
        dst = [torch.empty(object_bytes, dtype=torch.uint8, device=ctx.device) for _ in keys]

        def store_read() -> None:
            drop_page_cache(slab_paths(store))
            statuses = [f.result() for f in store.get_batch(keys, dst)]
            check(all(s is GetStatus.HIT for s in statuses), f"reads not HIT: {sorted({s.value for s in statuses})}")

        read_s = median_seconds(store_read, repeats, ctx.cuda)
        bad = [i for i in range(objects) if not torch.equal(src[i], dst[i])]
        check(not bad, f"objects differ after the read (xxh3 passed): {bad[:5]}")
        raw_s = raw_read_seconds(store, objects, ctx.device, repeats)
        figures.update(
            engine=store.engine.name,
            o_direct=[store.engine.direct(j) for j in range(DIRS)],
            objects=objects,
            object_mib=object_bytes / 2**20,
            write_gbps=sig(gbps(objects * object_bytes, write_s)),
            read_gbps=sig(gbps(objects * object_bytes, read_s)),
            raw_read_gbps=sig(gbps(objects * object_bytes, raw_s)),
            read_vs_raw=sig(raw_s / read_s),
        )
        figures["corrupt_detected"] = corrupt_read_is_refused(store, keys[0], dst[0])
    return figures


def corrupt_read_is_refused(store: SariaStore, key: str, dest: torch.Tensor) -> bool:
    """Flip the first stored byte of ``key`` (the first object put in a fresh store: slot 0 of
    slab 0) on disk: its read must report CORRUPT, not HIT."""
    path = store.layout.slab_path(0)
    print(f"flipping byte 0 of {path}: the read of {key!r} must fail its checksum", flush=True)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, 0)[0] ^ 0xFF]), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    drop_page_cache([path])
    status = store.get(key, dest)
    check(status is GetStatus.CORRUPT, f"a flipped byte at offset 0 of {path} read back as {status.value}")
    return True
