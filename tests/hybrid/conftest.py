"""Hybrid-model fixtures: the tiny Qwen3.5-style GDN/full-attention model and a server
factory with the flags the hybrid prefix cache needs on CPU."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sglang_saria.launcher import SGLangServer, ServerConfig

# fp16: cached-vs-cold exactness holds in any dtype (conv state kept in the model dtype,
# SSM state in fp32), and fp16's 10-bit mantissa keeps the comparison with transformers
# tight. Small pools so a few 300-token requests push a prefix out of the device (512
# tokens) and out of the host pool (ratio 2); 16 mamba slots (3 running requests).
HYBRID_POOLS = [
    "--dtype", "float16",
    "--page-size", "16",
    "--max-total-tokens", "512",
    "--max-mamba-cache-size", "16",
    "--max-running-requests", "4",
]


@pytest.fixture(scope="session")
def hybrid_model(repo_root) -> Path:
    """The tiny random hybrid model under models/ (built if missing, never downloaded)."""
    sys.path.insert(0, str(repo_root / "scripts"))
    try:
        from make_tiny_models import HYBRID, build
    finally:
        sys.path.pop(0)
    return build(HYBRID, repo_root / "models")


@pytest.fixture(scope="session")
def start_hybrid_server(hybrid_model, tmp_path_factory):
    """Factory: `with start_hybrid_server(args, env) as server:`; the server is always stopped."""

    @contextmanager
    def _start(args: list[str], env: dict[str, str] | None = None) -> Iterator[SGLangServer]:
        log = tmp_path_factory.mktemp("sglang-hybrid-log") / "server.log"
        config = ServerConfig(hybrid_model, args=HYBRID_POOLS + list(args), log_path=log, env=dict(env or {}))
        with SGLangServer(config) as server:
            yield server

    return _start
