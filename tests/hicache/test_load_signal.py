"""`auto`'s load signal in the SGLang driver, without a server: seconds of prefill queued, from
SGLang's load inquirer (each waiting request's tokens less its match and storage span, the chunked
request's rest), its measured prefill rate (converted as the replay converts), the step feed that
moves `auto`'s threshold, and the same value on every attention rank (MAX in the rank agreement's
step). On a real server: tests/e2e/test_auto_load_signal.py (the replay's value for the same
queue) and tests/e2e/test_loadaware_admission.py (the decisions it drives)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

import pytest
from prometheus_client import REGISTRY

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.load_signal import (LoadSignalMixin, PrefillRate, SchedulerLoad, seconds_of,
                                              waiting_uncached_tokens)
from sglang_saria.hicache.policy import SariaHiCachePolicy


@dataclass
class Req:
    """The fields of SGLang's Req the load signal reads."""

    seqlen: int
    num_matched_prefix_tokens: int = 0  # device + host match (at arrival or the last admission try)
    rid: str = "r"
    prefix_len: int = 0  # a chunked request's tokens already prefilled
    extend_len: int = 0  # a chunked request's chunk in the batch just formed

    @property
    def cache_request_handle(self):
        return self


@dataclass
class Inquirer:
    """The fields of SGLang's SchedulerLoadInquirer the load signal reads."""

    waiting: list = field(default_factory=list)
    chunked: Any = None
    tokens: int = 0
    busy_us: int = 0
    spans: dict = field(default_factory=dict)  # rid -> storage span, as the radix cache's seam answers

    def get_waiting_queue(self):
        return self.waiting

    def get_chunked_req(self):
        return self.chunked

    def get_total_prefill_uncached_tokens(self):
        return self.tokens

    def get_total_prefill_busy_us(self):
        return self.busy_us

    def get_waiting_storage_span(self, handle):
        return self.spans.get(handle.rid)


def waiting(uncached: int) -> list[Req]:
    """One waiting request with ``uncached`` tokens to compute."""
    return [Req(uncached)]


def test_the_measured_prefill_rate_replaces_the_configured_one_once_a_prefill_ran():
    rate = PrefillRate()
    assert rate.tps(6500.0) == 6500.0
    rate.update(0, 0)
    rate.update(4000, 2_000_000)  # 4000 tokens in 2 s of prefill
    assert rate.tps(6500.0) == pytest.approx(2000.0)
    rate.update(4000, 2_000_000)  # no prefill since: unchanged
    rate.update(10000, 3_000_000)  # 6000 more tokens in 1 s: the ratio weighs both by their time
    assert 2000.0 < rate.tps(6500.0) < 6000.0


def test_queued_seconds_are_zero_on_an_empty_queue_and_the_uncached_waiting_tokens_over_the_rate_otherwise():
    inquirer = Inquirer()
    load = SchedulerLoad(inquirer)
    load.queued_tokens = 1300  # after a prefill batch
    assert load.backlog_s(6500.0) == 0.0 and load.queued() == 0  # nothing waits: whatever a stale count says
    inquirer.waiting = ["req"]
    assert load.backlog_s(6500.0) == pytest.approx(0.2)  # no prefill measured yet: the configured rate
    inquirer.tokens, inquirer.busy_us = 1000, 1_000_000
    load.backlog_s(6500.0)
    inquirer.tokens, inquirer.busy_us = 2000, 2_000_000  # the scheduler measured 1000 tokens/s
    assert load.backlog_s(6500.0) == pytest.approx(1.3)
    inquirer.waiting, inquirer.chunked = [], object()  # a request still being chunked is queued work
    assert load.backlog_s(6500.0) == pytest.approx(1.3) and load.queued() == 1300


def test_a_waiting_request_counts_its_tokens_less_its_matched_prefix_and_its_storage_span():
    agent = Req(1000, num_matched_prefix_tokens=900, rid="agent")  # 90 % cached: 100 tokens of work
    stored = Req(500, num_matched_prefix_tokens=100, rid="stored")  # pages 100-400 come from the store
    cold = Req(300, rid="cold")
    inquirer = Inquirer(waiting=[agent, stored, cold], spans={"stored": (100, 400)})
    assert waiting_uncached_tokens(inquirer) == 100 + 100 + 300
    inquirer.spans["stored"] = (0, 400)  # a span from the root (published reload) overlaps the match
    assert waiting_uncached_tokens(inquirer) == 100 + 100 + 300
    inquirer.get_waiting_storage_span = None  # a cache without the seam: matches only
    assert waiting_uncached_tokens(inquirer) == 100 + 400 + 300


