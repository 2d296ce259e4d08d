"""N saria workers and the router, started and stopped together.

Why a class of its own: the CLI, the e2e test and a benchmark drive the same cluster, and
a worker must come back on the same port and store directory after a crash (the router
knows it by URL; its store is its node's NVMe), so one place owns ports, stores and
process lifetimes, and stops everything on any failure.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_saria.cluster.router import RouterProcess, RouterSettings, make_router
from sglang_saria.cluster.session_router import SessionRouter
from sglang_saria.cluster.workers import ClusterError, WorkerInfo, check_workers
from sglang_saria.launcher import SGLangServer, ServerConfig, ServerError, free_port, saria_hicache_args


@dataclass
class ClusterConfig:
    model_path: Path
    store_root: Path  # worker i keeps its store in store_root/worker-i (its node's NVMe)
    workers: int = 2
    args: list[str] = field(default_factory=list)  # more launch_server flags for every worker
    extra_config: dict[str, Any] = field(default_factory=dict)  # saria extra-config; data_dirs is set per worker
    host: str = "127.0.0.1"
    router_port: int | None = None  # None: a free port
    worker_ports: list[int] | None = None  # None: free ports
    cpu: bool = True
    env: dict[str, str] = field(default_factory=dict)  # worker environment (e.g. launcher.AUDIT_ENV)
    log_dir: Path | None = None  # None: /tmp/saria-*-<port>.log
    router: RouterSettings = field(default_factory=RouterSettings)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ClusterError(f"--workers {self.workers}: need at least one worker")
        if self.worker_ports is not None and len(self.worker_ports) != self.workers:
            raise ClusterError(f"{len(self.worker_ports)} worker ports for {self.workers} workers")
        if "data_dirs" in self.extra_config:
            raise ClusterError("extra-config data_dirs is set per worker (--store-root DIR: DIR/worker-<i>); leave it out")


class Cluster:
    """`with Cluster(config) as cluster:` workers and router up, `cluster.url` the router."""

    def __init__(self, config: ClusterConfig):
        self.config = config
        ports = config.worker_ports or [free_port(config.host) for _ in range(config.workers)]
        self.restarts = [0] * config.workers  # worker i's logs: worker-i.log, worker-i.restart-<n>.log
        self.servers = [SGLangServer(self._server_config(i, port)) for i, port in enumerate(ports)]
        self.router: RouterProcess | SessionRouter | None = None
        self.model = ""

    @property
    def url(self) -> str:
        if self.router is None:
            raise ClusterError("the cluster is not started")
        return self.router.url

    @property
    def worker_urls(self) -> list[str]:
        return [server.url for server in self.servers]

    def store_dir(self, index: int) -> Path:
        return self.config.store_root / f"worker-{index}"

    def _server_config(self, index: int, port: int) -> ServerConfig:
        extra = {**self.config.extra_config, "data_dirs": [str(self.store_dir(index))]}
        name = f"worker-{index}" + (f".restart-{self.restarts[index]}" if self.restarts[index] else "")
        log = self.config.log_dir / f"{name}.log" if self.config.log_dir else None
        return ServerConfig(
            self.config.model_path, args=saria_hicache_args(extra) + list(self.config.args), port=port,
            host=self.config.host, cpu=self.config.cpu, log_path=log, env=dict(self.config.env),
        )

    def start(self) -> "Cluster":
        try:
            self.config.store_root.mkdir(parents=True, exist_ok=True, mode=0o700)
            with ThreadPoolExecutor(len(self.servers)) as pool:  # model loads overlap
                errors = [e for e in pool.map(self._start_worker, range(len(self.servers))) if e]
            if errors:
                raise ClusterError("; ".join(errors))
            infos: list[WorkerInfo] = check_workers(self.worker_urls)
            self.model = infos[0].model
            log = self.config.log_dir / "router.log" if self.config.log_dir else None
            self.router = make_router(self.worker_urls, self.config.router, self.config.host,
                                      self.config.router_port, log).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_worker(self, index: int) -> str:
        try:
            self.servers[index].start()
            return ""
        except ServerError as err:
            return f"worker {index} ({self.servers[index].url}) did not start: {err}"

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill worker ``index``'s process group (a crash: no graceful shutdown with SIGKILL)."""
        process = self.servers[index].process
        if process is None or process.poll() is not None:
            raise ClusterError(f"worker {index} is not running")
        os.killpg(process.pid, sig)
        process.wait(timeout=60)

    def restart_worker(self, index: int, timeout_s: float = 120.0) -> None:
        """Start worker ``index`` again on its port and store; return once the router sees it healthy."""
        server = self.servers[index]
        if server.process is not None and server.process.poll() is None:
            raise ClusterError(f"worker {index} is still running")
        self.restarts[index] += 1
        self.servers[index] = SGLangServer(self._server_config(index, server.port)).start()
        if self.router is not None:
            self.router.wait_workers({server.url}, timeout_s)

    def dead_workers(self) -> list[int]:
        return [i for i, s in enumerate(self.servers) if s.process is not None and s.process.poll() is not None]

    def stop(self) -> None:
        """Router first (no new requests), then every worker; safe to call twice."""
        if self.router is not None:
            self.router.stop()
        for server in self.servers:
            server.stop()

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
