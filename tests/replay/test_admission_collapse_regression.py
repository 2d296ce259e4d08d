"""Regression: the hand-built workload on which section 4.2's rule out-writes full duplicate.

Eight agent sessions of a hybrid model (Qwen3.5-9B, 1,024-token blocks, a GDN checkpoint
every 16 blocks) each grow a 16-block context by one block per request, 30 s apart, on a
DRAM that holds about six contexts and an SSD that holds about nine. Every request ends one
block past its last checkpoint, so its tail is recomputed by each request, evicted first
(leaf first) and collects evictions fastest. The paper's rule writes those tails at E3 while
their prefix is not on SSD; no request can reload them, they evict readable copies, and every
lost copy is rewritten at the next eviction (docs/fidelity.md, section 2).
"""

import numpy as np
import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.trace import TraceRequest, TraceSession

SPEC = get_model_spec("qwen3.5-9b")
BT = 1024
SESSIONS, REQUESTS, START_BLOCKS, IDLE_S, START_GAP_S = 8, 10, 16, 30.0, 5.0


def _sessions() -> list[TraceSession]:
    out = []
    for s in range(SESSIONS):
        reqs = []
        for r in range(REQUESTS):
            n = START_BLOCKS + r
            keys = np.arange(s * 100_000 + 1, s * 100_000 + 1 + n, dtype=np.uint64)
            reqs.append(TraceRequest(0.0, IDLE_S if r else 0.0, n * BT + 500, 100, keys))
        out.append(TraceSession(f"s{s}", reqs))
    return out


def _replay(policy: str, rule: str = "robust"):
    cfg = SariaConfig(
        admission=AdmissionConfig(policy=policy, rule=rule),
        metadata=MetadataConfig(block_tokens=BT, checkpoint_placement="grid"),  # the paper's grid
        capacity=CapacityConfig(dram_tokens=100_000, ssd_tokens=150_000),
    ).validate()
    starts = [i * START_GAP_S for i in range(SESSIONS)]
    return replay(_sessions(), starts, cfg, SPEC, ReplaySettings())


def _prefix_closed(core) -> bool:
    """Every SSD block's parent is on SSD too (or it is a first block)."""
    nodes = core.metadata.nodes
    return all(nodes[k].parent in core.ssd or nodes[k].parent < 0 for k in core.ssd.victims())


@pytest.fixture(scope="module")
def full_duplicate():
    return _replay("full-duplicate")


def test_paper_rule_E3_out_writes_full_duplicate_on_recomputed_tails(full_duplicate):
    paper = _replay("eviction:E3", rule="paper")
    assert paper.core.ssd.bytes_written > 1.3 * full_duplicate.core.ssd.bytes_written
    assert not _prefix_closed(paper.core)  # it holds blocks no request can reach


def test_robust_E3_writes_less_than_full_duplicate_and_keeps_more_reuse_than_the_paper_rule(full_duplicate):
    robust = _replay("eviction:E3")
    paper = _replay("eviction:E3", rule="paper")
    assert robust.core.ssd.bytes_written < 0.5 * full_duplicate.core.ssd.bytes_written
    assert robust.metrics["char"] > paper.metrics["char"]
    assert _prefix_closed(robust.core)
