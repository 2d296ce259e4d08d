"""End-to-end fixtures: real `python -m sglang.launch_server` processes on CPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sglang_saria.launcher import SGLangServer, ServerConfig

# Small pools so a few 300-token requests push a prefix out of the device (512 tokens)
# and out of the host pool (hicache ratio 2 -> about 1K tokens).
SMALL_POOLS = ["--page-size", "16", "--max-total-tokens", "512", "--dtype", "bfloat16"]


@pytest.fixture(scope="session")
def start_server(tiny_model, tmp_path_factory):
    """Factory: `with start_server(args, env) as server:`; the server is always stopped."""

    @contextmanager
    def _start(args: list[str], env: dict[str, str] | None = None) -> Iterator[SGLangServer]:
        log = tmp_path_factory.mktemp("sglang-log") / "server.log"
        config = ServerConfig(tiny_model, args=SMALL_POOLS + list(args), log_path=log, env=dict(env or {}))
        server = SGLangServer(config)
        with server:
            yield server

    return _start
