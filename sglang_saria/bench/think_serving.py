"""`python -m sglang_saria.bench.think_serving --think-times FILE <sglang.bench_serving flags>`:
SGLang's own benchmark client, with each agent's think time before its next turn.

Why: `sglang.bench_serving --dataset-name agentic-trace` replays a conversation's turns
back to back, but an agent thinks (runs tools, waits for its user) between turns, and those
gaps decide what the cache still holds when the next turn comes: without them every
session's next turn finds its previous turn still on the device. SGLang 0.5.23's client has
no per-turn delay, so this entry point installs one hook into it and then runs its own
`cli_main` unchanged: before round r of a conversation it sleeps `think[r]` seconds (r = 0:
the session's start offset). The request, streaming, TTFT (measured from when a round is
sent, so a think time never counts as latency) and the result file are SGLang's.

`FILE` is JSON `{first user message text: [delay_s per round]}`: a conversation is found by
its first message, which `weka_chat` makes unique per session.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

THINK_FLAG = "--think-times"


def round_delay(think: dict[str, list[float]], messages: list[dict]) -> float:
    """Seconds to wait before sending ``messages`` (the whole history of a round): the
    conversation is the one whose first message it starts with, the round is the number of
    assistant replies already in it."""
    if not messages:
        return 0.0
    delays = think.get(str(messages[0].get("content")), [])
    round_index = sum(1 for m in messages if m.get("role") == "assistant")
    return float(delays[round_index]) if round_index < len(delays) else 0.0


def paced(request_func: Callable[..., Any], think: dict[str, list[float]]) -> Callable[..., Any]:
    """``request_func`` (one round of a multi-turn request) preceded by that round's think time."""

    async def run(request_func_input: Any, pbar: Any = None) -> Any:
        delay = round_delay(think, request_func_input.prompt)
        if delay > 0:
            await asyncio.sleep(delay)
        return await request_func(request_func_input, pbar=pbar)

    return run


def install(think: dict[str, list[float]]) -> None:
    """Wrap SGLang's multi-turn wrapper so each round it sends first waits its think time."""
    from sglang.benchmark import serving

    original = serving.wrap_multi_turn_request_func

    def wrap(request_func: Callable[..., Any], backend: str) -> Callable[..., Any]:
        return original(paced(request_func, think), backend=backend)

    serving.wrap_multi_turn_request_func = wrap


def split_argv(argv: list[str]) -> tuple[Path, list[str]]:
    """(the think-times file, the rest: bench_serving's own flags)."""
    if THINK_FLAG not in argv or argv.index(THINK_FLAG) + 1 >= len(argv):
        raise SystemExit(f"think_serving: {THINK_FLAG} FILE is required (JSON: first message -> delays per round)")
    i = argv.index(THINK_FLAG)
    return Path(argv[i + 1]), argv[:i] + argv[i + 2:]


def main(argv: list[str] | None = None) -> None:
    path, rest = split_argv(list(sys.argv[1:] if argv is None else argv))
    think = json.loads(path.read_text())
    install(think)
    from sglang.benchmark import serving

    sys.argv = [sys.argv[0], *rest]
    serving.cli_main()


if __name__ == "__main__":
    main()
