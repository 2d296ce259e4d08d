"""A scenario's steps served one by one on a real server, each checked against a cold run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

from sglang_saria.launcher import SGLangServer, assert_matches_cold, cached_tokens

# (what the step shows, its prompt, the tiers its prefix must come from; None: not checked)
Step = tuple[str, list[int], Optional[dict[str, int]]]


def serve_steps(server: SGLangServer, cold_run: Callable[[list[int]], dict], steps: Sequence[Step]) -> None:
    """Serve ``steps`` in order, letting each step's storage writes land: cached tokens by tier
    as expected, greedy tokens and logprobs as a cold run's (within tolerance)."""
    for what, prompt, expected_tiers in steps:
        result = server.generate(prompt)
        server.wait_storage_writes()
        if expected_tiers is not None:
            assert cached_tokens(result) == expected_tiers, what
            assert result["meta_info"]["cached_tokens"] == sum(expected_tiers.values()), what
        assert_matches_cold(result, cold_run(prompt), what)
