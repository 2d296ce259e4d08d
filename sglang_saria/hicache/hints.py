"""Agents' cache hints: from a chat request's body to the pages of its path, and the policy's
questions about tree nodes.

A chat completion may carry ``"saria": {"session": "<id>", "expect_return_s": 30}`` (the session
comes back in about 30 s: keep what DRAM gives up) or ``"saria": {"session": "<id>", "end": true}``
(the session is over: write none of it, its SSD copies go first).

- request (HTTP server): `plugin/requests.py` validates the field with `parse_hint` when the
  request model is built (a bad hint is a 400 naming the field, ``saria.session``, ...) and hands
  it to the scheduler inside ``sampling_params.custom_params`` under `HINT_KEY`, the channel SGLang
  itself uses for per-request data (its reasoning keys), which every tokenizer and scheduler path
  already carries (`validate_field`, `attach_hint`);
- release (scheduler): `HintsIntakeMixin` (of `SariaRadixCache`) reads it back with `hint_of`
  when SGLang releases the request after putting its KV in the tree (``on_release`` after
  ``checkpoint``: the prompt and the output, page-aligned); the pages of its path from the root
  are the request's pages (`apply_hint`):
  - ``end``: ``AgentHints.session_end`` (none of them is written from now, whatever the policy
    says) and their SSD copies become the store's first victims (the policy's ``on_ssd_demote``:
    ``SariaStorage.demote_pages``);
  - ``expect_return_s``: ``AgentHints.expect_return`` (a page DRAM gives up before then is written);
  - the session's id: the paths of its earlier hinted requests are remembered (`SessionPaths`,
    bounded in bytes by ``admission.hint_sessions_max_bytes``), so an ``end`` also covers pages of
    its turns that the last request did not reuse (a branch, a compacted history), and the pages of
    its previous request that a request without ``end`` no longer holds are left behind
    (``AgentHints.left_behind``: not written while no request uses them);
- decisions: ``AgentHints`` (``mem_cache/hints.py``) keeps hints by block key; the write sequencer
  asks it about the keys its driver decides on, which in this driver are SGLang's tree nodes.
  Nodes split and leave the tree, pages do not: the hints stay keyed by page (``page_key``, as the
  metadata is) and `NodeHints` asks about a node by its last page, as its counters are
  (``policy.py``).

A request that matches pages makes an end hint on them void (``policy.on_request_match``,
``AgentHints.used``). Every rank sees the same requests released in the same order, so under
TP every rank's hints are the same. Only ``auto`` and ``loadaware`` take hints (``admission.hints``); other
policies ignore them. Counted as ``sglang:saria_hints_total{kind}`` (``load_signal.py`` exports
``AgentHints.counts`` each step).
"""

from __future__ import annotations

import math
import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from sglang_saria.hicache.tree_view import page_key
from sglang_saria.mem_cache.hints import AgentHints

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


# ---------------------------------------------------------------- release: hints on a request's pages
ENTRY_OVERHEAD_BYTES = 200  # one session's dict entry and tuple header (CPython, 64-bit), beyond its strings


class SessionPaths:
    """The page hashes of each session's last hinted request, at most ``max_bytes`` of them in all
    (``admission.hint_sessions_max_bytes``): a 128K-token context is 2,000 hashes at page 64 but
    128,000 at page 1, so a bound by count would not bound memory. Past the bound the sessions
    hinted longest ago are forgotten first (an ``end`` then covers only its own request's path);
    a single path larger than the whole bound is not kept."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._paths: OrderedDict[str, tuple[tuple[str, ...], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._paths)

    def record(self, session: str, hashes: Sequence[str]) -> tuple[str, ...]:
        """Remember ``hashes`` as the session's path; returns its earlier one's pages not in it."""
        earlier = self.forget(session)
        path = tuple(hashes)
        cost = entry_bytes(session, path)
        if cost <= self.max_bytes:
            self._paths[session] = (path, cost)
            self.nbytes += cost
            while self.nbytes > self.max_bytes:
                _, (_, oldest) = self._paths.popitem(last=False)
                self.nbytes -= oldest
        if not earlier:
            return ()
        now = set(path)
        return tuple(h for h in earlier if h not in now)

    def forget(self, session: str) -> tuple[str, ...]:
        """Drop the session's path; returns it (empty if none was kept)."""
        path, cost = self._paths.pop(session, ((), 0))
        self.nbytes -= cost
        return path


def entry_bytes(session: str, path: tuple[str, ...]) -> int:
    """Memory one remembered session holds: its id, its hashes and the containers (an upper
    bound: hashes the radix tree still holds are shared with it)."""
    return ENTRY_OVERHEAD_BYTES + sys.getsizeof(session) + 8 * len(path) + sum(sys.getsizeof(h) for h in path)


def apply_hint(policy: Any, sessions: SessionPaths, hint: AgentHint, hashes: Sequence[str]) -> None:
    """A released request's hint on its path's pages (``hashes``, root first), for ``policy`` (a
    `SariaHiCachePolicy`): its hints told, its ``on_ssd_demote`` given the pages of an ended session."""
    hints = policy.hints
    if hints is None:
        return
    hints.on_clock(policy.clock())
    earlier = sessions.record(hint.session, hashes)
    if earlier and not hint.end:
        hints.left_behind([page_key(h) for h in earlier])
    if hint.end:
        pages = list(earlier) + list(hashes)  # an earlier branch first: the request's own tail goes first
        sessions.forget(hint.session)
        hints.session_end([page_key(h) for h in pages])
        if policy.on_ssd_demote is not None:
            policy.on_ssd_demote(pages)
    elif hint.expect_return_s is not None:
        hints.expect_return([page_key(h) for h in hashes], hint.expect_return_s)


class HintsIntakeMixin:
    """`SariaRadixCache`'s hint intake (uses its ``_policy()`` and ``tree_core``)."""

    _sessions: Optional[SessionPaths] = None

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)  # type: ignore[misc]
        if not checkpointed:
            return
        hint = hint_of(getattr(req.sampling_params, "custom_params", None))
        policy = self._policy()  # type: ignore[attr-defined]
        if hint is None or policy is None or policy.hints is None:
            return
        if self._sessions is None:
            self._sessions = SessionPaths(policy.config.admission.hint_sessions_max_bytes)
        tree = self.tree_core  # type: ignore[attr-defined]
        node = req.last_node
        apply_hint(policy, self._sessions, hint, tree.get_prefix_hash_values(node) + tree.get_hash_values(node))


# ---------------------------------------------------------------- decisions: hints asked about tree nodes
class NodeHints:
    """What the sequencer reads of ``AgentHints`` (``ended``, ``returns_later``, ``counts``), for nodes."""

    def __init__(self, hints: AgentHints, key_of: Callable[[Any], Hashable]) -> None:
        self.hints = hints
        self.counts = hints.counts  # the sequencer counts skipped and hinted writes here
        self._key_of = key_of

    def ended(self, node: Any) -> bool:
        return self.hints.ended(self._key_of(node))

    def is_left_behind(self, node: Any) -> bool:
        return self.hints.is_left_behind(self._key_of(node))

    def returns_later(self, node: Any) -> bool:
        return self.hints.returns_later(self._key_of(node))
