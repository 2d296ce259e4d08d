"""The README's decode-gap table (`scripts/bench_serving.py --scenario concurrent`) recomputed
from the raw records of docs/data/decode-gap.json (every decoder's inter-token gap while the SSD
hits arrived, every hit's TTFT), independently of the script: the p99 gap, the median TTFT and
their ratios to the staged path of the same run."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

from sglang_saria.bench import doc_blocks

ROOT = Path(__file__).resolve().parents[2]


def test_the_readmes_decode_gap_table_is_the_jsons_raw_records_recomputed():
    doc = json.loads((ROOT / "docs" / "data" / "decode-gap.json").read_text())
    blocks = doc_blocks.blocks((ROOT / "README.md").read_text(), "decode-gap")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in blocks["table"].splitlines()[2:]]
    runs = {r["name"]: r for r in doc["runs"]}
    assert set(runs) == {"staged", "direct", "blocking"} and len(rows) == 3
    p99 = {n: float(np.percentile(r["decode_gaps_s"], 99)) for n, r in runs.items()}
    ttft = {n: statistics.median(r["hit_ttft_s"]) for n, r in runs.items()}
    for cells in rows:
        name = cells[0].split()[0]
        got = [float(c) for c in cells[1:]]
        want = [p99[name] * 1e3, p99[name] / p99["staged"], ttft[name] * 1e3, ttft[name] / ttft["staged"]]
        assert got == pytest.approx(want, abs=0.051, rel=0.0005), name
        assert len(runs[name]["hit_ttft_s"]) == doc["hits"] and runs[name]["storage_tokens"] > 0
    setting = " ".join(blocks["setting"].split())
    # the runs whose decoders stopped early are named, their windows being shorter
    short = [name for name, run in runs.items() if not run["decoders_outlasted"]]
    named = re.search(r"In the (.+?) run the decoders finished before the last hit's first token", setting)
    assert (named.group(1).split(" and ") if named else []) == short
    assert (f"{doc['decoders']} decoders x {doc['decode_tokens']} tokens, {doc['hits']} hits of {doc['hit_pages']} pages "
            f"one every {doc['hit_interval_s']:g} s, store reads delayed {doc['read_delay_s']:g} s") in setting


@pytest.mark.e2e
@pytest.mark.slow
def test_a_reduced_concurrent_run_has_the_committed_shape(tiny_model: Path, tmp_path: Path):
    """`scripts/bench_serving.py --scenario concurrent` small (1 decoder, 2 hits of the default 32 pages; with
    4-page hits the staged path served none from the store): its JSON has the committed file's shape and
    every path served its hits from the store."""
    import os
    import subprocess
    import sys

    out = tmp_path / "gap.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_serving.py"), "--scenario", "concurrent",
                    "--model", str(tiny_model), "--decoders", "1", "--decode-tokens", "200", "--hits", "2",
                    "--hit-pages", "32", "--log-dir", str(tmp_path / "logs"), "--json", str(out)],
                   check=True, cwd=ROOT, timeout=900, env=os.environ | {"PYTHONPATH": str(ROOT)})
    got, committed = (json.loads(p.read_text()) for p in (out, ROOT / "docs" / "data" / "decode-gap.json"))
    assert set(got) == set(committed) and set(got["runs"][0]) == set(committed["runs"][0])
    assert [r["name"] for r in got["runs"]] == [r["name"] for r in committed["runs"]]
    for r in got["runs"]:
        assert len(r["hit_ttft_s"]) == 2 and r["storage_tokens"] > 0 and all(t > 0 for t in r["hit_ttft_s"]), r["name"]
