"""Coordinated reload on the serving path (paper 4.5, issue 30 item 5).

One plan with both parts: a session's promoted pages come back from host memory (DRAM) and
the rest from the store (SSD), as in `test_hicache_tiers.py`'s mixed-plan scenario. The
DRAM part goes host -> device in the reloader's gathers, at the rate the coordinator
allocates, not by HiCache's unpaced load_back. The bandwidths are set tiny (KB/s), so the
pacer, not the machine, sets the pace and a reload of a few KiB takes seconds: the pacer's
own timestamps (`transfer.pacing_trace`) then show the SSD part held to its GDS share while
the DRAM part copies at ``B_ingress - B_gds`` alongside it (coordinated), where `overlap`
copies the DRAM part first and leaves the SSD reads waiting. Bounds are generous (a loaded
machine only makes reads slower than the model; the pacer never lets them run faster).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_saria.launcher import (
    AUDIT_ENV,
    assert_kv_audit_clean,
    saria_hicache_args,
    saria_metrics,
)
from sglang_saria.reload.pacing_trace import read_pacing_trace
from tests.e2e.steps import serve_steps
from tests.e2e.test_hicache_tiers import OTHER_SESSIONS, SYSTEM_AND_TOOLS, TURN_2

pytestmark = pytest.mark.e2e

GB = 1e9
# r_eff = min(0.4, 1 - gds / ingress) = 0.4: 8 of the 20 pages of TURN_2 come back from DRAM.
BANDWIDTH = {"ingress_gbps": 50e-6, "gds_gbps": 20e-6, "dram_gbps": 50e-6}
STEPS = [
    ("the session's second turn is computed", TURN_2, None),
    *[("other sessions push it out of device and host memory", p, None) for p in OTHER_SESSIONS[:3]],
    ("its prefix reloads from SSD; 8 pages are promoted to host", SYSTEM_AND_TOOLS, None),
    *[("more sessions push it out of the device", p, None) for p in OTHER_SESSIONS[3:5]],
    ("promoted pages from DRAM, the rest from SSD: one paced plan", TURN_2, {"device": 128, "host": 0, "storage": 192}),
]


def serve_mixed_plan(start_server, cold_run, tmp_path: Path, mode: str) -> dict:
    """The scenario on an audited server in transfer ``mode``; the pacing record of its mixed plan."""
    trace = tmp_path / "pacing.jsonl"
    config = {
        "data_dirs": [str(tmp_path / "store")],
        "admission": "full-duplicate",
        "capacity": "64MiB",
        "bandwidth": BANDWIDTH,
        "transfer": {"mode": mode, "reload_chunk_pages": 2, "pacing_trace": str(trace)},
    }
    with start_server(saria_hicache_args(config), env=AUDIT_ENV) as server:
        serve_steps(server, cold_run, STEPS)
        assert_kv_audit_clean(saria_metrics(server.metrics()), ("host_to_device", "ssd_to_device"))
    assert trace.stat().st_mode & 0o077 == 0, "the pacing trace is readable by others"
    mixed = [r for r in read_pacing_trace(trace) if r["dram_bytes"] > 0]
    assert len(mixed) == 1, f"one reload plan has a DRAM part, got {len(mixed)}"
    record = mixed[0]
    assert record["mode"] == mode
    # 8 DRAM pages and 12 SSD pages of the same size, and the DRAM part rides in the gathers.
    assert record["dram_bytes"] * 12 == record["ssd_bytes"] * 8
    assert record["host_gather_bytes"] == record["dram_bytes"], "the DRAM part was not copied by the reloader"
    return record


def test_ssd_part_keeps_its_share_while_the_dram_part_is_paced_alongside(start_server, cold_run, tmp_path):
    record = serve_mixed_plan(start_server, cold_run, tmp_path, "coordinated")
    gds, dram_pace = BANDWIDTH["gds_gbps"] * GB, (BANDWIDTH["ingress_gbps"] - BANDWIDTH["gds_gbps"]) * GB
    steps, t0 = record["steps"], record["begin_t"]
    assert len(steps) == 6, "12 SSD pages in chunks of 2"
    assert [s[1] for s in steps] == sorted(s[1] for s in steps) and steps[-1][1] == record["ssd_bytes"]
    dram_done = [s[2] for s in steps]
    assert dram_done == sorted(dram_done), "the DRAM part went backwards"
    # Not copied up front: after the first chunk the model has moved only part of it.
    assert 0 < dram_done[0] < record["dram_bytes"]
    for t, ssd, dram in steps:
        elapsed = t - t0
        # The pacer never lets SSD reads or the DRAM copy run ahead of their allocated rates.
        assert ssd <= gds * elapsed * 1.05 + 1, (t, ssd)
        if dram < record["dram_bytes"]:
            assert dram <= dram_pace * elapsed * 1.05 + 1, (t, dram)
    # The SSD part ran at its share, not far below it (generous: a loaded machine is slower).
    while_dram = [s for s in steps if s[2] < record["dram_bytes"]]
    assert while_dram, "the DRAM part ended before the first SSD chunk"
    t, ssd, _ = while_dram[-1]
    assert ssd / (t - t0) >= 0.25 * gds


@pytest.mark.slow
def test_overlap_copies_the_dram_part_first_and_holds_the_ssd_reads_back(start_server, cold_run, tmp_path):
    """The contrast (uncoordinated, paper Figure 16's SSD tail): the DRAM part takes the link
    and is done before the first SSD chunk is let through."""
    record = serve_mixed_plan(start_server, cold_run, tmp_path, "overlap")
    steps, t0 = record["steps"], record["begin_t"]
    assert all(s[2] == record["dram_bytes"] for s in steps)
    dram_s = record["dram_bytes"] / (BANDWIDTH["dram_gbps"] * GB)
    first_chunk_s = steps[0][1] / (BANDWIDTH["gds_gbps"] * GB)
    assert steps[0][0] - t0 >= 0.95 * (dram_s + first_chunk_s)
