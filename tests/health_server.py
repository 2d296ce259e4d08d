"""A stand-in server process for launcher tests: answers 200 on every GET, on the port given."""

import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Healthy).serve_forever()
