"""`loadaware` and `auto` in the replay: the modelled GPU's backlog drives loadaware's threshold, hints derived from
the trace skip the writes of ended sessions, and every variant serves the same requests."""

import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.metrics import same_requests
from sglang_saria.replay.workload import apply_limits, session_starts, truncate

SPEC = get_model_spec("qwen3-8b")
BT = SPEC.default_block_tokens


@pytest.fixture(scope="module")
def sessions(shared_dir):
    return apply_limits(load_trace(f"weka:{shared_dir / 'traces' / 'weka-cc'}", BT, max_sessions=20))


def run(sessions, policy="auto", **settings):
    s = ReplaySettings(window_s=7200.0, **settings)
    cfg = SariaConfig(admission=AdmissionConfig(policy=policy), metadata=MetadataConfig(block_tokens=BT),
                      capacity=CapacityConfig(dram_tokens=150_000, ssd_tokens=2_000_000)).validate()
    return replay(sessions, session_starts(sessions, s.window_s, s.seed), cfg, SPEC, s)


def test_a_loaded_gpu_spends_writes_an_idle_one_saves_them(sessions):
    loaded = run(sessions, "loadaware", prefill_tokens_per_s=800.0)  # recomputation queues for minutes
    idle = run(sessions, "loadaware", prefill_tokens_per_s=200_000.0)
    same_requests([loaded.metrics, idle.metrics])
    assert loaded.core.admission.decisions["spend"] > 0
    assert idle.core.admission.decisions["spend"] == 0 and idle.core.admission.decisions["save"] > 0
    # idle, loadaware is E2; loaded, it writes at least as early as E2 would
    e2_idle = run(sessions, "eviction:E2", prefill_tokens_per_s=200_000.0)
    assert idle.metrics["ssd_write_bytes"] == e2_idle.metrics["ssd_write_bytes"]


def test_end_hints_skip_the_writes_of_ended_sessions(sessions):
    plain = run(sessions)
    ended = run(sessions, hints="end")
    same_requests([plain.metrics, ended.metrics])
    counts = ended.core.admission.hints.counts
    assert 0 < counts["end"] <= len(sessions) and counts["skipped_writes"] > 0  # sessions with a request kept
    assert ended.metrics["ssd_write_bytes"] < plain.metrics["ssd_write_bytes"]
    assert plain.core.admission.hints.counts["end"] == 0  # no hints unless asked


def test_end_hints_only_where_the_trace_ends_a_session_not_where_the_horizon_cuts_it(sessions):
    full = run(sessions, hints="end")
    cut = run(sessions, hints="end", horizon_s=1800.0)  # most sessions are cut after 30 min
    kept = truncate(sessions, session_starts(sessions, 7200.0, 0), 1800.0).kept
    ends_within = sum(1 for s, n in zip(sessions, kept) if n == len(s.requests))
    assert cut.core.admission.hints.counts["end"] == ends_within < full.core.admission.hints.counts["end"]


def test_end_hints_leave_behind_what_a_sessions_next_request_no_longer_holds(sessions):
    ended = run(sessions, hints="end")
    counts = ended.core.admission.hints.counts
    rewrites = sum(1 for s in sessions for a, b in zip(s.requests, s.requests[1:])
                   if not set(map(int, a.block_keys)) <= set(map(int, b.block_keys)))
    assert 0 < counts["left_behind"] <= rewrites  # one hint per rewriting turn the replay finished
    assert counts["left_skipped_writes"] > 0
    assert run(sessions).core.admission.hints.counts["left_behind"] == 0  # no hints unless asked
