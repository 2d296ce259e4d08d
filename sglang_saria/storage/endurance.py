"""Endurance accounting: bytes written/read per drive and projected drive lifetime.

Saria's admission exists to keep SSD writes inside a DWPD budget, so the store
reports writes per device (counted at the device, padding included) against
the vendor rating, persisted across restarts in the index.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Optional

from sglang_saria.storage.index import KEPT_HOURS, DeviceCounters
from sglang_saria.units import DAYS_PER_YEAR, SECONDS_PER_DAY, SECONDS_PER_HOUR, DriveRating

MIN_OBSERVATION_S = 60.0  # avoid absurd rates from the first seconds of a store


@dataclass(frozen=True)
class DeviceEndurance:
    data_dir: str
    block_device: str
    bytes_written: int
    bytes_read: int
    observed_days: float
    write_bytes_per_day: float
    # None without a drive rating.
    observed_dwpd: Optional[float]
    write_budget_used: Optional[float]  # fraction of the rated lifetime writes
    projected_lifetime_years: Optional[float]  # inf when nothing was written


class DeviceAccount:
    """Thread-safe counters for one data dir (one drive)."""

    def __init__(self, data_dir: str, block_device: str, counters: DeviceCounters) -> None:
        self.data_dir = data_dir
        self.block_device = block_device
        self._c = counters
        self._lock = threading.Lock()

    def add(self, written: int = 0, read: int = 0, now: Optional[float] = None) -> None:
        with self._lock:
            self._c.bytes_written += written
            self._c.bytes_read += read
            if written:
                hours = self._c.hours
                hour = int((time.time() if now is None else now) // SECONDS_PER_HOUR)
                hours[hour] = hours.get(hour, 0) + written
                if len(hours) > KEPT_HOURS:
                    for old in sorted(hours)[:-KEPT_HOURS]:
                        del hours[old]

    def snapshot(self) -> DeviceCounters:
        with self._lock:
            return DeviceCounters(self._c.bytes_written, self._c.bytes_read, self._c.since, dict(self._c.hours))

    def report(self, rating: Optional[DriveRating], now: Optional[float] = None) -> DeviceEndurance:
        c = self.snapshot()
        elapsed = max((now if now is not None else time.time()) - c.since, MIN_OBSERVATION_S)
        days = elapsed / SECONDS_PER_DAY
        per_day = c.bytes_written / days
        dwpd = used = years = None
        if rating is not None:
            dwpd = per_day / rating.capacity_bytes
            used = c.bytes_written / rating.rated_write_bytes
            years = math.inf if per_day == 0 else rating.rated_write_bytes / (per_day * DAYS_PER_YEAR)
        return DeviceEndurance(
            self.data_dir, self.block_device, c.bytes_written, c.bytes_read, days, per_day, dwpd, used, years
        )
