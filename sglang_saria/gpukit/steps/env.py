"""Step env: what the kit runs on, and whether SGLang stays out of every kit module."""

from __future__ import annotations

import importlib
import os
import platform
from pathlib import Path

import numpy as np
import torch

from sglang_saria.gpukit.steps.common import StepContext, StepFailed, kvikio_mode, require_cuda

KIT_MODULES = (
    "sglang_saria.storage.store",
    "sglang_saria.storage.kvikio_engine",
    "sglang_saria.reload.device",
    "sglang_saria.kernels.gather",
    "sglang_saria.kernels.checksum",
    "sglang_saria.mem_cache.coordinator",
    "sglang_saria.gpukit.workloads",
)


def o_direct_supported(directory: Path) -> bool:
    """Whether the store's files can be opened O_DIRECT where the kit puts them (GDS needs it;
    tmpfs refuses it, and then kvikio can only run in compat mode). SARIA_KIT_DIR moves them."""
    probe = directory / "o_direct.probe"
    probe.write_bytes(bytes(4096))
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


def run(ctx: StepContext) -> dict:
    import triton

    for name in KIT_MODULES:  # the runner blocks `sglang`: an SGLang import fails here
        importlib.import_module(name)
    figures = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "numpy": np.__version__,
        "modules_import_without_sglang": len(KIT_MODULES),
        "store_dir_o_direct": o_direct_supported(ctx.workdir),
    }
    if ctx.dry_run:
        ctx.log("dry run: on a GPU host this step reports the GPU and kvikio's GDS or compat mode")
        return figures
    require_cuda()
    props = torch.cuda.get_device_properties(0)
    figures.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    try:
        figures.update(kvikio_mode())
    except Exception as e:  # noqa: BLE001 - ImportError, or libkvikio/libcufile not found by its loader
        raise StepFailed(f"kvikio does not load ({type(e).__name__}: {e}); carry .whl/ from scripts/gpu_wheels.sh") from e
    return figures
