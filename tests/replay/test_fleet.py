"""Fleet replay (issue 28 item 3): one node equals today's replay; the router model follows sglang-router 0.3.2."""

import dataclasses

import pytest

from sglang_saria.config import AdmissionConfig, CapacityConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.cli import main as replay_main
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.fleet import FleetRun, FleetSettings, fleet_replay
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.routing import ROUTERS, CacheAware, CacheAwareConfig, RoutingError, make_router
from sglang_saria.replay.workload import apply_limits, session_starts
from sglang_saria.session_affinity import AffinityConfig

MODEL = "qwen3-8b"
SPEC = get_model_spec(MODEL)
BT = SPEC.default_block_tokens
SETTINGS = ReplaySettings(window_s=3600.0)


def load_weka(shared_dir, block_tokens: int):
    """6 real WEKA sessions started within an hour: DRAM and SSD small enough that both evict."""
    sessions = apply_limits(load_trace(f"weka:{shared_dir / 'traces' / 'weka-cc'}", block_tokens, max_sessions=6))
    return sessions, session_starts(sessions, SETTINGS.window_s, 0)


@pytest.fixture(scope="module")
def weka(shared_dir):
    return load_weka(shared_dir, BT)


def cfg(policy: str, block_tokens: int = BT) -> SariaConfig:
    return SariaConfig(admission=AdmissionConfig(policy=policy), metadata=MetadataConfig(block_tokens=block_tokens),
                       capacity=CapacityConfig(dram_tokens=150_000, ssd_tokens=1_000_000)).validate()


@pytest.mark.parametrize(("model", "policy"), [("qwen3-8b", "eviction:E2"), ("qwen3-8b", "full-duplicate"),
                                               ("qwen3.5-9b", "eviction:E2")])
def test_one_node_fleet_equals_the_single_node_replay_for_every_router(weka, shared_dir, model, policy):
    spec = get_model_spec(model)
    bt = spec.default_block_tokens
    sessions, starts = weka if bt == BT else load_weka(shared_dir, bt)
    single = replay(sessions, starts, cfg(policy, bt), spec, SETTINGS)
    assert single.metrics["ssd_write_bytes"] > 0 and single.metrics["dram_evictions"] > 0
    for router in ROUTERS:
        res = fleet_replay(sessions, starts, cfg(policy, bt), spec, SETTINGS, FleetSettings(1, router))
        assert res.metrics == single.metrics, router
        assert dataclasses.asdict(res.log) == dataclasses.asdict(single.log)
        assert res.end_time_s == single.end_time_s and res.fleet["moved_requests"] == 0
        assert res.fleet["shared_tier"]["recoverable_blocks"] == 0


@pytest.mark.parametrize("router", ROUTERS)
def test_a_fleet_serves_the_same_requests_and_its_nodes_sum_to_it(weka, router):
    sessions, starts = weka
    single = replay(sessions, starts, cfg("full-duplicate"), SPEC, SETTINGS)
    res = fleet_replay(sessions, starts, cfg("full-duplicate"), SPEC, SETTINGS, FleetSettings(3, router))
    m = res.metrics
    assert (m["requests"], m["request_set"], m["blocks_achievable"]) == (
        single.metrics["requests"], single.metrics["request_set"], single.metrics["blocks_achievable"])
    assert sum(n["requests"] for n in res.per_node) == m["requests"]
    assert sum(n["ssd_write_bytes"] for n in res.per_node) == m["ssd_write_bytes"]
    assert sum(n["blocks_hit"] for n in res.per_node) == m["blocks_hit"]
    assert res.fleet["dwpd_per_drive_max"] >= res.fleet["dwpd_per_drive_mean"]
    assert res.log.ssd_bytes_written[-1] == m["ssd_write_bytes"] and res.log.done_s == sorted(res.log.done_s)
    if router == "round_robin":  # spreads: request counts differ by at most one, sessions change node
        counts = [n["requests"] for n in res.per_node]
        assert max(counts) - min(counts) <= 1 and res.fleet["moved_frac"] > 0.5
        assert res.fleet["shared_tier"]["char"] > m["char"]


def test_cache_aware_keeps_a_session_on_its_node_while_balanced():
    r = CacheAware(3, block_tokens=10)
    a1, b1 = [1, 2, 3], [7, 8]
    assert r.pick(a1, 35, [0, 0, 0], 0.0, 0) == 0  # nothing matched: least loaded, first on ties
    assert r.pick(b1, 25, [1, 0, 0], 1.0, 0) == 1
    # the session's next turns extend its prefix: its node, however loaded, while the fleet is balanced
    assert r.pick([1, 2, 3, 4], 45, [60, 1, 0], 2.0, 0) == 0
    assert r.pick([1, 2, 3, 4, 5, 6], 65, [64, 0, 0], 3.0, 0) == 0  # 64 - 0 is not > 64
    assert r.pick([7, 8, 9], 35, [5, 5, 0], 4.0, 0) == 1
    assert r.stats == {"imbalanced": 0, "matched": 3, "unmatched": 2, "evicted_keys": 0}


