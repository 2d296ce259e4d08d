"""Plain CPU serving through the patched SGLang 0.5.23, and the launcher's bad-input errors."""

from __future__ import annotations

import socket

import pytest

from sglang_saria.launcher import (
    SGLangServer,
    ServerConfig,
    ServerError,
    assert_matches_cold,
    cached_tokens,
    saria_hicache_args,
)

pytestmark = pytest.mark.e2e

PROMPT = list(range(1, 301))


def test_cpu_server_generates_and_reuses_a_device_prefix(start_server):
    with start_server([]) as server:
        cold = server.generate(PROMPT)
        warm = server.generate(PROMPT)
    assert len(cold["output_ids"]) == 4
    assert cached_tokens(cold) == {"device": 0, "host": 0, "storage": 0}
    # The last prompt token is always recomputed; 299 tokens round down to 18 pages of 16.
    assert cached_tokens(warm)["device"] == 288
    assert warm["meta_info"]["cached_tokens"] == 288
    # Same tokens, logprobs within tolerance: the cached prefix runs prefill with other shapes.
    assert_matches_cold(warm, cold, "warm prefix")


def test_missing_model_path_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ServerError, match="no-such-model"):
        SGLangServer(ServerConfig(missing)).start()


def test_port_in_use_is_named(tiny_model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(ServerError, match=f"port {port}"):
            SGLangServer(ServerConfig(tiny_model, port=port)).start()


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"promotion": {"ratio": 1.5}}, r"promotion.ratio=1.5: must be in \[0, 1\]"),
        ({"data_dirs": []}, r"data_dirs=\[\] must be a non-empty list of paths"),
        # storage/preflight.py: also a capacity above the free space, a read-only data dir or slab
        ({"capacity": "1KiB"}, r"capacity=1024 bytes holds no store slot: the minimum is 4096 bytes"),
    ],
    ids=["ratio-outside-0-1", "no-data-dir", "capacity-below-a-slot"],
)
def test_bad_saria_extra_config_stops_the_server_naming_it(tiny_model, tmp_path, extra, message):
    """In the launching process (the plugin's hook after `handle_hicache`), before the model loads."""
    extra = {"data_dirs": [str(tmp_path / "store")], **extra}
    config = ServerConfig(tiny_model, args=saria_hicache_args(extra), log_path=tmp_path / "server.log")
    with pytest.raises(ServerError, match=message):
        SGLangServer(config).start()
    assert "Load weight begin" not in config.log_path.read_text()
