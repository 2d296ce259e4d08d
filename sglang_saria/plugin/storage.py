"""The `saria` storage backend, reached through SGLang's storage seams.

- `StorageBackendFactory.register_backend("saria", ...)`: SGLang's backend registry;
- `--hicache-storage-backend` lists `saria` among its choices (the flag's choices are a fixed
  list in 0.5.23: the parser's action gains it after `ServerArgs.add_cli_args`);
- the factory builds registered backends through a fixed if/elif chain by name, which has no
  branch for plugins: `saria` is built with `(storage_config, mem_pool_host)` like mooncake;
- HiCache picks its zero-copy page I/O from a fixed list of names: a `saria` backend moves
  host pages in place (`batch_get_v1`/`batch_set_v1`) as those do;
- the extra config is checked while SGLang resolves its arguments (`handle_hicache`), so a
  wrong field stops the launch in seconds, not after the model loaded;
- `PUT /hicache/storage-backend` with saria on a server launched without it is refused (its
  tree was built without saria's admission and direct reload).
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

NAME = "saria"
BACKEND_MODULE, BACKEND_CLASS = "sglang_saria.hicache.backend", "SariaStorage"
FLAG = "--hicache-storage-backend"


def register() -> None:
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    if NAME not in StorageBackendFactory._registry:
        StorageBackendFactory.register_backend(NAME, BACKEND_MODULE, BACKEND_CLASS)
    hooks: list[tuple[str, Callable, HookType]] = [
        ("sglang.srt.server_args.ServerArgs.add_cli_args", add_choice, HookType.AFTER),
        ("sglang.srt.mem_cache.storage.backend_factory.StorageBackendFactory._create_builtin_backend",
         create_builtin_backend, HookType.AROUND),
        ("sglang.srt.managers.cache_controller.HiCacheController.attach_storage_backend",
         use_zero_copy, HookType.AFTER),
        ("sglang.srt.arg_groups.hicache_hook.handle_hicache", check_extra_config_at_launch, HookType.AFTER),
        ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.attach_storage_backend",
         refuse_attach_without_saria_tree, HookType.AROUND),
    ]
    for target, hook, kind in hooks:
        HookRegistry.register(target, hook, kind)


def add_choice(_result: Any, parser: argparse.ArgumentParser) -> None:
    """After SGLang's flags are added: `saria` is a valid `--hicache-storage-backend`."""
    for action in parser._actions:
        if FLAG in action.option_strings and action.choices is not None and NAME not in action.choices:
            action.choices = [*action.choices, NAME]


def create_builtin_backend(original: Callable, cls: Any, backend_name: str, backend_class: type,
                           storage_config: Any, mem_pool_host: Any) -> Any:
    if backend_name == NAME:
        return backend_class(storage_config, mem_pool_host)
    return original(cls, backend_name, backend_class, storage_config, mem_pool_host)


def use_zero_copy(_result: Any, controller: Any, *args: Any, **kwargs: Any) -> None:
    """After HiCache attached a backend: a saria one reads and writes host pages in place."""
    if getattr(controller, "storage_backend_type", None) == NAME and getattr(controller, "enable_storage", False):
        controller.page_get_func = controller._page_get_zero_copy
        controller.page_set_func = controller._page_set_zero_copy


def check_extra_config_at_launch(_result: Any, server_args: Any) -> None:
    if getattr(server_args, "hicache_storage_backend", None) == NAME:
        from sglang_saria.hicache.backend import check_extra_config

        check_extra_config(server_args.hicache_storage_backend_extra_config)


def refuse_attach_without_saria_tree(original: Callable, cache: Any, storage_backend: str,
                                     storage_backend_extra_config_json: Optional[str] = None,
                                     *args: Any, **kwargs: Any) -> tuple[bool, str]:
    from sglang_saria.hicache.runtime_attach import attach_refusal

    if getattr(cache, "_storage_attachment", None) is not None:  # HiCache is on: else SGLang's own answer
        refusal = attach_refusal(cache, storage_backend, storage_backend_extra_config_json)
        if refusal is not None:
            return False, refusal
    return original(cache, storage_backend, storage_backend_extra_config_json, *args, **kwargs)
