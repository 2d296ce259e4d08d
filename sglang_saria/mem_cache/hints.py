"""Agents' hints about their sessions: which blocks will come back, and which will not.

Agent frameworks know what a cache can only guess: a session that ended will not return (vLLM's
"Session-Aware KV Cache Hints for Agentic Workloads" RFC; SGLang's retention requests). A request
may say ``{"saria": {"session": "<id>", "end": true}}`` or ``{"saria": {"session": "<id>",
"expect_return_s": 30}}``; the driver turns that into the request's block keys here:

- **end**: the blocks are never written, and their SSD copies become the first victims
  (``SSDVictimOrder.demote``); a later request that uses them again makes them live again;
- **expect_return_s**: a block evicted from DRAM before that time is written at that eviction
  (the session said it comes back after DRAM gave the block up), whatever the threshold says.
- **left behind**: a session's request that no longer holds blocks of its previous one (the agent
  rewrote or compacted its history, or took another branch) leaves them behind: they are not
  written at their DRAM eviction (a policy that learns, ``auto``, still counts them as seen), until
  a request uses them again. The driver derives this from the session id every hinted request
  carries (the server's ``SessionPaths``, the replay's per-session path).

Hints are optional and bounded: at most ``max_keys`` blocks carry one (the oldest hint is dropped
first), a return is taken at most ``max_return_s`` ahead, and hints only ever skip writes or
bring a write of a block that would be evicted anyway forward, so a client cannot pin the SSD.
Counted in ``counts`` (exported as metrics by the server).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class HintLimits:
    max_keys: int = 1_000_000  # blocks any hints cover at once
    max_return_s: float = 86_400.0  # a longer expect_return_s counts as this


class AgentHints:
    """Hints by block key: ended ones, and when a block's session said it returns."""

    def __init__(self, limits: HintLimits | None = None) -> None:
        self.limits = limits or HintLimits()
        self._ended: OrderedDict[Hashable, None] = OrderedDict()
        self._returns: OrderedDict[Hashable, float] = OrderedDict()
        self._left: OrderedDict[Hashable, None] = OrderedDict()
        self.now = 0.0
        self.counts = {"end": 0, "expect_return": 0, "left_behind": 0, "dropped": 0, "skipped_writes": 0,
                       "hinted_writes": 0, "left_skipped_writes": 0}

    def __len__(self) -> int:
        return len(self._ended) + len(self._returns) + len(self._left)

    def on_clock(self, now: float) -> None:
        self.now = now

    def session_end(self, keys: Iterable[Hashable]) -> None:
        """The session of these blocks ended."""
        self.counts["end"] += 1
        ended, returns = self._ended, self._returns
        for k in keys:
            returns.pop(k, None)
            ended[k] = None
            ended.move_to_end(k)
        self._bound()

    def expect_return(self, keys: Iterable[Hashable], after_s: float) -> None:
        """The session of these blocks said it returns ``after_s`` seconds from now."""
        self.counts["expect_return"] += 1
        at = self.now + min(max(after_s, 0.0), self.limits.max_return_s)
        ended, returns = self._ended, self._returns
        for k in keys:
            ended.pop(k, None)
            returns[k] = at
            returns.move_to_end(k)
        self._bound()

    def left_behind(self, keys: Iterable[Hashable]) -> None:
        """The session's latest request no longer holds these blocks of its previous one."""
        left = self._left
        n = len(left)
        for k in keys:
            left[k] = None
            left.move_to_end(k)
        if len(left) > n:
            self.counts["left_behind"] += 1
            self._bound()

    def used(self, keys: Collection[Hashable]) -> None:
        """A request uses these blocks again: an end or left-behind hint on them no longer holds."""
        for hinted in (self._ended, self._left):
            if hinted:
                for k in hinted.keys() & keys:  # a C-speed intersection: most keys carry no hint
                    del hinted[k]

    def ended(self, key: Hashable) -> bool:
        return key in self._ended

    def is_left_behind(self, key: Hashable) -> bool:
        return key in self._left

    def returns_later(self, key: Hashable) -> bool:
        """Whether the block's session said it returns after now."""
        at = self._returns.get(key)
        return at is not None and at > self.now

    @property
    def any_returns(self) -> bool:
        return bool(self._returns)

    def _bound(self) -> None:
        """Drop the oldest hints past ``max_keys`` (from the largest kind, oldest first within each)."""
        excess = len(self) - self.limits.max_keys
        while excess > 0:
            victims = max((self._returns, self._ended, self._left), key=len)
            victims.popitem(last=False)
            self.counts["dropped"] += 1
            excess -= 1
