"""The tree core of a saria server: SGLang's Python `UnifiedTreeCore` with a host eviction gate.

Saria decides at host eviction whether a block is written to SSD before its host copy is
reclaimed (write-before-reclaim, paper 4.2). Every host-leaf eviction of the tree core goes
through `_evict_host_leaf`; here it first asks `host_eviction_gate(node)`: True reclaims the
leaf now, False leaves it in place (the gate started its write, whose host lock defers the
reclaim). Without a gate (no saria policy) the core behaves as SGLang's.

Why not SGLang's default Rust core: it walks host eviction inside Rust with no callback and
has no `node_by_id`, so admission cannot sit between the choice of a victim and its reclaim
(measured cost of the Python core: `python -m sglang_saria.bench.tree`).

Registered as the tree core `saria` in SGLang's tree-core registry at import;
`SariaRadixCache` selects it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from sglang.srt.mem_cache.unified_cache.tree_core_registry import (
    get_tree_core_factory,
    register_tree_core_backend,
)
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

NAME = "saria"


class SariaTreeCore(UnifiedTreeCore):
    """`UnifiedTreeCore` whose host-leaf evictions ask ``host_eviction_gate`` first."""

    host_eviction_gate: Optional[Callable[[Any], bool]] = None

    def _evict_host_leaf(self, node: Any, *args: Any, **kwargs: Any) -> None:
        gate = self.host_eviction_gate
        if gate is not None and not gate(node):
            return  # being written to storage; reclaimed by a later eviction
        super()._evict_host_leaf(node, *args, **kwargs)


def _factory(params: Any, components: dict) -> SariaTreeCore:
    return SariaTreeCore(params, components)


if get_tree_core_factory(NAME) is None:
    register_tree_core_backend(NAME, _factory)
