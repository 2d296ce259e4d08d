"""Shared fixtures: repository paths, the tiny local models (built once, never downloaded),
and one factory of real SGLang servers on CPU for every end-to-end test."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import pytest

from sglang_saria.launcher import AUDIT_ENV, SGLangServer, ServerConfig, saria_hicache_args

REPO_ROOT = Path(__file__).resolve().parent.parent
# Small stores in tmp dirs (storage, reload and hicache tests alike).
pytest_plugins = ["tests.store_fixtures"]
# The suite's servers hold a few KiB of host pool each; SGLang's 10 GiB free-memory reserve
# (CPU rig patch 015) would refuse a server while the other pytest workers' servers run.
os.environ.setdefault("SGLANG_HICACHE_HOST_MEMORY_RESERVE_GB", "1")
# The suite's servers run on CPU: their scheduler and detokenizer fork from the launched server
# instead of importing SGLang again (CPU rig patch 016; 24 s per start instead of 39 s, measured idle).
os.environ.setdefault("SGLANG_MP_START_METHOD", "fork")



@pytest.fixture(scope="module", autouse=True)
def environment_kept_per_file() -> Iterator[None]:
    """What a test file leaves in ``os.environ`` does not reach the next file on its worker:
    SGLang's in-process config code sets variables as a side effect (on the CPU rig, a
    ``ModelConfig`` of a hybrid model sets ``SGLANG_MAMBA_CONV_DTYPE`` to the model's dtype, rig
    patch 023), and a server a later file starts inherits them (a bf16 conv state under an
    fp16 hybrid model stops its scheduler)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


# Small pools so a few 300-token requests push a prefix out of the device (512 tokens)
# and out of the host pool (hicache ratio 2 -> about 1K tokens). No warmup request: the
# caches and the store hold only what a scenario put there.
SMALL_POOLS = ["--page-size", "16", "--max-total-tokens", "512", "--dtype", "bfloat16", "--skip-server-warmup"]
# The hybrid model in fp16 (the Triton-free GDN path is exact in it; bf16 is not under the
# interpreter), the same small pools, 16 mamba slots for up to 4 running requests.
HYBRID_POOLS = [
    "--dtype", "float16",
    "--page-size", "16",
    "--max-total-tokens", "512",
    "--max-mamba-cache-size", "16",
    "--max-running-requests", "4",
    "--skip-server-warmup",
]
# Chat servers (tokenizer on, SGLang's cache report): a 5-turn agent session is about 1700
# tokens, so a 2048-token device pool and a 4096-token host pool (ratio 2).
CHAT_POOLS = ["--page-size", "16", "--max-total-tokens", "2048", "--dtype", "bfloat16", "--enable-cache-report", "--skip-server-warmup"]
# Server tests start processes that take 20-50 s on a loaded 2-core machine; one test may
# start several. Everything else gets the ini default (pyproject.toml).
E2E_TIMEOUT_S = 900

ServerFactory = Callable[..., AbstractContextManager[SGLangServer]]
# Server test files that take longest (several servers or restarts each), longest first.
LONGEST_FILES = [
    "tests/e2e/test_counter_restart.py",
    "tests/e2e/test_admission.py",
    "tests/e2e/test_async_reload.py",
    "tests/agents/test_openai_client.py",
    "tests/cluster/test_cluster_e2e.py",
    "tests/e2e/test_hybrid.py",
    "tests/e2e/test_hicache_tiers.py",
    "tests/faults/test_store_faults_served.py",
    # marker slow (make test-slow)
    "tests/agents/test_bench_serving_client.py",
    "tests/e2e/test_hybrid_admission.py",
    "tests/faults/test_kill_loop.py",
    "tests/conformance/test_hicache_storage_backends.py",
    "tests/e2e/test_tp_agreement.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))
    # Server tests first, the longest files first (measured: `--durations`), the rest in file
    # order: xdist hands out whole files in this order, so the long ones start at once on every
    # worker and the quick ones fill the gaps at the end.
    def order(item: pytest.Item) -> tuple[bool, int]:
        path = item.nodeid.split("::", 1)[0]
        rank = LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)
        return item.get_closest_marker("e2e") is None, rank

    items.sort(key=order)