def test_the_fake_request_reads_only_what_sglangs_req_has():
    """The fields above exist on SGLang 0.5.23's Req (a field it lacks stops the scheduler)."""
    from sglang.srt.managers.schedule_batch import Req as SGLangReq

    for name in ("seqlen", "extend_len"):
        assert isinstance(getattr(SGLangReq, name), property), name
    init = inspect.getsource(SGLangReq.__init__)
    for name in ("num_matched_prefix_tokens", "prefix_len", "cache_request_handle"):
        assert f"self.{name}" in init, name  # attributes set in __init__


def test_the_chunked_request_counts_its_rest_past_the_chunk_in_the_batch_just_formed():
    chunked = Req(1000, prefix_len=256, extend_len=128)
    inquirer = Inquirer(chunked=chunked)
    assert waiting_uncached_tokens(inquirer) == 744  # no batch formed: its whole rest waits
    batch = SimpleNamespace(reqs=[chunked])
    assert waiting_uncached_tokens(inquirer, batch) == 616  # the chunk now running is not queued
    assert waiting_uncached_tokens(inquirer, SimpleNamespace(reqs=[])) == 744


def test_tokens_become_seconds_as_the_replay_converts_them_at_the_same_rate():
    """The replay queues a request's computed tokens on its GPU at ``prefill_tokens_per_s``; the
    server divides its queued tokens by its measured rate. Same tokens, same rate: same seconds."""
    from sglang_saria.model_specs import get_model_spec
    from sglang_saria.replay.driver import ReplayRun, ReplaySettings
    from sglang_saria.replay.trace import TraceRequest, TraceSession

    tps = 2000.0
    request = TraceRequest(0.0, 0.0, 3 * 16 + 7, 1, np.arange(1, 4, dtype=np.uint64))
    cfg = SariaConfig.from_dict({"admission": {"policy": "auto"}, "metadata": {"block_tokens": 16}})
    run = ReplayRun([TraceSession("a", [request])], [0.0], cfg, get_model_spec("qwen3-8b"),
                    ReplaySettings(prefill_tokens_per_s=tps))
    run.events.heap.clear()
    run.admit(0, 0, 5.0, 5.0)  # cold: every token is computed, no transfer
    replay_backlog_s = run.gpu_free - 5.0
    inquirer = Inquirer(waiting=[Req(request.input_tokens)])
    load = SchedulerLoad(inquirer)
    load.queued_tokens = waiting_uncached_tokens(inquirer)
    load.backlog_s(6500.0)
    inquirer.tokens, inquirer.busy_us = int(tps), 1_000_000  # the server measured the same rate
    assert load.backlog_s(6500.0) == pytest.approx(replay_backlog_s) == seconds_of(55, tps)


class _Base:
    def check_hicache_events(self):
        self.stepped = True


class _Cache(LoadSignalMixin, _Base):
    _agreement = None

    def __init__(self, policy: SariaHiCachePolicy):
        self.policy = policy

    def _policy(self):
        return self.policy


def _policy(name: str, clock: list[float], tau_s: float = 1.0, agreement=None) -> SariaHiCachePolicy:
    config = SariaConfig.from_dict({"admission": {"policy": name, "loadaware_spend_backlog_s": 0.5, "loadaware_tau_s": tau_s}})
    if agreement is not None:  # as `runtime.saria_policy` builds it on several ranks
        return SariaHiCachePolicy(config, page_size=16, on_ssd=agreement.on_ssd, clock=agreement.clock)
    return SariaHiCachePolicy(config, page_size=16, on_ssd=lambda h: False, clock=lambda: clock[0])


