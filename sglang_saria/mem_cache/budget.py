"""Online write-budget controller: admission policy ``budget:<DWPD>`` (beyond the paper).

The paper shows that the eviction threshold meeting a DWPD budget depends on workload,
model and load (E3 on one trace, E5 on another) and leaves the choice to the operator.
This controller chooses it online. A token bucket earns the drive's rated write rate
``capacity_bytes * DWPD / 86400`` bytes per second of the clock the core is driven with,
holds at most ``horizon_s`` seconds of it, and starts empty, so cumulative SSD writes
never exceed ``rate * t`` (plus at most one node in flight: under the robust rule a node's
unwritten prefix must fit in the bucket, ``affords``). The bucket's fill level
sets the thresholds: a full bucket (slack: light load) admits at ``theta_min`` and
writes more; an emptying bucket (heavy load) raises ``theta_E`` towards ``theta_max``
so that only blocks with the longest eviction history still reach SSD. The fill level
is the integral of (budget rate - write rate), so this is integral control of the
write rate with a hard cap when the bucket is empty. Deterministic given the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_saria.config import AdmissionConfig, ConfigError
from sglang_saria.mem_cache import policy_names
from sglang_saria.mem_cache.admission import AdmissionEvent, ThresholdAdmission
from sglang_saria.units import SECONDS_PER_DAY

# Prometheus gauges the SGLang adapter exports from ``WriteBudgetController.state()``.
METRIC_BUDGET_THETA_E = "sglang:saria_budget_theta_e"
METRIC_BUDGET_FILL = "sglang:saria_budget_bucket_fill_ratio"


@dataclass(frozen=True)
class BudgetParams:
    """Controller knobs (``AdmissionConfig.budget_*``, checked by its ``validate``, and the DWPD of the
    policy name, checked by ``policy_names.parse``); capacity comes from the drive or SSD tier."""

    dwpd: float
    capacity_bytes: int
    horizon_s: float = 3600.0
    theta_min: int = 2
    theta_max: int = 12
    reuse_offset: int = 4  # theta_R = theta_E + offset; 0 = eviction history only

    @property
    def rate_bytes_per_s(self) -> float:
        return self.capacity_bytes * self.dwpd / SECONDS_PER_DAY


class WriteBudgetController(ThresholdAdmission):
    """``budget:<DWPD>``: threshold admission whose ``theta_E``/``theta_R`` track a write budget."""

    def __init__(self, params: BudgetParams) -> None:
        super().__init__(params.theta_max, None)
        self.params = params
        self.name = f"budget:{params.dwpd:g}"
        self.rate = params.rate_bytes_per_s
        self.depth = self.rate * params.horizon_s
        self.uses_eviction_count = True
        self.level = 0.0  # earned, unspent bytes: starts empty, so writes(t) <= rate * t
        self.bytes_admitted = 0
        self._t: float | None = None
        self._retune()

    def on_clock(self, now: float) -> None:
        """Earn ``rate`` bytes per second since the last call (capped at the horizon), retune."""
        if self._t is not None and now > self._t:
            self.level = min(self.depth, self.level + self.rate * (now - self._t))
        if self._t is None or now > self._t:
            self._t = now
        self._retune()

    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        return self.level > 0 and super().should_admit(E, R, event)

    def thresholds(self, event: AdmissionEvent) -> tuple[float, float]:
        return super().thresholds(event) if self.level > 0 else (math.inf, math.inf)

    def affords(self, extra_bytes: int) -> bool:
        """A node's unwritten prefix must fit in the earned bytes; only the node itself may overdraw."""
        return self.level - extra_bytes > 0

    def on_admitted(self, event: AdmissionEvent, nbytes: int = 0) -> None:
        super().on_admitted(event, nbytes)
        self.level -= nbytes
        self.bytes_admitted += nbytes

    def reset(self) -> None:
        super().reset()
        self.level = 0.0
        self.bytes_admitted = 0
        self._t = None
        self._retune()

    @property
    def fill(self) -> float:
        """Bucket fill in [0, 1] (negative level, one node over, counts as empty)."""
        return min(1.0, max(0.0, self.level / self.depth))

    def state(self) -> dict[str, float]:
        """Gauges for metrics and traces: thresholds, fill, bytes admitted so far."""
        return {"theta_E": self.theta_E, "theta_R": self.theta_R or 0, "fill": self.fill, "bytes_admitted": self.bytes_admitted}

    def _retune(self) -> None:
        """Linear map of fill to threshold: full -> theta_min, empty -> theta_max."""
        p = self.params
        span = p.theta_max - p.theta_min + 1
        self.theta_E = max(p.theta_min, p.theta_max - math.floor(self.fill * span))
        self.theta_R = self.theta_E + p.reuse_offset if p.reuse_offset else None
        self.reuse_threshold = self.theta_R or 0


@policy_names.register("budget")
def _make_budget(pn: policy_names.PolicyName, cfg: AdmissionConfig | None, ssd_capacity_bytes: int) -> WriteBudgetController:
    """``budget:<DWPD>`` with the ``budget_*`` knobs of ``cfg`` (defaults when None)."""
    cfg = cfg or AdmissionConfig(policy=f"budget:{pn.dwpd:g}")
    capacity = cfg.budget_capacity_bytes or ssd_capacity_bytes
    if capacity <= 0:  # the one setting not checkable from the config alone: it may come from the SSD tier
        raise ConfigError(f"admission.policy='budget:{pn.dwpd:g}': capacity_bytes={capacity}: the DWPD needs a drive "
                          "capacity (admission.budget_capacity_bytes, or an SSD tier)")
    return WriteBudgetController(BudgetParams(
        dwpd=pn.dwpd,
        capacity_bytes=capacity,
        horizon_s=cfg.budget_horizon_s,
        theta_min=cfg.budget_theta_min,
        theta_max=cfg.budget_theta_max,
        reuse_offset=cfg.budget_reuse_offset,
    ))
