"""``saria-replay --report DIR``: Markdown with the expected sections and non-empty PNG figures."""

import re

import numpy as np

from sglang_saria.replay.cli import main
from sglang_saria.replay.metrics import RequestLog
from sglang_saria.replay.report import FIGURES, SECTIONS, source_mix


def test_report_writes_markdown_and_figures(tmp_path, capsys):
    d = tmp_path / "rep"
    rc = main(["--trace", "synthetic:3", "--sessions", "8", "--window", "40m", "--dram-tokens", "200k", "--ssd-tokens", "2M",
               "--policy", "full-duplicate", "--policy", "eviction:E2", "--policy", "budget:2", "--no-progress",
               "--report", str(d)])
    assert rc == 0
    assert f"report: {d / 'report.md'}" in capsys.readouterr().out
    md = (d / "report.md").read_text()
    for s in SECTIONS:
        assert f"## {s}\n" in md, s
    for name in FIGURES.values():
        png = d / name
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000, name
        assert f"]({name})" in md  # relative links: the folder is self-contained
    rows = [line for line in md.splitlines() if re.match(r"^\| (full-duplicate|eviction:E2|budget:2) \|", line)]
    assert len(rows) == 3


def test_source_mix_splits_reuse_into_dram_ssd_and_missed():
    log = RequestLog()
    log.add(4, 5, True, 0.1, 1.0, done_s=100.0, ssd_hit=1, ssd_bytes_written=10)
    log.add(2, 2, False, 0.1, 1.0, done_s=7200.0, ssd_hit=0, ssd_bytes_written=20)
    edges, rows = source_mix(log, bins=2)
    assert edges[-1] == 2.0
    assert np.array_equal(rows, [[3, 2], [1, 0], [1, 0]])
