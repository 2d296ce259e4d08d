"""Persistence-aware SSD admission (paper 4.2).

A policy is a pure predicate over a node's shared counters at one of four moments
(vLLM kv_offload style), plus lifecycle callbacks that only count. Write *scheduling*
(write-before-reclaim, reuse-triggered async write, prewrite with ``E + 1``) is the
core's job; the policy only says whether a node qualifies at that moment.

Names (grammar and kind registry: ``policy_names.py``): ``none``, ``full-duplicate``,
``eviction:E<n>``, ``reuse:R<n>``, ``combined:E<n>R<m>`` (registered here), and ``budget:<DWPD>``
(the online write-budget controller in ``budget.py``). Build one by name with
``admission_factory.make_admission_policy``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from enum import Enum
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING

from sglang_saria import policy_names
from sglang_saria.mem_cache.hints import AgentHints

if TYPE_CHECKING:
    from sglang_saria.config import AdmissionConfig


class AdmissionEvent(str, Enum):
    INSERT = "insert"  # a (re)computed block enters DRAM
    REUSE = "reuse"  # a request's input contains the block again (R was just incremented)
    EVICT = "evict"  # DRAM eviction (E was just incremented): write-before-reclaim
    PREWRITE = "prewrite"  # near the DRAM eviction end: would it qualify at its next eviction?
    CLOSURE = "closure"  # an ancestor written with an admitted node (robust rule: SSD stays prefix-closed); never asked


# members as module constants: an Enum class attribute costs ~10x a global lookup, and the
# predicates below run for every DRAM eviction and prewrite candidate
_INSERT, _REUSE, _PREWRITE = AdmissionEvent.INSERT, AdmissionEvent.REUSE, AdmissionEvent.PREWRITE

# Prometheus name under which the SGLang adapter exports ``AdmissionPolicy.admitted`` (label: event).
METRIC_ADMITTED = "sglang:saria_ssd_admissions_total"


class AdmissionPolicy(ABC):
    """Decides whether a node not yet on SSD should be written there."""

    name: str = ""
    #: whether PREWRITE can ever differ from EVICT-time decisions (lets the core skip scans)
    uses_eviction_count: bool = False
    #: R value at which the reuse path fires (0 = never)
    reuse_threshold: int = 0
    #: whether ``thresholds`` may move with writes (``on_admitted``), not only with the clock
    retunes_on_write: bool = False
    #: whether it decides by block identity (``admits_key``) instead of counters: the replay's oracle
    keyed: bool = False
    #: agents' hints the sequencer consults before the policy (``auto``), or None
    hints: AgentHints | None = None
    #: whether the sequencer's robust rule applies (prefix-closed chains): threshold policies and ``auto``
    prefix_closed: bool = False
    #: whether ``admits_key`` is given the SSD victim a write would displace (``auto``)
    compares_victim: bool = False
    #: under the robust rule on FA-only models, whether a write leaves its ancestors still in DRAM to their own
    #: eviction, where each is written because a descendant's SSD copy needs it (``auto``); else it closes over
    #: them at once
    lazy_closure: bool = False
    #: whether ``lazy_closure`` holds on hybrid models too (writes still start at checkpoint nodes)
    lazy_hybrid: bool = False

    def __init__(self) -> None:
        self.admitted: dict[str, int] = {e.value: 0 for e in AdmissionEvent}

    @abstractmethod
    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        """Pure: no side effects, safe to call speculatively."""

    def admits_key(self, key: object, event: AdmissionEvent, node: object = None, victim: object = None) -> bool:
        """The decision of a ``keyed`` policy for block ``key`` (its ``node``; ``victim``: the SSD node the write
        would displace, for ``compares_victim`` policies, None while SSD has room); others decide by counters.
        Asking twice for one event decides the same."""
        raise TypeError(f"{self.name or type(self).__name__} decides by counters (should_admit), not by block")

    def thresholds(self, event: AdmissionEvent) -> tuple[float, float]:
        """Pure: ``(R, E)`` such that ``should_admit(E', R', event)`` implies ``R' >= R or E' >= E``
        (a necessary condition; inf: never). Lets the core skip hopeless nodes without a call each;
        ``(0, 0)`` (no bound) is always correct."""
        return 0, 0

    def on_clock(self, now: float) -> None:
        """The core's clock at each request call; only time-driven policies (budget) use it."""

    def on_load(self, backlog_s: float, now: float) -> None:
        """The driver's load signal at ``now`` (seconds of prefill queued on the GPU); only ``reads_load`` policies use it."""

    #: whether ``on_load`` changes its decisions (the SGLang driver feeds the signal only then)
    reads_load: bool = False

    #: whether ``on_missed`` learns anything (drivers skip building its argument otherwise)
    learns: bool = False

    def on_missed(self, keys: Iterable[Hashable]) -> None:
        """A request wanted ``keys`` from below DRAM (read from SSD, or recomputed); only ``auto`` uses it."""

    def affords(self, extra_bytes: int) -> bool:
        """Pure: whether ``extra_bytes`` more than the admitted node itself (its unwritten prefix,
        robust rule) may be written now; only budgeted policies refuse."""
        return True

    def on_admitted(self, event: AdmissionEvent, nbytes: int = 0) -> None:
        """A write of ``nbytes`` was emitted for ``event``."""
        self.admitted[event] += 1  # a str enum: hashes and compares as its value

    def reset(self) -> None:
        self.admitted = {e.value: 0 for e in AdmissionEvent}

    @property
    def writes_ssd(self) -> bool:
        return True


