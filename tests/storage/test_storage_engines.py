"""Engine selection; GDS (kvikio) reads into CUDA tensors where a GPU exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_saria.storage.engine import PosixEngine, cuda_and_kvikio_available, select_engine

GPU = cuda_and_kvikio_available()


def needs_gpu(test):
    """Marked `gpu` (scripts/gpu_check.sh runs these) and skipped, with the reason, without one."""
    return pytest.mark.gpu(pytest.mark.skipif(not GPU, reason="needs CUDA GPU + kvikio: GDS reads into CUDA tensors")(test))


@pytest.mark.skipif(GPU, reason="checks the CPU fallback; this host has CUDA + kvikio")
def test_auto_selects_posix_without_cuda_and_kvikio_is_refused():
    assert isinstance(select_engine("auto"), PosixEngine)
    with pytest.raises(ValueError, match="needs a CUDA GPU and the kvikio package"):
        select_engine("kvikio")


@needs_gpu
def test_auto_selects_kvikio_with_cuda():
    from sglang_saria.storage.kvikio_engine import KvikioEngine

    assert isinstance(select_engine("auto"), KvikioEngine)


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
