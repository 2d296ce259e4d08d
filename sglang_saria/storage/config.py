"""Store configuration parsed from `--hicache-storage-backend-extra-config`.

The extra-config JSON dict is shared with the policy core (admission,
promotion, ...), so the parser takes only the store's keys and is told which
other keys are legitimate; anything else is a typo worth failing on at startup.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from sglang_saria.units import ConfigError, DriveRating, parse_bytes, parse_count

ALIGN = 4096  # O_DIRECT and GDS both want 4 KiB-aligned offsets, sizes and buffers.

_WHERE = "saria store config"
_TOKENS_RE = re.compile(r"^\s*(.+?)\s*(tok|toks|tokens)\s*$")


@dataclass(frozen=True)
class Capacity:
    """Store capacity as bytes or tokens (tokens need bytes-per-token to resolve)."""

    bytes: Optional[int] = None
    tokens: Optional[int] = None

    @classmethod
    def parse(cls, value: Any, key: str = "capacity") -> "Capacity":
        if isinstance(value, str):
            m = _TOKENS_RE.match(value)
            if m:
                return cls(tokens=parse_count(m.group(1), f"{_WHERE}: {key}"))
        if isinstance(value, Mapping):
            if set(value) != {"tokens"}:
                raise ValueError(f"saria store config: {key}={dict(value)!r}: expected {{'tokens': N}}")
            tokens = value["tokens"]
            if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:
                raise ValueError(f"saria store config: {key}.tokens={tokens!r} must be a positive int")
            return cls(tokens=tokens)
        return cls(bytes=parse_bytes(value, f"{_WHERE}: {key}"))

    def resolve(self, bytes_per_token: Optional[int]) -> int:
        if self.bytes is not None:
            return self.bytes
        if not bytes_per_token:
            raise ValueError(
                f"saria store config: capacity given as {self.tokens} tokens, but the "
                f"KV bytes per token are unknown here; give capacity in bytes"
            )
        return self.tokens * bytes_per_token


DEFAULT_CAPACITY_BYTES = 4 * 2**30
ENGINES = ("auto", "posix", "kvikio")
O_DIRECT_MODES = ("auto", "on", "off")
FINGERPRINT_MISMATCH_MODES = ("set_aside", "refuse")


@dataclass
class StoreConfig:
    """Everything the SSD store needs; one data dir per SSD (objects stripe across all)."""

    data_dirs: list[str]
    # Per store (per rank in SGLang). The slab is preallocated, so the default is
    # modest; production deployments set it.
    capacity: Capacity = field(default_factory=lambda: Capacity(bytes=DEFAULT_CAPACITY_BYTES))
    engine: str = "auto"
    read_threads: int = 4
    write_threads: int = 2
    # None: chosen by the caller (the HiCache backend uses one KV page per slot).
    slot_bytes: Optional[int] = None
    o_direct: str = "auto"
    drive_rating: Optional[DriveRating] = None
    # fdatasync slab files before committing index entries: survives power loss,
    # not only process death.
    sync_writes: bool = True
    # Preallocate slab files so a full file system is found at open, not mid-write.
    preallocate: bool = True
    # Test-only: a fault the store's engine runs (storage/fault_injection.py), given as
    # {"class": "module:Class", ...its arguments} or as the injector itself.
    fault_injector: Optional[Any] = None
    # A store holding another model's KV (hicache/store_identity.py): "set_aside" moves it aside
    # and starts empty, "refuse" stops the server naming both model fingerprints.
    on_fingerprint_mismatch: str = "set_aside"

    KEYS = (
        "data_dirs",
        "capacity",
        "engine",
        "read_threads",
        "write_threads",
        "slot_bytes",
        "o_direct",
        "drive_rating",
        "sync_writes",
        "preallocate",
        "fault_injector",
        "on_fingerprint_mismatch",
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if isinstance(self.data_dirs, str):
            self.data_dirs = [self.data_dirs]
        if not isinstance(self.data_dirs, list) or not self.data_dirs:
            raise ValueError(
                f"saria store config: data_dirs={self.data_dirs!r} must be a non-empty list of paths"
            )
        for d in self.data_dirs:
            if not isinstance(d, str) or not d:
                raise ValueError(f"saria store config: data_dirs entry {d!r} is not a path")
        if len(set(self.data_dirs)) != len(self.data_dirs):
            raise ValueError(f"saria store config: data_dirs={self.data_dirs!r} has duplicates")
        if not isinstance(self.capacity, Capacity):
            self.capacity = Capacity.parse(self.capacity)
        if self.engine not in ENGINES:
            raise ValueError(f"saria store config: engine={self.engine!r} not in {ENGINES}")
        if self.on_fingerprint_mismatch not in FINGERPRINT_MISMATCH_MODES:
            raise ValueError(f"saria store config: on_fingerprint_mismatch={self.on_fingerprint_mismatch!r} "
                             f"not in {FINGERPRINT_MISMATCH_MODES}")
        if self.o_direct not in O_DIRECT_MODES:
            raise ValueError(f"saria store config: o_direct={self.o_direct!r} not in {O_DIRECT_MODES}")
        for name in ("read_threads", "write_threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 256:
                raise ValueError(f"saria store config: {name}={v!r} must be an int in [1, 256]")
        if self.slot_bytes is not None:
            self.slot_bytes = parse_bytes(self.slot_bytes, f"{_WHERE}: slot_bytes")
        if self.drive_rating is not None and not isinstance(self.drive_rating, DriveRating):
            try:
                self.drive_rating = DriveRating.parse(self.drive_rating)
            except ConfigError as e:
                raise ConfigError(f"{_WHERE}: {e}") from None
        for name in ("sync_writes", "preallocate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"saria store config: {name}={getattr(self, name)!r} must be true/false")
        if isinstance(self.fault_injector, Mapping):
            self.fault_injector = load_fault_injector(self.fault_injector)
        elif self.fault_injector is not None and not callable(getattr(self.fault_injector, "wrap", None)):
            raise ConfigError(f"{_WHERE}: fault_injector={self.fault_injector!r} is not a fault injector (no wrap(engine))")

    @classmethod
    def from_extra_config(
        cls,
        extra: Optional[Mapping[str, Any]],
        other_known_keys: Iterable[str] = (),
        defaults: Optional[Mapping[str, Any]] = None,
    ) -> "StoreConfig":
        """Take the store keys from the shared extra-config dict.

        `other_known_keys` are keys other components own (policy, SGLang's own
        such as "backend_name"); any key in neither set is an error naming it.
        `defaults` fill store keys the user left out (e.g. a default data dir).
        """
        extra = dict(extra or {})
        known = set(cls.KEYS) | set(other_known_keys)
        unknown = sorted(k for k in extra if k not in known)
        if unknown:
            raise ValueError(
                f"saria: unknown key {unknown[0]!r} in --hicache-storage-backend-extra-config "
                f"(store keys: {list(cls.KEYS)}; other known keys: {sorted(set(other_known_keys))})"
            )
        values = dict(defaults or {})
        values.update({k: v for k, v in extra.items() if k in cls.KEYS})
        if "data_dirs" not in values:
            raise ValueError("saria store config: data_dirs is required")
        if "capacity" in values:
            values["capacity"] = Capacity.parse(values["capacity"])
        return cls(**values)


def load_fault_injector(spec: Mapping[str, Any]) -> Any:
    """``{"class": "module:Class", **arguments}`` -> the injector (SGLang's dynamic-backend style:
    the class is imported by name, so the store imports no test code); errors name the key."""
    where = f"{_WHERE}: fault_injector"
    name = spec.get("class")
    if not isinstance(name, str) or ":" not in name:
        raise ConfigError(f"{where}={dict(spec)!r}: expected {{'class': 'module:Class', ...its arguments}}")
    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{where}.class={name!r}: {e}") from None
    args = {k: v for k, v in spec.items() if k != "class"}
    try:
        injector = cls(**args)
    except TypeError as e:
        raise ConfigError(f"{where}: {name} does not take the arguments {sorted(args)}: {e}") from None
    if not callable(getattr(injector, "wrap", None)):
        raise ConfigError(f"{where}.class={name!r} is not a fault injector (no wrap(engine))")
    return injector
