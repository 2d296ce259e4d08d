"""Head-to-head serving benchmarks: configurations, one measured server run, medians, tables.

Why one module: `scripts/bench_vs_hicache.py` (stock HiCache against saria) and
`saria-fig10` (Figure 10 on the real server: every admission policy against
DRAM only and stock HiCache) run the same thing, a WEKA agent workload replayed by SGLang's
own client against one fresh server and store per configuration, with the same pools, and
read the same numbers back (SSD bytes written, cached tokens by tier, TTFT, failures, the KV
audit). Only the list of configurations and the workload's size differ.

Configuration names: `dram-only` (HiCache, no storage backend), `hicache-file` (stock
HiCache with its `file` backend: every page that enters host memory written through), and
any saria admission policy name (`full-duplicate`, `eviction:E2`, `budget:0.5`, `auto`, ...;
`sglang_saria.policy_names`), optionally written `saria/<policy>`.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from sglang_saria import policy_names
from sglang_saria.agents.bench_client import BenchClient, BenchResult, start_bench_serving
from sglang_saria.agents.weka_chat import AGENTS, weka_conversations, write_agentic_trace
from sglang_saria.bench.file_writes import FileWriteCounter
from sglang_saria.launcher import AUDIT_ENV, SGLangServer, ServerConfig, free_port, hicache_args, saria_metrics
from sglang_saria.replay.report import md_table

DRAM_ONLY = "dram-only"
HICACHE_FILE = "hicache-file"
STOCK = (DRAM_ONLY, HICACHE_FILE)
# Server environment: the scheduler forks instead of re-importing SGLang (CPU rig patch 016: a start
# takes 24 s instead of 39 s on 2 cores), and the host pool's 10 GiB free-memory reserve
# (CPU rig patch 015) is 1 GiB, as in the tests: the pools here are a few MiB.
SERVER_ENV = {"SGLANG_MP_START_METHOD": "fork", "SGLANG_HICACHE_HOST_MEMORY_RESERVE_GB": "1"}


# A hybrid server's GDN checkpoint spacing, tokens (as in the hybrid tests): a prefix is
# reusable up to its last checkpoint, so a growing conversation keeps all but < 64 tokens.
MAMBA_TRACK_INTERVAL = 64
# A hybrid server's device state slots (`--max-mamba-cache-size`)
MAMBA_CACHE_SIZE = 16


class BenchError(RuntimeError):
    """A run the benchmark must not report: a failed request or a KV audit mismatch."""


@dataclass(frozen=True)
class Pools:
    """Device pool, host pool (``hicache_ratio`` x device) and the saria store, in tokens:
    the same for every configuration of a run (the `file` backend has no bound)."""

    page_size: int = 16
    device_tokens: int = 1024
    hicache_ratio: float = 2.0
    store_tokens: int = 4096
    hybrid: bool = False  # GDN hybrid model: mamba slots, 4 running requests
    server_warmup: bool = False  # SGLang's warmup request (it leaves a few cached pages behind)
    dtype: str = ""  # the served dtype ("": bfloat16, float16 for a hybrid: exact on CPU); see `serving_dtype`
    # torch threads of the server's forward passes (0: torch's default, one per core); see `server_env`
    compute_threads: int = 0

    @property
    def checkpoint_tokens(self) -> int:
        """A hybrid's GDN checkpoint grid (`--mamba-track-interval`): SGLang caches a prefix up
        to its last grid point, with one state there (`extra_buffer`), and the replay places its
        checkpoints the same way (`MetadataConfig.checkpoint_placement = "prefix-end"`)."""
        return MAMBA_TRACK_INTERVAL if self.hybrid else 0

    @property
    def host_tokens(self) -> int:
        return int(self.device_tokens * self.hicache_ratio)

    @property
    def host_state_slots(self) -> int:
        """A hybrid's host pool of GDN states, besides its FA pages: SGLang sizes it the device's
        slots x ``hicache_ratio``, plus one (`pool_host/mamba.py`: pages of one state)."""
        return int(MAMBA_CACHE_SIZE * self.hicache_ratio) + 1 if self.hybrid else 0

    def validate(self) -> "Pools":
        if self.compute_threads < 0:
            raise ValueError(f"compute_threads={self.compute_threads}: must be >= 0 (0: torch's default)")
        for name in ("page_size", "device_tokens", "store_tokens"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name}={value}: must be > 0")
        if self.device_tokens % self.page_size:
            raise ValueError(f"device_tokens={self.device_tokens}: must be a multiple of page_size={self.page_size}")
        if self.hicache_ratio <= 1:
            raise ValueError(f"hicache_ratio={self.hicache_ratio}: must be > 1 (SGLang's host pool exceeds the device's)")
        return self

    def server_env(self) -> dict[str, str]:
        """`SERVER_ENV`, and ``compute_threads`` as OMP_NUM_THREADS. Why: on a CPU server the
        forward pass runs in torch's OpenMP threads, and a parallel region waits for its
        slowest thread; with one thread per core, any other thread that runs (the store's
        writes, HiCache's copies, the client) stalls every matmul, so a configuration is charged
        for its I/O many times over. Fewer compute threads than cores leave the I/O its own
        core, as a GPU host's prefill never waits for its host threads."""
        threads = {"OMP_NUM_THREADS": str(self.compute_threads)} if self.compute_threads else {}
        return {**SERVER_ENV, **threads}

    def flags(self) -> list[str]:
        dtype = ["--dtype", self.dtype or ("float16" if self.hybrid else "bfloat16")]
        if self.hybrid:
            dtype += ["--max-mamba-cache-size", str(MAMBA_CACHE_SIZE), "--max-running-requests", "4", "--mamba-radix-cache-strategy",
                      "extra_buffer", "--mamba-track-interval", str(self.checkpoint_tokens)]
        warmup = [] if self.server_warmup else ["--skip-server-warmup"]
        return ["--page-size", str(self.page_size), "--max-total-tokens", str(self.device_tokens), *dtype,
                "--enable-cache-report", *warmup]


def serving_dtype(model: Path) -> str:
    """The dtype a model is served in: float32 where it is saved so (the benchmark models: bf16
    GEMMs are ~300x slower on CPUs without AVX-512 BF16 or AMX), else the tests' default ("")."""
    config = json.loads((Path(model) / "config.json").read_text())
    return "float32" if (config.get("torch_dtype") or config.get("dtype")) == "float32" else ""


@dataclass(frozen=True)
class BenchConfig:
    """One server configuration: stock HiCache without storage or with its `file` backend,
    or saria with one admission policy (and optional extra policy settings)."""

    name: str
    backend: str  # "none" | "file" | "saria"
    admission: str | None = None
    admission_extra: tuple[tuple[str, object], ...] = ()  # AdmissionConfig fields besides the policy
    file_max_bytes: int = 0  # the `file` backend's cap (SGLang's `max_size`: LRU files deleted); 0 unbounded

    @property
    def saria(self) -> bool:
        return self.backend == "saria"

    def server_args(self, pools: Pools, store: Path) -> list[str]:
        ratio = pools.hicache_ratio
        if self.backend == "none":
            return ["--enable-metrics", "--enable-hierarchical-cache", "--hicache-ratio", str(ratio)]
        if self.backend == "file":
            cap = {"max_size": str(self.file_max_bytes)} if self.file_max_bytes else {}
            return hicache_args("file", {"file_storage_path": str(store), **cap}, ratio)
        admission = {"policy": self.admission, **dict(self.admission_extra)}
        extra = {"data_dirs": [str(store)], "admission": admission, "capacity": f"{pools.store_tokens} tokens"}
        return hicache_args("saria", extra, ratio)


def parse_config(name: str, admission_extra: dict | None = None, flag: str = "--configs") -> BenchConfig:
    """A configuration by name; ValueError names ``flag`` and the value, and lists the forms."""
    if name == DRAM_ONLY:
        return BenchConfig(name, "none")
    if name == HICACHE_FILE:
        return BenchConfig(name, "file")
    policy = name.removeprefix("saria/")
    try:
        kind = policy_names.parse(policy).kind
    except ValueError as e:
        raise ValueError(f"{flag}: {name!r}: not {DRAM_ONLY}, {HICACHE_FILE} or a saria policy ({e})") from None
    if kind in policy_names.REPLAY_ONLY or kind == "none":
        raise ValueError(f"{flag}: {name!r}: a server cannot run it (use {DRAM_ONLY} for no storage)")
    extra = tuple(sorted((admission_extra or {}).items())) if kind in ("budget", "auto", "loadaware") else ()
    return BenchConfig(name, "saria", policy, extra)


@dataclass(frozen=True)
class Workload:
    """WEKA agent sessions shortened to fit the model (`weka_chat`), replayed concurrently.

    ``think_scale``: each turn waits the trace's idle gap before it times this (0: back to back;
    capped at ``think_cap_s``), so DRAM ages between turns as it does between an agent's
    requests. ``chars_per_block``: tokens per 64-token WEKA block (byte-level tokenizer)."""

    sessions: tuple[str, ...] = AGENTS
    turns: int = 10
    max_chars: int = 700
    chars_per_block: int = 1
    output_len: int = 4
    think_scale: float = 0.0
    think_cap_s: float = 5.0
    weka: Path | None = None
    client_warmup: int = 0  # the client's warmup replays whole conversations first (and leaves them cached)

    def validate(self) -> "Workload":
        for name in ("turns", "max_chars", "chars_per_block", "output_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)}: must be > 0")
        if self.think_scale < 0 or self.think_cap_s < 0:
            raise ValueError(f"think_scale={self.think_scale}, think_cap_s={self.think_cap_s}: must be >= 0")
        return self


@dataclass
class Prepared:
    """A workload written out for the client: the agentic-trace JSON and the think times."""

    conversations: list[list[dict]]
    think_s: list[list[float]]  # per conversation, per round (round 0: its start)
    trace: Path
    think_path: Path | None
    dataset_args: list[str]

    @property
    def requests(self) -> int:
        return sum(map(len, self.conversations))


def think_times(workload: Workload, conversations: list[list[dict]]) -> list[list[float]]:
    """The trace's idle gap before each turn, times ``think_scale``, capped; 0 before the first."""
    from sglang_saria.replay.agent_prompts import weka_dir
    from sglang_saria.replay.loaders.weka import load_weka_file

    path = workload.weka or weka_dir()
    files = sorted({path / f"{name.split('/')[0]}.json.gz" for name in workload.sessions})
    loaded = {s.session_id: s for f in files if f.exists() for s in load_weka_file(f, 64)}
    out = []
    for name, conversation in zip(workload.sessions, conversations):
        gaps = [r.idle_before_s for r in loaded[name].requests[: len(conversation)]]
        out.append([0.0] + [min(g * workload.think_scale, workload.think_cap_s) for g in gaps[1:]])
    return out


def prepare(workload: Workload, work: Path) -> Prepared:
    """Write the trace (and the think times, when the workload has them) under ``work``."""
    workload.validate()
    conversations = weka_conversations(workload.turns, workload.sessions, workload.chars_per_block,
                                       workload.max_chars, workload.weka)
    trace = write_agentic_trace(work / "weka-agentic.json", conversations)
    think = think_times(workload, conversations) if workload.think_scale > 0 else [[0.0] * len(c) for c in conversations]
    think_path = None
    if workload.think_scale > 0:
        think_path = work / "think-times.json"
        think_path.write_text(json.dumps({c[0]["messages"][0]["content"]: t for c, t in zip(conversations, think)}))
    dataset = ["--dataset-name", "agentic-trace", "--dataset-path", str(trace), "--num-prompts", str(len(conversations)),
               "--sharegpt-output-len", str(workload.output_len), "--warmup-requests", str(workload.client_warmup)]
    return Prepared(conversations, think, trace, think_path, dataset)


@dataclass
class ClientRun:
    """SGLang's client result plus the per-request details the replay comparison needs."""

    result: BenchResult
    input_lens: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    ttfts_all_s: list[float] = field(default_factory=list)


def start_client(url: str, model: Path, prepared: Prepared, out_dir: Path, timeout_s: float = 900.0,
                 ready_timeout_s: int = 60) -> BenchClient:
    """SGLang's `bench_serving` against ``url`` (`bench_client.start_bench_serving`); with think
    times, the same client through `think_serving` (one hook that sleeps before each round)."""
    client = ("sglang.bench_serving",)
    if prepared.think_path is not None:
        client = ("sglang_saria.bench.think_serving", "--think-times", str(prepared.think_path))
    return start_bench_serving(url, model, prepared.dataset_args, out_dir, timeout_s, client, ready_timeout_s)


def client_run(client: BenchClient, out_dir: Path) -> ClientRun:
    return ClientRun(client.result(), **_details(out_dir / "bench_serving.jsonl"))


def _details(path: Path) -> dict:
    raw = json.loads(path.read_text().splitlines()[-1])
    return {"input_lens": list(raw.get("input_lens", [])), "cached": [int(c or 0) for c in raw.get("cached_tokens", [])],
            "ttfts_all_s": list(raw.get("ttfts", []))}


@dataclass
class RunResult:
    """One configuration, one server: what the benchmark reports (medians over repeats)."""

    config: str
    requests: int
    failed: int
    ssd_bytes: float
    device_tokens: float
    host_tokens: float
    storage_tokens: float
    ttft_mean_ms: float
    ttft_p90_ms: float
    store_evictions: float = 0.0
    audit_pages: float = 0.0
    audit_errors: float = 0.0
    wall_s: float = 0.0
    store_bytes_held: float = 0.0  # `file` backend: bytes on disk once its writes settled (its cap's effect)


# (key, label, format): the table's rows, in order
METRICS = (
    ("ssd_bytes", "SSD bytes written", "{:.0f}"),
    ("device_tokens", "device-hit tokens", "{:.0f}"),
    ("host_tokens", "host-hit tokens", "{:.0f}"),
    ("storage_tokens", "storage-hit tokens", "{:.0f}"),
    ("ttft_mean_ms", "TTFT mean (ms)", "{:.1f}"),
    ("ttft_p90_ms", "TTFT P90 (ms)", "{:.1f}"),
)
RATIO_KEYS = ("ssd_bytes", "ttft_mean_ms", "ttft_p90_ms")
RATIO_LABELS = {"ssd_bytes": "SSD writes", "ttft_mean_ms": "TTFT mean", "ttft_p90_ms": "TTFT P90"}


def file_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0


def settled_file_bytes(folder: Path, quiet_s: float = 1.0, timeout_s: float = 60.0) -> int:
    """The `file` backend's bytes once HiCache's write-through has stopped adding files."""
    deadline = time.monotonic() + timeout_s
    last = file_bytes(folder)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = file_bytes(folder)
        if now == last:
            return now
        last = now
    return last


def check_audit(config: BenchConfig, metrics: dict[str, float], where: Path) -> tuple[float, float]:
    """(pages the KV audit checked, mismatches). A mismatch is printed at once and kept in the
    run (the benchmark finishes, writes its JSON, and then fails: `fail_if_unclean`); an audit
    that checked nothing was not on, and stops the benchmark."""
    pages = sum(v for k, v in metrics.items() if k.startswith("sglang:saria_kv_audit_pages_total"))
    errors = {k: v for k, v in metrics.items() if k.startswith("sglang:saria_kv_audit_errors_total") and v}
    if errors:
        print(f"KV AUDIT MISMATCH: {config.name}: moved pages differ from what was computed: {errors} "
              f"(server log: {where / 'server.log'})", file=sys.stderr, flush=True)
    if not pages:
        raise BenchError(f"{config.name}: the KV audit checked no page (is {AUDIT_ENV} set on the server?)")
    return pages, float(sum(errors.values()))


def run_config(config: BenchConfig, model: Path, prepared: Prepared, pools: Pools, work: Path,
               audit: bool = True, when_done: Callable[[SGLangServer], None] | None = None) -> tuple[RunResult, ClientRun]:
    """One fresh server and store, the workload, the numbers. The KV audit (saria's: it
    checks every page saria moves; stock configurations have none) is on unless ``audit``
    is False. ``when_done`` gets the server once the numbers are read (it is idle then): a
    measurement that needs a server of this configuration spares starting another."""
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    # the `file` backend's writes are counted as they land (a bounded one deletes pages)
    counter = None
    if config.backend == "file":
        store.mkdir(mode=0o700, exist_ok=True)
        counter = FileWriteCounter(store)
    env = {**pools.server_env(), **(AUDIT_ENV if audit and config.saria else {})}
    started = time.monotonic()
    server_config = ServerConfig(model, args=pools.flags() + config.server_args(pools, store),
                                 port=free_port(), log_path=work / "server.log", env=env)
    # the client starts with the server and waits for it: its imports overlap the server's start
    early = start_client(f"http://{server_config.host}:{server_config.port}", model, prepared, work / "client",
                         ready_timeout_s=int(server_config.startup_timeout_s))
    try:
        with SGLangServer(server_config) as server:
            client = client_run(early, work / "client")
            if config.saria:
                server.wait_storage_writes()
            metrics = saria_metrics(server.metrics())
            (work / "saria-metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
            held = float(settled_file_bytes(store)) if counter is not None else 0.0
            written = counter.close() if counter is not None else metrics.get("sglang:saria_ssd_bytes_written_total", 0.0)
            counter = None
            if when_done is not None:
                when_done(server)
    finally:
        early.stop()
        if counter is not None:
            counter.close()
    pages, errors = check_audit(config, metrics, work) if audit and config.saria else (0.0, 0.0)
    result = client.result
    cache = result.cache
    run = RunResult(
        config.name, result.requests, len(result.errors), float(written),
        float(cache.get("device_cached_tokens") or 0), float(cache.get("host_cached_tokens") or 0),
        float(result.storage_tokens),
        result.mean_ttft_ms if result.ttfts_s else math.nan,
        result.p90_ttft_ms if len(result.ttfts_s) > 1 else math.nan,
        metrics.get("sglang:saria_store_evictions_total", 0.0), pages, errors, time.monotonic() - started, held,
    )
    return run, client


def median_result(runs: list[RunResult]) -> RunResult:
    """Medians of every measured number; failures and audit errors: the worst run's."""
    numbers = [f.name for f in fields(RunResult) if f.name not in ("config", "requests", "failed", "audit_errors")]
    med = {name: statistics.median(getattr(r, name) for r in runs) for name in numbers}
    return RunResult(runs[0].config, runs[0].requests, max(r.failed for r in runs), audit_errors=max(
        r.audit_errors for r in runs), **med)


def spread(runs: list[RunResult], key: str) -> float:
    """Run-to-run spread of ``key``: (max - min) / median (0 for one run)."""
    values = [getattr(r, key) for r in runs]
    med = statistics.median(values)
    return (max(values) - min(values)) / med if len(values) > 1 and med else 0.0


def ratio(value: float, base: float) -> float:
    return value / base if base else math.nan


def ratios(results: dict[str, RunResult], base: str, keys: tuple[str, ...] = RATIO_KEYS) -> dict[str, dict[str, float]]:
    """Each configuration's ``keys`` over ``base``'s, from the same run."""
    if base not in results:
        return {}
    ref = results[base]
    return {name: {k: ratio(getattr(r, k), getattr(ref, k)) for k in keys} for name, r in results.items()}


def _fmt_ratio(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.2f}"


def results_table(results: dict[str, RunResult], bases: tuple[str, ...] = (HICACHE_FILE, DRAM_ONLY)) -> str:
    """One row per configuration: metrics, failures, and SSD writes / TTFT as ratios to each base."""
    bases = tuple(b for b in bases if b in results)
    per_base = {b: ratios(results, b) for b in bases}
    keys = {b: [k for k in RATIO_KEYS if getattr(results[b], k)] for b in bases}  # dram-only writes nothing
    head = ["config", *(label for _, label, _ in METRICS), "failed"]
    for b in bases:
        head += [f"{RATIO_LABELS[k]} / {b}" for k in keys[b]]
    rows = []
    for name, r in results.items():
        row = [name, *(fmt.format(getattr(r, key)) for key, _, fmt in METRICS), f"{r.failed}/{r.requests}"]
        for b in bases:
            row += [_fmt_ratio(per_base[b][name][k]) for k in keys[b]]
        rows.append(row)
    return md_table(head, rows)


def to_json(results: dict[str, RunResult]) -> dict[str, dict]:
    return {name: asdict(r) for name, r in results.items()}


def fail_if_unclean(runs: dict[str, list[RunResult]]) -> None:
    """BenchError when any request failed or the KV audit found a mismatch in any run."""
    failed = {name: sum(r.failed for r in rs) for name, rs in runs.items() if any(r.failed for r in rs)}
    if failed:
        raise BenchError(f"failed requests per configuration: {failed}")
    audit = {name: sum(r.audit_errors for r in rs) for name, rs in runs.items() if any(r.audit_errors for r in rs)}
    if audit:
        raise BenchError(f"KV audit mismatches per configuration: {audit}")


def private_work_dir(prefix: str) -> Path:
    """A fresh directory only the user can read (stores hold KV pages: user data)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, 0o700)
    return path
