"""sglang-router 0.3.2 in front of the workers: the flags we choose, start, wait, stop.

Why these failover settings (README "Many nodes"): with the router's defaults a SIGKILLed
worker keeps its sessions. cache_aware picks the worker that holds the longest prefix, and
a retry picks again by the same rule, so all 5 attempts of a request (50 ms backoff) hit the
dead worker and the client gets `500 call_upstream_request_error`; the worker leaves the
candidate list only when its circuit breaker opens (10 consecutive failures) or the health
check notices (3 failures x 60 s). The router filters candidates with `is_available()`
(healthy and circuit not open) before the policy runs, so opening the circuit after 3
failed attempts sends the 4th to a live worker. A worker that comes back is tried again
after `cb_timeout_duration_secs` and marked healthy after one good health check.

How cache_aware decides in 0.3.2 (the fleet replay models this). Sources: the wheel ships
only a compiled library (`sglang_router_rs`, built from sgl-project/sglang
`sgl-model-gateway/src/policies/cache_aware.rs` and `tree.rs`); the logic below is read
from those files in the versions around 0.3.2 (mesh sync, `PeriodicTask` eviction, trees
keyed by model, not yet by worker pool), matched against the log strings compiled into the
library ("Load balancing triggered | max: .. | min: ..", "Removed stale worker .. from cache
tree", "Before eviction - Used size per tenant") and the defaults the router prints at start
(`CacheAware { cache_threshold: 0.3, balance_abs_threshold: 64, balance_rel_threshold: 1.5,
eviction_interval_secs: 60, max_tree_size: 67108864 }`); placement, failover and the tree
wipe below were also seen on the real router (tests/cluster/test_cluster_e2e.py).

- One approximate radix tree per model, shared by all workers: nodes hold *characters* of
  the request text (never tokens), and each node records which workers ("tenants") have
  been sent that prefix and when (a global counter, not wall time). For a chat request the
  text is the messages' text contents joined by spaces (tool schemas are not part of it).
- Load: a worker's `load()` is the router's count of its requests in flight. The system is
  imbalanced when `max_load - min_load > balance_abs_threshold` (default 64) AND
  `max_load > min_load * balance_rel_threshold` (default 1.5). Then the request goes to the
  least-loaded worker (first one on ties), and the text is still inserted under it.
- Balanced: walk the tree with the text; `match_rate = matched_chars / text_chars`. If
  `match_rate > cache_threshold` (default 0.3) the request goes to a tenant of the deepest
  matched node (the node's cached "last tenant"; on a node several workers share, an
  arbitrary one of them), otherwise to the least-loaded worker (first on ties, so with
  sequential traffic new prefixes all land on the same worker). The chosen worker is then
  inserted as a tenant of the whole text.
- If the matched tenant is no longer a candidate (dead, unhealthy or circuit open), the
  policy removes that worker from the whole tree (`remove_tenant`: every prefix it held)
  and falls back to the first available worker, without inserting. So a worker that comes
  back starts with an empty tree: its old sessions stay where they moved.
- Eviction: a background task every `eviction_interval_secs` (default 60) evicts, per
  tenant whose character count exceeds `max_tree_size` (default 67,108,864 chars), that
  tenant's least recently used leaves until it is under the limit. A match refreshes the
  matched node's timestamp only one time in 8 (sampled); inserts refresh the leaf.
- Defaults of the rest (`launch_router --help`): 5 attempts per request (backoff 50 ms x
  1.5, jitter 0.2, max 30 s), each selecting a worker again; circuit breaker opens at 10
  consecutive failures (a success resets the count) and half-opens after 60 s (closes
  after 3 successes); a 4xx answer counts as a failure too (seen on the real router: with
  threshold 1, one 400 opened a worker's circuit); health check every 60 s (unhealthy after
  3 failures, healthy after 2 successes, 5 s timeout, `/health`, which on SGLang runs a
  1-token generation when the worker is idle).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from sglang_saria.cluster.session_router import SessionRouter
from sglang_saria.cluster.workers import ClusterError
from sglang_saria.launcher import free_port, log_tail, port_in_use, stop_process_group
from sglang_saria.session_affinity import AffinityConfig

# sglang-router's policies, and ``session``: the launcher's session router (``session_router.py``)
POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "session")
# The router panics with this when its port or its Prometheus port is taken.
ADDRESS_IN_USE = "Address already in use"
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class RouterSettings:
    """The router flags the launcher sets; everything else stays at the router's default."""

    policy: str = "cache_aware"
    # Each attempt selects a worker again; after 3 consecutive failures the dead worker's
    # circuit is open, so attempts 4 and 5 go to a live one. Not 1: 0.3.2 counts a 4xx
    # answer (a client's bad request) as a failure too, and an open circuit makes
    # cache_aware forget every session of that worker.
    retry_max_retries: int = 5
    retry_max_backoff_ms: int = 2000
    cb_failure_threshold: int = 3
    cb_success_threshold: int = 1
    cb_timeout_duration_secs: int = 10
    health_check_interval_secs: int = 5
    health_failure_threshold: int = 2
    health_success_threshold: int = 1
    extra: tuple[str, ...] = field(default_factory=tuple)  # more launch_router flags, passed as given
    session: AffinityConfig = field(default_factory=AffinityConfig)  # the session policy's constants

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ClusterError(f"--policy {self.policy!r}: choose one of {', '.join(POLICIES)}")
        if self.policy == "session" and self.extra:
            raise ClusterError(f"--router-arg {' '.join(self.extra)}: the session policy runs no sglang-router")
        self.session.validate()
        for name in ("retry_max_retries", "cb_failure_threshold", "cb_success_threshold",
                     "cb_timeout_duration_secs", "health_check_interval_secs",
                     "health_failure_threshold", "health_success_threshold"):
            if getattr(self, name) < 1:
                raise ClusterError(f"router setting {name}={getattr(self, name)}: must be >= 1")

    def flags(self) -> list[str]:
        return [
            "--policy", self.policy,
            "--retry-max-retries", str(self.retry_max_retries),
            "--retry-max-backoff-ms", str(self.retry_max_backoff_ms),
            "--cb-failure-threshold", str(self.cb_failure_threshold),
            "--cb-success-threshold", str(self.cb_success_threshold),
            "--cb-timeout-duration-secs", str(self.cb_timeout_duration_secs),
            "--health-check-interval-secs", str(self.health_check_interval_secs),
            "--health-failure-threshold", str(self.health_failure_threshold),
            "--health-success-threshold", str(self.health_success_threshold),
            *self.extra,
        ]