def test_cache_aware_match_rate_must_exceed_the_threshold():
    r = CacheAware(2, block_tokens=10)
    r.pick([1, 2, 3], 30, [0, 0], 0.0, 0)  # node 0
    assert r.pick([1, 5, 6, 7], 40, [1, 0], 1.0, 0) == 1  # 10/40 = 0.25: least loaded, not the matched node
    assert r.pick([1, 2, 3, 11, 12, 13, 14, 15, 16, 17], 100, [1, 0], 2.0, 0) == 1  # 30/100 = 0.3: not > 0.3
    assert r.pick([1, 2, 3, 21], 40, [1, 0], 3.0, 0) == 1  # 0.75: the newest tenant of key 3 is node 1 now
    r.insert([1, 2, 3], 0)
    assert r.match([1, 2, 3, 22]) == (3, 0)


@pytest.mark.parametrize(("loads", "imbalanced"), [
    ([65, 0], True),  # 65 - 0 > 64 and 65 > 1.5 x 0
    ([64, 0], False),  # the absolute threshold is strict
    ([200, 134], False),  # 66 > 64 but 200 is not > 1.5 x 134 = 201
    ([202, 134], True),
    ([0, 100], True),  # the least loaded wins even against the session's node
])
def test_imbalance_rule_triggers_at_the_documented_thresholds(loads, imbalanced):
    r = CacheAware(2, block_tokens=10)
    r.insert([1, 2, 3], 0)
    node = r.pick([1, 2, 3, 4], 40, loads, 1.0, 0)
    assert r.is_imbalanced(loads) is imbalanced
    assert node == (loads.index(min(loads)) if imbalanced else 0)
    assert r.stats["imbalanced"] == int(imbalanced)
    assert 4 in r.held[node]  # the tree is updated in both modes


def test_cache_aware_eviction_removes_each_nodes_oldest_leaves_first():
    cfg = CacheAwareConfig(max_tree_chars=4 * 10 * 4, chars_per_token=4.0, eviction_interval_s=60.0)  # 4 blocks
    r = CacheAware(2, block_tokens=10, config=cfg)
    r.pick([1, 2, 3], 30, [0, 0], 0.0, 0)  # node 0: 1, 2, 3
    r.pick([1, 2, 3, 4, 5], 50, [0, 0], 1.0, 0)  # node 0 now holds 5 blocks, over 4
    r.pick([9], 10, [0, 0], 59.0, 0)  # before the eviction time: nothing evicted
    assert r.tree_tokens(0) == 60 and r.stats["evicted_keys"] == 0
    r.pick([8], 10, [1, 0], 61.0, 0)  # the eviction runs first: node 0 loses its least recent leaf 5, then 4
    assert r.stats["evicted_keys"] == 2 and not r.holds(5) and not r.holds(4) and r.holds(9)
    assert r.match([1, 2, 3, 4, 5]) == (3, 0)  # prefix-closed: the path above the leaves is intact
    assert r.next_eviction_s == 120.0


