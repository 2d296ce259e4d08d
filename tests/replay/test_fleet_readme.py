"""The README's reading of the fleet replay (`docs/fleet.md`), recomputed from docs/data/fleet.json's
records: requests moved and the shared tier's savings behind `cache_aware`, the shared tier's CHAR and
cross-node reads behind `round_robin`, and the 8-node qwen3-8b eviction:E2 comparison of the routers
(fleet writes over one node's, CHAR, requests moved, the two busiest nodes' share, the busiest drive)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readmes_fleet_figures_are_the_jsons():
    records = json.loads((ROOT / "docs" / "data" / "fleet.json").read_text())["records"]
    readme = " ".join((ROOT / "README.md").read_text().split())

    def one(router: str, nodes: int) -> dict:
        (r,) = [r for r in records if (r["model"], r["policy"], r["router"], r["nodes"]) == ("qwen3-8b", "eviction:E2", router, nodes)]
        return r

    behind = [r for r in records if r["router"] == "cache_aware" and r["nodes"] > 1]
    moved = [r["fleet"]["moved_frac"] for r in behind]
    saved = max(r["fleet"]["shared_tier"]["prefill_tokens_saved"] / r["fleet"]["prefill_tokens"] for r in behind)
    rr, ca, base = one("round_robin", 8), one("cache_aware", 8), one("cache_aware", 1)
    tier = rr["fleet"]["shared_tier"]

    def busiest_two(r: dict) -> float:
        reqs = sorted((p["requests"] for p in r["per_node"]), reverse=True)
        return sum(reqs[:2]) / sum(reqs)

    two = [busiest_two(r) for r in records if r["router"] == "cache_aware" and r["nodes"] == 8]
    # a fleet's ssd_writes_norm is per node: the fleet's bytes are nodes x that, against one node's run
    fleet_x = lambda r: r["nodes"] * r["metrics"]["ssd_writes_norm"] / base["metrics"]["ssd_writes_norm"]  # noqa: E731
    phrases = [
        f"behind `cache_aware` {min(moved) * 100:.1f}-{max(moved):.1%} of requests change node and a shared tier would "
        f"save at most {saved:.1%} of prefill",
        f"it would lift CHAR from {rr['metrics']['char']:.2f} to {tier['char']:.2f} at 8 nodes (qwen3-8b, E2) for "
        f"{tier['read_bytes'] / rr['fleet']['days'] / 1e12:.0f} TB of cross-node reads a day",
        f"`round_robin` moves {rr['fleet']['moved_frac']:.0%} of requests between nodes, writes {fleet_x(rr):.2f}x one "
        f"node's bytes at CHAR {rr['metrics']['char']:.3f}",
        f"`cache_aware` keeps sessions on their node ({ca['fleet']['moved_frac']:.0%} move), writes {fleet_x(ca):.2f}x at "
        f"CHAR {ca['metrics']['char']:.3f}",
        f"two nodes serve {min(two) * 100:.0f}-{max(two):.0%} of the requests (every 8-node `cache_aware` fleet of both "
        f"models and policies) and the busiest drive wears at "
        f"{ca['fleet']['dwpd_per_drive_max']:.2f} DWPD against a {ca['fleet']['dwpd_per_drive_mean']:.2f} mean",
    ]
    for phrase in phrases:
        assert phrase in readme, f"README.md does not say {phrase!r}"
