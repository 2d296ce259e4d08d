"""Reload planning (paper 4.3) and the baselines' lookups.

``saria``: the longest prefix in which every FA block has a source (DRAM preferred,
else SSD), so DRAM-SSD-DRAM interleavings are recovered; for hybrid models the
prefix must end on a node whose GDN checkpoint is available.
``lmcache``: LMCache-style tier-prefix lookup: the longest DRAM prefix, then the
longest SSD continuation; it never switches back to DRAM (the "LMCache+" baseline).
``gds-only``: SSD is the only source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_saria.mem_cache.metadata import DRAM, SSD, ContextNode


@dataclass
class ReloadPlan:
    """Which objects to load, from where. ``sources[i]`` is DRAM or SSD for FA block i."""

    n_blocks: int = 0
    sources: list[int] = field(default_factory=list)
    ckpt_source: int = 0  # DRAM / SSD for the checkpoint at the end of the prefix; 0 = none
    dram_blocks: int = 0
    ssd_blocks: int = 0
    # FA blocks held from the head on, before a hybrid's cut at its last checkpoint (>= n_blocks):
    # where SGLang's full-attention match ends, which places its branching-point state
    fa_blocks: int = 0

    @property
    def uses_ssd(self) -> bool:
        return self.ssd_blocks > 0 or self.ckpt_source == SSD


def _pick(loc: int) -> int:
    return DRAM if loc & DRAM else SSD


_HELD = DRAM | SSD
_SOURCE = bytes.maketrans(bytes(range(1, _HELD + 1)), bytes(map(_pick, range(1, _HELD + 1))))  # location -> source


def plan_reload(
    keys: list[int], nodes: dict[int, ContextNode], planner: str = "saria", hybrid: bool = False
) -> ReloadPlan:
    """Walk ``keys`` through the metadata tree and return the reload plan. O(prefix length).

    ``hybrid``: the model has GDN layers, so only prefixes ending on an available
    checkpoint are reusable (FA KV alone cannot resume the recurrent state).
    """
    return plan_nodes(list(map(nodes.get, keys)), planner, hybrid)


def plan_nodes(found: list[ContextNode | None], planner: str = "saria", hybrid: bool = False) -> ReloadPlan:
    """``plan_reload`` of a request's nodes, looked up already (None: unknown key); the core
    looks them up once for the plan and the reuse count."""
    if planner == "saria":
        return _plan_saria(found, hybrid)
    # the baselines: lmcache, gds-only
    sources: list[int] = []
    append = sources.append
    best = 0  # length of the longest valid prefix so far
    best_ck = 0
    phase = DRAM  # lmcache: current tier of the tier-prefix lookup
    for node in found:
        if node is None:
            break
        loc = node.fa_loc
        if planner == "lmcache":
            if phase == DRAM and not loc & DRAM:
                phase = SSD
            if not loc & phase:
                break
            src = phase
        else:  # gds-only
            if not loc & SSD:
                break
            src = SSD
        append(src)
        ck = node.ck_loc
        if hybrid and ck > 0:
            ck_ok = ck & (SSD if planner == "gds-only" else (DRAM | SSD))
            if ck_ok:
                best = len(sources)
                best_ck = src if ck & src else _pick(ck_ok)
    fa_blocks = len(sources)
    if hybrid:
        del sources[best:]
    else:
        best = fa_blocks
        best_ck = 0
    dram = sources.count(DRAM)
    return ReloadPlan(best, sources, best_ck, dram, best - dram, fa_blocks)


def _plan_saria(found: list[ContextNode | None], hybrid: bool) -> ReloadPlan:
    """``saria``, the replay's most frequent call: every FA block from DRAM, else SSD; on a hybrid
    model the prefix ends on the last node whose checkpoint has a copy (DRAM preferred).

    Per block only a list comprehension runs in Python (the FA locations of the known nodes);
    C calls find the first unknown block and the first held nowhere, and map locations to sources.
    """
    try:
        run = found[: found.index(None)]
    except ValueError:  # every block known
        run = found
    locs = bytes([node.fa_loc for node in run])
    best = locs.find(0)
    if best < 0:
        best = len(locs)
    best_ck = 0
    fa_blocks = best
    if hybrid:  # end on the deepest checkpoint with a copy (ck_loc > 0: NO_CHECKPOINT is -1), read from the end
        while best:
            ck = run[best - 1].ck_loc
            if ck > 0 and ck & _HELD:
                best_ck = _pick(ck & _HELD)
                break
            best -= 1
    sources = list(locs[:best].translate(_SOURCE))
    dram = sources.count(DRAM)
    return ReloadPlan(best, sources, best_ck, dram, best - dram, fa_blocks)
