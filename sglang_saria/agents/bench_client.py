"""Run SGLang's own benchmark client, `python -m sglang.bench_serving`, against a server.

Why a subprocess of the real CLI: the point is that a client written by someone else
works against a `saria` server, so it runs exactly as a user would run it, and its JSON
result (per-request TTFTs, errors, SGLang's cache report by tier) is read back.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class BenchResult:
    requests: int
    completed: int
    errors: list[str]  # non-empty error strings of failed requests
    ttfts_s: list[float]  # successful requests
    cache: dict  # bench_serving's cache_report: device/host/storage_cached_tokens, ...

    @property
    def storage_tokens(self) -> int:
        return int(self.cache.get("storage_cached_tokens") or 0)

    @property
    def mean_ttft_ms(self) -> float:
        return statistics.fmean(self.ttfts_s) * 1e3

    @property
    def p90_ttft_ms(self) -> float:
        return statistics.quantiles(self.ttfts_s, n=10, method="inclusive")[-1] * 1e3


@dataclass
class BenchClient:
    """A started `bench_serving` process; ``result`` waits for it and reads its output."""

    process: subprocess.Popen
    client: str
    out: Path
    log: Path
    timeout_s: float

    def result(self) -> BenchResult:
        try:
            returncode = self.process.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"{self.client} still running after {self.timeout_s:.0f} s (log {self.log})") from None
        if returncode != 0 or not self.out.exists():
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{self.client} exited with {returncode} (log {self.log}):\n{tail}")
        result = json.loads(self.out.read_text().splitlines()[-1])
        errors = [e for e in result.get("errors", []) if e]
        ttfts = [t for t, e in zip(result["ttfts"], result["errors"]) if not e]
        return BenchResult(len(result["errors"]), int(result["completed"]), errors, ttfts, result.get("cache_report") or {})

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_bench_serving(
    base_url: str, tokenizer: Path, dataset_args: list[str], out_dir: Path, timeout_s: float = 600.0,
    client: tuple[str, ...] = ("sglang.bench_serving",), ready_timeout_s: int = 60,
) -> BenchClient:
    """Start `--backend sglang-oai-chat` (the OpenAI chat endpoint) with `dataset_args`, cache
    report on. ``client``: the module to run and its own arguments (SGLang's client, or a
    wrapper of it that takes the same flags, e.g. `sglang_saria.bench.think_serving
    --think-times FILE`). The client waits up to ``ready_timeout_s`` for the server's
    `/v1/models` (its `--ready-check-timeout-sec`), so it may start while the server does:
    its imports (about 15 s on 2 cores) then overlap the server's start."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "bench_serving.jsonl"
    out.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", *client,
        "--backend", "sglang-oai-chat", "--base-url", base_url, "--tokenizer", str(tokenizer),
        "--cache-report", "--output-details", "--output-file", str(out), "--disable-tqdm", "--seed", "1",
        "--ready-check-timeout-sec", str(ready_timeout_s), *dataset_args,
    ]
    log = out_dir / "bench_serving.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    return BenchClient(process, client[0], out, log, timeout_s)


def run_bench_serving(
    base_url: str, tokenizer: Path, dataset_args: list[str], out_dir: Path, timeout_s: float = 600.0,
    client: tuple[str, ...] = ("sglang.bench_serving",),
) -> BenchResult:
    """`start_bench_serving` against a running server, and its result."""
    return start_bench_serving(base_url, tokenizer, dataset_args, out_dir, timeout_s, client).result()
