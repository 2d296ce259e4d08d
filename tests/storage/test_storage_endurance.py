"""Endurance accounting and its Prometheus metrics."""

from __future__ import annotations

import math
import time

import pytest
from prometheus_client import REGISTRY, generate_latest

from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.endurance import DeviceAccount
from sglang_saria.storage.index import KEPT_HOURS, DeviceCounters
from sglang_saria.storage.metrics import store_metrics
from sglang_saria.units import SECONDS_PER_HOUR, DriveRating

SLOT = 64 * 1024


def test_projected_lifetime_from_rating():
    rating = DriveRating(capacity_bytes=10**12, dwpd=1.0, years=5.0)
    acct = DeviceAccount("/d", "nvme0n1", DeviceCounters(since=0.0))
    acct.add(written=2 * 10**11)  # 0.2 drive writes in one day
    rep = acct.report(rating, now=86400.0)
    assert rep.observed_dwpd == pytest.approx(0.2)
    assert rep.projected_lifetime_years == pytest.approx(25.0)  # 5 years at 1 DWPD / 0.2 DWPD
    assert rep.write_budget_used == pytest.approx(2e11 / (1e12 * 365 * 5))
    idle = DeviceAccount("/e", "nvme1n1", DeviceCounters(since=0.0)).report(rating, now=86400.0)
    assert math.isinf(idle.projected_lifetime_years)
    assert DeviceAccount("/f", "x", DeviceCounters(since=0.0)).report(None, now=1.0).observed_dwpd is None


def _sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_shared_by_several_stores_without_double_registration(make_store, payload, tmp_path):
    a = make_store(ndirs=2, drive_rating={"capacity": "1TB", "dwpd": 1, "years": 5})
    b = make_store(
        config=StoreConfig(data_dirs=[str(tmp_path / "other")], capacity="8MiB", slot_bytes="64KiB")
    )
    assert store_metrics() is store_metrics()
    dev0 = a.layout.data_dirs[0]
    before = _sample("sglang:saria_ssd_bytes_written_total", device=dev0)
    assert a.put("x", payload("x", 4 * SLOT)).ok
    assert _sample("sglang:saria_ssd_bytes_written_total", device=dev0) - before == 2 * SLOT
    a.stats()
    assert _sample("sglang:saria_ssd_projected_lifetime_years", device=dev0) > 0
    assert _sample("sglang:saria_store_ops_total", store=a.name, op="put", result="ok") >= 1
    text = generate_latest(REGISTRY).decode()
    for name in [
        "sglang:saria_ssd_bytes_read_total",
        "sglang:saria_store_objects",
        "sglang:saria_ssd_observed_dwpd",
    ]:
        assert name in text
    assert b.stats().objects == 0


def test_hourly_writes_survive_a_reopen_and_age_from_the_end_of_their_hour(make_store, payload):
    store = make_store(ndirs=2)
    for key in ("a", "b", "c"):
        assert store.put(key, payload(key, 3 * SLOT)).ok
    store.flush()
    written = sum(r.bytes_written for r in store.endurance())
    assert written > 0
    config = store.config
    store.close()
    again = make_store(config=config)  # a restart: counts come back from the index
    recent = again.recent_writes(86400.0)
    assert sum(b for _, b in recent) == written
    assert all(age < 60.0 for age, _ in recent)  # this hour: written "now" at the latest (or an hour that just ended)
    later = time.time() + 5 * SECONDS_PER_HOUR
    aged = again.recent_writes(86400.0, now=later)
    assert sum(b for _, b in aged) == written and all(4 * SECONDS_PER_HOUR <= age <= 5 * SECONDS_PER_HOUR for age, _ in aged)
    assert again.recent_writes(3 * SECONDS_PER_HOUR, now=later) == []  # outside a 3-h window


def test_hourly_counts_keep_only_the_last_two_days():
    acct = DeviceAccount("/d", "nvme0n1", DeviceCounters(since=0.0))
    for hour in range(KEPT_HOURS + 10):
        acct.add(written=100, now=hour * SECONDS_PER_HOUR + 1.0)
    hours = acct.snapshot().hours
    assert sorted(hours) == list(range(10, KEPT_HOURS + 10)) and set(hours.values()) == {100}
    assert acct.snapshot().bytes_written == 100 * (KEPT_HOURS + 10)  # the lifetime total keeps everything
