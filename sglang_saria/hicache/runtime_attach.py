"""Whether `saria` may be attached at run time (`PUT /hicache/storage-backend`, plugin hook in `plugin/storage.py`).

Saria's admission hooks need the Python tree core and its direct reload needs
`SariaRadixCache`; SGLang picks both when it builds the tree, from the launch-time
`--hicache-storage-backend`. A server launched without `saria` has neither, and attaching
it there would stop the scheduler at the first request, so the attach is refused with a
message naming the flag. A server launched with `saria` may detach it and attach it again
(`SariaRadixCache.attach_storage_backend`).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from sglang_saria.hicache.radix_cache import SariaRadixCache

SARIA_MODULE = "sglang_saria"


def names_saria(storage_backend: str, extra_config_json: Optional[str]) -> bool:
    """Whether an attach request asks for saria: by name, or as a `dynamic` backend whose
    module is sglang_saria's."""
    if storage_backend == "saria":
        return True
    if storage_backend != "dynamic" or not extra_config_json:
        return False
    try:
        extra = json.loads(extra_config_json)
    except json.JSONDecodeError:
        return False  # SGLang's own parser refuses it, naming the field
    return isinstance(extra, dict) and str(extra.get("module_path", "")).startswith(SARIA_MODULE)


def attach_refusal(cache: Any, storage_backend: str, extra_config_json: Optional[str]) -> Optional[str]:
    """Why ``storage_backend`` cannot be attached to ``cache`` now; None when it can."""
    if not names_saria(storage_backend, extra_config_json) or isinstance(cache, SariaRadixCache):
        return None
    core = type(getattr(cache, "tree_core", None)).__name__
    return (
        f"saria cannot be attached to this server: its radix cache ({type(cache).__name__}, tree core "
        f"{core}) was built at launch without saria's admission hooks and direct reload. Launch with "
        "--hicache-storage-backend saria (the backend can then be detached and attached again at run time)."
    )
