"""SGLang's own device and host pool objects, small, on CPU (shared by the backend and audit tests)."""

from __future__ import annotations

import warnings

import torch

warnings.filterwarnings("ignore", category=UserWarning)
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402

PAGE = 16


def mha_pools(layout: str) -> tuple[MHATokenToKVPool, MHATokenToKVPoolHost]:
    """A 512-token bf16 device KV pool (2 layers, 2 heads of 64) and its host pool (ratio 2)."""
    kv = MHATokenToKVPool(512, PAGE, torch.bfloat16, 2, 64, 2, "cpu", False, start_layer=0, end_layer=2)
    host = MHATokenToKVPoolHost(
        kv.get_device_pool_infos()[0].buffer_info,
        2,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device_capacity_tokens=kv.size,
        start_layer=kv.start_layer,
        end_layer=kv.end_layer,
        write_back_staging=kv.hicache_write_back_staging,
    )
    return kv, host


def mha_host_pool(layout: str) -> MHATokenToKVPoolHost:
    return mha_pools(layout)[1]


def mamba_host_pool() -> MambaPoolHost:
    """Mamba states of 3 layers, 9 device slots (fp32 temporal, bf16 conv), host ratio 2."""
    info = MambaStateBufferInfo(
        temporal=torch.zeros(3, 9, 4, 16, 16, dtype=torch.float32),
        conv=(torch.zeros(3, 9, 3, 96, dtype=torch.bfloat16),),
    )
    return MambaPoolHost(info, 2, 0, device_capacity=8, pin_memory=False, layout="page_first")


def pages(pool, first_page: int, n: int) -> torch.Tensor:
    """Slot indices of ``n`` whole pages starting at page ``first_page``."""
    return torch.arange(first_page * pool.page_size, (first_page + n) * pool.page_size, dtype=torch.int64)


def fill_random(tensors, seed: int = 0) -> None:
    """Random bytes in every contiguous tensor (pools' buffers)."""
    g = torch.Generator().manual_seed(seed)
    for buf in tensors:
        if buf.is_contiguous() and buf.numel():
            flat = buf.view(torch.uint8)
            flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g))


def storage_config(extra: dict) -> HiCacheStorageConfig:
    """What SGLang hands a storage backend on one rank of a tp=1 FA model."""
    return HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=True,
        is_page_first_layout=True,
        model_name="tiny/qwen3",
        extra_config=extra,
    )
