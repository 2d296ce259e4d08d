"""The clairvoyant frontier (replay/frontier.py) on real WEKA sessions under DRAM and SSD pressure,
and `auto` admission replayed on the same requests."""

import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.frontier import Frontier, FrontierPoint, build_frontier, ranked_blocks, writes_at
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.metrics import same_requests
from sglang_saria.replay.workload import apply_limits, session_starts

SPEC = get_model_spec("qwen3-8b")
BT = SPEC.default_block_tokens


@pytest.fixture(scope="module")
def pressured(shared_dir):
    sessions = apply_limits(load_trace(f"weka:{shared_dir / 'traces' / 'weka-cc'}", BT, max_sessions=20))
    settings = ReplaySettings(window_s=7200.0)
    cfg = SariaConfig(metadata=MetadataConfig(block_tokens=BT),
                      capacity=CapacityConfig(dram_tokens=150_000, ssd_tokens=2_000_000)).validate()
    return sessions, session_starts(sessions, settings.window_s, settings.seed), settings, cfg


@pytest.fixture(scope="module")
def frontier(pressured):
    sessions, starts, settings, cfg = pressured
    return build_frontier(sessions, starts, cfg, SPEC, settings, shares=(0.1, 0.4, 1.0))


def run(pressured, policy):
    sessions, starts, settings, cfg = pressured
    return replay(sessions, starts, SariaConfig(**{**cfg.__dict__, "admission": AdmissionConfig(policy=policy)}),
                  SPEC, settings).metrics


def test_every_point_reaches_its_fixed_point_and_the_full_one_is_the_oracle(pressured, frontier):
    sessions, starts, settings, cfg = pressured
    assert frontier.converged and len(frontier.points) == 4
    none, *restricted, full = frontier.points
    assert none.k == 0 and none.writes_norm == 0 and none.char == pytest.approx(run(pressured, "none")["char"])
    oracle = replay(sessions, starts, SariaConfig(**{**cfg.__dict__, "admission": AdmissionConfig(policy="oracle")}),
                    SPEC, ReplaySettings(**{**settings.__dict__, "oracle_max_passes": 40})).metrics
    assert oracle["oracle_fixed_point"]
    assert (full.char, full.writes_norm) == (oracle["char"], oracle["ssd_writes_norm"]) and full.share == 1.0
    assert [p.k for p in frontier.points] == sorted(p.k for p in frontier.points)
    assert 0 < restricted[0].writes_norm < full.writes_norm  # fewer blocks allowed, fewer writes
    assert restricted[0].char > none.char


def test_pareto_points_rise_in_both_and_writes_at_interpolates(frontier):
    pareto = frontier.pareto
    assert all(a.writes_norm <= b.writes_norm and a.char < b.char for a, b in zip(pareto, pareto[1:]))
    for p in pareto:
        assert frontier.writes_at(p.char) == pytest.approx(p.writes_norm)
    assert frontier.writes_at(frontier.best_char + 1e-6) is None
    pts = [FrontierPoint(0, 0, 0.0, 0.2, 1, True, 0), FrontierPoint(5, 0.5, 1.0, 0.6, 2, True, 0),
           FrontierPoint(10, 1, 3.0, 1.0, 3, True, 0)]
    assert writes_at(pts, 0.4) == pytest.approx(0.5) and writes_at(pts, 0.8) == pytest.approx(2.0)
    assert writes_at(pts, 0.1) == 0.0
    assert Frontier.from_json(frontier.to_json()) == frontier


def test_blocks_ranked_by_requests_wanting_them():
    assert ranked_blocks({1: {7, 8}, 2: {8, 9}, 3: {8, 9}}) == [8, 9, 7]


def test_bad_frontier_arguments_are_refused(pressured):
    sessions, starts, settings, cfg = pressured
    with pytest.raises(ValueError, match="shares"):
        build_frontier(sessions, starts, cfg, SPEC, settings, shares=(0.0,))
    with pytest.raises(ValueError, match="max_passes"):
        build_frontier(sessions, starts, cfg, SPEC, settings, max_passes=1)


def test_auto_replays_the_same_requests_and_learns_from_them(pressured, frontier):
    auto, fd = run(pressured, "auto"), run(pressured, "full-duplicate")
    same_requests([auto, fd])
    assert 0 < auto["ssd_write_bytes"] < fd["ssd_write_bytes"]
    assert auto["char"] > frontier.points[0].char
