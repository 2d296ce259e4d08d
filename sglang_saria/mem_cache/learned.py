"""``auto`` admission (the operators' policy): write a block at its DRAM eviction when its learned chance
of reuse pays.

Fixed thresholds and ``loadaware`` count evictions; what a write is worth is whether the block is read
again while out of DRAM, and, when the SSD is full, whether it is worth more than the copy it
displaces. This policy estimates that chance online, from the running workload alone:

- **classes**: at a DRAM eviction of a block not on SSD, the block falls in a class of its counters
  (request reuses ``R``: 0-3+, DRAM evictions ``E`` with this one: 1-3+), of the time since a
  request last used it (log2 of seconds, 0-15+) and of whether a later request went around it
  (``metadata.bypassed``: it used the block's path but not the block): ``N_CLASSES`` classes. The
  last is what the past says of an agent that rewrote or compacted its history: on the WEKA
  sessions 1-175, 12% of the writes ``auto`` made without it were of such blocks, and none of
  them was read again. Where a first block is shared by many sessions, most blocks are bypassed
  and the learned chances, not a rule, say what that is worth;
- **ghost**: the evicted block's key is remembered with its class (written or not: blocks never
  written are tracked too), bounded by ``max_bytes`` (``GHOST_BYTES_PER_BLOCK`` per tracked
  block; the oldest entry goes first); the class's ``seen`` count grows by one;
- **outcome**: a request that wants a block from below DRAM (read from SSD, or recomputed though
  a cache could have held it) and finds it in the ghost counts one reuse of its class (``on_missed``);
- **estimate**: ``p = (reused + 1) / (seen + 2)`` per class (the Laplace rule: no prior fitted to
  a trace); O(1) per block event.

Decision at an eviction (``admits_key``, EVICT only; every write goes through the sequencer's
robust rule, prefix-closed): admit when the odds ``p / (1 - p)`` reach the bar
``odds / (1 + backlog_s / load_ref_s)``, where ``backlog_s`` is the driver's load signal (prefill
work queued on the GPU, seconds: a queued GPU makes each recomputation dearer) and, under a drive
rating (``auto:<DWPD>``), the bar is divided by the share of the window's budget left (none
left: no write). When the SSD has no room for the block, the victim the write would displace is
classed the same way (its counters and idle time now) and the block is admitted only if its
chance is higher (TinyLFU's comparison with the victim). The two constants, ``odds`` (4: a write
pays on an idle GPU when a reuse is four times as likely as not; chosen on WEKA files 1-175 among
0.5-16 as the value with the lowest writes against the clairvoyant frontier that kept every hit
ratio there within 0.02 of the frontier's best) and ``load_ref_s`` (1 s of queued prefill halves
the bar), are stated in ``docs/admission.md`` with the results at half and double each.

Agents' hints (``hints.py``) come first in the sequencer. Decisions are counted by
reason (``decisions``: ``admit``, ``cold``, ``victim``, ``budget``); ``state_dict`` /
``load_state_dict`` carry the classes and the ghost across a restart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from sglang_saria import policy_names
from sglang_saria.config import AdmissionConfig, ConfigError
from sglang_saria.mem_cache.admission import AdmissionEvent, AdmissionPolicy
from sglang_saria.mem_cache.budget import WriteBudgetController, rated_budget
from sglang_saria.mem_cache.hints import AgentHints
from sglang_saria.mem_cache.metadata import ContextNode, bypassed

_EVICT = AdmissionEvent.EVICT

R_CLASSES, E_CLASSES, AGE_CLASSES = 4, 3, 16
N_CLASSES = 2 * R_CLASSES * E_CLASSES * AGE_CLASSES  # bypassed or not, R, E, age
#: memory of one tracked block in the ghost (dict entry and int key object): 64-92 bytes measured with
#: tracemalloc on CPython 3.11 (92 just after the table doubles, 122 while it does), 104 with a margin
GHOST_BYTES_PER_BLOCK = 104
#: Prometheus name of ``decisions`` (label: reason)
METRIC_DECISIONS = "sglang:saria_auto_decisions_total"
_STATE_VERSION = 2  # 1: classes without the bypassed half


@dataclass(frozen=True)
class LearnedParams:
    """The policy's constants (``AdmissionConfig.auto_odds``, ``auto_load_ref_s``, ``auto_max_bytes``)."""

    odds: float = 4.0  # reuse odds p / (1 - p) at which a write pays on an idle GPU
    load_ref_s: float = 1.0  # queued prefill (s) that halves the bar
    max_bytes: int = 64 << 20  # ghost memory bound
    lazy_closure: bool = True  # ancestors still in DRAM are written at their own eviction (sequencer)
    lazy_hybrid: bool = True  # ... on hybrid models too

    @property
    def max_blocks(self) -> int:
        return max(1, self.max_bytes // GHOST_BYTES_PER_BLOCK)


def block_class(R: int, E: int, idle_s: float, went_around: bool = False) -> int:
    """The class of a block with ``R`` reuses, ``E`` DRAM evictions (this one counted), ``idle_s``
    seconds since its last use, and whether a later request went around it."""
    age = 0 if idle_s < 1.0 else min(AGE_CLASSES - 1, 1 + int(math.log2(idle_s)))
    cls = ((min(R, R_CLASSES - 1) * E_CLASSES) + min(max(E, 1), E_CLASSES) - 1) * AGE_CLASSES + age
    return cls + N_CLASSES // 2 if went_around else cls


def node_class(node: ContextNode, E: int, now: float) -> int:
    """``block_class`` of a node at ``now``, with ``E`` DRAM evictions."""
    return block_class(node.R, E, now - node.t_reuse, bypassed(node))


class LearnedAdmission(AdmissionPolicy):
    """``auto`` / ``auto:<DWPD>``: admit by the learned reuse chance of the block's class."""

    keyed = True
    prefix_closed = True
    compares_victim = True
    learns = True
    reads_load = True

    def __init__(self, params: LearnedParams | None = None, budget: WriteBudgetController | None = None) -> None:
        super().__init__()
        self.params = params or LearnedParams()
        self.lazy_closure = self.params.lazy_closure
        self.lazy_hybrid = self.params.lazy_hybrid
        self.budget = budget
        self.name = "auto" if budget is None else f"auto:{budget.params.dwpd:g}"
        self.retunes_on_write = budget is not None
        self.hints = AgentHints()
        self.seen = [0] * N_CLASSES
        self.reused = [0] * N_CLASSES
        self.ghost: dict[Hashable, int] = {}  # evicted block -> its class, until reused or pushed out
        self.now = 0.0
        self.backlog_s = 0.0
        self.decisions = {"admit": 0, "cold": 0, "victim": 0, "budget": 0}
        self._fixed: list[float] | None = None  # fix_chances

    # ------------------------------------------------------------ driver signals
    def on_clock(self, now: float) -> None:
        self.now = now
        self.hints.on_clock(now)
        if self.budget is not None:
            self.budget.on_clock(now)

    def on_load(self, backlog_s: float, now: float) -> None:
        """Seconds of prefill queued on the GPU that will really be computed, over the measured prefill rate."""
        self.backlog_s = max(0.0, backlog_s)

    def on_missed(self, keys: Iterable[Hashable]) -> None:
        """A request wanted ``keys`` from below DRAM (read from SSD or recomputed): each one the ghost
        holds counts one reuse of its class."""
        ghost = self.ghost
        if not ghost:
            return
        reused = self.reused
        for k in ghost.keys() & (keys if isinstance(keys, (set, frozenset)) else set(keys)):
            reused[ghost.pop(k)] += 1

    # ------------------------------------------------------------ decision
    def chance(self, cls: int) -> float:
        """The learned chance that a block of class ``cls`` is wanted again from below DRAM."""
        if self._fixed is not None:
            return self._fixed[cls]
        return (self.reused[cls] + 1) / (self.seen[cls] + 2)

    def chances(self) -> list[float]:
        """``chance`` of every class, now."""
        return [self.chance(c) for c in range(N_CLASSES)]

    def fix_chances(self, table: list[float]) -> None:
        """Answer ``chance`` from ``table`` (one value in [0, 1] per class) instead of the counts, which
        still grow: the hindsight bound of ``saria-admission-sweep hindsight``, where ``table`` is what
        a replay of the same requests had learned by its end."""
        if len(table) != N_CLASSES or not all(0.0 <= p <= 1.0 for p in table):
            raise ValueError(f"fix_chances: need {N_CLASSES} chances in [0, 1], got {len(table)}")
        self._fixed = list(table)

    def bar(self) -> float:
        """The reuse odds a write needs now (inf: none allowed)."""
        b = self.params.odds / (1.0 + self.backlog_s / self.params.load_ref_s)
        if self.budget is not None:
            fill = self.budget.fill
            return b / fill if fill > 0 and self.budget.level > 0 else math.inf
        return b

    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        raise TypeError("auto decides by block (admits_key), not by counters")

    def admits_key(self, key: Hashable, event: AdmissionEvent, node: ContextNode | None = None,
                   victim: ContextNode | None = None) -> bool:
        """At a DRAM eviction (``node.E`` not yet counted): track the block in the ghost (once per
        eviction: asking again changes nothing) and decide; ``victim``: the SSD copy the write would
        displace, if the SSD has no room."""
        if event is not _EVICT or node is None:
            return False
        cls = self.ghost.get(key)
        if cls is None:
            cls = node_class(node, node.E + 1, self.now)
            self._track(key, cls)
        p = self.chance(cls)
        bar = self.bar()
        if bar == math.inf:
            self.decisions["budget"] += 1
            return False
        if p < 1.0 and p / (1.0 - p) < bar:
            self.decisions["cold"] += 1
            return False
        if victim is not None and self.chance(node_class(victim, victim.E, self.now)) >= p:
            self.decisions["victim"] += 1
            return False
        self.decisions["admit"] += 1
        return True

    def _track(self, key: Hashable, cls: int) -> None:
        ghost = self.ghost
        if len(ghost) >= self.params.max_blocks:
            del ghost[next(iter(ghost))]  # the oldest entry (insertion order)
        ghost[key] = cls
        self.seen[cls] += 1

    def thresholds(self, event: AdmissionEvent) -> tuple[float, float]:
        # asked at every eviction of a block not on SSD, never at insert, reuse or prewrite
        return (0, 0) if event is _EVICT else (math.inf, math.inf)

    def affords(self, extra_bytes: int) -> bool:
        return self.budget is None or self.budget.affords(extra_bytes)

    def on_admitted(self, event: AdmissionEvent, nbytes: int = 0) -> None:
        super().on_admitted(event, nbytes)
        if self.budget is not None:
            self.budget.on_admitted(event, nbytes)

    def reset(self) -> None:
        super().reset()
        if self.budget is not None:
            self.budget.reset()
        self.decisions = dict.fromkeys(self.decisions, 0)

    # ------------------------------------------------------------ state
    def state(self) -> dict[str, float]:
        """Gauges: the load signal, the bar it gives, the ghost's size and the budget's fill (1 without a cap)."""
        return {"backlog_s": self.backlog_s, "bar": self.bar(), "ghost_blocks": float(len(self.ghost)),
                "fill": self.budget.fill if self.budget is not None else 1.0}

    def state_dict(self) -> dict:
        """The learned state as JSON-able data: class counts and the ghost (keys that are ints or strings)."""
        return _state(self.seen, self.reused, self.ghost)

    def snapshot(self) -> Callable[[], dict]:
        """The state now, copied at C speed (for a driver's scheduler thread); calling the result
        builds ``state_dict``'s data from the copy, on any thread."""
        seen, reused, ghost = list(self.seen), list(self.reused), dict(self.ghost)
        return lambda: _state(seen, reused, ghost)

    def load_state_dict(self, state: dict, source: str = "auto admission state") -> None:
        """Restore ``state_dict``'s output; a malformed state raises ConfigError naming the field, and
        changes nothing. A version 1 state (no bypassed classes) fills the classes of blocks not bypassed."""
        version = state.get("version") if isinstance(state, dict) else None
        if version not in (1, _STATE_VERSION):
            raise ConfigError(f"{source}: version must be 1 or {_STATE_VERSION}, got "
                              f"{version if isinstance(state, dict) else type(state).__name__!r}")
        n = N_CLASSES if version == _STATE_VERSION else N_CLASSES // 2
        counts = {}
        for name in ("seen", "reused"):
            v = state.get(name)
            if not (isinstance(v, list) and len(v) == n and all(isinstance(x, int) and x >= 0 for x in v)):
                raise ConfigError(f"{source}: {name} must be {n} counts >= 0 (version {version})")
            counts[name] = v + [0] * (N_CLASSES - n)
        if any(r > s for r, s in zip(counts["reused"], counts["seen"])):
            raise ConfigError(f"{source}: reused must not exceed seen in any class")
        ghost = state.get("ghost")
        if not isinstance(ghost, list) or not all(
                isinstance(e, list) and len(e) == 2 and isinstance(e[0], (int, str)) and isinstance(e[1], int)
                and 0 <= e[1] < n for e in ghost):
            raise ConfigError(f"{source}: ghost must be a list of [key, class] with class in [0, {n})")
        self.seen, self.reused = list(counts["seen"]), list(counts["reused"])
        self.ghost = {k: c for k, c in ghost[-self.params.max_blocks:]}


def _state(seen: list[int], reused: list[int], ghost: dict) -> dict:
    return {"version": _STATE_VERSION, "seen": list(seen), "reused": list(reused),
            "ghost": [[k, c] for k, c in ghost.items() if isinstance(k, (int, str))]}


@policy_names.register("auto")
def _make_auto(pn: policy_names.PolicyName, cfg: AdmissionConfig | None, ssd_capacity_bytes: int) -> LearnedAdmission:
    cfg = cfg or AdmissionConfig(policy="auto")
    params = LearnedParams(odds=cfg.auto_odds, load_ref_s=cfg.auto_load_ref_s, max_bytes=cfg.auto_max_bytes,
                           lazy_closure=cfg.auto_lazy_closure, lazy_hybrid=cfg.auto_lazy_hybrid)
    if pn.dwpd is None:
        return LearnedAdmission(params)
    return LearnedAdmission(params, rated_budget("auto", pn.dwpd, cfg, ssd_capacity_bytes))
