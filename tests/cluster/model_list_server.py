"""A local HTTP server that answers `/v1/models` as an SGLang worker of ``model`` does
(and nothing else): the other side of the launcher's worker checks, without loading a model."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def model_list_server(model: str) -> Iterator[str]:
    """``with model_list_server("m") as url:`` a URL whose /v1/models lists model ``m``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/v1/models":
                self.send_error(404)
                return
            body = json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class EchoWorker:
    """A local HTTP server standing in for a worker: ``/v1/models`` lists ``model``, ``/metrics`` has its
    SSD bytes written, a POST is answered with the worker's name and the body it got. ``stop()`` closes the port (a dead worker), ``start()``
    opens the same port again (the worker is back)."""

    def __init__(self, name: str, model: str = "m", port: int = 0, written_bytes: float = 0.0) -> None:
        self.name, self.model, self.port = name, model, port
        self.written_bytes = written_bytes  # its /metrics' sglang:saria_ssd_bytes_written_total
        self.server: ThreadingHTTPServer | None = None
        self.bodies: list[dict] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "EchoWorker":
        worker = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/metrics":
                    body = (f'sglang:saria_ssd_bytes_written_total{{model_name="{worker.model}"}} '
                            f"{worker.written_bytes}\n").encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._send({"object": "list", "data": [{"id": worker.model, "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                got = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                worker.bodies.append(got)
                self._send({"worker": worker.name, "body": got})

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
