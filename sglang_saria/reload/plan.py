"""A request's pages past the device prefix as the core planner's nodes (paper 4.3).

The planner (`mem_cache/planner.py`) decides; this module only says where SGLang's tiers
hold each page's objects: its full-attention block (host pool and/or store) and, on a
hybrid model, the GDN state at the page's end (a host `MambaPoolHost` copy on the tree
node ending there, and/or the store's MAMBA sidecar of that page). A state counts only on
a checkpoint boundary: a page ending on a multiple of the mamba track interval, where
SGLang records states (extra_buffer strategy). Off a boundary a page has no checkpoint
object at all (`NO_CHECKPOINT`), exactly as the replay's nodes between checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sglang_saria.mem_cache.metadata import DRAM, NO_CHECKPOINT, SSD, ContextNode
from sglang_saria.mem_cache.planner import ReloadPlan, plan_reload


@dataclass(frozen=True)
class PageObjects:
    """Where one page's objects are: ``fa_loc`` (DRAM | SSD bits of its FA block) and
    ``ck_loc`` (the same for the GDN state at its end; NO_CHECKPOINT off a boundary)."""

    key: int
    fa_loc: int
    ck_loc: int = NO_CHECKPOINT


def on_boundary(end_tokens: int, track_interval: int) -> bool:
    """Whether a page ending at ``end_tokens`` ends on a checkpoint boundary."""
    return track_interval > 0 and end_tokens > 0 and end_tokens % track_interval == 0


def checkpoint_loc(end_tokens: int, track_interval: int, in_dram: bool, in_ssd: bool) -> int:
    """``ck_loc`` of a page ending at ``end_tokens``: NO_CHECKPOINT off a boundary, else
    the tiers holding its state (0: a boundary whose state no tier holds)."""
    if not on_boundary(end_tokens, track_interval):
        return NO_CHECKPOINT
    return (DRAM if in_dram else 0) | (SSD if in_ssd else 0)


def plan_pages(pages: Sequence[PageObjects], planner: str, hybrid: bool) -> ReloadPlan:
    """The core planner over ``pages`` (in prefix order). ``hybrid``: the plan ends on the
    last page whose checkpoint a tier holds (the core's hybrid rule); FA-only: the longest
    run of pages with an FA source."""
    nodes: dict[int, ContextNode] = {}
    for page in pages:
        node = ContextNode(0.0, has_checkpoint=page.ck_loc != NO_CHECKPOINT)
        node.fa_loc = page.fa_loc
        if page.ck_loc != NO_CHECKPOINT:
            node.ck_loc = page.ck_loc
        nodes[page.key] = node
    return plan_reload([p.key for p in pages], nodes, planner, hybrid=hybrid)


__all__ = ["PageObjects", "checkpoint_loc", "on_boundary", "plan_pages"]
