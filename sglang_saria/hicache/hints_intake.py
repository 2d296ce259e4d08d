"""Agents' hints inside SGLang: a released request's hint becomes hints on its pages.

A chat request's ``"saria"`` hint (``hint_request.py``, ``plugin/requests.py``) reaches the scheduler in its
``custom_params``. When SGLang releases the request after putting its KV in the tree
(``on_release`` after ``checkpoint``: the prompt and the output, page-aligned), the pages of its
path from the root are the request's pages:

- ``end``: ``AgentHints.session_end`` (none of them is written from now, whatever the policy says)
  and their SSD copies become the store's first victims (``SariaStorage.demote_pages``);
- ``expect_return_s``: ``AgentHints.expect_return`` (a page DRAM gives up before then is written);
- the session's id: the paths of its earlier hinted requests are remembered (``SessionPaths``,
  bounded in bytes by ``admission.hint_sessions_max_bytes``), so an ``end`` also covers pages of
  its turns that the last request did not reuse
  (a branch, a compacted history).

A request that matches pages makes an end hint on them void (``policy.on_request_match``,
``AgentHints.used``). Every rank sees the same requests released in the same order, so under
TP every rank's hints are the same. Only ``auto`` takes hints (``admission.hints``); other
policies ignore them. Counted as ``sglang:saria_hints_total{kind}`` (``load_signal.py`` exports
``AgentHints.counts`` each step).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Optional

from sglang_saria.hicache.hint_request import AgentHint, hint_of
from sglang_saria.hicache.policy import SariaHiCachePolicy, page_key

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


def apply_hint(policy: SariaHiCachePolicy, sessions: SessionPaths, hint: AgentHint, hashes: Sequence[str]) -> None:
    """A released request's hint, on its path's pages (``hashes``, root first)."""
    hints = policy.hints
    if hints is None:
        return
    hints.on_clock(policy.clock())
    earlier = sessions.record(hint.session, hashes)
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