def test_round_robin_and_random_spread():
    rr = make_router("round_robin", 3, BT)
    assert [rr.pick([1], 10, [0, 0, 0], 0.0, 0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    picks = [make_router("random", 4, BT, seed=7).pick([1], 10, [0] * 4, 0.0, 0) for _ in range(3)]
    assert len(set(picks)) == 1  # seeded: repeatable
    r = make_router("random", 4, BT, seed=7)
    counts = [0] * 4
    for _ in range(400):
        counts[r.pick([1], 10, [0] * 4, 0.0, 0)] += 1
    assert min(counts) > 70


@pytest.mark.parametrize(("kw", "message"), [
    ({"nodes": 0}, "--nodes 0: must be"),
    ({"nodes": -2}, "--nodes -2: must be"),
    ({"router": "least_load"}, "--router 'least_load': choose one of cache_aware, round_robin, random, session"),
])
def test_bad_fleet_settings_name_the_flag_and_value(kw, message):
    with pytest.raises(RoutingError, match=message):
        FleetSettings(**kw).validate()


@pytest.mark.parametrize(("flags", "message"), [
    (["--nodes", "0"], "--nodes 0: must be"),
    (["--nodes", "2", "--router", "power_of_three"], "--router 'power_of_three': choose one of"),
    (["--nodes", "2", "--policy", "oracle"], "--policy oracle: the clairvoyant bound is single-node only"),
])
def test_cli_bad_fleet_input_is_a_clear_error(capsys, flags, message):
    assert replay_main(["--trace", "synthetic", "--sessions", "2", "--no-progress", *flags]) == 2
    assert message in capsys.readouterr().err


def test_cli_prints_the_fleet_and_per_node_tables(capsys, tmp_path):
    out = tmp_path / "f.json"
    rc = replay_main(["--trace", "synthetic:1", "--sessions", "6", "--window", "20m", "--dram-tokens", "100k",
                      "--nodes", "2", "--router", "round_robin", "--policy", "eviction:E2", "--no-progress",
                      "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "eviction:E2 on 2 nodes, round_robin: DWPD per drive mean" in text and "prefill Mtok" in text
    import json

    d = json.loads(out.read_text())
    assert d["config"]["nodes"] == 2 and d["config"]["router"] == "round_robin"
    assert [len(f["per_node"]) for f in d["fleet"]] == [2] and d["fleet"][0]["router"] == "round_robin"


def test_session_routing_keeps_each_session_on_one_node_and_spreads_the_sessions(weka):
    """The WEKA sessions of the hour on 3 nodes, none idle long enough to stop counting and no wear moves: no
    request changes node."""
    sessions, starts = weka
    fleet = FleetSettings(3, "session", session=AffinityConfig(idle_s=3600.0, wear_moves=False))
    res = fleet_replay(sessions, starts, cfg("eviction:E2"), SPEC, SETTINGS, fleet)
    assert res.fleet["moved_requests"] == 0 and res.fleet["router"] == "session"
    stats = res.fleet["router_stats"]
    assert 0 < stats["placed"] <= len(sessions) and stats["placed"] + stats["stayed"] == res.metrics["requests"]
    assert all(n["requests"] > 0 for n in res.per_node)


def test_a_dead_nodes_sessions_spread_over_the_others_and_come_back(shared_dir):
    """48 real WEKA trace files on 4 nodes; the node with the most sessions dies for half an hour: nothing is
    routed to it meanwhile, its sessions that send a request then land on more than one other node, every
    request is still served, and each of them goes back to it at its first request after it is back."""
    sessions = apply_limits(load_trace(f"weka:{shared_dir / 'traces' / 'weka-cc'}", BT, max_sessions=48))
    starts = session_starts(sessions, SETTINGS.window_s, 0)
    aff = AffinityConfig(idle_s=3600.0, wear_moves=False)  # no wear moves: deaths alone move sessions
    base = FleetRun(sessions, starts, cfg("eviction:E2"), SPEC, SETTINGS, FleetSettings(4, "session", session=aff))
    base.loop()
    times = sorted(t for t, _, _ in base.decisions)
    down = times[len(times) // 3]
    up = down + 1800.0
    on = {}
    for t, sid, node in base.decisions:
        if t < down:
            on[sid] = node
    dead = max(range(4), key=lambda n: sum(1 for sid, node in on.items() if node == n
                                           and any(down <= t < up and s == sid for t, s, _ in base.decisions)))
    fleet = FleetSettings(4, "session", session=aff, outages=((dead, down, up),))
    run = FleetRun(sessions, starts, cfg("eviction:E2"), SPEC, SETTINGS, fleet)
    run.loop()
    res = run.result("eviction:E2")
    assert res.metrics["request_set"] == base.result("eviction:E2").metrics["request_set"]
    assert not [d for d in run.decisions if down <= d[0] < up and d[2] == dead]
    victims = {sid for sid, node in on.items() if node == dead}
    during = {sid: node for t, sid, node in run.decisions if down <= t < up and sid in victims}
    assert len(during) >= 3 and len(set(during.values())) >= 2, during
    after = {}
    for t, sid, node in run.decisions:
        if t >= up and sid in during:
            after.setdefault(sid, node)
    assert after and all(node == dead for node in after.values()), after
    assert res.fleet["router_stats"]["moved_dead"] == len(during)
    assert res.fleet["router_stats"]["returned"] == len(after)


def test_worker_deaths_are_validated_and_modelled_for_the_session_router_only():
    with pytest.raises(RoutingError, match="worker deaths are modelled for the session router only"):
        FleetSettings(2, "cache_aware", outages=((0, 1.0, 2.0),)).validate()
    with pytest.raises(RoutingError, match=r"outage \(2, 1.0, 2.0\): needs a node in 0..1"):
        FleetSettings(2, "session", outages=((2, 1.0, 2.0),)).validate()
    with pytest.raises(RoutingError, match="every node is down at 5 s"):
        FleetSettings(1, "session", outages=((0, 1.0, 9.0),)).validate().alive(5.0)
