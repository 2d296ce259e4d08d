"""Online write-budget controller: admission policy ``budget:<DWPD>`` (beyond the paper).

The paper shows that the eviction threshold meeting a DWPD budget depends on workload,
model and load (E3 on one trace, E5 on another) and leaves the choice to the operator.
This controller chooses it online, under a hard cap that is the rating's own definition:
the bytes admitted in any window of ``window_s`` (default one day) stay within
``capacity_bytes * DWPD * window_s / 86400``, plus at most one node (under the robust rule a
node's unwritten prefix must fit in what is left, ``affords``; the node itself may overdraw).
The window slides, so the budget a burst spends comes back one window later.

Thresholds: ``theta_min`` while at least ``low_water`` of the window's budget is unspent,
then rising linearly to ``theta_max`` as it runs out. Two earlier designs collapsed a loaded
replay (350 WEKA sessions, qwen3.5-9b, docs/fidelity.md): a token bucket that starts empty
refuses the writes of the first hours, and a threshold that rises with every byte spent
defers persistence while budget is left. Under load both turn into recomputation, which
queues requests, which keeps more contexts alive and evicted, which needs more writes:
``budget:10`` served CHAR 0.69 with both and 0.96 with this rule, which is E2's. Raising
theta saves few bytes on such a workload (E2 -> E8 cut writes by a quarter at half the
CHAR), so the budget is best spent at ``theta_min`` and rationed only near its end.
Deterministic given the clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from sglang_saria.config import AdmissionConfig, ConfigError
from sglang_saria import policy_names
from sglang_saria.mem_cache.admission import AdmissionEvent, ThresholdAdmission
from sglang_saria.units import SECONDS_PER_DAY

# Admissions within 1/SLOTS of the window share one entry: the window holds at most SLOTS
# entries, and an entry leaves with its latest admission (never early: the cap stays hard).
SLOTS = 1440


@dataclass(frozen=True)
class BudgetParams:
    """Controller knobs (``AdmissionConfig.budget_*``, checked by its ``validate``, and the DWPD of the
    policy name, checked by ``policy_names.parse``); capacity comes from the drive or SSD tier."""

    dwpd: float
    capacity_bytes: int
    window_s: float = SECONDS_PER_DAY
    low_water: float = 0.1
    theta_min: int = 2
    theta_max: int = 12
    reuse_offset: int = 0  # theta_R = theta_E + offset; 0 = eviction history only

    @property
    def rate_bytes_per_s(self) -> float:
        return self.capacity_bytes * self.dwpd / SECONDS_PER_DAY


class WriteBudgetController(ThresholdAdmission):
    """``budget:<DWPD>``: threshold admission under a sliding-window write cap."""

    retunes_on_write = True  # each write spends budget

    def __init__(self, params: BudgetParams) -> None:
        super().__init__(params.theta_min, None)
        self.params = params
        self.name = f"budget:{params.dwpd:g}"
        self.rate = params.rate_bytes_per_s
        self.budget = self.rate * params.window_s  # bytes any one window may hold
        self.uses_eviction_count = True
        self.bytes_admitted = 0
        self._window: deque[list[float]] = deque()  # [time of the latest admission, bytes], oldest first
        self._slot_s = params.window_s / SLOTS
        self._spent = 0.0  # bytes admitted within the window
        self._t: float | None = None
        self._retune()

    @property
    def level(self) -> float:
        """Unspent bytes of the current window (negative: one node overdrew it)."""
        return self.budget - self._spent

    def on_clock(self, now: float) -> None:
        """Advance the window to ``now`` (a clock going backwards changes nothing) and retune."""
        if self._t is not None and now <= self._t:
            return
        self._t = now
        horizon = now - self.params.window_s
        window = self._window
        while window and window[0][0] <= horizon:
            self._spent -= window.popleft()[1]
        if not window:
            self._spent = 0.0  # no float drift once the window is empty
        self._retune()

    def seed(self, written: Iterable[tuple[float, int]], now: float) -> None:
        """Count bytes written before this controller existed (a server restart), given as
        (seconds before ``now``, bytes): each holds the window until its time plus the window,
        as if admitted then."""
        self.on_clock(now)
        seeded = [[now - age, float(nbytes)] for age, nbytes in written if 0 <= age < self.params.window_s and nbytes > 0]
        if seeded:
            self._window = deque(sorted([*self._window, *seeded], key=lambda entry: entry[0]))
            self._spent += sum(nbytes for _, nbytes in seeded)
        self._retune()

    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        return self.level > 0 and super().should_admit(E, R, event)

    def thresholds(self, event: AdmissionEvent) -> tuple[float, float]:
        return super().thresholds(event) if self.level > 0 else (math.inf, math.inf)

    def affords(self, extra_bytes: int) -> bool:
        """A node's unwritten prefix must fit in the unspent budget; only the node itself may overdraw."""
        return self.level - extra_bytes > 0

    def on_admitted(self, event: AdmissionEvent, nbytes: int = 0) -> None:
        super().on_admitted(event, nbytes)
        self.bytes_admitted += nbytes
        if nbytes <= 0:
            return
        t = self._t or 0.0
        window = self._window
        if window and t - window[-1][0] < self._slot_s:
            window[-1][0] = t
            window[-1][1] += nbytes
        else:
            window.append([t, float(nbytes)])
        self._spent += nbytes
        self._retune()

    def reset(self) -> None:
        super().reset()
        self._window.clear()
        self._spent = 0.0
        self.bytes_admitted = 0
        self._t = None
        self._retune()

    @property
    def fill(self) -> float:
        """Unspent share of the window's budget in [0, 1] (an overdrawn window counts as empty)."""
        return min(1.0, max(0.0, self.level / self.budget))

    def state(self) -> dict[str, float]:
        """Gauges for metrics and traces: thresholds, fill, bytes admitted so far."""
        return {"theta_E": self.theta_E, "theta_R": self.theta_R or 0, "fill": self.fill, "bytes_admitted": self.bytes_admitted}

    def _retune(self) -> None:
        """``theta_min`` above the low-water mark, then linear to ``theta_max`` at an empty window."""
        p = self.params
        fill = self.fill
        if fill >= p.low_water:
            self.theta_E = p.theta_min
        else:
            span = p.theta_max - p.theta_min + 1
            self.theta_E = max(p.theta_min, p.theta_max - math.floor(fill / p.low_water * span))
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
        window_s=cfg.budget_window_s,
        low_water=cfg.budget_low_water,
        theta_min=cfg.budget_theta_min,
        theta_max=cfg.budget_theta_max,
        reuse_offset=cfg.budget_reuse_offset,
    ))


def rated_budget(policy: str, dwpd: float, cfg: AdmissionConfig, ssd_capacity_bytes: int) -> WriteBudgetController:
    """The write budget of ``<policy>:<dwpd>`` (auto, loadaware): the cap's threshold starts at 1,
    so the policy's own rule decides until the window runs low. Raises ConfigError without a
    drive capacity (``admission.budget_capacity_bytes``, or an SSD tier)."""
    capacity = cfg.budget_capacity_bytes or ssd_capacity_bytes
    if capacity <= 0:
        raise ConfigError(f"admission.policy='{policy}:{dwpd:g}': the DWPD needs a drive capacity "
                          "(admission.budget_capacity_bytes, or an SSD tier)")
    return WriteBudgetController(BudgetParams(dwpd=dwpd, capacity_bytes=capacity, window_s=cfg.budget_window_s,
                                              low_water=cfg.budget_low_water, theta_min=1,
                                              theta_max=cfg.budget_theta_max))
