"""`--policy session`: the launcher's session router, an HTTP proxy in front of the workers.

Each request's session key picks its worker through ``session_affinity.SessionAffinity`` (the
core the fleet replay's ``--router session`` runs): the saria session id of the body
(``"saria": {"session": ...}``), else a routing-key header (``x-smg-routing-key``, SGLang Model
Gateway's, or ``x-session-id``), else a hash of the conversation's head (its first two messages, or
the first 512 characters of a prompt), which every turn of a conversation repeats. The request is
forwarded as it came, the answer streamed back as it comes, with ``x-saria-worker`` naming the
worker that served it.

Why a proxy of the launcher and not the router's own policy: smg 1.13.0 (the SGLang Model
Gateway) pins a routing key to a worker (``manual`` policy, ``--sticky-sessions``) without a load
bound and without bringing a session back to a worker that returns, and its ``x-smg-target-worker``
header answered ``no_available_workers`` for every registered worker URL and id tried on this
machine, so it cannot take a placement decided outside it. sglang-router 0.3.2 has no key at all.

Wear: every ``wear_interval_s`` the same thread reads each live worker's
``sglang:saria_ssd_bytes_written_total`` (its ``/metrics``), so new and moving sessions go where the
drives wore least, as in the replay; a counter that falls (the worker restarted) keeps counting on
from what it had reached. A request's size is its body's bytes: the core compares it with the
other active sessions' (placement by tokens) and with the session's previous request's (a session
leaves a worn-out drive at a body shorter than ``wear_shrink`` x its previous one). Whether a request
extends what its worker holds (``extends``: the core's wear moves and bound) is judged on
its prefixes (``request_prefixes``: a digest of its messages so far after each message, weighted by
the message's bytes, or of a prompt's text after each ``HEAD_CHARS``), against those the session sent
that worker (``session_affinity.HeldPrefixes``).

Worker death: a thread probes every worker's ``/v1/models`` each ``probe_interval_s``; a refused
connection marks it dead at once, other failures after ``probe_failures`` in a row. A request whose
worker fails to connect marks it dead and is placed again (the core spreads a dead worker's
sessions over the others), so no request is lost to a worker that died between probes. A worker
that answers again is alive, and its sessions come back to it if the bound allows.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
import xxhash
from aiohttp import web

from sglang_saria.cluster.workers import ClusterError
from sglang_saria.launcher import free_port
from sglang_saria.session_affinity import AffinityConfig, HeldPrefixes, SessionAffinity, key_hash

ROUTING_KEY_HEADERS = ("x-smg-routing-key", "x-session-id")
WRITTEN = "sglang:saria_ssd_bytes_written_total"
WORKER_HEADER = "x-saria-worker"
HEAD_CHARS = 512
# hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself
_DROP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer",
         "host", "content-length"}


def session_key(body: object, headers: Mapping[str, str]) -> str | None:
    """A request's session key (module docstring); None when it has none (no JSON body)."""
    saria = body.get("saria") if isinstance(body, dict) else None
    if isinstance(saria, dict) and isinstance(saria.get("session"), str) and saria["session"]:
        return f"saria:{saria['session']}"
    for name in ROUTING_KEY_HEADERS:
        if headers.get(name):
            return f"header:{headers[name]}"
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("messages"), list) and body["messages"]:
        head = json.dumps(body["messages"][:2], sort_keys=True)
    elif isinstance(body.get("prompt") or body.get("text"), str):
        head = (body.get("prompt") or body.get("text"))[:HEAD_CHARS]
    else:
        return None
    return f"prefix:{key_hash(head):016x}"


