"""``saria-plan --nodes N``: the per-drive write budget across a fleet, a policy and a routing mode.

Each candidate policy is replayed on N nodes behind each router (``replay/fleet.py``; one router
with ``--router``). The drives given are each node's own: a node's drive wears by what that node
writes, so a point fits when its *busiest* node's writes fit one node's budget over the replayed
period; the mean DWPD per drive is shown next to it (a router that spreads evenly makes them
equal; one that piles sessions on few nodes wears those first). Among the points that fit, the
lowest mean TTFT is recommended (ties: fewer writes), as on one node; with none, the point closest
to the budget.
"""

from __future__ import annotations

from typing import Any

from sglang_saria.replay.planning.recommend import build_plan
from sglang_saria.replay.planning.sweep import SweepPoint

SEPARATOR = " @ "  # a point's label: policy @ router


def build_fleet_plan(swept: list[SweepPoint], budget_bytes: float, drive_bytes: int, days: float) -> dict[str, Any]:
    """The ``--json`` document: the single-node plan over points labelled ``policy @ router`` whose writes
    are the busiest node's, and ``fleet``: per point the fleet's writes, DWPD per drive (mean, busiest)
    and load imbalance."""
    results = [{**p.metrics, "policy": f"{p.metrics['policy']}{SEPARATOR}{p.fleet['router']}",
                "ssd_write_bytes": max(n["ssd_write_bytes"] for n in p.per_node)} for p in swept]
    plan = build_plan(results, budget_bytes)
    per_drive_day = drive_bytes * days
    points = []
    for p in swept:
        writes = [n["ssd_write_bytes"] for n in p.per_node]
        points.append({
            "policy": p.metrics["policy"], "router": p.fleet["router"],
            "busiest_drive_write_bytes": max(writes), "fleet_write_bytes": sum(writes),
            "dwpd_per_drive_mean": sum(writes) / len(writes) / per_drive_day,
            "dwpd_per_drive_max": max(writes) / per_drive_day,
            "within_budget": max(writes) <= budget_bytes,
            "char": p.metrics["char"], "ttft_mean_s": p.metrics["ttft_mean_s"],
            "requests_max_over_mean": p.fleet["requests_max_over_mean"], "moved_frac": p.fleet["moved_frac"],
        })
    rec = plan["recommendation"]
    rec["policy"], rec["router"] = rec["policy"].split(SEPARATOR)
    plan["fleet"] = {"nodes": swept[0].fleet["nodes"], "budget_bytes_per_drive": float(budget_bytes), "points": points}
    return plan


def format_fleet_plan(plan: dict[str, Any], rated_dwpd: float) -> str:
    """Table of every policy x router (busiest drive against the budget) and the recommendation line."""
    fleet = plan["fleet"]
    budget = fleet["budget_bytes_per_drive"]
    rows = [["policy", "router", "busiest W TB", "W/budget", "DWPD mean", "DWPD max", "CHAR", "TTFT s",
             "reqs max/mean", "moved", "fits"]]
    for p in sorted(fleet["points"], key=lambda p: (p["busiest_drive_write_bytes"], p["policy"], p["router"])):
        rows.append([p["policy"], p["router"], f"{p['busiest_drive_write_bytes'] / 1e12:.2f}",
                     f"{p['busiest_drive_write_bytes'] / budget:.2f}", f"{p['dwpd_per_drive_mean']:.2f}",
                     f"{p['dwpd_per_drive_max']:.2f}", f"{p['char']:.3f}", f"{p['ttft_mean_s']:.3f}",
                     f"{p['requests_max_over_mean']:.2f}", f"{p['moved_frac']:.0%}", "yes" if p["within_budget"] else "no"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.append(f"per-drive write budget over the replayed period: {budget / 1e12:.2f} TB ({rated_dwpd:g} DWPD; "
                 f"{fleet['nodes']} nodes, each its own drives; a point fits when its busiest drive does)")
    rec = plan["recommendation"]
    pt = next(p for p in fleet["points"] if (p["policy"], p["router"]) == (rec["policy"], rec["router"]))
    if rec["within_budget"]:
        lines.append(f"recommendation: {rec['policy']} with {rec['router']} routing (lowest mean TTFT whose busiest "
                     f"drive fits: {rec['ttft_mean_s']:.3f} s, DWPD per drive {pt['dwpd_per_drive_mean']:.2f} mean, "
                     f"{pt['dwpd_per_drive_max']:.2f} busiest, CHAR {pt['char']:.3f})")
    else:
        lines.append(f"no policy and routing fits the per-drive budget; closest: {rec['policy']} with {rec['router']}, "
                     f"busiest drive {pt['dwpd_per_drive_max']:.2f} DWPD (raise thresholds, add drives or nodes, or a "
                     f"higher DWPD rating)")
    return "\n".join(lines)
