"""Hypothesis: random request sequences keep the core's invariants."""

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_saria.config import BandwidthConfig
from sglang_saria.mem_cache.coordinator import TransferCoordinator
from sglang_saria.mem_cache.metadata import DRAM, SSD

from tests.mem_cache.helpers import make_core

POLICIES = ["none", "full-duplicate", "eviction:E2", "reuse:R2", "combined:E2R3"]

# a request = (session id, prefix length in blocks, time step); keys chain within a session
requests = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 9), st.floats(0.0, 40.0)), min_size=1, max_size=40)


def _check_invariants(core):
    for tier, bit in ((core.dram, DRAM), (core.ssd, SSD)):
        assert 0 <= tier.used_tokens <= tier.capacity_tokens
        assert tier.used_tokens == sum(tier.size_of(k)[0] for k in list(tier.victims()))
        assert len(list(tier.victims())) == len(tier)
    for k, node in core.metadata.nodes.items():
        assert bool(node.fa_loc & DRAM) == (k in core.dram)
        assert bool(node.fa_loc & SSD) == (k in core.ssd)
        if node.ck_loc >= 0:
            assert node.ck_loc == node.fa_loc  # replay keeps a node's objects together
    for k in core.dram.victims():
        assert k in core.metadata.nodes  # tiers never hold reclaimed metadata
    for k in core.ssd.victims():
        assert k in core.metadata.nodes


@settings(max_examples=60, deadline=None)
@given(
    reqs=requests,
    policy=st.sampled_from(POLICIES),
    hybrid=st.booleans(),
    prewrite=st.booleans(),
    promotion=st.sampled_from(["zero", "half", "full", "saria"]),
    planner=st.sampled_from(["saria", "lmcache", "gds-only"]),
    dram=st.integers(0, 6),
    ssd=st.integers(0, 10),
)
def test_random_sequences_keep_capacities_locations_and_monotone_counters(
    reqs, policy, hybrid, prewrite, promotion, planner, dram, ssd
):
    core = make_core(policy, dram_blocks=dram, ssd_blocks=ssd, hybrid=hybrid, prewrite=prewrite,
                     promotion=promotion, ratio=0.9, planner=planner, window_s=50.0, bw=(48.0, 10.0, 48.0))
    now = 0.0
    prev: dict[int, tuple[int, int]] = {}
    for sid, length, dt in reqs:
        now += dt
        keys = [sid * 1000 + i for i in range(length)]
        plan, a = core.begin_request(keys, now)
        # a block on no tier is never planned; every planned source really holds it
        for k, src in zip(keys, plan.sources):
            assert core.metadata.get(k).fa_loc & src
        if core.hybrid and plan.n_blocks:
            assert core.metadata.get(keys[plan.n_blocks - 1]).ck_loc & plan.ckpt_source
        if planner == "gds-only":
            assert plan.dram_blocks == 0
        _check_invariants(core)
        f = core.finish_request(keys, plan, now)
        _check_invariants(core)
        if policy == "none":
            assert not a.ssd_writes and not f.ssd_writes
        for k, node in core.metadata.nodes.items():
            if k in prev:
                assert node.R >= prev[k][0] and node.E >= prev[k][1]  # monotone while tracked
        prev = {k: (n.R, n.E) for k, n in core.metadata.nodes.items()}
    assert core.ssd.bytes_written_then_read <= core.ssd.bytes_written


@settings(max_examples=80, deadline=None)
@given(
    jobs=st.lists(st.tuples(st.floats(0, 5e9), st.floats(0, 5e9), st.floats(0, 0.5)), min_size=1, max_size=6),
    mode=st.sampled_from(["serial", "overlap", "coordinated"]),
    gds=st.floats(1.0, 48.0),
)
def test_coordinator_conserves_bytes_and_respects_ingress(jobs, mode, gds):
    bw = BandwidthConfig(48.0, gds, 40.0)
    c = TransferCoordinator(bw, mode)
    t = 0.0
    done = []
    submit_t = {}
    for i, (d, s, dt) in enumerate(jobs):
        t += dt
        done += c.advance(t)
        done += c.submit(i, d, s, t)
        submit_t[i] = t
        rates = c.allocate()
        assert sum(r[0] + r[1] for r in rates) <= 48e9 * (1 + 1e-9)
        assert sum(r[1] for r in rates) <= gds * 1e9 * (1 + 1e-9)
    done += c.advance(float("inf"))
    assert sorted(r for r, _ in done) == list(range(len(jobs)))
    finish = dict(done)
    for i, (d, s, _) in enumerate(jobs):
        lower = max((d + s) / 48e9, s / (gds * 1e9), d / 40e9)  # no request beats its own bottleneck
        assert finish[i] - submit_t[i] >= lower * (1 - 1e-9) - 1e-12 * (1 + finish[i])  # float rounding of absolute times
    total = sum(d + s for d, s, _ in jobs)
    assert max(finish.values()) >= total / 48e9 * (1 - 1e-9)
