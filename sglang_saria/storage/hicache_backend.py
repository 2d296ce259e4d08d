"""HiCache storage backend `saria` (placeholder until the Saria SSD store lands).

Why a placeholder: the foundation needs `--hicache-storage-backend saria` to serve
end to end; this adapter stores pages through SGLang's own file backend in the first
of `data_dirs`. The Saria store (issue 4) replaces this module.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig


class SariaStorage(HiCacheFile):
    def __init__(self, storage_config: HiCacheStorageConfig, mem_pool_host: Any = None):
        extra = dict(storage_config.extra_config or {})
        data_dirs = extra.get("data_dirs") or ["/tmp/saria"]
        super().__init__(storage_config, file_path=str(data_dirs[0]))
        if mem_pool_host is not None:
            self.register_mem_pool_host(mem_pool_host)
