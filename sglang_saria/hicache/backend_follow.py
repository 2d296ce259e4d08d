"""What `SariaRadixCache` redoes when its storage backend changes at run time.

SGLang's admin API (`PUT`/`DELETE /hicache/storage-backend`) attaches and detaches the
backend while the scheduler is idle. The direct reload was built over the old backend's
store (its worker would read a closed store), the KV audit checked the old store's reads and
writes, and a new saria backend brings a new policy that has never seen the pages the tree
already holds in host memory (the tier audit requires their counters).
"""

from __future__ import annotations

from typing import Any, Optional

from sglang_saria.hicache.backend import policy_of
from sglang_saria.hicache.kv_audit import KVAudit, attach_audit
from sglang_saria.hicache.reload_setup import DirectReload
from sglang_saria.hicache.tier_audit import tree_nodes


def follow_backend(
    old: Optional[DirectReload], new: Optional[DirectReload], backend: Any, audit: Optional[KVAudit], tree_core: Any
) -> Optional[DirectReload]:
    """The direct reload to use from now (``new``, built over ``backend``; None without one):
    ``old``'s worker ends, the KV audit checks ``backend``'s store, and a saria ``backend``'s
    policy counts the host-held pages of the tree as used now."""
    if old is not None:
        old.close()
    attach_audit(audit, backend)
    policy = policy_of(backend)
    if policy is not None:
        policy.adopt(tree_nodes(tree_core.root_node))
    return new
