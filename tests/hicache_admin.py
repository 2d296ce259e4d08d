"""SGLang's HiCache admin API (`/hicache/storage-backend`: attach, detach, status;
`/flush_cache`) for servers launched with `--admin-api-key ADMIN_KEY`."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sglang_saria.launcher import SGLangServer

ADMIN_KEY = "saria-test-admin"
ADMIN_ARGS = ["--admin-api-key", ADMIN_KEY]  # the attach/detach endpoints refuse without one


@dataclass(frozen=True)
class Reply:
    status: int
    text: str


@dataclass
class HiCacheAdmin:
    server: SGLangServer

    def call(self, method: str, path: str, body: Optional[dict] = None) -> Reply:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_KEY}"}
        request = urllib.request.Request(f"{self.server.url}{path}", data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return Reply(response.status, response.read().decode())
        except urllib.error.HTTPError as err:
            return Reply(err.code, err.read().decode(errors="replace"))

    def attach(self, backend: str, extra_config: Optional[dict[str, Any]] = None, **policies: str) -> Reply:
        """PUT: ``policies`` are `hicache_storage_prefetch_policy`, `hicache_write_policy`."""
        body = {"hicache_storage_backend": backend, **policies}
        if extra_config is not None:
            body["hicache_storage_backend_extra_config_json"] = json.dumps(extra_config)
        return self.call("PUT", "/hicache/storage-backend", body)

    def detach(self) -> Reply:
        return self.call("DELETE", "/hicache/storage-backend")

    def status(self) -> dict:
        return json.loads(self.call("GET", "/hicache/storage-backend").text)

    def flush(self) -> Reply:
        """Drop the device and host tiers (the store keeps its pages)."""
        return self.call("POST", "/flush_cache")


def wait_files(directory: Path, count: int, timeout_s: float = 120.0) -> None:
    """Wait until ``directory`` holds at least ``count`` files (HiCache's `file` backend writes
    one per page, asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while len([p for p in directory.rglob("*") if p.is_file()]) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{directory}: fewer than {count} files after {timeout_s:.0f} s")
        time.sleep(0.1)