def request_prefixes(body: object) -> tuple[list[int], list[float]]:
    """A request's prefixes and their weights (module docstring); empty when its body has no prompt."""
    h = xxhash.xxh64()
    ids: list[int] = []
    weights: list[float] = []
    if not isinstance(body, dict):
        return ids, weights
    if isinstance(body.get("messages"), list):
        for message in body["messages"]:
            part = json.dumps(message, sort_keys=True).encode()
            h.update(part)
            ids.append(h.intdigest())
            weights.append(float(len(part)))
    elif isinstance(body.get("prompt") or body.get("text"), str):
        text = (body.get("prompt") or body.get("text")).encode()
        for i in range(0, len(text), HEAD_CHARS):
            h.update(text[i:i + HEAD_CHARS])
            ids.append(h.intdigest())
            weights.append(float(len(text[i:i + HEAD_CHARS])))
    return ids, weights


@dataclass
class Liveness:
    """Which workers answer; written by the probe thread and by failed requests, read by the router."""

    urls: list[str]
    probe_failures: int = 2
    alive: list[bool] = field(init=False)
    failures: list[int] = field(init=False)
    wear: list[float] = field(init=False)  # SSD bytes written per worker since the router started
    seen: list[float] = field(init=False)  # the counter's last value
    offset: list[float] = field(init=False)  # what it had reached before its worker's restarts

    def __post_init__(self) -> None:
        n = len(self.urls)
        self.alive, self.failures = [True] * n, [0] * n
        self.wear, self.seen, self.offset = [0.0] * n, [0.0] * n, [0.0] * n

    def read_written(self, index: int, timeout_s: float) -> None:
        """Worker ``index``'s SSD bytes written (its /metrics), kept monotonic across its restarts."""
        try:
            with urllib.request.urlopen(f"{self.urls[index]}/metrics", timeout=timeout_s) as response:
                text = response.read().decode(errors="replace")
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return  # the liveness probe decides what a failure means
        value = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith(WRITTEN) and line[len(WRITTEN)] in " {")
        if value < self.seen[index]:  # restarted: its counter began again at 0
            self.offset[index] += self.seen[index]
        self.seen[index] = value
        self.wear[index] = self.offset[index] + value

    def probe(self, index: int, timeout_s: float) -> None:
        try:
            with urllib.request.urlopen(f"{self.urls[index]}/v1/models", timeout=timeout_s) as response:
                response.read()
            self.failures[index], self.alive[index] = 0, True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
            refused = isinstance(getattr(err, "reason", err), ConnectionRefusedError)
            self.failures[index] += 1
            if refused or self.failures[index] >= self.probe_failures:
                self.alive[index] = False


