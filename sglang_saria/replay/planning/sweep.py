"""``saria-plan`` sweep: every candidate policy replayed on the identical workload.

Replays run in parallel processes (each deterministic, so a parallel sweep equals a serial
one); ``load_step_starts`` builds the workload of a load step inside one replay. A point with a
``FleetSettings`` is a fleet replay (``replay/fleet.py``) of that policy behind that router.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import numpy as np

from sglang_saria.model_specs import ModelSpec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.fleet import FleetSettings, fleet_replay
from sglang_saria.replay.metrics import same_requests
from sglang_saria.replay.workload import session_start_times


def load_step_starts(sessions: list, window_s: float, step_window_s: float, seed: int) -> np.ndarray:
    """Start times with a load step: the first half of the top-level sessions spread over
    ``window_s``, the second half over ``step_window_s`` right after it (Figure 11's windows
    as a step inside one replay: e.g. 40 min then 10 min is a 4x jump in session arrivals).
    Sub-agent sessions follow their parent as in ``workload.session_starts``."""
    top = [s for s in sessions if s.parent_id is None]
    half = len(top) // 2
    first = session_start_times(half, window_s, seed) if half else np.empty(0)
    second = window_s + session_start_times(len(top) - half, step_window_s, seed + 1)
    by_id = dict(zip((s.session_id for s in top), np.concatenate([first, second])))
    return np.array([by_id[s.session_id] if s.parent_id is None else by_id[s.parent_id] + s.start_offset_s for s in sessions])


def idle_span_s(sessions: list, starts: np.ndarray, horizon_s: float) -> float:
    """A lower bound of the period a replay occupies: until the last session's start plus its
    recorded idle gaps (the replay adds each request's queueing, transfer and prefill), capped
    at the horizon, after which no session issues."""
    last = max((float(t0) + sum(r.idle_before_s for r in s.requests) for s, t0 in zip(sessions, starts) if s.requests),
               default=0.0)
    return max(1.0, min(last, horizon_s))


_WORK: dict[str, Any] = {}


def _init_worker(sessions: list, starts: np.ndarray, spec: ModelSpec, settings: ReplaySettings) -> None:
    """Process initializer: the workload reaches each worker once (inherited under fork)."""
    _WORK.update(sessions=sessions, starts=starts, spec=spec, settings=settings)


@dataclass(frozen=True)
class SweepPoint:
    """One replayed policy: its ``saria-replay`` result record and the logical time its last request finished;
    for a fleet, its summary and per-node records (``FleetResult``)."""

    metrics: dict
    span_s: float
    fleet: dict | None = None
    per_node: list[dict] | None = None


def _run_point(index: int, cfg, fleet: FleetSettings | None = None) -> tuple[int, SweepPoint]:
    w = _WORK
    if fleet is not None:
        res = fleet_replay(w["sessions"], w["starts"], cfg, w["spec"], w["settings"], fleet, label=cfg.admission.policy)
        return index, SweepPoint(res.metrics, res.end_time_s, res.fleet, res.per_node)
    res = replay(w["sessions"], w["starts"], cfg, w["spec"], w["settings"], progress=False, label=cfg.admission.policy)
    return index, SweepPoint(res.metrics, res.end_time_s)


def sweep(cfgs: list, sessions: list, starts: np.ndarray, spec: ModelSpec, settings: ReplaySettings,
          jobs: int, progress: bool = True, fleets: list[FleetSettings | None] | None = None) -> list[SweepPoint]:
    """Replay every config on the identical workload (``fleets[i]``: config i on a fleet); results in
    ``cfgs`` order, all scored over the same requests (``DifferentRequestsError`` otherwise).

    ``jobs > 1`` runs points in worker processes; each replay is deterministic, so the
    results equal a serial run's.
    """
    from tqdm import tqdm

    fleets = fleets or [None] * len(cfgs)
    results: list[SweepPoint | None] = [None] * len(cfgs)
    with tqdm(total=len(cfgs), desc="sweep", unit="policy", disable=not progress) as bar:
        if jobs <= 1:
            _init_worker(sessions, starts, spec, settings)
            for i, cfg in enumerate(cfgs):
                results[i] = _run_point(i, cfg, fleets[i])[1]
                bar.update(1)
        else:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
            with ProcessPoolExecutor(max_workers=min(jobs, len(cfgs)), mp_context=ctx, initializer=_init_worker,
                                     initargs=(sessions, starts, spec, settings)) as pool:
                futures = [pool.submit(_run_point, i, cfg, fleets[i]) for i, cfg in enumerate(cfgs)]
                for fut in as_completed(futures):
                    i, point = fut.result()
                    results[i] = point
                    bar.set_postfix_str(point.metrics["policy"])
                    bar.update(1)
    same_requests([p.metrics for p in results])  # type: ignore[union-attr]
    return results  # type: ignore[return-value]
