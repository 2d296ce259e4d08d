"""Step queues: read latency with and without a concurrent write stream (paper 5.1).

On kvikio the store reads through kvikio and writes (from pinned host memory, as HiCache's
host pool does) with pwritev on its own write pool (``storage/split_engine.py``), so a write
stream should not queue ahead of reads. One reload-sized batch of reads into device memory is
timed (page cache dropped before each run, untimed; median of several runs) on an idle store,
then again while a stream of puts keeps the write pool busy; the ratio is what writes cost a
reload.
"""

from __future__ import annotations

import threading
import time

import torch

from sglang_saria.gpukit.steps.common import StepContext, check, drop_page_cache, kvikio_mode, random_bytes, require_cuda
from sglang_saria.gpukit.steps.store import open_store, slab_paths
from sglang_saria.gpukit.timing import gbps, median_seconds, sig
from sglang_saria.storage.split_engine import SplitEngine
from sglang_saria.storage.store import GetStatus, SariaStore


class WriteStream:
    """Puts of ``sources`` (overwriting their keys) back to back on a thread until stopped."""

    def __init__(self, store: SariaStore, sources: list[torch.Tensor]) -> None:
        self.store, self.items = store, [(f"stream{i}", s) for i, s in enumerate(sources)]
        self.bytes, self.t0, self.seconds = 0, 0.0, 0.0
        self.errors: list[str] = []
        self._started, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="kit-write-stream", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                futures = self.store.put_batch(self.items, overwrite=True)
                self._started.set()
                for f, (_, source) in zip(futures, self.items):
                    result = f.result()
                    if result.ok:
                        self.bytes += source.numel()
                    else:
                        self.errors.append(result.error or "put failed")
        except Exception as e:  # noqa: BLE001 - the step reports it instead of waiting forever
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            self._started.set()

    def __enter__(self) -> "WriteStream":
        self.t0 = time.perf_counter()
        self._thread.start()
        self._started.wait()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self.t0


def run(ctx: StepContext) -> dict:
    reads, writes, object_bytes, repeats = (8, 16, 4 << 20, 7) if ctx.cuda else (4, 8, 256 << 10, 5)
    if ctx.cuda:
        require_cuda()
        figures = kvikio_mode()
    else:
        figures = {"io_mode": "posix (dry run)"}
        ctx.log("dry run: POSIX engine into CPU tensors; on a GPU host this step times 8 x 4 MiB kvikio reads "
                "into CUDA memory, idle and beside a stream of 4 MiB puts from pinned host memory")
    host = [random_bytes((object_bytes,), "cpu", seed=100 + i) for i in range(reads + writes)]
    if ctx.cuda:
        host = [t.pin_memory() for t in host]
    with open_store(ctx, "queues", object_bytes, reads + writes) as store:
        write_engine = store.engine.writes.name if isinstance(store.engine, SplitEngine) else store.engine.name
        check(write_engine == "posix", f"store writes go through {write_engine}, not the store's own write pool")
        keys = [f"read{i}" for i in range(reads)]
        puts = [f.result() for f in store.put_batch(list(zip(keys, host[:reads])))]
        check(all(p.ok for p in puts), f"puts failed: {[p.error for p in puts if not p.ok][:3]}")
        dst = [torch.empty(object_bytes, dtype=torch.uint8, device=ctx.device) for _ in keys]

        def read_batch() -> None:
            statuses = [f.result() for f in store.get_batch(keys, dst)]
            check(all(s is GetStatus.HIT for s in statuses), f"reads not HIT: {sorted({s.value for s in statuses})}")

        def drop() -> None:
            drop_page_cache(slab_paths(store))

        idle_s = median_seconds(read_batch, repeats, ctx.cuda, before=drop)
        with WriteStream(store, host[reads:]) as stream:
            busy_s = median_seconds(read_batch, repeats, ctx.cuda, before=drop)
        check(not stream.errors, f"stream puts failed: {stream.errors[:3]}")
        check(stream.bytes > 0, "the write stream wrote nothing while the reads were timed")
        bad = [i for i in range(reads) if not torch.equal(dst[i].cpu(), host[i])]
        check(not bad, f"objects read beside the write stream differ: {bad}")
        figures.update(
            read_engine=store.engine.name,
            write_engine=write_engine,
            objects_per_read=reads,
            object_mib=object_bytes / 2**20,
            repeats=repeats,
            read_ms_idle=sig(idle_s * 1e3),
            read_ms_with_writes=sig(busy_s * 1e3),
            with_writes_vs_idle=sig(busy_s / idle_s),
            stream_write_gbps=sig(gbps(stream.bytes, stream.seconds)),
        )
    return figures
