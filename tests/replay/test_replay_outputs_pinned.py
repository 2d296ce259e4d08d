"""Speed work must not change a decision: replay outputs pinned on a small built-in workload.

The values were recorded with the replay as it stood before the hot-path rewrite (commit
1abc8c2) on 12 synthetic sessions started within 30 min, with DRAM and SSD small enough that
every admission path (insert, evict, prewrite, closure), SSD eviction and promotion runs.
Integer counters must match exactly (same code path, same input); the float summaries are
derived from the same event times, compared to a relative 1e-9. One value was re-recorded on
purpose since: qwen3-8b full duplicate's mean TTFT (1.32600 -> 1.32648 s, counters unchanged),
when SSD writes began to take drive bandwidth from concurrent reloads (issue 25, item 4).
"""

import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.workload import apply_limits, session_starts

WINDOW_S = 1800.0

# (model, policy): (SSD bytes written, SSD bytes read, blocks hit, requests, DRAM evictions,
#                   promoted blocks, SSD-resident nodes at the end), mean TTFT s, CHAR
PINNED = {
    ("qwen3.5-9b", "full-duplicate"): ((31971606528, 84528726016, 8080, 136, 1018, 97, 873), 2.290438671656425, 1.0),
    ("qwen3.5-9b", "eviction:E2"): ((19586744320, 51274448896, 7584, 136, 1485, 61, 530), 2.9241759507412346, 0.9386138613861386),
    ("qwen3.5-9b", "eviction:E3"): ((16761094144, 35022307328, 7264, 136, 1776, 16, 455), 3.3108297667554374, 0.899009900990099),
    ("qwen3-8b", "full-duplicate"): ((131969581056, 414330126336, 18111, 136, 1656, 200, 1748), 1.3264839154385781, 1.0),
    ("qwen3-8b", "eviction:E2"): ((84783661056, 251557576704, 17300, 136, 2323, 102, 1123), 1.8125096370531644, 0.955220584175363),
    ("qwen3-8b", "eviction:E3"): ((71496105984, 145710120960, 16596, 136, 2976, 51, 947), 2.1991035220802577, 0.9163491800563194),
}


@pytest.mark.parametrize(("model", "policy"), sorted(PINNED))
def test_replay_outputs_equal_the_pre_optimisation_replay(model, policy):
    spec = get_model_spec(model)
    bt = spec.default_block_tokens
    sessions = apply_limits(load_trace("synthetic:0", bt, max_sessions=12))
    cfg = SariaConfig(admission=AdmissionConfig(policy=policy), metadata=MetadataConfig(block_tokens=bt, checkpoint_placement="grid"),
                      capacity=CapacityConfig(dram_tokens=150_000, ssd_tokens=1_000_000)).validate()
    res = replay(sessions, session_starts(sessions, WINDOW_S, 0), cfg, spec, ReplaySettings(window_s=WINDOW_S))
    m, st = res.metrics, res.core.stats
    counters = (m["ssd_write_bytes"], m["ssd_read_bytes"], sum(res.log.hit_blocks), m["requests"],
                st.dram_evictions, st.promoted_blocks, len(res.core.ssd))
    expected, ttft, char = PINNED[model, policy]
    assert counters == expected
    assert m["ttft_mean_s"] == pytest.approx(ttft, rel=1e-9)
    assert m["char"] == pytest.approx(char, rel=1e-9)
