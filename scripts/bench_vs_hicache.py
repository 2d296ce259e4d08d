#!/usr/bin/env python
"""Head-to-head: stock SGLang HiCache (`file` storage backend) vs saria, same agent workload.

One multi-turn agent workload, WEKA Claude Code sessions shortened to fit the tiny model
(`sglang_saria.agents.weka_chat`), replayed by SGLang's own client (`python -m
sglang.bench_serving --backend sglang-oai-chat --dataset-name agentic-trace`) against one
fresh server and store per configuration, same pools (device, host = ratio x device),
same write-through from device to host (SGLang's default):

- `hicache-file`: stock HiCache, `file` backend: every page that enters host memory is
  written to storage (the baseline every ratio refers to, measured in the same run);
- `saria/full-duplicate`: the saria store writing every page too (same admission as stock);
- `saria/eviction:E2`: saria's default, persisting a node at its second host eviction.

Reported per configuration: SSD bytes written (stock: the page files' bytes; saria: the
store's `sglang:saria_ssd_bytes_written_total`), storage-hit tokens (SGLang's cache report),
TTFT mean and P90, each also as a ratio to stock. With `--repeats N`, medians over N runs.

    python scripts/bench_vs_hicache.py [--repeats 3] [--turns 10] [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from make_tiny_models import FULL_ATTENTION, build  # noqa: E402

from sglang_saria.agents.bench_client import run_bench_serving  # noqa: E402
from sglang_saria.agents.weka_chat import weka_conversations, write_agentic_trace  # noqa: E402
from sglang_saria.launcher import SGLangServer, ServerConfig, hicache_args, saria_metrics  # noqa: E402

POOLS = ["--page-size", "16", "--max-total-tokens", "1024", "--dtype", "bfloat16", "--enable-cache-report"]
STORE_CAPACITY = "64MiB"  # saria's store; the file backend has no bound (the run stays below it)
CONFIGS = ("hicache-file", "saria/full-duplicate", "saria/eviction:E2")
METRICS = (  # (key, label, format)
    ("ssd_bytes", "SSD bytes written", "{:.0f}"),
    ("storage_tokens", "storage-hit tokens", "{:.0f}"),
    ("ttft_mean_ms", "TTFT mean (ms)", "{:.1f}"),
    ("ttft_p90_ms", "TTFT P90 (ms)", "{:.1f}"),
)


@dataclass
class Run:
    config: str
    requests: int
    failed: int
    ssd_bytes: float
    storage_tokens: float
    ttft_mean_ms: float
    ttft_p90_ms: float


def server_args(config: str, store: Path) -> list[str]:
    if config == "hicache-file":
        return hicache_args("file", {"file_storage_path": str(store)})
    admission = config.split("/", 1)[1]
    return hicache_args("saria", {"data_dirs": [str(store)], "admission": admission, "capacity": STORE_CAPACITY})


def file_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def run_one(config: str, model: Path, dataset: list[str], work: Path) -> Run:
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    log = work / "server.log"
    with SGLangServer(ServerConfig(model, args=POOLS + server_args(config, store), log_path=log)) as server:
        result = run_bench_serving(server.url, model, dataset, work / "client")
        metrics = saria_metrics(server.metrics())
    written = file_bytes(store) if config == "hicache-file" else metrics.get("sglang:saria_ssd_bytes_written_total", 0.0)
    return Run(config, result.requests, len(result.errors), written, result.storage_tokens,
               result.mean_ttft_ms, result.p90_ttft_ms)


def median_run(runs: list[Run]) -> Run:
    return Run(runs[0].config, runs[0].requests, max(r.failed for r in runs),
               *(statistics.median(getattr(r, key) for r in runs) for key, _, _ in METRICS))


def table(runs: dict[str, Run], markdown: bool) -> str:
    base = runs[CONFIGS[0]]
    head = ["metric", *[f"{c}" for c in CONFIGS], *[f"{c} / stock" for c in CONFIGS[1:]]]
    rows = []
    for key, label, fmt in METRICS:
        values = [getattr(runs[c], key) for c in CONFIGS]
        ratios = [v / getattr(base, key) if getattr(base, key) else float("nan") for v in values[1:]]
        rows.append([label, *[fmt.format(v) for v in values], *[f"{r:.2f}" for r in ratios]])
    rows.append(["failed requests", *[f"{runs[c].failed}/{runs[c].requests}" for c in CONFIGS], "", ""])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt_row = lambda r: "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt_row(head), "-" * (sum(widths) + 2 * len(widths)), *map(fmt_row, rows)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="model dir (default: build models/qwen3-tiny)")
    ap.add_argument("--weka", type=Path, default=None, help="weka-cc trace dir (default: ../shared/traces/weka-cc)")
    ap.add_argument("--turns", type=int, default=10, help="turns per WEKA session (default 10)")
    ap.add_argument("--max-chars", type=int, default=700, help="longest conversation, in tokens (default 700)")
    ap.add_argument("--output-len", type=int, default=4, help="tokens per reply (default 4)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per configuration; medians reported (default 1)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--work-dir", type=Path, default=None, help="stores, logs, client output (default: a temp dir)")
    args = ap.parse_args()

    model = args.model or build(FULL_ATTENTION, REPO / "models")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="saria-vs-hicache-"))
    work.mkdir(parents=True, exist_ok=True)
    conversations = weka_conversations(turns=args.turns, max_chars=args.max_chars, weka=args.weka)
    trace = write_agentic_trace(work / "weka-agentic.json", conversations)
    dataset = ["--dataset-name", "agentic-trace", "--dataset-path", str(trace),
               "--num-prompts", str(len(conversations)), "--sharegpt-output-len", str(args.output_len)]
    print(f"{len(conversations)} WEKA agent sessions, {sum(map(len, conversations))} turns, "
          f"{args.repeats} run(s) per configuration; work dir {work}")
    runs: dict[str, list[Run]] = {c: [] for c in CONFIGS}
    jobs = [(c, i) for i in range(args.repeats) for c in CONFIGS]
    for config, i in tqdm(jobs, desc="servers"):
        runs[config].append(run_one(config, model, dataset, work / f"{config.replace('/', '_')}-{i}"))
    print(table({c: median_run(r) for c, r in runs.items()}, args.markdown))
    failed = sum(r.failed for rs in runs.values() for r in rs)
    if failed:
        print(f"FAIL: {failed} requests failed (see {work}/*/client/bench_serving.log)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
