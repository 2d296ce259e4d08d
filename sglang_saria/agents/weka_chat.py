"""WEKA Claude Code sessions as a chat dataset for `sglang.bench_serving` (`agentic-trace`).

Why: SGLang's own benchmark client replays multi-turn chats, feeding each real reply back
into the next turn. A WEKA session gives the turns' reuse structure: each request's
64-token blocks (chained keys) extend the previous request's. Shortened to fit the tiny
models: each block becomes `chars_per_block` characters (tokens, with the byte-level
tokenizer) derived from its key, so equal blocks give equal text; a turn's new message is
the blocks beyond the previous request's common prefix; a conversation stops growing at
`max_chars` (its first turn at half of it). (A history the trace rewrites, e.g. on compaction, is replayed as appended.)
"""

from __future__ import annotations

import json
from pathlib import Path

from sglang_saria.replay.agent_prompts import SESSIONS, weka_dir
from sglang_saria.replay.loaders.weka import load_weka_file

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
# Eight concurrent agents: the four of agent_prompts.SESSIONS and four more (sub-agents too).
AGENTS = SESSIONS + ("trace_0001", "trace_0003", "trace_0004/sub1", "trace_0004/sub2")


def block_text(key: int, chars: int) -> str:
    """Text of one trace block: `chars` characters from its chained key."""
    out = []
    for _ in range(chars):
        key, digit = divmod(int(key), len(_ALPHABET))
        out.append(_ALPHABET[digit])
    return "".join(out)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def weka_conversations(
    turns: int = 6,
    sessions: tuple[str, ...] = AGENTS,
    chars_per_block: int = 1,
    max_chars: int = 700,
    weka: Path | None = None,
) -> list[list[dict]]:
    """One conversation per session: turns of `{"messages": [...], "prompt_tokens": n}`."""
    path = weka or weka_dir()
    files = sorted({path / f"{name.split('/')[0]}.json.gz" for name in sessions})
    loaded = {s.session_id: s for f in files if f.exists() for s in load_weka_file(f, 64)}
    missing = [name for name in sessions if name not in loaded]
    if missing:
        raise ValueError(f"WEKA sessions {missing} not found in {path}")
    conversations = []
    for name in sessions:
        conversation, previous, used = [], [], 0
        for request in loaded[name].requests[:turns]:
            keys = [int(k) for k in request.block_keys]
            new = keys[_common_prefix(previous, keys):]
            # The first request keeps at most half the budget, so long sessions still have turns.
            budget = (max_chars // 2 if not conversation else max_chars - used) // chars_per_block
            if budget <= 0:
                break
            separator = " " if chars_per_block > 1 else ""
            text = separator.join(block_text(k, chars_per_block) for k in new[:budget]) or "continue"
            used += len(text)
            conversation.append({"messages": [{"role": "user", "content": text}], "prompt_tokens": used})
            previous = keys
        conversations.append(conversation)
    return conversations


def write_agentic_trace(path: Path, conversations: list[list[dict]]) -> Path:
    """The JSON layout `sglang.bench_serving --dataset-name agentic-trace` reads."""
    path.write_text(json.dumps({"metadata": {"source": "WEKA cc-traces, shortened"}, "conversations": conversations}))
    return path