def router_installed() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


def make_router(worker_urls: list[str], settings: RouterSettings, host: str = "127.0.0.1", port: int | None = None,
                log_path: Path | None = None) -> "RouterProcess | SessionRouter":
    """The router of ``settings.policy``, not started: the launcher's session router or sglang-router."""
    if settings.policy == "session":
        return SessionRouter(worker_urls, settings.session, host, port)
    return RouterProcess(worker_urls, settings, host, port, log_path)


class RouterProcess:
    """One `python -m sglang_router.launch_router` process; `stop()` is always safe."""

    def __init__(self, worker_urls: list[str], settings: RouterSettings = RouterSettings(),
                 host: str = "127.0.0.1", port: int | None = None, log_path: Path | None = None,
                 startup_timeout_s: float = 120.0):
        self.worker_urls = list(worker_urls)
        self.settings = settings
        self.host = host
        self.fixed_port = port is not None
        self.port = port or free_port(host)
        self.prometheus_port = self._other_free_port()
        self.log_path = log_path or Path(f"/tmp/saria-router-{self.port}.log")
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "sglang_router.launch_router",
            "--host", self.host, "--port", str(self.port),
            "--prometheus-host", self.host, "--prometheus-port", str(self.prometheus_port),
            "--worker-urls", *self.worker_urls,
            *self.settings.flags(),
        ]

    def _other_free_port(self) -> int:
        """A free port for the router's Prometheus exporter, not the router's own."""
        while (port := free_port(self.host)) == self.port:
            pass
        return port

    def start(self) -> "RouterProcess":
        if not router_installed():
            raise ClusterError("sglang-router is not installed: pip install .[cluster] (sglang-router==0.3.2)")
        if self.fixed_port and port_in_use(self.port, self.host):
            raise ClusterError(f"--port {self.port}: already in use on {self.host}")
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start_once()
            except ClusterError:
                # Another process bound a port we picked before the router did: pick again.
                if ADDRESS_IN_USE not in self.log_tail() or attempt == PORT_ATTEMPTS - 1:
                    raise
                if not self.fixed_port:
                    self.port = free_port(self.host)
                self.prometheus_port = self._other_free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> "RouterProcess":
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        try:
            self.wait_workers(set(self.worker_urls), self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def workers(self) -> dict[str, bool]:
        """The router's workers: URL -> healthy (its `/workers` list)."""
        with urllib.request.urlopen(f"{self.url}/workers", timeout=5) as response:
            listing = json.load(response)
        return {w["url"]: bool(w.get("is_healthy")) for w in listing.get("workers", [])}

    def wait_workers(self, healthy: set[str], timeout_s: float) -> None:
        """Until the router lists every URL in ``healthy`` as healthy (registration runs in
        the background after the router starts listening)."""
        deadline = time.monotonic() + timeout_s
        seen: dict[str, bool] = {}
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise ClusterError(f"sglang-router exited with code {self.process and self.process.returncode}:\n{self.log_tail()}")
            try:
                seen = self.workers()
                if all(seen.get(url) for url in healthy):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            time.sleep(0.5)
        raise ClusterError(f"router at {self.url} did not report {sorted(healthy)} healthy within "
                           f"{timeout_s:.0f} s (it has {seen}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        stop_process_group(self.process)
