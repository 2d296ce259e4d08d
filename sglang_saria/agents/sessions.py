"""Coding-agent chat sessions for the demo and the tests, sent through the OpenAI API.

Why this shape: a coding agent's context is a fixed system prompt and tool schemas (the
same for every session), then per turn the model's reply with a tool call and the tool's
result appended to the history. Each turn's prompt extends the previous one, so the
server can reuse the whole previous turn from its cache, whichever tier holds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

SYSTEM_PROMPT = "You are a coding agent in a Python repository. Read files before editing them.\n"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name, description in (
        ("read_file", "Read a file."),
    )
]

FILES = ("src/parser.py", "src/cache.py", "tests/test_parser.py", "src/cli.py", "src/store.py")


def tool_result(session: str, turn: int, chars: int) -> str:
    """Deterministic stand-in for a file the agent read: Python source of about `chars` bytes."""
    lines, size, i = [], 0, 0
    while size < chars:
        line = f"def {session.replace('-', '_')}_step_{turn}_{i}(value):\n    return value * {turn + 1} + {i}\n"
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)[:chars]


@dataclass
class AgentSession:
    """One agent's growing chat history."""

    name: str
    task: str
    tool_chars: int = 300  # bytes (= tokens with the tiny models' tokenizer) per tool result
    messages: list[dict] = field(default_factory=list)
    turn: int = 0

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.task}]

    def add_turn(self, reply: str) -> None:
        """Append the model's reply, its call of a tool and the tool's result."""
        call_id = f"call_{self.name}_{self.turn}"
        path = FILES[(self.turn + len(self.name)) % len(FILES)]
        self.messages.append({
            "role": "assistant",
            "content": reply,
            "tool_calls": [{
                "id": call_id,
                "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
            }],
        })
        self.messages.append({
            "role": "tool",
            "tool_call_id": call_id,
            "content": tool_result(self.name, self.turn, self.tool_chars),
        })
        self.turn += 1


def agent_sessions(count: int, tool_chars: int = 300) -> list[AgentSession]:
    """`count` sessions with different tasks and the same system prompt and tools."""
    return [
        AgentSession(f"agent-{chr(ord('a') + i)}", f"Task {i + 1}: fix the failing test in {FILES[i % len(FILES)]}.", tool_chars)
        for i in range(count)
    ]
