"""The one write sequencer: every SSD write of both drivers is decided here (paper 4.2, robust rule).

Drivers report events on nodes not yet on SSD; the sequencer answers with the nodes to write,
deepest first (the node, then the ancestors its write closes over), or nothing:

| event | driver calls | asked with |
|---|---|---|
| a recomputed node reaches DRAM | ``insert`` | ``R`` |
| ``R`` just reached ``theta_R`` while in DRAM | ``reuse`` | ``R`` |
| DRAM is about to reclaim the node (write-before-reclaim) | ``evict`` | ``E + 1`` (this eviction counted) |
| the node is among the next to be reclaimed | ``prewrite`` | ``E + 1`` (its next eviction) |
| an SSD copy was lost (evicted, dropped) | ``ssd_lost`` | - |

A driver counts the eviction itself (``E += 1``) when it reclaims the DRAM copy: the replay at
once, SGLang after the write it deferred the reclaim for. Under the robust rule (threshold
policies, ``admission.rule = "robust"``) a write closes over every ancestor not on SSD, starts
only at checkpoint nodes on hybrid models, is skipped when an ancestor is on no tier, needs
``theta_E`` evictions since the node's last SSD copy was lost, and total writes stay within
the computed content (docs/fidelity.md). A policy with ``lazy_closure`` (``auto``) writes the node
alone while its parent has a copy (on a hybrid model only with ``lazy_hybrid``, still starting at
checkpoint nodes); the parent is written at its own eviction because the node's SSD copy needs it
(``closure_forced``), so ancestors that stay in DRAM until the prefix is used again are never
written; on a hybrid model drivers are then asked about every node, checkpoint or not
(``write_floor``). A forced write completes a write decided within the credit, so the credit does
not refuse it (``closure_past_credit`` counts those past it): refusing it would leave the
descendant's SSD copy without its prefix, unusable, and the hits lost make more prefill, more
evictions and more such writes. Agents' hints come first (``hints.py``: an ended session's node is not written,
a returning one's is), except that a node its session left behind is refused after the policy
decided, so a learning policy still counts it. The tiers are read through a ``TierView``.
Promotion (which DRAM nodes a replica may displace) is decided in ``promotion.py``, with
``robust`` from here.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable, Iterator
from dataclasses import dataclass

from sglang_saria.mem_cache.admission import AdmissionEvent, AdmissionPolicy
from sglang_saria.mem_cache.metadata import DRAM, SSD, ContextNode
from sglang_saria.mem_cache.tier_view import TierView

_INSERT, _REUSE, _EVICT, _PREWRITE = (AdmissionEvent.INSERT, AdmissionEvent.REUSE, AdmissionEvent.EVICT,
                                      AdmissionEvent.PREWRITE)


@dataclass
class RuleStats:
    """Writes the robust rule refused."""

    unusable_skipped: int = 0  # qualifying nodes not written: an ancestor is on no tier (or the chain passes SSD)
    credit_refused: int = 0  # total writes would pass the computed content
    closure_deferred: int = 0  # lazy closure: writes that left their parent in DRAM for its own eviction
    closure_forced: int = 0  # lazy closure: nodes written at their eviction because a descendant's SSD copy needs them
    closure_past_credit: int = 0  # forced writes the credit would have refused (made all the same)


class WriteSequencer:
    """Decides which nodes to write to SSD at each event, for any ``TierView``."""

    def __init__(self, admission: AdmissionPolicy, rule: str, stats: RuleStats | None = None) -> None:
        self.admission = admission
        self.robust = rule == "robust" and admission.prefix_closed
        self.stats = stats if stats is not None else RuleStats()
        self.hints = admission.hints  # agents' hints come before the policy (mem_cache/hints.py)
        self.written_bytes = 0  # bytes of the writes drivers executed (replay) or ordered (SGLang)
        self.lazy = self.robust and admission.lazy_closure
        self.lazy_hybrid = self.lazy and admission.lazy_hybrid
        # lazy closure: block key of a parent left in DRAM -> the (last) child written without it
        self._needed_by: dict[Hashable, Hashable] = {}

    # ------------------------------------------------------------------ events
    def insert(self, view: TierView, key: Hashable, node: ContextNode, hbm: Container = ()) -> list | None:
        return self.admit(view, key, node, _INSERT, hbm=hbm)

    def reuse(self, view: TierView, key: Hashable, node: ContextNode, hbm: Container = ()) -> list | None:
        return self.admit(view, key, node, _REUSE, hbm=hbm)

    def evict(self, view: TierView, key: Hashable, node: ContextNode, hbm: Container = ()) -> list | None:
        """Write-before-reclaim: asked as if this eviction were counted already."""
        return self.admit(view, key, node, _EVICT, evictions=1, hbm=hbm)

    def write_floor(self, view: TierView, event: AdmissionEvent) -> tuple[float, float, bool]:
        """``(R, E, checkpoint_only)`` for ``insert``, ``reuse`` or ``evict``: at ``event`` a node is
        written only if its ``R >= R`` or ``E >= E`` (its counters when the driver asks, before an
        eviction is counted; inf: never) and, if ``checkpoint_only``, it has a checkpoint. A driver
        asks only for such nodes, so most cost it no call. The floor holds until the next clock
        tick (``on_clock``) or, if ``admission.retunes_on_write`` (a budget), the next write (``written``).
        Under the robust rule ``E - e_spent <= E``, so the bound on ``E`` holds for both rules."""
        r_min, e_min = self.admission.thresholds(event)
        if event is _EVICT:
            e_min -= 1  # asked with this eviction counted (``E + 1``)
        # a lazy closure must be asked about every node: any may be an ancestor a descendant's SSD copy needs
        return r_min, e_min, self._checkpoint_only(view) and not self.lazy_hybrid

    def _checkpoint_only(self, view: TierView) -> bool:
        """Whether only checkpoint nodes start a write: the robust rule on a hybrid model (``admit``)."""
        return self.robust and view.hybrid

    def prewrite(self, view: TierView, head: Iterable[tuple[Hashable, ContextNode]],
                 hbm: Container = ()) -> Iterator[list]:
        """Writes for the nodes next to be reclaimed (``head``, in eviction order) that would qualify at
        their next eviction. Lazy: a driver executes each write before the next is decided (a closure
        may cover a later candidate, a budget may run out).

        Most candidates are below the thresholds at every scan, or cannot start a write (no
        checkpoint, robust rule on a hybrid model); those are left out first (their ``E``, ``R``
        and checkpoint do not change during the scan), by their counters before the view calls.
        """
        r_min, e_min = self.admission.thresholds(_PREWRITE)  # E bounds the robust rule's E - e_spent too
        ckpt_only = self._checkpoint_only(view)
        due = [(k, n) for k, n in head if (n.R >= r_min or n.E >= e_min)
               and (not ckpt_only or view.has_checkpoint(k)) and not view.location(k) & SSD]
        for k, n in due:
            if not view.location(k) & SSD:
                chain = self.admit(view, k, n, _PREWRITE, hbm=hbm)
                if chain:
                    yield chain

    def ssd_lost(self, node: ContextNode) -> None:
        """A node's SSD copy is gone: under the robust rule the evictions that admitted it are spent."""
        if self.robust:
            node.e_spent = node.E

    def written(self, event: AdmissionEvent, nbytes: int) -> None:
        """A driver executed (or ordered) one write of ``nbytes`` for ``event``."""
        self.written_bytes += nbytes
        self.admission.on_admitted(event, nbytes)

    # ------------------------------------------------------------------ the rule
    def admit(self, view: TierView, key: Hashable, node: ContextNode, event: AdmissionEvent,
              evictions: int = 0, hbm: Container = ()) -> list | None:
        """The nodes to write for a node not on SSD, ``key`` first then ancestors deepest first; None: none.

        Paper rule: the node alone. Robust rule: on a hybrid model only checkpoint nodes start a
        write; evictions before its last SSD copy was lost do not count again; the node goes with
        every ancestor not yet on SSD, so SSD content stays prefix-closed, unless an ancestor has no
        copy to write from (DRAM, or ``hbm``: the current request's GPU blocks) or the chain cannot
        fit; total writes stay within the computed content (write-through's minimum).
        """
        hinted = False
        hints = self.hints
        if hints is not None:
            if hints.ended(key):  # its session ended: it will not be read
                hints.counts["skipped_writes"] += 1
                return None
            hinted = event is _EVICT and hints.returns_later(key)  # its session returns after DRAM gave it up
        admission = self.admission
        if not self.robust:
            if admission.keyed:
                return [key] if admission.admits_key(view.block_key(key), event, node, self._victim(view, key)) else None
            return [key] if hinted or admission.should_admit(node.E + evictions, node.R, event) else None
        lazy = self.lazy and (self.lazy_hybrid or not view.hybrid)
        forced = False
        if lazy and event is _EVICT:
            child = self._needed_by.pop(view.block_key(key), None)
            forced = child is not None and bool((view.location(child) or 0) & SSD)
        if forced:
            self.stats.closure_forced += 1
            admitted = True
        elif self._checkpoint_only(view) and not view.has_checkpoint(key):
            return None
        elif admission.keyed:
            admitted = admission.admits_key(view.block_key(key), event, node, self._victim(view, key))
        else:
            admitted = admission.should_admit(node.E + evictions - node.e_spent, node.R, event)
        if admitted and not forced and hints is not None and hints.is_left_behind(key):
            hints.counts["left_skipped_writes"] += 1  # its session went on without it (asked after the policy,
            return None  # which counts it as seen)
        if not admitted:
            if not hinted:
                return None
            hints.counts["hinted_writes"] += 1
        chain = self._lazy_chain(view, key, hbm) if lazy else self._missing_prefix(view, key, hbm)
        if chain is None:
            self.stats.unusable_skipped += 1
            return None
        tokens, nbytes = view.size(key)
        extra = 0
        if len(chain) > 1:
            sizes = [view.size(k) for k in chain[1:]]
            if sum(t for t, _ in sizes) + tokens > view.ssd_capacity_tokens:
                self.stats.unusable_skipped += 1
                return None
            extra = sum(b for _, b in sizes)
            if not self.admission.affords(extra):
                return None
        if self.written_bytes + nbytes + extra > view.computed_bytes():
            if not forced:
                self.stats.credit_refused += 1
                return None
            self.stats.closure_past_credit += 1
        return chain

    def _victim(self, view: TierView, key: Hashable) -> ContextNode | None:
        """For a ``compares_victim`` policy: the SSD node a write of ``key`` would displace first (None: room)."""
        return view.ssd_victim(view.size(key)[0]) if self.admission.compares_victim else None

    def _lazy_chain(self, view: TierView, key: Hashable, hbm: Container) -> list | None:
        """Lazy closure: ``[key]`` if its parent has a copy (SSD, DRAM or ``hbm``), else None. A parent not on
        SSD is written at its own eviction (``_needed_by``), where its own parent is checked: O(1) per write,
        where closing over the chain walks every ancestor up to SSD."""
        p = view.parent(key)
        if p is None:
            return [key]
        loc = view.location(p)
        if loc is None or not (loc & (SSD | DRAM) or p in hbm):
            return None
        if not loc & SSD:
            self._needed_by[view.block_key(p)] = key
            self.stats.closure_deferred += 1
        return [key]

    @staticmethod
    def _missing_prefix(view: TierView, key: Hashable, hbm: Container) -> list | None:
        """``key`` and its ancestors up to the first one on SSD, deepest first; None if one of them
        has no copy to write from."""
        chain = [key]
        p = view.parent(key)
        while p is not None:
            loc = view.location(p)
            if loc is None:
                return None
            if loc & SSD:
                break
            if not loc & DRAM and p not in hbm:
                return None
            chain.append(p)
            p = view.parent(p)
        return chain
