"""Agents' hints asked about SGLang tree nodes.

``AgentHints`` (``mem_cache/hints.py``) keeps hints by block key; the write sequencer asks it
about the keys its driver decides on, which in this driver are SGLang's tree nodes. Nodes split
and leave the tree, pages do not: the hints stay keyed by page (``policy.page_key``, as the
metadata is) and a node is asked about by its last page, as its counters are (``policy.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from sglang_saria.mem_cache.hints import AgentHints


class NodeHints:
    """What the sequencer reads of ``AgentHints`` (``ended``, ``returns_later``, ``counts``), for nodes."""

    def __init__(self, hints: AgentHints, key_of: Callable[[Any], Hashable]) -> None:
        self.hints = hints
        self.counts = hints.counts  # the sequencer counts skipped and hinted writes here
        self._key_of = key_of

    def ended(self, node: Any) -> bool:
        return self.hints.ended(self._key_of(node))

    def returns_later(self, node: Any) -> bool:
        return self.hints.returns_later(self._key_of(node))
