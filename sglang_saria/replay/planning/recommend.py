"""``saria-plan`` decisions: the drives' write budget, the Pareto front and the recommendation.

The paper's Table 1 arithmetic (section 2.2) for a drive pool, the budget a sweep must fit,
and the choice among swept policies: the lowest mean TTFT whose writes fit the budget.
"""

from __future__ import annotations

from typing import Any

from sglang_saria.units import DAYS_PER_YEAR, SECONDS_PER_DAY, ConfigError, DriveRating, parse_bytes, parse_positive

DEFAULT_SWEEP = [
    "none",  # DRAM-only: writes nothing, so the recommendation is never worse than not using the SSD
    "full-duplicate",
    "eviction:E2",
    "eviction:E3",
    "eviction:E4",
    "eviction:E5",
    "eviction:E6",
    "eviction:E8",
    "reuse:R4",
    "combined:E3R4",
]
POINT_KEYS = ("policy", "ssd_write_bytes", "char", "char_p25_bad", "ttft_mean_s", "within_budget")


class PlanError(ConfigError):
    """Bad planner input; the message names the flag and value."""


def parse_drives(capacities: list[str] | None, dwpds: list[str] | None, years: list[str] | None, copies: int = 1) -> list[DriveRating]:
    """Drives from repeatable ``--ssd-capacity/--dwpd/--years`` (one value applies to all), times ``--drives``."""
    given = {"--ssd-capacity": capacities or [], "--dwpd": dwpds or [], "--years": years or []}
    missing = [f for f, v in given.items() if not v]
    if missing:
        raise PlanError(f"drive rating is missing {', '.join(missing)} (each drive needs --ssd-capacity, --dwpd and --years, e.g. --ssd-capacity 1.92TB --dwpd 1 --years 5)")
    n = len(given["--ssd-capacity"])
    for f in ("--dwpd", "--years"):
        if len(given[f]) not in (1, n):
            raise PlanError(f"{f} given {len(given[f])} times for {n} --ssd-capacity values: give it once (all drives) or once per drive")
    if copies < 1:
        raise PlanError(f"--drives={copies}: must be >= 1")
    drives = []
    for i, cap in enumerate(given["--ssd-capacity"]):
        d = parse_positive(given["--dwpd"][i if len(given["--dwpd"]) > 1 else 0], "--dwpd")
        y = parse_positive(given["--years"][i if len(given["--years"]) > 1 else 0], "--years")
        drives.append(DriveRating(parse_bytes(cap, "--ssd-capacity"), d, y))
    return drives * copies


def endurance_arithmetic(drives: list[DriveRating], write_bytes_per_s: float) -> dict[str, float]:
    """Paper 2.2 / Table 1 for a pool striped in proportion to capacity.

    Lifetime: rated writes over the write rate (``1,825C/(86.4B)`` days for 1 DWPD, 5 years);
    the pool wears out with its first drive. Minimum capacity to sustain the rate over the
    rating: daily writes over DWPD (``86.4B`` TB at 1 DWPD, whatever the years).
    """
    total = sum(d.capacity_bytes for d in drives)
    dwpd_eff = sum(d.bytes_per_day for d in drives) / total
    if write_bytes_per_s <= 0:
        life_days = float("inf")
    else:
        life_days = min(d.dwpd * DAYS_PER_YEAR * d.years * total / (write_bytes_per_s * SECONDS_PER_DAY) for d in drives)
    return {
        "write_gb_per_s": write_bytes_per_s / 1e9,
        "lifetime_days": life_days,
        "c_min_bytes": write_bytes_per_s * SECONDS_PER_DAY / dwpd_eff,
        "years": min(d.years for d in drives),
        "dwpd": dwpd_eff,
        "capacity_bytes": total,
    }


def pareto_front(points: list[dict]) -> list[bool]:
    """Non-dominated points: fewer SSD writes, higher CHAR P25-bad, lower mean TTFT."""

    def dominates(a: dict, b: dict) -> bool:
        no_worse = (a["ssd_write_bytes"] <= b["ssd_write_bytes"] and a["char_p25_bad"] >= b["char_p25_bad"]
                    and a["ttft_mean_s"] <= b["ttft_mean_s"])
        better = (a["ssd_write_bytes"] < b["ssd_write_bytes"] or a["char_p25_bad"] > b["char_p25_bad"]
                  or a["ttft_mean_s"] < b["ttft_mean_s"])
        return no_worse and better

    return [not any(dominates(q, p) for q in points if q is not p) for p in points]


def recommend(points: list[dict]) -> tuple[dict, bool]:
    """(point, feasible): the lowest mean TTFT within budget (ties: fewer writes); with no
    feasible point, the one closest to the budget (fewest writes) and ``False``."""
    feasible = [p for p in points if p["within_budget"]]
    if feasible:
        return min(feasible, key=lambda p: (p["ttft_mean_s"], p["ssd_write_bytes"], p["policy"])), True
    return min(points, key=lambda p: (p["ssd_write_bytes"], p["ttft_mean_s"], p["policy"])), False


def build_plan(results: list[dict], budget_bytes: float) -> dict[str, Any]:
    """The ``--json`` document: budget, recommendation, points (sorted by SSD writes)."""
    if not budget_bytes > 0:
        raise PlanError(f"write budget {budget_bytes!r} bytes: must be positive")
    points = sorted(
        ({"policy": r["policy"], "ssd_write_bytes": int(r["ssd_write_bytes"]), "char": float(r["char"]),
          "char_p25_bad": float(r["char_p25_bad"]), "ttft_mean_s": float(r["ttft_mean_s"]),
          "within_budget": bool(r["ssd_write_bytes"] <= budget_bytes)} for r in results),
        key=lambda p: (p["ssd_write_bytes"], p["policy"]),
    )
    best, _ = recommend(points)
    rec = {k: best[k] for k in ("policy", "ssd_write_bytes", "within_budget", "char_p25_bad", "ttft_mean_s")}
    return {"budget_bytes": float(budget_bytes), "recommendation": rec, "points": points, "auto": auto_vs_fixed(points)}


def auto_vs_fixed(points: list[dict]) -> dict[str, Any] | None:
    """``auto:<DWPD>`` (the operator's default: it needs only the drives' rating) next to the best fixed
    threshold within the same budget (highest CHAR; ties: fewer writes); None if ``auto`` was not swept."""
    auto = next((p for p in points if p["policy"].startswith("auto")), None)
    if auto is None:
        return None
    fixed = [p for p in points if p["within_budget"] and p["policy"].startswith(("eviction:", "reuse:", "combined:"))]
    best = max(fixed, key=lambda p: (p["char"], -p["ssd_write_bytes"]), default=None)
    return {"auto": auto, "best_fixed": best}
