"""Admission policy names: the grammar and the registry of policy kinds.

A leaf module (it imports nothing from the package): the configuration validates a name
here without importing any policy, and each policy module registers the factory of its
kinds by name (libCacheSim's ``create_admissioner``, vLLM's ``register_policy``), so
``config``, ``admission`` and ``budget`` do not import each other.

Names: ``none``, ``full-duplicate``, ``eviction:E<n>``, ``reuse:R<n>``, ``combined:E<n>R<m>``,
``budget:<DWPD>``, ``auto`` / ``auto:<DWPD>`` (the operators' policy: a reuse chance learned online from a
ghost of evicted blocks, ``mem_cache/learned.py``), ``loadaware`` / ``loadaware:<DWPD>`` (an eviction
threshold that follows the load signal, ``mem_cache/auto.py``; a comparison row), and ``oracle`` (the replay's clairvoyant bound: it reads the trace's future, so
a server refuses it, ``REPLAY_ONLY``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FORMS = "none, full-duplicate, eviction:E<n>, reuse:R<n>, combined:E<n>R<m>, budget:<DWPD>, auto, auto:<DWPD>, loadaware, loadaware:<DWPD> or oracle (replay only)"
#: kinds only the replay can run
REPLAY_ONLY = frozenset({"oracle"})

_THRESHOLD_RE = re.compile(r"^(?:eviction:E(\d+)|reuse:R(\d+)|combined:E(\d+)R(\d+))$")
_BUDGET_RE = re.compile(r"^(budget|auto|loadaware):([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)$")


@dataclass(frozen=True)
class PolicyName:
    """A parsed policy name: its kind and the parameters the name carries."""

    kind: str  # none | full-duplicate | eviction | reuse | combined | budget | auto | loadaware | oracle
    theta_E: int | None = None
    theta_R: int | None = None
    dwpd: float | None = None


def parse(name: str) -> PolicyName:
    """Parse a policy name; ValueError names the policy and lists the forms."""
    if name in ("none", "full-duplicate", "oracle", "auto", "loadaware"):
        return PolicyName(name)
    if name.startswith(("budget:", "auto:", "loadaware:")):
        kind = name.split(":", 1)[0]
        m = _BUDGET_RE.match(name)
        dwpd = float(m.group(2)) if m else 0.0
        if not m or not (dwpd > 0 and math.isfinite(dwpd)):
            raise ValueError(f"admission policy {name!r}: {kind}:<DWPD> needs a positive number of drive writes "
                             f"per day, e.g. {kind}:1")
        return PolicyName(kind, dwpd=dwpd)
    m = _THRESHOLD_RE.match(name)
    if not m:
        raise ValueError(f"unknown admission policy {name!r}; expected {FORMS}")
    e1, r1, e2, r2 = m.groups()
    theta_E = int(e1 or e2) if (e1 or e2) else None
    theta_R = int(r1 or r2) if (r1 or r2) else None
    for label, v in (("E", theta_E), ("R", theta_R)):
        if v is not None and v < 1:
            raise ValueError(f"admission policy {name!r}: threshold {label}{v} must be >= 1")
    return PolicyName("combined" if e2 else "eviction" if e1 else "reuse", theta_E, theta_R)


#: ``factory(parsed name, AdmissionConfig or None, SSD tier capacity in bytes) -> AdmissionPolicy``
Factory = Callable[[PolicyName, Any, int], Any]
_FACTORIES: dict[str, Factory] = {}


def register(*kinds: str) -> Callable[[Factory], Factory]:
    """Decorator: ``factory`` builds the policies of ``kinds``; a kind is registered once."""

    def deco(factory: Factory) -> Factory:
        for kind in kinds:
            if kind in _FACTORIES and _FACTORIES[kind] is not factory:
                raise ValueError(f"admission policy kind {kind!r} is already registered")
            _FACTORIES[kind] = factory
        return factory

    return deco


def factory_for(kind: str) -> Factory:
    """The registered factory of ``kind`` (the policy modules register on import)."""
    try:
        return _FACTORIES[kind]
    except KeyError:
        raise ValueError(f"admission policy kind {kind!r} has no registered factory "
                         f"(registered: {', '.join(sorted(_FACTORIES))})") from None
