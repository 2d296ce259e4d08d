"""`auto`'s load signal in the SGLang driver, without a server: seconds of prefill queued, from
SGLang's load inquirer (its uncached waiting tokens), its measured prefill rate, the step feed that
moves `auto`'s threshold, and the same value on every attention rank (MAX in the rank agreement's
step). The server-level proof is tests/e2e/test_auto_admission.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
from prometheus_client import REGISTRY

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.load_signal import LoadSignalMixin, PrefillRate, SchedulerLoad
from sglang_saria.hicache.policy import SariaHiCachePolicy


@dataclass
class Inquirer:
    """The fields of SGLang's SchedulerLoadInquirer the load signal reads."""

    waiting: list = field(default_factory=list)
    chunked: Any = None
    tokens: int = 0
    busy_us: int = 0
    uncached: int = 0  # input tokens waiting for prefill compute (cached prefixes left out)

    def get_waiting_queue(self):
        return self.waiting

    def get_chunked_req(self):
        return self.chunked

    def get_total_prefill_uncached_tokens(self):
        return self.tokens

    def get_total_prefill_busy_us(self):
        return self.busy_us

    def get_num_waiting_uncached_tokens(self):
        return self.uncached


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
    inquirer.uncached = 1300
    load.queued_tokens = inquirer.get_num_waiting_uncached_tokens()  # after a prefill batch
    assert load.backlog_s(6500.0) == 0.0  # nothing waits: no work queued, whatever a stale count says
    inquirer.waiting = ["req"]
    assert load.backlog_s(6500.0) == pytest.approx(0.2)  # no prefill measured yet: the configured rate
    inquirer.tokens, inquirer.busy_us = 1000, 1_000_000
    load.backlog_s(6500.0)
    inquirer.tokens, inquirer.busy_us = 2000, 2_000_000  # the scheduler measured 1000 tokens/s
    assert load.backlog_s(6500.0) == pytest.approx(1.3)
    inquirer.waiting, inquirer.chunked = [], object()  # a request still being chunked is queued work
    assert load.backlog_s(6500.0) == pytest.approx(1.3)


class _Base:
    def check_hicache_events(self):
        self.stepped = True


class _Cache(LoadSignalMixin, _Base):
    _agreement = None

    def __init__(self, policy: SariaHiCachePolicy):
        self.policy = policy

    def _policy(self):
        return self.policy


def _policy(name: str, clock: list[float], tau_s: float = 1.0) -> SariaHiCachePolicy:
    config = SariaConfig.from_dict({"admission": {"policy": name, "auto_spend_backlog_s": 0.5, "auto_tau_s": tau_s}})
    return SariaHiCachePolicy(config, page_size=16, on_ssd=lambda h: False, clock=lambda: clock[0])


def _sample(name: str, labels: Optional[dict] = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_each_step_feeds_auto_before_hicaches_events_and_exports_its_gauges():
    clock = [100.0]
    policy = _policy("auto", clock)
    cache = _Cache(policy)
    cache.check_hicache_events()  # the scheduler has not handed its load inquirer over yet: nothing read
    assert cache.stepped and policy.admission.theta_E == 2
    inquirer = Inquirer(waiting=["a", "b"], uncached=13000)  # 2 s at the configured 6500 tokens/s
    cache.read_scheduler_load(inquirer)
    cache.note_prefill_batch()
    cache.check_hicache_events()
    assert policy.admission.loaded and policy.admission.theta_E == 1
    assert _sample("sglang:saria_auto_theta_e") == 1 and _sample("sglang:saria_auto_backlog_seconds") == pytest.approx(2.0)
    inquirer.waiting = []  # the queue drained; ten time constants later the smoothed backlog is gone
    clock[0] += 10.0
    cache.check_hicache_events()
    assert not policy.admission.loaded and policy.admission.theta_E == 2
    assert _sample("sglang:saria_auto_backlog_seconds") < 0.5


def test_other_policies_are_not_fed():
    policy = _policy("eviction:E2", [100.0])
    cache = _Cache(policy)
    cache.read_scheduler_load(Inquirer(waiting=["a"], uncached=10**6))
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
    policy = _policy("auto", [100.0], tau_s=1e-9)  # no smoothing: the step's value decides
    policy.use_agreement(agreement.on_ssd, agreement.clock)  # as connect_agreement wires it
    cache = _Cache(policy)
    cache._agreement = agreement
    inquirer = Inquirer(waiting=["a"], uncached=6500)  # 1 s queued on this rank
    cache.read_scheduler_load(inquirer)
    cache.note_prefill_batch()
    agreement.step()  # the agreement's first step: this rank's load is not wired yet (it adds 0)
    cache.check_hicache_events()  # wires it; feeds the step's agreed value
    assert agreement.load == 3.0 and policy.admission.backlog_s == 3.0  # the other rank's 3 s
    inquirer.uncached = 6500 * 5  # now this rank has the most queued: 5 s
    cache.note_prefill_batch()
    agreement.step()
    cache.check_hicache_events()
    assert agreement.load == policy.admission.backlog_s == pytest.approx(5.0) and policy.admission.theta_E == 1