def _sample(name: str, labels: Optional[dict] = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_each_step_feeds_auto_before_hicaches_events_and_exports_its_gauges():
    clock = [100.0]
    policy = _policy("loadaware", clock)
    cache = _Cache(policy)
    cache.check_hicache_events()  # the scheduler has not handed its load inquirer over yet: nothing read
    assert cache.stepped and policy.admission.theta_E == 2
    inquirer = Inquirer(waiting=waiting(13000))  # 2 s at the configured 6500 tokens/s
    cache.read_scheduler_load(inquirer)
    cache.note_prefill_batch()
    cache.check_hicache_events()
    assert policy.admission.loaded and policy.admission.theta_E == 1
    assert _sample("sglang:saria_loadaware_theta_e") == 1 and _sample("sglang:saria_auto_backlog_seconds") == pytest.approx(2.0)
    assert _sample("sglang:saria_auto_queued_prefill_tokens") == 13000
    inquirer.waiting = []  # the queue drained; ten time constants later the smoothed backlog is gone
    clock[0] += 10.0
    cache.check_hicache_events()
    assert not policy.admission.loaded and policy.admission.theta_E == 2
    assert _sample("sglang:saria_auto_backlog_seconds") < 0.5


class _HiCacheBase:
    def waiting_storage_span(self, request):
        return (0, 64)  # HiCache's own (host-staged prefetch)


class _ReloadingCache(LoadSignalMixin, _HiCacheBase):
    """The parts of `SariaRadixCache` the storage span reads: its direct reload, reloads by request
    id and published reloads' ends."""

    def __init__(self):
        self._direct = object()
        self._published = {}
        self._reloads = SimpleNamespace(by_rid={})


def test_with_direct_reload_a_waiting_requests_storage_span_is_what_saria_loads_for_it():
    cache = _ReloadingCache()
    handle = SimpleNamespace(rid="r")
    assert cache.waiting_storage_span(handle) is None  # nothing stored for it
    cache.note_storage_span("r", 32, 160)  # a follower: another request's reload reads its pages
    assert cache.waiting_storage_span(handle) == (32, 160)
    cache._reloads.by_rid["r"] = SimpleNamespace(start=32, key=list(range(224)))  # its own reload
    assert cache.waiting_storage_span(handle) == (32, 224)
    cache._published["r"] = 224  # published: on the device, matched at its admission
    assert cache.waiting_storage_span(handle) == (0, 224)
    cache._direct = None  # no direct reload: HiCache's span
    assert cache.waiting_storage_span(handle) == (0, 64)


def test_a_followers_span_is_kept_while_it_waits_and_dropped_once_it_leaves_the_queue():
    cache = _ReloadingCache()
    inquirer = Inquirer(waiting=[Req(200, rid="a"), Req(300, num_matched_prefix_tokens=0, rid="b")])
    inquirer.get_waiting_storage_span = cache.waiting_storage_span  # as SGLang binds the seam
    cache.read_scheduler_load(inquirer)
    cache.note_storage_span("b", 0, 288)  # b follows a's reload of 288 stored tokens
    cache.note_storage_span("gone", 0, 16)  # admitted or aborted since
    cache.note_prefill_batch()
    assert cache._scheduler_load.queued_tokens == 200 + 12
    assert set(cache._storage_spans) == {"b"}


def test_other_policies_are_not_fed():
    policy = _policy("eviction:E2", [100.0])
    cache = _Cache(policy)
    cache.read_scheduler_load(Inquirer(waiting=waiting(10**6)))
    cache.note_prefill_batch()
    cache.check_hicache_events()
    assert policy.admission.theta_E == 2 and cache.stepped


def test_every_rank_reads_the_largest_load_of_the_ranks(monkeypatch):
    """The rank agreement's step all-reduce carries each rank's load (MAX); here the other rank's
    contribution (3 s queued there, 1 s here) is folded in by a stand-in for gloo's all-reduce."""
    from sglang_saria.hicache import rank_agreement

    def all_reduce(tensor, op, group):  # the other rank: same view and clock, 3 s queued
        if len(tensor) == 3 and op == rank_agreement.dist.ReduceOp.MAX:
            tensor[2] = max(float(tensor[2]), 3.0)

    monkeypatch.setattr(rank_agreement.dist, "all_reduce", all_reduce)
    agreement = rank_agreement.RankAgreement(lambda h: False, lambda: [], ["group"])
    policy = _policy("loadaware", [100.0], tau_s=1e-9, agreement=agreement)  # no smoothing: the step's value decides
    cache = _Cache(policy)
    cache._agreement = agreement
    inquirer = Inquirer(waiting=waiting(6500))  # 1 s queued on this rank
    cache.read_scheduler_load(inquirer)
    cache.note_prefill_batch()
    agreement.step()  # the agreement's first step: this rank's load is not wired yet (it adds 0)
    cache.check_hicache_events()  # wires it; feeds the step's agreed value
    assert agreement.load == 3.0 and policy.admission.backlog_s == 3.0  # the other rank's 3 s
    inquirer.waiting = waiting(6500 * 5)  # now this rank has the most queued: 5 s
    cache.note_prefill_batch()
    agreement.step()
    cache.check_hicache_events()
    assert agreement.load == policy.admission.backlog_s == pytest.approx(5.0) and policy.admission.theta_E == 1
