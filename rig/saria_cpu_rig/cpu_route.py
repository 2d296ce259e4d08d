"""When SGLang's GDN layer should run the pure-torch ops of ``gdn_torch``.

WHY: the patched SGLang modules ask this once at import; keeping the rule in one
place makes "GPU paths unchanged" checkable: it is true only when SGLang sees no
accelerator platform (CUDA, ROCm, NPU, XPU) and no ``sgl_kernel`` CPU engine
(``SGLANG_USE_CPU_ENGINE=1`` has its own CPU kernels).
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def use_torch_gdn() -> bool:
    """True on a plain-CPU SGLang platform, where GDN ops would otherwise hit Triton."""
    from sglang.srt.utils import is_cpu, is_cuda, is_hip, is_npu, is_xpu

    return not (is_cuda() or is_hip() or is_npu() or is_xpu() or is_cpu())