@pytest.fixture(scope="session")
def sglang_plugins() -> None:
    """SGLang's plugins loaded in the test process, as SGLang loads them in each of its own
    (sglang-saria's hooks applied): for tests that build SGLang's objects without a server."""
    from sglang.srt.plugins import load_plugins

    load_plugins()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


def _build_model(name: str) -> Path:
    """Build (or find) a tiny model; the lock keeps two xdist workers from writing it at once."""
    from sglang_saria import tiny_models

    models = REPO_ROOT / "models"
    models.mkdir(exist_ok=True)
    with open(models / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return tiny_models.build(getattr(tiny_models, name), models)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random full-attention Qwen3 model under models/ (built if missing)."""
    return _build_model("FULL_ATTENTION")


@pytest.fixture(scope="session")
def hybrid_model() -> Path:
    """The tiny random Qwen3.5-style hybrid (GDN + full attention) model under models/."""
    return _build_model("HYBRID")


def _server_factory(model: Path, pools: list[str], logs: pytest.TempPathFactory) -> ServerFactory:
    @contextmanager
    def start(args: list[str], env: dict[str, str] | None = None) -> Iterator[SGLangServer]:
        log = logs.mktemp("sglang-log") / "server.log"
        config = ServerConfig(model, args=pools + list(args), log_path=log, env=dict(env or {}))
        with SGLangServer(config) as server:
            yield server

    return start


@pytest.fixture(scope="session")
def start_server(tiny_model, tmp_path_factory) -> ServerFactory:
    """`with start_server(args, env) as server:` a tiny-model server, always stopped."""
    return _server_factory(tiny_model, SMALL_POOLS, tmp_path_factory)


@pytest.fixture(scope="session")
def start_hybrid_server(hybrid_model, tmp_path_factory) -> ServerFactory:
    """`with start_hybrid_server(args, env) as server:` a hybrid-model server, always stopped."""
    return _server_factory(hybrid_model, HYBRID_POOLS, tmp_path_factory)


@pytest.fixture(scope="session")
def start_chat_server(tiny_model, tmp_path_factory):
    """`with start_chat_server(store_dirs, admission, args) as server:` a tiny-model chat
    server with the saria store at ``store_dirs`` (one data dir, or a list: pages striped over
    them) and both audits on; ``args`` come last, so they override CHAT_POOLS (e.g. a smaller
    device pool)."""
    start = _server_factory(tiny_model, CHAT_POOLS, tmp_path_factory)

    def chat_server(store_dirs: Path | list[Path], admission: str = "full-duplicate", args: tuple[str, ...] = ()):
        dirs = store_dirs if isinstance(store_dirs, list) else [store_dirs]
        extra = {"data_dirs": [str(d) for d in dirs], "admission": admission, "capacity": "64MiB"}
        return start(saria_hicache_args(extra) + list(args), env=AUDIT_ENV)

    return chat_server


def _cold_runs(start: ServerFactory) -> Iterator[Callable[[list[int]], dict]]:
    """``cold(prompt)``: the greedy result of a server without prefix cache
    (`--disable-radix-cache`), started on first use, memoized per prompt."""
    with ExitStack() as stack:
        server: list[SGLangServer] = []
        results: dict[tuple[int, ...], dict] = {}

        def cold(prompt: list[int]) -> dict:
            if tuple(prompt) not in results:
                if not server:
                    server.append(stack.enter_context(start(["--disable-radix-cache"])))
                results[tuple(prompt)] = server[0].generate(prompt)
            return results[tuple(prompt)]

        yield cold


@pytest.fixture(scope="session")
def cold_run(start_server) -> Iterator[Callable[[list[int]], dict]]:
    """The reference every cached tiny-model run is compared with (tolerance oracle)."""
    yield from _cold_runs(start_server)


@pytest.fixture(scope="session")
def cold_hybrid_run(start_hybrid_server) -> Iterator[Callable[[list[int]], dict]]:
    """The same for the hybrid model."""
    yield from _cold_runs(start_hybrid_server)


@pytest.fixture(scope="session")
def run_interpreted():
    """run_interpreted(script) -> {case: result}: run a check script in a fresh Python with
    TRITON_INTERPRET=1 (it only takes effect before triton is imported, which this process may
    have done) and collect the JSON object it prints per line, keyed by its "case"."""

    def run(script: Path) -> dict[str, dict]:
        env = {
            **os.environ,
            "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout}\n{proc.stderr}"
        results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return {r["case"]: r for r in results}

    return run
