"""`scripts/dram_residency.py` on a small synthetic workload: both residencies replay the same requests,
"tree" DRAM never plans DRAM after SSD where "flat" does, and the table is recomputed from the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "dram_residency.py"


def test_flat_and_tree_on_the_same_requests(tmp_path):
    out = tmp_path / "dr.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(SCRIPT), "run", "--workload", "synthetic:40", "--policies", "eviction:E2",
                    "full-duplicate", "--json", str(out)], check=True, env=env, capture_output=True)
    doc = json.loads(out.read_text())
    recs = {r["dram_residency"]: r for r in doc["records"]}
    assert set(recs) == {"flat", "tree"}
    flat = {r["policy"]: r for r in recs["flat"]["rows"]}
    tree = {r["policy"]: r for r in recs["tree"]["rows"]}
    assert {r["request_set"] for r in [*flat.values(), *tree.values()]} == {flat["eviction:E2"]["request_set"]}
    assert flat["full-duplicate"]["dram_after_ssd_requests"] > 0
    assert all(r["dram_after_ssd_requests"] == 0 for r in tree.values())
    table = subprocess.run([sys.executable, str(SCRIPT), "render", str(out)], check=True, env=env,
                           capture_output=True, text=True).stdout
    fd_flat, fd_tree = flat["full-duplicate"], tree["full-duplicate"]
    row = next(line for line in table.splitlines() if line.startswith("| synthetic:40") and "| full-duplicate | "
               in line and "x ->" in line)
    assert f"| {fd_tree['char'] - fd_flat['char']:+.3f} | {fd_tree['writes_norm'] / fd_flat['writes_norm']:.2f}x |" in row
    shape = f"| {fd_flat['dram_after_ssd_requests']:,} / {fd_flat['ssd_hit_requests']:,} |"
    assert any(shape in line and "| flat | full-duplicate |" in line for line in table.splitlines())
