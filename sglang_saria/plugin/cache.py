"""The radix cache of a saria server, reached through SGLang's cache seams.

- `registry.create_unified_radix_cache` takes a `cache_class`: with HiCache and the saria
  backend it builds `SariaRadixCache` (direct reload SSD -> device, admission at the cache's
  write points), which falls back to HiCache's own paths where direct reload cannot run;
- `SariaRadixCache` asks for the tree core `saria` (registered at import of
  `hicache/tree_core.py` through SGLang's tree-core registry): the Python core with a host
  eviction gate, so a host leaf the policy admits is written before it is reclaimed;
- `KVCacheConfigurator.config_from_budget` sizes the KV pool from a byte budget, before and
  after CUDA-graph capture: the direct reload's staging, allocated later, is taken off it first;
- `Scheduler.init_load_inquirer` builds SGLang's `SchedulerLoadInquirer`; the saria cache keeps
  it, and after each `Scheduler.get_new_batch_prefill` reads from it the uncached prefill work
  left waiting (`auto` admission's load signal, `hicache/load_signal.py`);
- `Scheduler._prefetch_kvcache` prefetches from host-backed match ends only: a match that ends
  on a direct reload's published (device-only) nodes is probed by the saria cache after it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

NAME = "saria"


def register() -> None:
    HookRegistry.register("sglang.srt.mem_cache.registry.create_unified_radix_cache", build_saria_cache,
                          HookType.AROUND)
    HookRegistry.register("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.config_from_budget",
                          reserve_reload_staging, HookType.BEFORE)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.init_load_inquirer", hand_over_load,
                          HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill", note_prefill_batch,
                          HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler._prefetch_kvcache", probe_past_reloaded,
                          HookType.AFTER)


def _saria_serving() -> bool:
    from sglang.srt.runtime_context import get_memory

    memory = get_memory()
    return bool(memory.enable_hierarchical_cache) and memory.hicache_storage_backend == NAME


def build_saria_cache(original: Callable, ctx: Any, *, cache_class: Optional[type] = None) -> Any:
    if cache_class is None and ctx.enable_hierarchical_cache and _saria_serving():
        from sglang_saria.hicache.radix_cache import SariaRadixCache

        cache_class = SariaRadixCache
    return original(ctx, cache_class=cache_class)


def reserve_reload_staging(configurator: Any, budget_bytes: int, **kwargs: Any) -> Optional[tuple]:
    """Before the KV pool is sized from ``budget_bytes``: the staging bytes come off it."""
    if not _saria_serving():
        return None
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator
    from sglang.srt.runtime_context import get_memory, get_schedule

    from sglang_saria.hicache.direct_reload.staging import checkpoint_bytes, reserve_bytes

    cell = 0 if configurator.use_mla_backend else getattr(create_memory_pool_configurator(configurator),
                                                          "_cell_size", 0)
    state = checkpoint_bytes(configurator.mambaish_config, configurator.layer_info.start_layer,
                             configurator.layer_info.end_layer)
    budget_bytes -= reserve_bytes(get_memory(), cell, get_schedule().page_size, state)
    return (configurator, budget_bytes), kwargs


def hand_over_load(_result: Any, scheduler: Any) -> None:
    read = getattr(scheduler.tree_cache, "read_scheduler_load", None)
    if read is not None:
        read(scheduler.load_inquirer)


def note_prefill_batch(plan: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    note = getattr(scheduler.tree_cache, "note_prefill_batch", None)
    if note is not None:
        note(getattr(plan, "batch_to_run", None))


def probe_past_reloaded(_result: Any, scheduler: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    probe = getattr(scheduler.tree_cache, "probe_past_reloaded", None)
    if probe is not None and not req.finished():
        probe(req)
