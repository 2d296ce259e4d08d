"""An agent's cache hint on a chat request, from the HTTP body to the scheduler.

A chat completion may carry ``"saria": {"session": "<id>", "expect_return_s": 30}`` (the session
comes back in about 30 s: keep what DRAM gives up) or ``"saria": {"session": "<id>", "end": true}``
(the session is over: write none of it, its SSD copies go first). Patch 014 validates the field
with `parse_hint` when the request model is built (a bad hint is a 400 naming the field) and hands
it to the scheduler inside ``sampling_params.custom_params`` under `HINT_KEY`, the channel SGLang
itself uses for per-request data (its reasoning keys), which every tokenizer and scheduler path
already carries; `SariaRadixCache` reads it back with `hint_of` when the request is released
(`hints_intake.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

FIELD = "saria"
HINT_KEY = "__saria_hint"  # in custom_params; SGLang's own private keys are "__sglang_*"
MAX_SESSION_CHARS = 256
SHOWN_CHARS = 40  # of a bad value echoed in an error: a request may send megabytes
_KEYS = ("session", "expect_return_s", "end")


@dataclass(frozen=True)
class AgentHint:
    """One validated hint: the session, and whether it ended or when it returns."""

    session: str
    expect_return_s: Optional[float] = None
    end: bool = False

    def to_params(self) -> dict[str, Any]:
        """The JSON scalars carried in ``custom_params`` (msgpack-safe, as SGLang requires)."""
        params: dict[str, Any] = {"session": self.session, "end": self.end}
        if self.expect_return_s is not None:
            params["expect_return_s"] = self.expect_return_s
        return params


def parse_hint(raw: Any, field: str = FIELD) -> AgentHint:
    """Validate a hint object; ``ValueError`` naming the field (``saria.session``, ...) and value."""
    if not isinstance(raw, dict):
        raise ValueError(f"{field}={shown(raw)}: must be an object with 'session' and 'end' or 'expect_return_s'")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ValueError(f"{field}.{shown(unknown[0], quote=False)}: unknown key (known: {', '.join(_KEYS)})")
    session = raw.get("session")
    if not isinstance(session, str) or not 0 < len(session) <= MAX_SESSION_CHARS:
        raise ValueError(f"{field}.session={shown(session)}: must be a non-empty string of at most "
                         f"{MAX_SESSION_CHARS} characters")
    end = raw.get("end", False)
    if not isinstance(end, bool):
        raise ValueError(f"{field}.end={shown(end)}: must be true or false")
    after = raw.get("expect_return_s")
    if after is not None:
        if isinstance(after, bool) or not isinstance(after, (int, float)) or not math.isfinite(after) or after < 0:
            raise ValueError(f"{field}.expect_return_s={shown(after)}: must be a finite number >= 0 (seconds)")
        if end:
            raise ValueError(f"{field}.expect_return_s={after!r}: a session that ends does not return (end=true)")
        after = float(after)
    return AgentHint(session, after, end)


def shown(value: Any, quote: bool = True) -> str:
    """``value`` for an error message: its repr (``quote``) or text, cut after ``SHOWN_CHARS``
    characters with its length said, so a bad megabyte of request is not sent back whole."""
    text = repr(value) if quote else str(value)
    if len(text) <= 2 * SHOWN_CHARS:
        return text
    if isinstance(value, str):
        cut = f"{text[: SHOWN_CHARS + 1]}...'" if quote else f"{text[:SHOWN_CHARS]}..."
        return f"{cut} ({len(value)} characters)"
    return f"{text[:SHOWN_CHARS]}... ({len(text)} characters as text)"


def validate_field(raw: Any) -> Optional[dict[str, Any]]:
    """The request model's ``saria`` field (`plugin/requests.py`): the hint's normalized parameters, or None."""
    return None if raw is None else parse_hint(raw).to_params()


def attach_hint(sampling_params: dict[str, Any], params: Optional[dict[str, Any]]) -> None:
    """Put a validated hint (``validate_field``'s output) into a request's sampling parameters
    for the scheduler (`plugin/requests.py`)."""
    if params is not None:
        sampling_params["custom_params"] = {**(sampling_params.get("custom_params") or {}), HINT_KEY: params}


def hint_of(custom_params: Any) -> Optional[AgentHint]:
    """The hint a scheduler request carries, or None. Validated again: ``custom_params`` also
    reaches the scheduler from ``/generate``, where nothing checked it; an invalid one is ignored."""
    if not isinstance(custom_params, dict) or HINT_KEY not in custom_params:
        return None
    try:
        return parse_hint(custom_params[HINT_KEY])
    except ValueError:
        return None
