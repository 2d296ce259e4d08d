"""Policies of one comparison are scored over the same requests (issue 25, item 1).

The 24-hour truncation filters which requests exist; it is no deadline that a slower policy
fails to meet. Under overload DRAM-only drains long after full duplicate, yet both serve
every request that exists, and a comparison over different request sets is refused.
"""

import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.metrics import DifferentRequestsError, same_requests
from sglang_saria.replay.workload import apply_limits, session_starts, truncate

SPEC = get_model_spec("qwen3-8b")
BT = SPEC.default_block_tokens


@pytest.fixture(scope="module")
def overloaded(shared_dir):
    """30 WEKA sessions started within 20 min, a 1-hour horizon, a GPU at the paper's 6,500
    tokens/s and a DRAM of 100K tokens: recomputation queues far past the horizon."""
    sessions = apply_limits(load_trace(f"weka:{shared_dir / 'traces' / 'weka-cc'}", BT, max_sessions=30))
    settings = ReplaySettings(window_s=1200.0, horizon_s=3600.0)
    starts = session_starts(sessions, settings.window_s, settings.seed)
    return sessions, starts, settings


def run(overloaded, policy: str, **settings_changes):
    sessions, starts, settings = overloaded
    cfg = SariaConfig(admission=AdmissionConfig(policy=policy), metadata=MetadataConfig(block_tokens=BT),
                      capacity=CapacityConfig(dram_tokens=100_000, ssd_tokens=1_000_000)).validate()
    if settings_changes:
        settings = ReplaySettings(**{**settings.__dict__, **settings_changes})
    return replay(sessions, starts, cfg, SPEC, settings)


def test_every_policy_serves_every_request_the_truncation_keeps(overloaded):
    sessions, starts, settings = overloaded
    kept = truncate(sessions, starts, settings.horizon_s)
    assert 0 < kept.requests < sum(len(s.requests) for s in sessions)  # the horizon does filter
    fd, dram_only = run(overloaded, "full-duplicate"), run(overloaded, "none")
    for res in (fd, dram_only):
        assert res.metrics["requests"] == kept.requests
    # the slower policy drains later (its recomputations queue), but over the same requests
    assert dram_only.metrics["drain_s"] > fd.metrics["drain_s"] > settings.horizon_s
    assert dram_only.metrics["queue_mean_s"] > fd.metrics["queue_mean_s"]
    assert same_requests([fd.metrics, dram_only.metrics])
    assert fd.metrics["write_budget_norm"] == dram_only.metrics["write_budget_norm"]


def test_a_comparison_over_different_requests_is_refused(overloaded):
    """A cut workload (here: a shorter horizon) is not the same comparison, whatever it writes."""
    full = run(overloaded, "full-duplicate").metrics
    cut = run(overloaded, "eviction:E2", horizon_s=1800.0).metrics
    assert cut["requests"] < full["requests"]
    with pytest.raises(DifferentRequestsError, match=r"full-duplicate: \d+ requests .*eviction:E2: \d+ requests"):
        same_requests([full, cut])


def test_the_same_count_of_other_requests_is_refused_too(overloaded):
    """Equal counts are not enough: the digest names which requests were served."""
    a = run(overloaded, "full-duplicate").metrics
    b = {**a, "policy": "other", "request_set": "0" * 16}
    with pytest.raises(DifferentRequestsError):
        same_requests([a, b])
