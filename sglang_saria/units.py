"""Units: byte sizes, token counts, durations and drive ratings, parsed in one place.

The store's extra-config keys, the policy configuration and the replay and planning CLIs all
read sizes and durations through these functions, so ``1.92TB``, ``10M`` and ``12h`` mean the
same everywhere and a bad value fails with one kind of message, naming the field and value.
A leaf module: it imports nothing from the package.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
DAYS_PER_YEAR = 365.0

_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
# decimal units as drive vendors rate capacity; binary ones for memory-sized buffers
BYTE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
              "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": SECONDS_PER_DAY}


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names source, field and value."""


def _scaled(value: Any, name: str, units: dict[str, float], what: str, examples: str) -> float:
    """A bare number, or a string number with one of ``units`` (case-insensitive)."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: not a {what} (use e.g. {examples})")
    if isinstance(value, (int, float)):
        return value
    m = _NUMBER_UNIT.match(str(value))
    if not m or m.group(2).lower() not in units:
        raise ConfigError(f"{name}={value!r}: not a {what} (use e.g. {examples})")
    return float(m.group(1)) * units[m.group(2).lower()]


def parse_bytes(value: Any, name: str = "size") -> int:
    """``4096``, ``64GiB``, ``500MB``, ``1.92TB`` -> a positive number of bytes."""
    n = int(_scaled(value, name, BYTE_UNITS, "size", "64GiB, 500MB, 1.92TB"))
    if n <= 0:
        raise ConfigError(f"{name}={value!r}: a size must be positive")
    return n


def parse_count(value: Any, name: str = "tokens") -> int:
    """``1M``, ``512k``, ``2.5M``, ``65536`` -> a non-negative integer (token capacities)."""
    n = _scaled(value, name, COUNT_UNITS, "token count", "1M, 10M, 512k, 65536")
    if n < 0 or n != int(n):
        raise ConfigError(f"{name}={value!r}: a token count must be a non-negative integer")
    return int(n)


def parse_duration_s(value: Any, name: str = "duration") -> float:
    """``12h``, ``40m``, ``90s``, ``2d`` or a number of seconds -> positive seconds."""
    s = float(_scaled(value, name, DURATION_UNITS, "duration", "12h, 40m, 90s"))
    if s <= 0:
        raise ConfigError(f"{name}={value!r}: a duration must be positive")
    return s


def parse_positive(value: Any, name: str) -> float:
    """A finite number > 0 (a number or its text), e.g. a drive's DWPD or rated years."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: not a number")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r}: not a number") from None
    if not (v > 0 and math.isfinite(v)):
        raise ConfigError(f"{name}={value!r}: must be a positive number (a zero or negative rating is an impossible budget)")
    return v


@dataclass(frozen=True)
class DriveRating:
    """A drive's endurance rating: rated host writes = capacity * DWPD * 365 * years."""

    capacity_bytes: int
    dwpd: float
    years: float

    @property
    def bytes_per_day(self) -> float:
        return self.capacity_bytes * self.dwpd

    @property
    def rated_write_bytes(self) -> float:
        return self.bytes_per_day * DAYS_PER_YEAR * self.years

    @classmethod
    def parse(cls, value: Any, name: str = "drive_rating") -> "DriveRating":
        """From ``{"capacity": "1.92TB", "dwpd": 1, "years": 5}``; every key required, no others."""
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}={value!r}: must be an object {{'capacity': '3.84TB', 'dwpd': 1, 'years': 5}}")
        allowed = {"capacity", "dwpd", "years"}
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise ConfigError(f"unknown key {name}.{unknown[0]} (allowed: {sorted(allowed)})")
        missing = sorted(allowed - set(value))
        if missing:
            raise ConfigError(f"{name}.{missing[0]} is required")
        return cls(parse_bytes(value["capacity"], f"{name}.capacity"), parse_positive(value["dwpd"], f"{name}.dwpd"),
                   parse_positive(value["years"], f"{name}.years"))
