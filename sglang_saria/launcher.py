"""Start and stop a real `python -m sglang.launch_server` process (tests, demo, benchmarks).

Why here and not in tests: the demo and the e2e benchmarks drive the same server the
tests do, with the same CPU flags, so there is one place that knows how to start it,
wait for health, talk to `/generate`, and always stop it (process group, also on failure).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# HiCache hashes pages with a C++ extension that torch compiles on first use (20-50 s on
# 2 cores) into one cache per user, rebuilt whenever another venv's copy of the source is
# loaded. One cache per venv; scripts/setup.sh compiles it there once.
TORCH_EXTENSIONS_DIR = Path(sys.prefix) / "torch_extensions"

# Flags that make SGLang 0.5.23 serve on a CPU-only machine (with the patches applied).
# The tiny models carry a local tokenizer (sglang_saria/tiny_models.py): text, chat and
# token-id requests all work. --sleep-on-idle: without it an idle scheduler spins a whole
# core (on a 2-core machine a server kept for later requests halves everyone else's CPU);
# an idle scheduler then wakes on a request at once, and for HiCache's pending write
# acknowledgements at least once a second. --mem-fraction-static: on CPU the "device memory"
# SGLang profiles is the machine's free RAM, which other processes change while a server loads
# its weights; at 0.05 a 5% drop between the two readings refused the server ("Loaded weights
# leave no GPU memory for the KV cache", seen with three test servers starting at once), 0.3
# tolerates 30%. Every caller sizes its pools with --max-total-tokens.
CPU_FLAGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    "--mem-fraction-static", "0.3",
    "--sleep-on-idle",
)


def hicache_args(backend: str, extra_config: dict[str, Any], hicache_ratio: float = 2) -> list[str]:
    """Flags serving HiCache (write-through, SGLang's default) with storage `backend` and
    metrics; storage prefetch (the host-staged path) waits for completion, so storage hits
    are taken deterministically. Stock backends (e.g. `file`) take the same flags."""
    return [
        "--enable-metrics",
        "--enable-hierarchical-cache",
        "--hicache-ratio", str(hicache_ratio),
        "--hicache-storage-backend", backend,
        "--hicache-storage-prefetch-policy", "wait_complete",
        "--hicache-storage-backend-extra-config", json.dumps(extra_config),
    ]


def saria_hicache_args(extra_config: dict[str, Any], hicache_ratio: float = 2) -> list[str]:
    """HiCache with the saria store; ``extra_config`` is the extra-config JSON (store keys,
    policy sections)."""
    return hicache_args("saria", extra_config, hicache_ratio)


# The gauges of writes not yet in the store (`SariaRadixCache._report_writes_pending`).
WRITES_PENDING = ("sglang:saria_storage_writes_in_flight", "sglang:saria_write_through_in_flight")

class ServerError(RuntimeError):
    """The server could not be started or answered with an error."""


class PortTaken(ServerError):
    """Uvicorn could not bind the port: someone took it between our pick and its bind."""


# Uvicorn's message when the port is taken; the server then hangs instead of exiting.
BIND_ERROR = "error while attempting to bind on address"
PORT_ATTEMPTS = 3


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, below the kernel's ephemeral range where it says what that is: outgoing
    connections take their source ports from that range, and one may take a port picked there in
    the seconds before the server binds it. Else (or if none is free there) one the kernel assigns."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low > 2048:
        for port in random.sample(range(max(1025, low - 12_000), low), 32):
            if not port_in_use(port, host):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


@dataclass
class ServerConfig:
    model_path: Path
    args: list[str] = field(default_factory=list)  # extra launch_server flags
    port: int | None = None  # None: pick a free loopback port
    host: str = "127.0.0.1"
    cpu: bool = True
    startup_timeout_s: float = 240.0
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable  # the interpreter (its environment's SGLang and plugins) that serves
    cwd: Path | None = None  # the server's working directory (None: this process's)


@dataclass
class StreamedResult:
    """A streamed request: when it was sent, when each chunk came (monotonic), the last chunk."""

    sent: float
    chunk_times: list[float]
    result: dict

    @property
    def first_token_at(self) -> float:
        return self.chunk_times[0]

    def max_gap_s(self) -> float:
        """The largest wait between two consecutive chunks (inter-token gap)."""
        return max((b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])), default=0.0)


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a process's log (for error messages)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process_group(process: subprocess.Popen | None) -> None:
    """SIGTERM a process's whole group (it was started in a session of its own), SIGKILL after 30 s."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    except ProcessLookupError:
        pass


class SGLangServer:
    """Context manager around one server process; `stop()` is always safe to call."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.port = config.port or free_port(config.host)
        self.process: subprocess.Popen | None = None
        self.log_path = config.log_path or Path(f"/tmp/saria-sglang-{self.port}.log")
        # logs of starts that lost their port (a server that starts again on another port ran its
        # start-up, store included, once before: what it logged then is kept here)
        self.earlier_logs: list[Path] = []

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def command(self) -> list[str]:
        flags = list(CPU_FLAGS) if self.config.cpu else []
        return [
            self.config.python, "-m", "sglang.launch_server",
            "--model-path", str(self.config.model_path),
            "--host", self.config.host, "--port", str(self.port),
            *flags, *self.config.args,
        ]

    def start(self) -> "SGLangServer":
        model = Path(self.config.model_path)
        if not (model / "config.json").exists():
            raise ServerError(f"model path {model} has no config.json (build it: saria-make-tiny-models)")
        for attempt in range(PORT_ATTEMPTS):
            if port_in_use(self.port, self.config.host):
                raise ServerError(f"port {self.port} on {self.config.host} is already in use")
            try:
                return self._start_once()
            except PortTaken:
                # Another process bound the free port we picked while the server was starting.
                if self.config.port is not None or attempt == PORT_ATTEMPTS - 1:
                    raise
                earlier = self.log_path.with_name(f"{self.log_path.name}.start{attempt + 1}")
                self.log_path.replace(earlier)
                self.earlier_logs.append(earlier)
                self.port = free_port(self.config.host)
        raise AssertionError("unreachable")

    def _start_once(self) -> "SGLangServer":
        env = dict(os.environ, **self.config.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS_DIR))
        # stop() signals the whole process group, so the server sees its scheduler "crash" and would
        # sleep 5 s and py-spy it before exiting: diagnostics of a stop it asked for (override in env)
        env.setdefault("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
        env.setdefault("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "0")
        log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            cwd=self.config.cwd,
        )
        log.close()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"sglang server exited with code {self.process.returncode}:\n{self.log_tail()}")
            if BIND_ERROR in self.log_tail(20):
                raise PortTaken(f"port {self.port} was taken while the server started:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise ServerError(f"sglang server not healthy after {self.config.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        stop_process_group(self.process)

    def kill(self) -> None:
        """SIGKILL every process of the server at once, as a crash or the OOM killer would:
        nothing is flushed, closed or detached (the fault tests restart on what it left)."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def post(self, path: str, payload: dict, timeout: float = 300.0) -> dict:
        request = urllib.request.Request(
            f"{self.url}{path}", json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as err:
            raise ServerError(f"POST {path} -> HTTP {err.code}: {err.read().decode(errors='replace')[:500]}") from err

    def generate(self, input_ids: list[int], max_new_tokens: int = 4, top_logprobs: int = 5) -> dict:
        """Greedy generation that returns output logprobs (the exact-equality check)."""
        return self.post("/generate", {
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
            "return_logprob": True,
            "top_logprobs_num": top_logprobs,
        })

    def generate_stream(
        self,
        input_ids: list[int],
        max_new_tokens: int = 4,
        top_logprobs: int = 5,
        ignore_eos: bool = False,
        rid: str | None = None,
        first_chunk: threading.Event | None = None,
    ) -> "StreamedResult":
        """Greedy streamed generation: when each chunk arrived, and the last chunk (SGLang
        streams cumulative output, so it holds the whole result, logprobs included).
        ``first_chunk`` is set when the first chunk arrives; ``rid`` names the request (for
        `/abort_request`)."""
        payload = {
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": ignore_eos},
            "return_logprob": True,
            "top_logprobs_num": top_logprobs,
            "stream": True,
            **({"rid": rid} if rid else {}),
        }
        request = urllib.request.Request(
            f"{self.url}/generate", json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        sent = time.monotonic()
        times: list[float] = []
        last: dict = {}
        with urllib.request.urlopen(request, timeout=300) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                times.append(time.monotonic())
                last = json.loads(line[len("data:") :])
                if first_chunk is not None:
                    first_chunk.set()
        return StreamedResult(sent, times, last)

    def abort(self, rid: str) -> None:
        """Abort request ``rid`` (SGLang's `/abort_request`, which answers with an empty body)."""
        request = urllib.request.Request(
            f"{self.url}/abort_request", json.dumps({"rid": rid}).encode(), {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=30).read()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return response.read().decode()

    def wait_storage_writes(self, timeout_s: float = 120.0) -> None:
        """Wait until the saria store has acknowledged every write HiCache requested and no
        write-through is still being copied to host memory (at its ack it asks the store for its
        nodes' writes), as an agent's next turn finds it after its think time (WEKA: 154 s mean
        gap). Both gauges are set on the scheduler thread before a request's response leaves, so
        a caller that has its responses sees every write they caused. An acknowledged write is
        durable in the store's index."""
        deadline = time.monotonic() + timeout_s
        while True:
            metrics = saria_metrics(self.metrics())
            if not any(metrics.get(name, 0) for name in WRITES_PENDING):
                return
            if time.monotonic() > deadline:
                raise ServerError(f"store writes still in flight after {timeout_s:.0f} s")
            time.sleep(0.05)

    def wait_counters_saved(self, timeout_s: float = 60.0) -> None:
        """Wait until every admission counter change is durable in the saria store's index
        (`sglang:saria_counters_unsaved` is 0), so a restart now keeps them all."""
        deadline = time.monotonic() + timeout_s
        while saria_metrics(self.metrics()).get("sglang:saria_counters_unsaved", 0):
            if time.monotonic() > deadline:
                raise ServerError(f"admission counters still unsaved after {timeout_s:.0f} s")
            time.sleep(0.05)

    def flush_cache(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/flush_cache", method="POST"), timeout=30).read()


# Server environment of the tests' saria servers: the KV audit checks the bytes of every
# page that moves between device, host and store; the tier audit the tree's locations.
AUDIT_ENV = {"SGLANG_SARIA_AUDIT_KV": "1", "SGLANG_SARIA_AUDIT_TIERS": "1"}


def kv_audit_pages(metrics: dict[str, float], path: str, pool: str = "") -> float:
    """Pages the KV audit checked on ``path`` (all pools, or one: "kv", "mamba")."""
    name = f"sglang:saria_kv_audit_pages_total/{path}/"
    return sum(v for k, v in metrics.items() if k.startswith(name) and k.endswith(pool))


def assert_kv_audit_clean(metrics: dict[str, float], paths: tuple[str, ...]) -> None:
    """The KV audit checked pages on each of ``paths`` and found no page changed anywhere."""
    checked = {p: kv_audit_pages(metrics, p) for p in paths}
    assert all(checked.values()), f"KV audit checked no page on some path: {checked}"
    errors = {k: v for k, v in metrics.items() if k.startswith("sglang:saria_kv_audit_errors_total") and v}
    assert not errors, f"KV audit found moved pages that differ from what was computed: {errors}"


# Labels that split a saria metric into "name/value" entries; other labels are summed over.
SPLIT_LABELS = ("event", "source", "target", "reason", "tier", "path", "pool", "state", "kind")


def saria_metrics(text: str) -> dict[str, float]:
    """`sglang:saria_*` samples of a /metrics page, summed over labels except those in
    SPLIT_LABELS: `sglang:saria_reload_tokens_total/ssd` is the `source="ssd"` sample."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("sglang:saria_"):
            continue
        sample, value = line.rsplit(" ", 1)
        name = sample.split("{")[0]
        for label in SPLIT_LABELS:
            if f'{label}="' in sample:
                name += "/" + sample.split(f'{label}="')[1].split('"')[0]
        values[name] = values.get(name, 0.0) + float(value)
    return values


def cached_tokens(result: dict) -> dict[str, int]:
    """Cached prompt tokens by tier as SGLang reports them: device, host, storage."""
    meta = result["meta_info"]
    details = meta.get("cached_tokens_details") or {}
    tiers = {tier: int(details.get(tier, 0)) for tier in ("device", "host", "storage")}
    if not details:
        tiers["device"] = int(meta.get("cached_tokens", 0))
    return tiers


def logprob_trace(result: dict) -> list:
    """Output tokens with their logprobs and top-k alternatives."""
    meta = result["meta_info"]
    return [meta["output_token_logprobs"], meta.get("output_top_logprobs")]


# Cached-vs-cold logprob tolerance. Stock SGLang 0.5.23 (plain radix cache, no HiCache)
# differs from `--disable-radix-cache` by up to 3.9e-3 on some CPUs (a cached prefix runs
# prefill attention with other shapes, and CPU kernels pick shape-dependent paths); wrong
# KV moves the tiny models' logprobs by 3e-2 and more (tests/test_oracle_tolerance.py).
# 1e-2 sits 2.5x above the first and 3x below the second.
LOGPROB_TOLERANCE = 1e-2


@dataclass
class LogprobDiff:
    """How one run's output differs from a reference run of the same prompt."""

    same_tokens: bool  # the greedy output tokens are identical
    max_abs: float  # largest |logprob difference|: output tokens, and top-k values rank by rank

    def within(self, tolerance: float = LOGPROB_TOLERANCE) -> bool:
        return self.same_tokens and self.max_abs <= tolerance


def logprob_diff(result: dict | list, reference: dict | list) -> LogprobDiff:
    """Compare two `/generate` results (or their `logprob_trace`s) step by step.

    Top-k alternatives are compared by rank, not by id: two near-tied alternatives may swap
    places within the tolerance, which leaves the k-th best logprob where it was.
    """
    (tokens, tops), (ref_tokens, ref_tops) = (r if isinstance(r, list) else logprob_trace(r) for r in (result, reference))
    same = [int(t[1]) for t in tokens] == [int(t[1]) for t in ref_tokens]
    pairs = [(float(a[0]), float(b[0])) for a, b in zip(tokens, ref_tokens)]
    for top, ref_top in zip(tops or [], ref_tops or []):
        ranked = sorted((float(e[0]) for e in top or []), reverse=True)
        ref_ranked = sorted((float(e[0]) for e in ref_top or []), reverse=True)
        same = same and len(ranked) == len(ref_ranked)
        pairs += list(zip(ranked, ref_ranked))
    return LogprobDiff(same, max((abs(a - b) for a, b in pairs), default=0.0))


def assert_matches_cold(result: dict, cold: dict, what: str = "", tolerance: float = LOGPROB_TOLERANCE) -> None:
    """The cached run's greedy tokens equal the cold run's, logprobs within ``tolerance``."""
    diff = logprob_diff(result, cold)
    assert diff.same_tokens, f"{what}: greedy tokens differ from the cold run"
    assert diff.max_abs <= tolerance, f"{what}: logprobs differ from the cold run by {diff.max_abs:.2e} > {tolerance:.0e}"
