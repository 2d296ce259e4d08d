"""``loadaware`` admission: spend writes when a recomputation would queue, save them when the GPU is idle.

A comparison row for the operators' ``auto`` (``learned.py``): an eviction-count threshold that follows
the load signal, with constants chosen on the replay's development sessions.

The threshold a write budget needs moves with the workload, the model and the load (paper 5.2:
"the threshold needed to meet a write budget thus depends on both workload and model"; the
replay: E3 writes 0.82x FD at 6,500 tokens/s and 0.42x at 15,950 on the same sessions). What a
deferred write costs is a recomputation, and a recomputation costs only as much as the GPU is
busy: an idle GPU recomputes a context at once, a loaded one queues everyone behind it. So
``loadaware`` reads a load signal, the prefill work queued on the GPU in seconds (the replay: the
modelled GPU's backlog; SGLang: the scheduler's waiting-queue tokens over its prefill rate,
rank-agreed), smoothed over ``tau_s`` (one long prompt is not load), and writes at a block's
first DRAM eviction while the smoothed backlog passes ``spend_backlog_s``, at its second
otherwise; a block reused ``reuse_spend`` times (a long-lived agent context) is written at its
first eviction either way. Hints from agents (``hints.py``) and a
drive rating (``loadaware:<DWPD>``: the sliding-window cap of ``budget.py``, whose threshold wins
when it is higher) bound it. Under a rating, spending stops once less than ``spend_fill`` of
the window's budget is unspent: what is left keeps the E2 floor, so the cap does not have to
raise the threshold under load, where deferred writes turn into recomputation (an earlier
``auto:8`` that spent down to the cap's low-water mark served CHAR 0.867 where E2 served 0.966).
Every decision goes through the write sequencer, as for any threshold policy (robust rule:
prefix-closed chains, lost-copy evidence).

The defaults (1.5 s over 120 s, 0.7) were chosen with the replay sweep of ``docs/admission.md``;
a longer smoothing (600 s) or a lower bar (0.5 s) spent too much at 6,500 tok/s on qwen3-8b
(1.66x the oracle), a higher bar (2 s over 600 s) too little at 20,000 tok/s on qwen3.5-9b.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_saria import policy_names
from sglang_saria.config import AdmissionConfig
from sglang_saria.mem_cache.admission import AdmissionEvent, ThresholdAdmission

_INSERT, _REUSE, _EVICT, _PREWRITE = (AdmissionEvent.INSERT, AdmissionEvent.REUSE, AdmissionEvent.EVICT,
                                      AdmissionEvent.PREWRITE)
from sglang_saria.mem_cache.budget import WriteBudgetController, rated_budget
from sglang_saria.mem_cache.hints import AgentHints


@dataclass(frozen=True)
class LoadParams:
    """When a recomputation is expensive enough to spend a write on (``AdmissionConfig.loadaware_*``)."""

    spend_backlog_s: float = 1.5  # smoothed queued prefill (seconds of GPU work) above which blocks are written at E1
    theta_idle: int = 2  # theta_E while the smoothed backlog is at most ``spend_backlog_s``
    reuse_spend: int = 0  # idle or not, a block reused this often is written at its first eviction (0: off)
    tau_s: float = 120.0  # time constant of the smoothing: one long prompt is no load, minutes of queueing are
    spend_fill: float = 0.7  # with a budget: spend only while this share of the window's budget is unspent


class LoadAwareAdmission(ThresholdAdmission):
    """``loadaware`` / ``loadaware:<DWPD>``: the eviction threshold follows the load signal, under an optional cap."""

    def __init__(self, load: LoadParams, budget: WriteBudgetController | None = None) -> None:
        super().__init__(load.theta_idle, None)
        self.load = load
        self.budget = budget
        self.name = "loadaware" if budget is None else f"loadaware:{budget.params.dwpd:g}"
        self.uses_eviction_count = True
        self.reads_load = True
        self.retunes_on_write = budget is not None
        self.backlog_s = 0.0  # smoothed (exponential moving average over ``tau_s``)
        self._t: float | None = None
        self.loaded = False
        self.decisions = {"spend": 0, "save": 0}  # writes admitted while loaded / idle
        self.hints = AgentHints()

    def on_load(self, backlog_s: float, now: float) -> None:
        """The driver's load signal at ``now``: seconds of prefill queued on the GPU. Smoothed over ``tau_s``,
        the last value held since the previous call (a clock going backwards changes nothing)."""
        if self._t is None:
            self.backlog_s = backlog_s
        elif now > self._t:
            keep = math.exp(-(now - self._t) / self.load.tau_s)
            self.backlog_s = self.backlog_s * keep + backlog_s * (1.0 - keep)
        else:
            return
        self._t = now
        self.loaded = self.backlog_s > self.load.spend_backlog_s
        self._retune()

    def on_clock(self, now: float) -> None:
        self.hints.on_clock(now)
        if self.budget is not None:
            self.budget.on_clock(now)
        self._retune()

    def _retune(self) -> None:
        spend = self.loaded and (self.budget is None or self.budget.fill >= self.load.spend_fill)
        theta = 1 if spend else self.load.theta_idle
        if self.budget is not None:
            theta = max(theta, self.budget.theta_E)
        self.theta_E = theta

    def should_admit(self, E: int, R: int, event: AdmissionEvent) -> bool:
        if self.budget is not None and self.budget.level <= 0:
            return False
        if super().should_admit(E, R, event):
            return True
        r = self.load.reuse_spend
        if not r or R < r or event is _INSERT or event is _REUSE or self.theta_E > 2:
            return False
        return E + (event is _PREWRITE) >= 1  # a reused context outlives its first eviction

    def thresholds(self, event: AdmissionEvent) -> tuple[float, float]:
        if self.budget is not None and self.budget.level <= 0:
            return math.inf, math.inf
        r_min, e_min = super().thresholds(event)
        if event is _EVICT and self.hints.any_returns:  # a block whose session returns goes at any eviction
            return r_min, min(e_min, 1)
        if self.load.reuse_spend and self.theta_E <= 2 and event is _EVICT:
            return r_min, min(e_min, 1)
        if self.load.reuse_spend and self.theta_E <= 2 and event is _PREWRITE:
            return r_min, 0
        return r_min, e_min

    def affords(self, extra_bytes: int) -> bool:
        return self.budget is None or self.budget.affords(extra_bytes)

    def on_admitted(self, event: AdmissionEvent, nbytes: int = 0) -> None:
        super().on_admitted(event, nbytes)
        self.decisions["spend" if self.loaded else "save"] += 1
        if self.budget is not None:
            self.budget.on_admitted(event, nbytes)
            self._retune()

    def reset(self) -> None:
        super().reset()
        if self.budget is not None:
            self.budget.reset()
        self.decisions = {"spend": 0, "save": 0}

    def state(self) -> dict[str, float]:
        """Gauges: the load signal, the threshold it gives, and the budget's fill (1 without a cap)."""
        return {"theta_E": self.theta_E, "backlog_s": self.backlog_s, "loaded": float(self.loaded),
                "fill": self.budget.fill if self.budget is not None else 1.0}


@policy_names.register("loadaware")
def _make_loadaware(pn: policy_names.PolicyName, cfg: AdmissionConfig | None, ssd_capacity_bytes: int) -> LoadAwareAdmission:
    cfg = cfg or AdmissionConfig(policy="loadaware")
    load = LoadParams(spend_backlog_s=cfg.loadaware_spend_backlog_s, theta_idle=cfg.loadaware_theta_idle, tau_s=cfg.loadaware_tau_s,
                      reuse_spend=cfg.loadaware_reuse_spend, spend_fill=cfg.loadaware_spend_fill)
    if pn.dwpd is None:
        return LoadAwareAdmission(load)
    return LoadAwareAdmission(load, rated_budget("loadaware", pn.dwpd, cfg, ssd_capacity_bytes))
