"""sglang-saria as an SGLang plugin: the `sglang.srt.plugins` entry point `saria`.

SGLang 0.5.23 loads general plugins in every process it starts (launcher, engine, scheduler,
detokenizer, DP controller) and then applies the hooks they registered (`HookRegistry`). This
package registers saria's hooks there; no file of the `sglang` package is edited. Each module
groups the hooks of one job:

| module        | what SGLang gains                                                           |
|---------------|-----------------------------------------------------------------------------|
| `storage.py`  | the `saria` storage backend: CLI choice, factory, zero-copy I/O, launch-time config check, runtime-attach refusal |
| `cache.py`    | `SariaRadixCache` and its tree core for a saria server, the reload staging off the KV budget, the scheduler's load |
| `requests.py` | agents' cache hints on chat completions (`"saria": {...}`)                   |
| `fixes.py`    | SGLang request-validation bugs kept fixed (each names its upstream issue)    |

Hooks only act when the server runs `--hicache-storage-backend saria` (fixes: always), so
installing sglang-saria changes nothing for servers that do not use it.
"""

from __future__ import annotations

import logging

from sglang_saria.plugin import cache, fixes, requests, storage

logger = logging.getLogger(__name__)

_registered = False


def register() -> None:
    """Entry point of group `sglang.srt.plugins` (name `saria`); idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    storage.register()
    cache.register()
    requests.register()
    fixes.register()
    logger.debug("sglang-saria plugin hooks registered")
