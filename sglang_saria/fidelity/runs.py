"""What every fidelity figure shares: the workload paths, one replay setup (``Setup``), a runner
that caches traces and results across figures (``Runner``) and one row of the table (``Row``).

The figure modules (``table.py``, ``figures.py``, ``placement.py``) build on one runner: a replay two
figures share runs once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from sglang_saria.config import (
    AdmissionConfig,
    CapacityConfig,
    MetadataConfig,
    PromotionConfig,
    SariaConfig,
    TransferConfig,
)
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.loaders import load_trace, shared_dir
from sglang_saria.replay.metrics import same_requests
from sglang_saria.replay.report import md_table
from sglang_saria.replay.workload import apply_limits, session_starts

WEKA = f"weka:{shared_dir() / 'traces' / 'weka-cc'}"
MODELS = ("qwen3.5-9b", "qwen3-8b")
NOMINAL_TPS = ReplaySettings.prefill_tokens_per_s  # paper 5.1: "advances at 6,500 computed prefill tokens/s"
# Paper 5.2: on WEKA with Qwen3.5-9B, E3 "stays within the one-day write budget" (1 C) while
# writing 78.2% less than FD, so the paper's FD wrote at most 1 / (1 - 0.782) = 4.59 C.
PAPER_FD_WRITES_MAX_C = 1.0 / (1.0 - 0.782)


# agreement grades of a relative row, tightest first: the replay's magnitude within this factor of the paper's
GRADES = (("1.25x", 1.25), ("2x", 2.0))


@dataclass(frozen=True)
class Row:
    """One claim: the paper's number and the replay's, as relative changes (or fractions)."""

    figure: str
    claim: str
    paper: float
    replay: float
    baseline_relative: bool = True  # a change vs a baseline: same direction = same sign
    note: str = ""

    @property
    def same_direction(self) -> bool:
        if self.baseline_relative:
            return (self.paper > 0) == (self.replay > 0)
        return True  # fractions (e.g. writes never read) are compared by value in the table

    @property
    def grade(self) -> str:
        """How far a relative row agrees with the paper: "no" (opposite sign), "sign" (same sign,
        magnitudes more than 2x apart), "2x" (within 2x of the paper's magnitude), "1.25x" (within
        1.25x); "-" for an absolute fraction."""
        if not self.baseline_relative:
            return "-"
        if not self.same_direction:
            return "no"
        for grade, factor in GRADES:
            if self.paper and 1 / factor <= abs(self.replay / self.paper) <= factor:
                return grade
        return "sign"

    def as_dict(self) -> dict:
        return {**asdict(self), "same_direction": self.same_direction}


@dataclass(frozen=True)
class Setup:
    """One replay: workload, model and the config knobs a figure varies."""

    trace: str
    model: str
    sessions: int | None
    window_h: float = 12.0
    in_flight: int = 4
    policy: str = "full-duplicate"
    rule: str = "robust"
    planner: str = "saria"
    transfer: str = "coordinated"
    promotion: str = "saria"
    ratio: float = 0.4
    dram_tokens: int = 1_000_000
    ssd_tokens: int = 10_000_000
    prefill_tps: float = NOMINAL_TPS
    placement: str | None = None  # a hybrid's GDN states ("grid", "sglang"); None: the Runner's


# Where a hybrid's GDN states sit unless a run says otherwise: where SGLang 0.5.23 keeps them (each
# prefill chunk's end and a hit's branching point), as the server the replay stands for does; "grid"
# is the paper's state every 16,384 tokens, for the comparisons that need the paper's own model.
DEFAULT_PLACEMENT = "sglang"


class Runner:
    """Replays setups, caching loaded traces and results (figures share baselines)."""

    def __init__(self, progress: bool, placement: str = DEFAULT_PLACEMENT) -> None:
        self._traces: dict[tuple, list] = {}
        self._results: dict[Setup, dict] = {}
        self.progress = progress
        self.placement = placement  # of a Setup that names none: SGLang's ("sglang") or the paper's grid

    def resolve(self, s: Setup) -> Setup:
        """``s`` as replayed: its placement set, the rule shared where it changes nothing."""
        if s.placement is None:
            s = replace(s, placement=self.placement)
        if s.policy in ("none", "full-duplicate"):
            s = replace(s, rule="robust")  # the rule only changes threshold policies: share the run
        return s

    def sessions(self, s: Setup) -> list:
        """The setup's sessions, loaded once per (trace, block size, count) for every figure."""
        key = (s.trace, get_model_spec(s.model).default_block_tokens, s.sessions)
        if key not in self._traces:
            self._traces[key] = apply_limits(load_trace(s.trace, key[1], max_sessions=s.sessions))
        return self._traces[key]

    def __call__(self, s: Setup) -> dict:
        s = self.resolve(s)
        if s not in self._results:
            spec = get_model_spec(s.model)
            bt = spec.default_block_tokens
            sessions = self.sessions(s)
            settings = ReplaySettings(window_s=s.window_h * 3600.0, in_flight=s.in_flight,
                                      prefill_tokens_per_s=s.prefill_tps)
            cfg = SariaConfig(
                admission=AdmissionConfig(policy=s.policy, rule=s.rule),
                metadata=MetadataConfig(block_tokens=bt, checkpoint_placement=s.placement),
                promotion=PromotionConfig(mode=s.promotion, ratio=s.ratio),
                transfer=TransferConfig(mode=s.transfer, planner=s.planner),
                capacity=CapacityConfig(dram_tokens=s.dram_tokens, ssd_tokens=s.ssd_tokens),
            ).validate()
            label = (f"{s.model} {s.policy} {s.planner}/{s.transfer}/{s.promotion}{s.ratio:g} {s.window_h:g}h "
                     f"{s.prefill_tps:.0f}tok/s {s.placement}")
            res = replay(sessions, session_starts(sessions, settings.window_s, 0), cfg, spec, settings,
                         progress=self.progress, label=label)
            self._results[s] = res.metrics
        return self._results[s]


def rel(new: float, base: float) -> float:
    """Relative change of ``new`` against ``base`` (-0.2 = 20% lower)."""
    return new / base - 1.0 if base else 0.0


def rel_same(new: dict, base: dict, metric: str) -> float:
    """``rel`` of one metric of two policies' results, which must cover the same requests."""
    same_requests([new, base])
    return rel(new[metric], base[metric])


def format_rows(rows: list[Row]) -> str:
    """The claims table (kept in docs/fidelity.md), each relative row graded (``Row.grade``)."""
    def grade(r: Row) -> str:
        return "**no**" if r.grade == "no" else r.grade

    return md_table(["fig", "claim", "paper", "replay", "agreement", "note"],
                    [[r.figure, r.claim, f"{r.paper:+.1%}", f"{r.replay:+.1%}", grade(r), r.note] for r in rows])


def grade_counts(rows: list[Row]) -> dict[str, int]:
    """Relative rows, and of them those that agree in sign, within 2x and within 1.25x (each grade
    counts the tighter ones too)."""
    graded = [r.grade for r in rows if r.baseline_relative]
    return {"relative rows": len(graded), "same sign": sum(g != "no" for g in graded),
            "within 2x": sum(g in ("2x", "1.25x") for g in graded), "within 1.25x": graded.count("1.25x")}


def format_grades(rows: list[Row]) -> str:
    """The agreement summary (kept in docs/fidelity.md): how many relative rows reach each grade."""
    counts = grade_counts(rows)
    n = counts["relative rows"]
    return md_table(["agreement with the paper", "rows", "of relative rows"],
                    [[k, str(v), f"{v / n:.0%}" if n else "-"] for k, v in counts.items()])
