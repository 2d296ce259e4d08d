"""Fixtures for the agents' endpoint tests: chat-capable saria servers on CPU.

Same factory shape as tests/e2e/conftest.py's `start_server` (through
`sglang_saria.launcher`), with the tokenizer on and SGLang's cache report enabled; to be
folded into the shared server factory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sglang_saria.launcher import SGLangServer, ServerConfig, saria_hicache_args

# Device pool 2048 tokens (a 5-turn agent session is about 1700), host pool 4096 (hicache
# ratio 2), pages of 16 tokens.
CHAT_POOLS = ["--page-size", "16", "--max-total-tokens", "2048", "--dtype", "bfloat16", "--enable-cache-report"]


@pytest.fixture(scope="session")
def start_chat_server(tiny_model, tmp_path_factory):
    """Factory: `with start_chat_server(store_dir, admission, args) as server:`; always
    stopped. `args` come last, so they override CHAT_POOLS (e.g. a smaller device pool)."""

    @contextmanager
    def _start(store_dir, admission: str = "full-duplicate", args: tuple[str, ...] = ()) -> Iterator[SGLangServer]:
        extra = {"data_dirs": [str(store_dir)], "admission": admission, "capacity": "64MiB"}
        flags = CHAT_POOLS + saria_hicache_args(extra) + list(args)
        log = tmp_path_factory.mktemp("sglang-log") / "server.log"
        with SGLangServer(ServerConfig(tiny_model, args=flags, log_path=log)) as server:
            yield server

    return _start