class NoAdmission(AdmissionPolicy):
    """DRAM-only caching: nothing reaches SSD."""

    name = "none"

    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        return False

    def thresholds(self, event: AdmissionEvent) -> tuple[float, float]:
        return math.inf, math.inf

    @property
    def writes_ssd(self) -> bool:
        return False


class FullDuplicate(AdmissionPolicy):
    """Every block entering DRAM is also written to SSD (HiCache/LMCache write-through)."""

    name = "full-duplicate"

    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        return True


class ThresholdAdmission(AdmissionPolicy):
    """Admit when ``E >= theta_E`` (eviction history) or ``R >= theta_R`` (popularity).

    The thresholds come from a parsed name (``policy_names.parse`` checks them, once).
    """

    def __init__(self, theta_E: int | None, theta_R: int | None) -> None:
        super().__init__()
        self.theta_E = theta_E
        self.theta_R = theta_R
        self.prefix_closed = True
        self.uses_eviction_count = theta_E is not None
        self.reuse_threshold = theta_R or 0
        parts = ([f"E{theta_E}"] if theta_E else []) + ([f"R{theta_R}"] if theta_R else [])
        kind = "combined" if len(parts) == 2 else ("eviction" if theta_E else "reuse")
        self.name = f"{kind}:{''.join(parts)}"

    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        theta_R, theta_E = self.theta_R, self.theta_E
        if theta_R is not None and R >= theta_R:
            return True
        if theta_E is None or event is _INSERT or event is _REUSE:
            return False
        if event is _PREWRITE:
            E += 1
        return E >= theta_E

    def thresholds(self, event: AdmissionEvent) -> tuple[float, float]:
        theta_R, theta_E = self.theta_R, self.theta_E
        r_min = math.inf if theta_R is None else theta_R
        if theta_E is None or event is _INSERT or event is _REUSE:
            return r_min, math.inf
        return r_min, theta_E - 1 if event is _PREWRITE else theta_E


def parse_policy_name(name: str) -> tuple[str, int | None, int | None]:
    """Split a policy name into (kind, theta_E, theta_R); raises ValueError listing the forms."""
    pn = policy_names.parse(name)
    return pn.kind, pn.theta_E, pn.theta_R


@policy_names.register("none", "full-duplicate", "eviction", "reuse", "combined")
def _make_fixed(pn: policy_names.PolicyName, cfg: "AdmissionConfig | None", ssd_capacity_bytes: int) -> AdmissionPolicy:
    if pn.kind == "none":
        return NoAdmission()
    if pn.kind == "full-duplicate":
        return FullDuplicate()
    return ThresholdAdmission(pn.theta_E, pn.theta_R)
