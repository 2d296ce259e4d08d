"""`saria` HiCache storage backend: SGLang's L3 interface over SariaStore.

Registered through SGLang's storage backend registry (`plugin/storage.py`) as name "saria";
HiCache's controller builds it, SariaStorage(storage_config, mem_pool_host), and registers its
host pools. It does store I/O only, as SGLang's `HiCacheFile`: the zero-copy v1 interface
(pages read/written in place in the host pool), the v2 pool-transfer interface (MAMBA sidecar
pages next to the KV pages), the legacy get/set/batch_* calls, and the direct reload's reads,
drops and victim-order reports. It parses the policy's sections of the extra config
(`policy_config`) but builds nothing that decides: `SariaRadixCache` builds the policy, the rank
agreement and the direct reload over this store (`runtime.build_runtime`), which hear of the
store's removals and its close through `add_evict_listener` and `add_close_listener`.

Each TP/PP/CP rank runs its own store in a rank subdirectory of every data dir
(capacity is per rank); keys carry the model and page format so stores never
hand a page to a model or layout that wrote a different byte order.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from sglang_saria import policy_names
from sglang_saria.config import ConfigError, SariaConfig
from sglang_saria.hicache.audit.kv import KVAudit
from sglang_saria.hicache.metrics import SariaServingMetrics
from sglang_saria.hicache.store_identity import claim as claim_store
from sglang_saria.hicache.store_identity import server_fingerprint
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.reload.host_pages import HostPageView
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.preflight import check_writable, preflight
from sglang_saria.storage.private import default_data_dir
from sglang_saria.storage.store import DEFAULT_SLOT_BYTES, SariaStore
from sglang_saria.units import DriveRating

logger = logging.getLogger(__name__)

# Sections of the policy config (sglang_saria.config.SariaConfig) in the same JSON. Its
# `capacity` (replay tier sizes) is not one: SGLang sizes the pools and `capacity` is the store's.
POLICY_KEYS = frozenset(f.name for f in dataclasses.fields(SariaConfig)) - {"capacity"}
# Keys SGLang itself leaves in the extra-config dict (dynamic backend loading).
SGLANG_EXTRA_KEYS = frozenset({"interface_v1", "backend_name", "module_path", "class_name"})
EXTRA_CONFIG_FLAG = "--hicache-storage-backend-extra-config"


def rank_subdir(cfg: HiCacheStorageConfig) -> str:
    name = f"rank_tp{cfg.tp_rank}of{cfg.tp_size}"
    if cfg.pp_size > 1:
        name += f"_pp{cfg.pp_rank}of{cfg.pp_size}"
    if cfg.attn_cp_size > 1:
        name += f"_cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}"
    if cfg.dp_rank:
        name += f"_dp{cfg.dp_rank}"
    return name


def _format_tag(pool: Any) -> str:
    dtype = str(getattr(pool, "dtype", "")).replace("torch.", "")
    return f"{getattr(pool, 'layout', '')}.{dtype}"


def policy_config_from_extra(extra: Dict[str, Any]) -> SariaConfig:
    """The policy sections of the extra config; `"admission": "eviction:E2"` is short for
    `{"admission": {"policy": "eviction:E2"}}`."""
    sections = {k: v for k, v in extra.items() if k in POLICY_KEYS}
    if isinstance(sections.get("admission"), str):
        sections["admission"] = {"policy": sections["admission"]}
    source = "--hicache-storage-backend-extra-config"
    config = SariaConfig.from_dict(sections, source=source)
    if policy_names.parse(config.admission.policy).kind in policy_names.REPLAY_ONLY:
        raise ConfigError(f"{source}: admission.policy={config.admission.policy!r} is the replay's clairvoyant bound "
                          "(it reads the trace's future); a server cannot run it")
    if config.transfer.planner == "gds-only":
        # SGLang's tree keeps host pages as the DRAM prefix of a match; a plan that reads
        # them from SSD instead would need a second device copy of tree-owned pages.
        raise ConfigError(f"{source}: transfer.planner='gds-only' is a replay baseline; SGLang serves saria or lmcache")
    return config


def configs_from_extra(extra: Optional[Dict[str, Any]]) -> tuple[StoreConfig, SariaConfig]:
    """The store's and the policy's config from the extra-config dict HiCache passes on."""
    store_config = StoreConfig.from_extra_config(
        extra, SGLANG_EXTRA_KEYS | POLICY_KEYS, defaults={"data_dirs": [default_data_dir()]}
    )
    return store_config, rated_auto(policy_config_from_extra(extra or {}), store_config.drive_rating)


def rated_auto(config: SariaConfig, rating: Optional[DriveRating]) -> SariaConfig:
    """``auto`` on a store with a ``drive_rating`` is ``auto:<its DWPD>`` on the rated drive's capacity:
    the operator states the drive once, and the policy holds its write budget."""
    admission = config.admission
    if rating is None or admission.policy != "auto":
        return config
    rated = dataclasses.replace(admission, policy=f"auto:{rating.dwpd:g}",
                                budget_capacity_bytes=admission.budget_capacity_bytes or rating.capacity_bytes)
    logger.info("saria: admission auto with drive_rating %g DWPD: %s on %d bytes", rating.dwpd, rated.policy,
                rated.budget_capacity_bytes)
    return dataclasses.replace(config, admission=rated)


def check_extra_config(raw: Optional[str]) -> None:
    """Validate `--hicache-storage-backend-extra-config` while SGLang checks its arguments
    (plugin hook after `handle_hicache`): a bad value stops the launch in seconds, naming the field, instead of
    after the model has loaded. SGLang's own parser reads the JSON or @file and takes its
    keys (prefetch_threshold, ...) out, exactly as HiCache does before building the backend.
    The store's paths and capacity are checked here too, before anything loads
    (`storage/preflight.py`: private, writable, a slot at least, the free space)."""
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    if raw and not raw.startswith("@"):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"{EXTRA_CONFIG_FLAG}: not valid JSON ({e}): {raw!r}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"{EXTRA_CONFIG_FLAG}: must be a JSON object, got {raw!r}")
    store_config, _ = configs_from_extra(HybridCacheController.parse_storage_backend_extra_config(raw)[0])
    preflight(store_config, EXTRA_CONFIG_FLAG)


class SariaStorage(HiCacheStorage):
    def __init__(
        self,
        storage_config: HiCacheStorageConfig,
        mem_pool_host: Any = None,
    ) -> None:
        # The policy's config rides in the same extra config; `runtime.build_runtime` builds the policy.
        self.store_config, self.policy_config = configs_from_extra(storage_config.extra_config)
        # Set by the radix cache when SGLANG_SARIA_AUDIT_KV=1: checks every page this store moves.
        self.kv_audit: Optional[KVAudit] = None
        if storage_config.is_mla_model and storage_config.tp_size > 1:
            raise ValueError(
                "saria store: MLA models with tp_size > 1 replicate KV across ranks and need "
                "a shared store; the saria backend keeps one store per rank. Use tp_size=1 "
                "or another HiCache backend for this model."
            )
        self.storage_config = storage_config
        self.model_name = "-".join((storage_config.model_name or "").split("/"))
        self.registered_pools: Dict[str, Any] = {}
        self._views: Dict[str, HostPageView] = {}
        self._tags: Dict[str, str] = {}
        self.mem_pool_host = None
        self.store: Optional[SariaStore] = None
        self._evict_listeners: List[Callable[[List[Tuple[str, str]]], None]] = []
        self._close_listeners: List[Callable[[], None]] = []
        self._io_log: Dict[str, List[float]] = {
            "prefetch_pgs": [],
            "backup_pgs": [],
            "prefetch_bw": [],
            "backup_bw": [],
        }
        # The "dynamic" backend route passes a kwargs dict here, then registers the pool.
        if mem_pool_host is not None and not isinstance(mem_pool_host, dict):
            self.register_mem_pool_host(mem_pool_host)

    # ---------------------------------------------------------------- setup
    def _open_store(self, page_bytes: Optional[int], bytes_per_token: Optional[int]) -> None:
        cfg = self.store_config
        sub = rank_subdir(self.storage_config)
        rank_cfg = dataclasses.replace(cfg, data_dirs=[os.path.join(d, sub) for d in cfg.data_dirs])
        for rank_dir in rank_cfg.data_dirs:  # a read-only index or slab: named with its mode, not moved aside
            check_writable(rank_dir)
        name = f"{os.path.abspath(cfg.data_dirs[0])}/{sub}"
        # Locked, and holding this model's KV or nothing, before the store reads its index.
        fingerprint = server_fingerprint(self.storage_config, self.mem_pool_host, sub)
        logger.info("saria store %s: model fingerprint %s (%s: %s)", name, fingerprint, fingerprint.model,
                    fingerprint.weights)
        self._claim = claim_store(rank_cfg.data_dirs, fingerprint.digest, cfg.on_fingerprint_mismatch, name)
        try:
            self.store = SariaStore(
                rank_cfg,
                bytes_per_token=bytes_per_token,
                default_slot_bytes=page_bytes or DEFAULT_SLOT_BYTES,
                on_evict=self._on_store_evict,
                name=name,
                victim_order=SSDVictimOrder(),  # the SSD victim order the replay uses too
            )
            self._claim.record(name)
        except BaseException:
            self._claim.release()
            raise

    def _ensure_store(self) -> SariaStore:
        if self.store is None:
            self._open_store(None, None)
        return self.store

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        self._register_view(PoolName.KV.value, mem_pool_host)
        if self.store is None:
            view = self._views[PoolName.KV.value]
            self._open_store(view.page_bytes, int(mem_pool_host.get_size_per_token()))

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        self.registered_pools[str(host_pool_name)] = host_pool
        self._register_view(str(host_pool_name), host_pool)

    @property
    def hybrid(self) -> bool:
        """Whether a MAMBA host pool is registered (GDN checkpoints stored next to the KV pages)."""
        return PoolName.MAMBA.value in self.registered_pools

    def _register_view(self, name: str, pool: Any) -> None:
        view = HostPageView(pool)
        self._views[name] = view
        self._tags[name] = _format_tag(pool)
        if not view.zero_copy:
            logger.info(
                "saria store: host pool %s pages are not views of pool memory; using the copy path", name
            )

    def storage_key(self, key: str, pool: str = PoolName.KV.value) -> str:
        """Store key of a page hash for one pool (use it to reach `self.store` directly)."""
        tag = self._tags.get(pool, "")
        stem = key if pool == PoolName.KV.value else f"{key}.{pool}"
        return f"{stem}@{self.model_name}.{tag}"

    @staticmethod
    def split_storage_key(skey: str) -> Tuple[str, str]:
        """Inverse of storage_key: (page hash, pool name). Page hashes are hex, without dots."""
        stem = skey.rsplit("@", 1)[0]
        key, _, pool = stem.partition(".")
        return key, pool or PoolName.KV.value

    def add_evict_listener(self, listener: Callable[[List[Tuple[str, str]]], None]) -> None:
        """Tell `listener` which (page hash, pool) objects left the store (evicted for space,
        dropped by the caller or a failed checksum, lost with a data dir), from any thread.

        The rank agreement uses this to keep the ranks' common SSD view true.
        """
        self._evict_listeners.append(listener)

    def add_close_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` before the store closes (detach, shutdown): what it hands the store
        then (the policy's last counters) goes in the store's last commit."""
        self._close_listeners.append(listener)

    def _on_store_evict(self, skeys: List[str]) -> None:
        pairs = [self.split_storage_key(k) for k in skeys]
        for listener in self._evict_listeners:
            listener(pairs)

    # ---------------------------------------------------------------- page I/O
    def _pages_io(
        self, pool_name: str, keys: List[str], host_indices: torch.Tensor, write: bool
    ) -> List[bool]:
        store = self._ensure_store()
        view = self._views.get(pool_name)
        if view is None:
            logger.error("saria store: no host pool registered under %r", pool_name)
            return [False] * len(keys)
        if host_indices is None or host_indices.numel() != len(keys) * view.page_size:
            logger.error(
                "saria store: %s: %d keys need %d host indices, got %s",
                pool_name,
                len(keys),
                len(keys) * view.page_size,
                None if host_indices is None else host_indices.numel(),
            )
            return [False] * len(keys)
        t0 = time.perf_counter()
        pages = host_indices[:: view.page_size].tolist()
        results: List[Any] = []
        for key, index in zip(keys, pages):
            skey = self.storage_key(key, pool_name)
            segs = view.segments(index)
            if write:
                data = segs if segs is not None else view.pool.get_data_page(index, flat=True).contiguous()
                results.append(store.put_async(skey, data))
            elif segs is not None:
                results.append(store.get_async(skey, segs))
            else:
                scratch = view.pool.get_dummy_flat_data_page()
                ok = store.get(skey, scratch).ok
                if ok:
                    view.pool.set_from_flat_data_page(index, scratch)
                results.append(ok)
        done = [r if isinstance(r, bool) else r.result() for r in results]
        out = [r if isinstance(r, bool) else r.ok for r in done]
        # One prefix's run, read or written together: the SSD victim order's rule (deepest first).
        store.touch_prefix([self.storage_key(k, pool_name) for k, ok in zip(keys, out) if ok])
        if not write:
            SariaServingMetrics.get().pages_read("host", sum(out))
        if self.kv_audit is not None and pool_name in self.kv_audit.pools:
            if write:
                new = [not isinstance(r, bool) and r.ok and not r.already_present for r in done]
                self.kv_audit.host_to_store(pool_name, keys, host_indices, new)
            else:
                self.kv_audit.store_to_host(pool_name, keys, host_indices, out)
        self._log_io(write, sum(out), sum(out) * view.page_bytes, time.perf_counter() - t0)
        return out

    def _log_io(self, write: bool, pages: int, nbytes: int, seconds: float) -> None:
        if not self.storage_config.enable_storage_metrics:
            return
        kind = "backup" if write else "prefetch"
        self._io_log[f"{kind}_pgs"].append(pages)
        self._io_log[f"{kind}_bw"].append(nbytes / max(seconds, 1e-9) / 1e9)

    def batch_get_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        return self._pages_io(PoolName.KV.value, keys, host_indices, write=False)

    def batch_set_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        return self._pages_io(PoolName.KV.value, keys, host_indices, write=True)

    def batch_get_v2(
        self, transfers: List[PoolTransfer], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> Dict[str, List[bool]]:
        return {
            t.name: self._pages_io(str(t.name), t.keys or [], t.host_indices, write=False) for t in transfers
        }

    def batch_set_v2(
        self, transfers: List[PoolTransfer], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> Dict[str, List[bool]]:
        return {
            t.name: self._pages_io(str(t.name), t.keys or [], t.host_indices, write=True) for t in transfers
        }

    @property
    def page_bytes(self) -> int:
        """Bytes of one stored KV page (the host pool's page, in its byte order)."""
        return self._views[PoolName.KV.value].page_bytes

    def read_page_async(self, key: str, dest: Any, host_check: bool = True) -> Any:
        """Start reading KV page `key` into `dest` (any device); a Future of its GetStatus.

        The direct reload path (`reload/device.py`) reads this way into a staging
        buffer on the device pool's device, bypassing the host pool; on a GPU it passes
        ``host_check=False`` and verifies `page_digest` there instead.
        """
        return self._ensure_store().get_async(self.storage_key(key), dest, host_check)

    def read_state_async(self, key: str, dest: Any, host_check: bool = True) -> Any:
        """Start reading the MAMBA sidecar (GDN checkpoint) of page `key` into `dest`; a
        Future of its GetStatus. The hybrid direct reload stages it on the device pool's
        device next to the page's FA rows (`reload/gdn_state.py`)."""
        return self._ensure_store().get_async(self.storage_key(key, PoolName.MAMBA.value), dest, host_check)

    def state_exists(self, key: str) -> bool:
        """Whether the store holds the MAMBA sidecar of page `key` (an index probe, no I/O)."""
        return self._ensure_store().exists(self.storage_key(key, PoolName.MAMBA.value))

    def touch_pages(self, page_hashes: Sequence[str]) -> None:
        """Pages of one prefix (head first) were read from SSD: the SSD victim order's read rule, for
        every pool's object of each page (a node's objects age together, as the replay's one entry)."""
        pools = [PoolName.KV.value] + [p for p in self._views if p != PoolName.KV.value]
        self._ensure_store().touch_prefix([self.storage_key(h, p) for h in page_hashes for p in pools])

    def demote_pages(self, page_hashes: Sequence[str]) -> int:
        """Pages of a session that ended (head first): every pool's object of each becomes one of the
        store's next victims, the tail first (``SSDVictimOrder.demote``); returns the objects held."""
        pools = [PoolName.KV.value] + [p for p in self._views if p != PoolName.KV.value]
        return self._ensure_store().demote([self.storage_key(h, p) for h in page_hashes for p in pools])

    def page_digest(self, key: str) -> Optional[int]:
        """The device digest recorded for KV page `key` (None: absent, or stored before index format 2)."""
        return self._ensure_store().digest_of(self.storage_key(key))

    def drop_failed_pages(self, page_hashes: Sequence[str]) -> None:
        """Pages whose direct reload read failed leave the store index (reload worker thread;
        the store locks). A host checksum failure is already gone (the store drops it on
        read); a device digest mismatch (GPU) is dropped here."""
        keys = [self.storage_key(h) for h in page_hashes]
        self.store.evict(keys)
        gone = sum(not self.store.exists(k) for k in keys)
        SariaServingMetrics.get().pages_dropped(gone)
        logger.warning("saria: %d page(s) that failed their read left the store index", gone)

    def drop_failed_state(self, page_hash: str) -> None:
        """A checkpoint sidecar whose direct reload read failed leaves the store index (reload worker thread)."""
        self.store.evict([self.storage_key(page_hash, PoolName.MAMBA.value)])
        logger.warning("saria: the GDN checkpoint of page %s failed its read and left the store index", page_hash)

    # ---------------------------------------------------------------- existence
    def kv_page_hashes(self) -> List[str]:
        """Page hashes of the KV pages this store holds for this model and page format."""
        suffix = self.storage_key("")
        return [k[: -len(suffix)] for k in self._ensure_store().keys() if k.endswith(suffix) and "." not in k[: -len(suffix)]]

    def exists(self, key: str) -> bool:
        return self._ensure_store().exists(self.storage_key(key))

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        return self._ensure_store().prefix_hits([self.storage_key(k) for k in keys])

    def batch_exists_v2(
        self,
        keys: List[str],
        pool_transfers: Optional[List[PoolTransfer]] = None,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> PoolTransferResult:
        """Longest KV prefix whose sidecar pools satisfy their hit policies (as HiCacheFile)."""
        store = self._ensure_store()
        kv_pages = self.batch_exists(keys)
        hit_count: Dict[str, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            present = [store.exists(self.storage_key(k, str(t.name))) for k in keys[:kv_pages]]
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = present.index(False) if False in present else kv_pages
                pool_ok = set(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(t.keys) if t.keys else 1)
                pool_ok = {p for p in range(1, kv_pages + 1) if all(present[max(0, p - trailing) : p])}
                boundary = max(pool_ok, default=0)
            else:
                raise ValueError(f"saria store: unsupported pool hit policy {t.hit_policy}")
            if boundary:
                hit_count[t.name] = boundary
            restorable &= pool_ok
        return PoolTransferResult(max(restorable, default=0), hit_count, sorted(restorable))

    # ---------------------------------------------------------------- legacy tensor API
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Optional[torch.Tensor]:
        if target_location is None:
            raise ValueError("saria store: get needs a target_location tensor to read into")
        return (
            target_location if self._ensure_store().get(self.storage_key(key), target_location).ok else None
        )

    def batch_get(
        self, keys: List[str], target_locations: Any = None, target_sizes: Any = None
    ) -> List[Optional[torch.Tensor]]:
        if target_locations is None or len(target_locations) != len(keys):
            raise ValueError("saria store: batch_get needs one target tensor per key")
        futs = [
            self._ensure_store().get_async(self.storage_key(k), t) for k, t in zip(keys, target_locations)
        ]
        return [t if f.result().ok else None for f, t in zip(futs, target_locations)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self._ensure_store().put(self.storage_key(key), value.contiguous()).ok

    def batch_set(
        self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        futs = [
            self._ensure_store().put_async(self.storage_key(k), v.contiguous()) for k, v in zip(keys, values)
        ]
        return all(f.result().ok for f in futs)

    # ---------------------------------------------------------------- misc
    def clear(self) -> bool:
        store = self._ensure_store()
        store.evict(store.keys())
        store.flush()
        return True

    def get_stats(self):
        from sglang.srt.observability.metrics_collector import StorageMetrics

        m = StorageMetrics()
        m.prefetch_pgs.extend(int(x) for x in self._io_log["prefetch_pgs"])
        m.backup_pgs.extend(int(x) for x in self._io_log["backup_pgs"])
        m.prefetch_bandwidth.extend(self._io_log["prefetch_bw"])
        m.backup_bandwidth.extend(self._io_log["backup_bw"])
        for v in self._io_log.values():
            v.clear()
        return m

    def close(self) -> None:
        if self.store is not None:
            for listener in self._close_listeners:
                listener()
            self.store.close()
            self.store = None
            self._claim.release()
