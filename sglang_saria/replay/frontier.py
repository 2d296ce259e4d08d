"""The clairvoyant frontier: the fewest SSD writes the replay found for each hit ratio (CHAR).

The oracle (``oracle.py``) is one point: it writes every block some later request wants from below
DRAM. Where the SSD is small those writes evict each other and its CHAR can fall below that of a
selective policy, so one point says nothing about a policy at another CHAR. The frontier is a
curve of clairvoyant points:

1. the oracle run to a fixed point from a DRAM-only first pass (``replay_oracle``; its wants only
   grow, so the iteration ends; ``max_passes`` is a guard, and a point that hit it says so:
   ``fixed_point`` False);
2. its wanted blocks ranked by value, the number of requests that wanted each (ties: key order);
3. for each k of a sweep, the oracle restricted to its k most valuable blocks, warm-started from
   the full oracle's wants of those blocks and iterated to its own fixed point;
4. the frontier: the points (and DRAM-only, k = 0) that no other point beats on both writes and
   CHAR; ``writes_at(char)`` interpolates linearly between neighbours.

What it bounds, and what not: every point is a schedule a clairvoyant policy can run on the same
requests, capacities and victim order, so a policy above the curve (more writes at its CHAR) is
beaten by a policy that knows the future, by that ratio. It is not a proof of a minimum: the
value ranking is one heuristic, a restricted oracle writes for wants recorded under earlier
passes' timings (some copies are never read), and the victim order is LRU for every point; a
policy may lie below the curve. A CHAR above the frontier's best has no frontier value
(``writes_at`` returns None): the frontier then does not dominate that policy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from sglang_saria.config import AdmissionConfig, SariaConfig
from sglang_saria.model_specs import ModelSpec
from sglang_saria.replay.driver import ReplaySettings, replay, replay_oracle

if TYPE_CHECKING:
    from sglang_saria.replay.trace import TraceSession

#: shares of the oracle's wanted blocks (most valuable first) the frontier runs
DEFAULT_SHARES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0)


@dataclass(frozen=True)
class FrontierPoint:
    """One clairvoyant run: the oracle restricted to its ``k`` most valuable blocks."""

    k: int
    share: float  # k over the oracle's wanted blocks
    writes_norm: float  # SSD writes over the SSD capacity
    char: float
    passes: int
    fixed_point: bool
    writes_never_read_frac: float


@dataclass
class Frontier:
    """The clairvoyant points of one setting and their Pareto frontier."""

    points: list[FrontierPoint]

    @property
    def pareto(self) -> list[FrontierPoint]:
        """Points no other beats on both writes and CHAR, by increasing writes (and CHAR)."""
        out: list[FrontierPoint] = []
        for p in sorted(self.points, key=lambda p: (p.writes_norm, -p.char)):
            if not out or p.char > out[-1].char:
                out.append(p)
        return out

    @property
    def best_char(self) -> float:
        return max(p.char for p in self.points)

    @property
    def converged(self) -> bool:
        """Every point reached its fixed point."""
        return all(p.fixed_point for p in self.points)

    def writes_at(self, char: float) -> float | None:
        """The frontier's writes (over capacity) at ``char``: linear between Pareto neighbours; None above
        its best CHAR."""
        return writes_at(self.pareto, char)

    def to_json(self) -> dict:
        return {"points": [asdict(p) for p in self.points]}

    @classmethod
    def from_json(cls, doc: dict) -> "Frontier":
        return cls([FrontierPoint(**p) for p in doc["points"]])


def writes_at(pareto: Sequence[FrontierPoint], char: float) -> float | None:
    """Writes on the piecewise-linear curve through ``pareto`` (increasing writes and CHAR) at ``char``."""
    if not pareto or char > pareto[-1].char:
        return None
    if char <= pareto[0].char:
        return pareto[0].writes_norm
    for lo, hi in zip(pareto, pareto[1:]):
        if char <= hi.char:
            f = (char - lo.char) / (hi.char - lo.char)
            return lo.writes_norm + f * (hi.writes_norm - lo.writes_norm)
    raise AssertionError("unreachable: char is at most the last point's")


def ranked_blocks(needs: dict[int, set[int]]) -> list[int]:
    """The wanted blocks, most valuable first: by the number of requests that wanted each, then by key."""
    counts = Counter(k for keys in needs.values() for k in keys)
    return sorted(counts, key=lambda k: (-counts[k], k))


def build_frontier(sessions: Sequence["TraceSession"], start_times: Sequence[float], cfg: SariaConfig,
                   spec: ModelSpec, settings: ReplaySettings, shares: Sequence[float] = DEFAULT_SHARES,
                   max_passes: int = 40) -> Frontier:
    """The frontier of ``cfg``'s capacities on these requests (``cfg.admission`` is replaced)."""
    if not shares or any(not 0 < s <= 1 for s in shares):
        raise ValueError(f"frontier shares {list(shares)}: each must be in (0, 1]")
    if max_passes < 2:
        raise ValueError(f"frontier max_passes={max_passes}: must be >= 2 (the first pass is DRAM-only)")
    oracle_cfg = replace(cfg, admission=AdmissionConfig(policy="oracle")).validate()
    none_cfg = replace(cfg, admission=AdmissionConfig(policy="none")).validate()
    base = replay(sessions, start_times, none_cfg, spec, settings).metrics
    points = [FrontierPoint(0, 0.0, 0.0, base["char"], 1, True, 0.0)]
    full, needs = replay_oracle(sessions, start_times, oracle_cfg, spec, settings, {}, None, max_passes)
    ranked = ranked_blocks(needs)
    for share in sorted(set(shares)):
        k = max(1, round(share * len(ranked)))
        if k >= len(ranked):
            res = full
        else:
            allowed = frozenset(ranked[:k])
            start = {rid: keys & allowed for rid, keys in needs.items() if not keys.isdisjoint(allowed)}
            res, _ = replay_oracle(sessions, start_times, oracle_cfg, spec, settings, start, allowed, max_passes)
        m = res.metrics
        points.append(FrontierPoint(k, k / len(ranked) if ranked else 1.0, m["ssd_writes_norm"], m["char"],
                                    m["oracle_passes"], m["oracle_fixed_point"], m["writes_never_read_frac"]))
    return Frontier(points)
