"""Engine selection; GDS (kvikio) reads into CUDA tensors where a GPU exists; with kvikio,
reads and writes run in separate queues (writes on the store's own write pool, paper 5.1)."""

from __future__ import annotations

import threading
from typing import Optional, Sequence

import numpy as np
import pytest
import torch

from sglang_saria.storage import engine as engine_module
from sglang_saria.storage.buffers import Segment
from sglang_saria.storage.engine import PosixEngine, cuda_and_kvikio_available, select_engine
from sglang_saria.storage.fault_injection import WrappedEngine
from sglang_saria.storage.io_engine import IOEngine
from sglang_saria.storage.split_engine import SplitEngine
from sglang_saria.storage.store import GetStatus, SariaStore
from tests.store_fixtures import make_payload

GPU = cuda_and_kvikio_available()
OBJECT = 128 << 10  # two 64 KiB slots: one stripe run per data dir


def needs_gpu(test):
    """Marked `gpu` (scripts/gpu_check.sh runs these) and skipped, with the reason, without one."""
    return pytest.mark.gpu(pytest.mark.skipif(not GPU, reason="needs CUDA GPU: with kvikio, GDS reads into CUDA tensors")(test))


class ThreadLog(WrappedEngine):
    """A real engine that notes which thread ran each call; its writes wait while
    ``writes_open`` is clear (a write stream held in its queue)."""

    def __init__(self, engine: IOEngine, name: Optional[str] = None) -> None:
        super().__init__(engine)
        self.name = name or engine.name
        self.calls: list[tuple[str, str]] = []  # (op, thread name)
        self.writes_open = threading.Event()
        self.writes_open.set()

    def _note(self, op: str) -> None:
        self.calls.append((op, threading.current_thread().name))

    def read(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        self._note("read")
        return super().read(dir_idx, offset, segs)

    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        self._note("write")
        self.writes_open.wait()
        return super().write(dir_idx, offset, segs)

    def sync(self, dir_idx: int) -> None:
        self._note("sync")
        super().sync(dir_idx)

    def threads(self, op: str) -> set[str]:
        return {thread for o, thread in self.calls if o == op}


class GdsStandIn(ThreadLog):
    """kvikio's place in ``select_engine`` on a host without CUDA: a real POSIX engine under
    kvikio's name, so the selection's routing runs as it does on a GPU."""

    def __init__(self) -> None:
        super().__init__(PosixEngine(), name="kvikio")


def reads_pass_a_held_write_stream(store: SariaStore, engine: SplitEngine, device: str) -> None:
    """Objects stored, then a write stream held in the write queue (every write blocked), and
    the stored objects are read back meanwhile: reads never wait behind writes. Then the stream
    commits, and each side of the engine ran only its own calls on its own pool's threads."""
    stored = {f"r{i}": make_payload(f"r{i}", OBJECT) for i in range(4)}
    assert all(f.result(timeout=30).ok for f in store.put_batch(list(stored.items())))
    engine.writes.writes_open.clear()
    stream = store.put_batch([(f"w{i}", make_payload(f"w{i}", OBJECT)) for i in range(8)])
    try:
        for key, want in stored.items():
            out = torch.zeros(OBJECT, dtype=torch.uint8, device=device)
            assert store.get_async(key, out).result(timeout=30) is GetStatus.HIT
            assert np.array_equal(out.cpu().numpy(), want)
        assert not any(f.done() for f in stream), "the write stream was not held while the reads ran"
    finally:
        engine.writes.writes_open.set()
    assert all(f.result(timeout=30).ok for f in stream)
    reads, writes = engine.reads, engine.writes
    assert {op for op, _ in reads.calls} == {"read"}  # the GDS side never writes or syncs
    assert {op for op, _ in writes.calls} == {"write", "sync"}
    assert isinstance(writes.inner, PosixEngine)  # pwritev, on the calling thread
    assert reads.threads("read") and all(t.startswith("saria-read") for t in reads.threads("read"))
    assert writes.threads("write") and all(t.startswith("saria-write") for t in writes.threads("write"))


@pytest.mark.skipif(GPU, reason="checks the CPU fallback; this host has CUDA + kvikio")
def test_auto_selects_posix_without_cuda_and_kvikio_is_refused():
    assert isinstance(select_engine("auto"), PosixEngine)
    with pytest.raises(ValueError, match="needs a CUDA GPU and the kvikio package"):
        select_engine("kvikio")


def test_kvikio_selection_reads_through_kvikio_and_writes_on_the_store_write_pool(make_store, monkeypatch):
    """The selection as on a GPU host, kvikio's reads stood in for by a real POSIX engine."""
    monkeypatch.setattr(engine_module, "cuda_and_kvikio_available", lambda: True)
    monkeypatch.setattr(engine_module, "KvikioEngine", GdsStandIn)
    engine = select_engine("kvikio")
    assert isinstance(engine, SplitEngine) and engine.name == "kvikio"
    assert isinstance(engine.reads, GdsStandIn) and isinstance(engine.writes, PosixEngine)
    engine.writes = ThreadLog(engine.writes)
    store = make_store(ndirs=2, engine=engine)
    assert store.stats().engine == "kvikio"
    reads_pass_a_held_write_stream(store, engine, "cpu")


@needs_gpu
def test_kvikio_reads_into_cuda_pass_a_held_write_stream_on_the_store_write_pool(make_store):
    from sglang_saria.storage.kvikio_engine import KvikioEngine

    engine = select_engine("kvikio")
    assert isinstance(engine.reads, KvikioEngine) and isinstance(engine.writes, PosixEngine)
    engine.reads, engine.writes = ThreadLog(engine.reads), ThreadLog(engine.writes)
    store = make_store(ndirs=2, engine=engine)
    reads_pass_a_held_write_stream(store, engine, "cuda")


@needs_gpu
def test_auto_selects_kvikio_with_cuda():
    from sglang_saria.storage.kvikio_engine import KvikioEngine

    engine = select_engine("auto")
    assert isinstance(engine, SplitEngine) and isinstance(engine.reads, KvikioEngine)


@needs_gpu
@pytest.mark.parametrize("ndirs", [1, 2])
def test_kvikio_reads_straight_into_cuda_tensor(make_store, payload, ndirs):
    store = make_store(ndirs=ndirs, slot_bytes="1MiB", capacity="64MiB", engine=select_engine("kvikio"))
    assert store.engine.name == "kvikio"
    src = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, device="cuda")
    assert store.put("g", src).ok
    out = torch.zeros_like(src)
    assert store.get("g", out).ok
    assert torch.equal(out, src)
    host = np.zeros(3 << 20, np.uint8)
    assert store.get("g", host).ok
    np.testing.assert_array_equal(host, src.cpu().numpy())


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA GPU: posix engine staging into CUDA memory"
)
def test_posix_engine_into_cuda_tensor_via_bounce(make_store):
    store = make_store(engine=PosixEngine())
    src = torch.arange(100_000, dtype=torch.int32, device="cuda")
    assert store.put("c", src).ok
    out = torch.zeros_like(src)
    assert store.get("c", out).ok and torch.equal(out, src)