class SessionRouter:
    """The session router on ``host:port`` in a thread of its own; ``stop()`` is always safe.

    Same surface as ``router.RouterProcess`` (``url``, ``start``, ``stop``, ``workers``,
    ``wait_workers``, ``running``, ``log_tail``), so the cluster and the CLI drive either.
    """

    def __init__(self, worker_urls: list[str], config: AffinityConfig = AffinityConfig(), host: str = "127.0.0.1",
                 port: int | None = None, probe_interval_s: float = 1.0, probe_timeout_s: float = 5.0,
                 wear_interval_s: float = 5.0, startup_timeout_s: float = 30.0) -> None:
        if not worker_urls:
            raise ClusterError("the session router needs at least one worker URL")
        self.worker_urls = list(worker_urls)
        self.core = SessionAffinity(len(worker_urls), config)
        self.held = HeldPrefixes(config.held_frac, config.max_sessions)
        self.liveness = Liveness(self.worker_urls)
        self.host = host
        self.port = port or free_port(host)
        self.probe_interval_s, self.probe_timeout_s = probe_interval_s, probe_timeout_s
        self.wear_interval_s = wear_interval_s
        self.startup_timeout_s = startup_timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.runner: web.AppRunner | None = None
        self.client: aiohttp.ClientSession | None = None
        self.log: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "SessionRouter":
        for i in range(len(self.worker_urls)):
            self.liveness.probe(i, self.probe_timeout_s)
            self.liveness.read_written(i, self.probe_timeout_s)
        self.thread = threading.Thread(target=self._serve, name="saria-session-router", daemon=True)
        self.thread.start()
        threading.Thread(target=self._probe_loop, name="saria-session-probe", daemon=True).start()
        if not self.ready.wait(self.startup_timeout_s) or self.error is not None:
            self.stop()
            raise ClusterError(f"session router did not start on {self.url}: {self.error}")
        return self

    def _serve(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._open())
        except BaseException as err:  # reported by start()
            self.error = err
            self.ready.set()
            return
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self._close())
        self.loop.close()

    async def _open(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.host, self.port).start()

    async def _close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.client is not None:
            await self.client.close()

    def _probe_loop(self) -> None:
        next_wear = time.monotonic() + self.wear_interval_s
        while not self.stopping.wait(self.probe_interval_s):
            read_wear = time.monotonic() >= next_wear
            if read_wear:
                next_wear = time.monotonic() + self.wear_interval_s
            for i in range(len(self.worker_urls)):
                was = self.liveness.alive[i]
                self.liveness.probe(i, self.probe_timeout_s)
                if was != self.liveness.alive[i]:
                    self.note(f"worker {i} ({self.worker_urls[i]}) {'is back' if self.liveness.alive[i] else 'is dead'}")
                if read_wear and self.liveness.alive[i]:
                    self.liveness.read_written(i, self.probe_timeout_s)

    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def stop(self) -> None:
        self.stopping.set()
        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not None:
            self.thread.join(timeout=30)

    def note(self, line: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {line}")
        del self.log[:-200]

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log[-lines:]) or "(no log)"

    def workers(self) -> dict[str, bool]:
        """URL -> alive, as the router sees them."""
        return dict(zip(self.worker_urls, self.liveness.alive))

    def wait_workers(self, healthy: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self.workers().get(url) for url in healthy):
                return
            time.sleep(0.2)
        raise ClusterError(f"session router at {self.url} did not see {sorted(healthy)} alive within "
                           f"{timeout_s:.0f} s (it has {self.workers()})")

    # ------------------------------------------------------------ requests
    def choose(self, key: str | None, size: float | None = None,
               prefixes: tuple[list[int], list[float]] = ([], [])) -> int:
        """The worker of a request: the core's choice for a keyed one (``size``: its body's bytes, in
        proportion to its prompt's tokens; ``prefixes``: ``request_prefixes``), else the first live worker."""
        alive = self.liveness.alive
        if not any(alive):
            raise ClusterError(f"no live worker among {self.worker_urls}")
        if key is None:
            return alive.index(True)
        ids, weights = prefixes
        extends = self.held.extends(key, ids, weights)
        node = self.core.pick(key, time.monotonic(), list(alive), list(self.liveness.wear), size, extends)
        self.held.record(key, node, ids)
        return node

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        key = session_key(parsed, request.headers)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        for _ in range(len(self.worker_urls)):
            try:
                index = self.choose(key, float(len(body)), request_prefixes(parsed))
            except ClusterError as err:
                return web.json_response({"error": {"message": str(err), "type": "no_live_worker"}}, status=503)
            url = self.worker_urls[index]
            try:
                upstream = await self.client.request(request.method, url + request.path_qs, data=body, headers=headers)
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as err:
                self.liveness.alive[index] = False  # placed again below: the core moves its sessions
                self.note(f"worker {index} ({url}) failed a request ({err!r}); marked dead")
                continue
            return await self.relay(request, upstream, url)
        return web.json_response({"error": {"message": f"every worker failed: {self.workers()}",
                                            "type": "no_live_worker"}}, status=503)

    async def relay(self, request: web.Request, upstream: aiohttp.ClientResponse, url: str) -> web.StreamResponse:
        """The worker's answer, streamed as it arrives (server-sent events included)."""
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _DROP and k.lower() != "content-encoding":
                    response.headers[k] = v
            response.headers[WORKER_HEADER] = url
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
