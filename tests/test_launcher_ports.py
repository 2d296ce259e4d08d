"""The launcher's ports: picked below the kernel's ephemeral range (outgoing connections cannot take
them in the seconds before a server binds), and a start that lost its port keeps its log."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from sglang_saria import launcher
from sglang_saria.launcher import EPHEMERAL_RANGE, SGLangServer, ServerConfig, free_port, port_in_use


def test_a_picked_port_is_free_and_below_the_ephemeral_range():
    if not EPHEMERAL_RANGE.exists():
        pytest.skip(f"{EPHEMERAL_RANGE} is missing: the kernel picks the port (tested by the bind below)")
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 < p < low for p in ports)
    for port in ports:
        assert not port_in_use(port)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_without_a_range_to_read_the_kernel_assigns_the_port(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "EPHEMERAL_RANGE", tmp_path / "missing")
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_start_that_lost_its_port_keeps_its_log_and_the_next_uses_another_port(tmp_path, monkeypatch):
    """The first start's process prints uvicorn's bind error (its port was taken); the second, on a
    new port, is a real HTTP server answering /health."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    log = tmp_path / "server.log"
    starts: list[int] = []

    def command(self) -> list[str]:
        starts.append(self.port)
        if len(starts) == 1:
            return [sys.executable, "-c", f"print('restored at start'); print({launcher.BIND_ERROR!r}); "
                                          "import time; time.sleep(60)"]
        return [sys.executable, str(Path(__file__).parent / "health_server.py"), str(self.port)]

    monkeypatch.setattr(SGLangServer, "command", command)
    with SGLangServer(ServerConfig(model, log_path=log, startup_timeout_s=60)) as server:
        assert len(starts) == 2 and starts[0] != starts[1] == server.port
        (earlier,) = server.earlier_logs
        assert earlier == tmp_path / "server.log.start1"
        assert "restored at start" in earlier.read_text()
        assert "restored at start" not in log.read_text()
