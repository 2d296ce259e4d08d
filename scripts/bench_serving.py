#!/usr/bin/env python
"""Serving benchmark: Saria policies on a real SGLang server, TTFT and SSD writes per policy.

Replays a few WEKA agent sessions (shortened: one token per 64-token block) through
`/generate` of one server per configuration, with small device and host pools so
prefixes are evicted and come back from host memory and from the SSD store:

- `cold`: `--disable-radix-cache`, the baseline every ratio refers to (same run);
- `<admission>/<reload>`: HiCache + the saria store, admission policy (full-duplicate,
  eviction:E2, ...) and reload path (`direct`: SSD -> device pool; `staged`: HiCache's
  prefetch into host memory).

TTFT is the latency of a one-token request (median over requests; also over the requests
that hit storage). `--check` fails unless every configuration returns the cold server's
greedy tokens with logprobs within `launcher.LOGPROB_TOLERANCE` and a clean KV audit
(every moved page keeps its bytes; the servers run with `AUDIT_ENV`). Runs on CPU (`--device cpu`, default) or GPU
(`--device cuda`: kvikio GDS engine, compiled Triton gather), see scripts/gpu_check.sh.

    python scripts/bench_serving.py [--device cuda] [--admission full-duplicate eviction:E2] --check

`--scenario concurrent` (issue 12): streaming decoders keep decoding while a stream of
requests hits prefixes that only the SSD store holds (a restarted server on a store a first
server wrote). Per reload path: the decoders' inter-token gaps while the hits arrive (p99,
max) and the SSD-hit TTFT, with ratios to HiCache's staged prefetch measured in the same run.
Paths: `direct` (the reload worker, off the scheduler thread), `staged` (HiCache's prefetch
into host memory), `blocking` (the direct reload with the scheduler thread waiting for
the reads, as before issue 12: `"transfer": {"blocking_reload": true}`, benchmark-only). On CPU the
tiny model's pages read in microseconds, so `--read-delay-s` (the store's test-only fault
injector `ReadDelay`, default 0.1 s per object read on CPU, 0 on GPU) stands for a slow drive.

    python scripts/bench_serving.py --scenario concurrent [--device cuda] [--json out.json --update-doc README.md]

`--json` keeps every run's raw records (each decoder gap, each hit's TTFT); `--update-doc`
rewrites the README's `<!-- decode-gap:NAME -->` blocks from that JSON, `--render-only` from one
committed earlier (docs/data/decode-gap.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from sglang_saria.bench import doc_blocks
from sglang_saria.launcher import (
    AUDIT_ENV,
    LOGPROB_TOLERANCE,
    SGLangServer,
    ServerConfig,
    cached_tokens,
    logprob_diff,
    logprob_trace,
    saria_hicache_args,
    saria_metrics,
)
from sglang_saria.replay.agent_prompts import agent_requests
from sglang_saria.tiny_models import FULL_ATTENTION, build

POOLS = ["--page-size", "16", "--max-total-tokens", "512", "--dtype", "bfloat16"]
GPU_FLAGS = ["--skip-tokenizer-init", "--mem-fraction-static", "0.2"]


@dataclass
class Run:
    name: str
    ttft_s: list[float] = field(default_factory=list)
    storage_ttft_s: list[float] = field(default_factory=list)
    traces: list = field(default_factory=list)
    tiers: dict[str, int] = field(default_factory=lambda: {"device": 0, "host": 0, "storage": 0})
    metrics: dict[str, float] = field(default_factory=dict)


def serve(
    name: str, model: Path, args: list[str], prompts: list[list[int]], device: str, log_dir: Path, audit: bool = False
) -> Run:
    """Serve ``prompts`` one by one; ``audit``: with the KV and tier audits on (they wait
    for every copy, so TTFTs of an audited run are not the product's)."""
    run = Run(name)
    flags = POOLS + (GPU_FLAGS if device == "cuda" else []) + args
    config = ServerConfig(
        model, args=flags, cpu=device == "cpu", log_path=log_dir / f"{name.replace('/', '_')}.log",
        env=AUDIT_ENV if audit else {},
    )
    with SGLangServer(config) as server:
        for prompt in tqdm(prompts, desc=name, leave=False):
            t = time.perf_counter()
            result = server.generate(prompt, max_new_tokens=1)
            ttft = time.perf_counter() - t
            tiers = cached_tokens(result)
            run.ttft_s.append(ttft)
            if tiers["storage"]:
                run.storage_ttft_s.append(ttft)
            for tier, n in tiers.items():
                run.tiers[tier] += n
            run.traces.append(logprob_trace(result))
        if "--enable-metrics" in args:
            run.metrics = saria_metrics(server.metrics())
    return run


def saria_args(admission: str, reload: str, data_dir: Path) -> list[str]:
    extra = {"data_dirs": [str(data_dir)], "admission": admission, "capacity": "64MiB"}
    if reload == "staged":
        extra["transfer"] = {"direct_reload": False}
    return saria_hicache_args(extra)


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3 if xs else float("nan")


def print_table(runs: list[Run], cold: Run) -> None:
    base = statistics.median(cold.ttft_s)
    head = (
        f"{'config':<28}{'TTFT ms':>9}{'x cold':>8}{'TTFT storage-hit ms':>21}"
        f"{'cached dev/host/ssd':>22}{'SSD MB written':>16}{'pages read dev/host':>21}{'promoted':>10}"
    )
    print(head)
    print("-" * len(head))
    for run in [cold, *runs]:
        m = run.metrics
        pages = f"{m.get('sglang:saria_store_pages_read_total/device', 0):.0f}/{m.get('sglang:saria_store_pages_read_total/host', 0):.0f}"
        cached = f"{run.tiers['device']}/{run.tiers['host']}/{run.tiers['storage']}"
        print(
            f"{run.name:<28}{median_ms(run.ttft_s):>9.1f}{statistics.median(run.ttft_s) / base:>8.2f}"
            f"{median_ms(run.storage_ttft_s):>21.1f}{cached:>22}"
            f"{m.get('sglang:saria_ssd_bytes_written_total', 0) / 1e6:>16.3f}{pages:>21}"
            f"{m.get('sglang:saria_promoted_tokens_total', 0):>10.0f}"
        )


@dataclass
class ConcurrentRun:
    name: str
    decode_gaps_s: list[float]  # inter-token gaps of the decoders while SSD hits arrive
    hit_ttft_s: list[float]
    storage_tokens: int  # reported by SGLang for the SSD-hit requests
    decoders_outlasted: bool  # every decoder still decoding when the last hit was served


def _prefix(seed: int, pages: int) -> list[int]:
    return [(seed * 97 + 13 * j) % 1000 + 5 for j in range(pages * 16)]


def percentile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs or [float("nan")])[0]


def serve_concurrent(
    name: str, model: Path, flags: list[str], hits: list[list[int]], args: argparse.Namespace, seed: int, log_dir: Path,
) -> ConcurrentRun:
    """Decoders stream ``args.decode_tokens`` tokens each; once all decode, one SSD-hit
    request every ``args.hit_interval_s``; gaps counted from the first hit sent to the
    last hit's first token."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Event

    decoders = [[(seed * 31 + 7 * j + 101 * d) % 900 + 50 for j in range(32)] for d in range(args.decoders)]
    config = ServerConfig(model, args=flags, cpu=args.device == "cpu", log_path=log_dir / f"{name}.log")
    with SGLangServer(config) as server, ThreadPoolExecutor(len(decoders) + len(hits)) as pool:
        started = [Event() for _ in decoders]
        streams = [
            pool.submit(server.generate_stream, p, args.decode_tokens, 0, True, None, ev)
            for p, ev in zip(decoders, started)
        ]
        for ev in started:
            ev.wait(300)
        sent = []
        for prompt in hits:
            sent.append(pool.submit(server.generate_stream, prompt, 1, 0))
            time.sleep(args.hit_interval_s)
        hit_runs = [f.result() for f in sent]
        decode_runs = [f.result() for f in streams]
    window = (hit_runs[0].sent, max(r.first_token_at for r in hit_runs))
    gaps = [
        b - a
        for run in decode_runs
        for a, b in zip(run.chunk_times, run.chunk_times[1:])
        if window[0] <= b and a <= window[1]
    ]
    return ConcurrentRun(
        name,
        gaps,
        [r.first_token_at - r.sent for r in hit_runs],
        sum(cached_tokens(r.result)["storage"] for r in hit_runs),
        all(run.chunk_times[-1] > window[1] for run in decode_runs),
    )


PATHS = {"staged": "staged (HiCache prefetch into host memory)", "direct": "direct (reload worker)",
         "blocking": "blocking (scheduler waits for the reads)"}


def render_concurrent(doc: dict) -> dict[str, str]:
    """The README's decode-gap blocks from a ``--json`` record: per path the decoders' gap p99 and
    the hits' median TTFT from the raw records, with ratios to `staged` of the same run."""
    base = {r["name"]: r for r in doc["runs"]}["staged"]
    gap99, ttft50 = (lambda r: percentile(r["decode_gaps_s"], 99)), (lambda r: statistics.median(r["hit_ttft_s"]))
    rows = [f"| {PATHS[r['name']]} | {gap99(r) * 1e3:.1f} | {gap99(r) / gap99(base):.2f} | {ttft50(r) * 1e3:.0f} | "
            f"{ttft50(r) / ttft50(base):.2f} |" for r in doc["runs"]]
    table = "\n".join(["| reload path | decode gap p99 ms | x staged | SSD-hit TTFT p50 ms | x staged |",
                       "|---|---|---|---|---|", *rows])
    load = doc["load_average_1min"]
    setting = (f"{doc['device'].upper()}, {doc['decoders']} decoders x {doc['decode_tokens']} tokens, {doc['hits']} hits "
               f"of {doc['hit_pages']} pages one every {doc['hit_interval_s']:g} s, store reads delayed "
               f"{doc['read_delay_s']:g} s to stand for a slow drive; one run, 1-minute load average "
               f"{load['start']:.1f} at the start and {load['end']:.1f} at the end, ratios to HiCache's staged "
               f"prefetch in the same run")
    short = [r["name"] for r in doc["runs"] if not r["decoders_outlasted"]]
    if short:
        setting += (f". In the {' and '.join(short)} run the decoders finished before the last hit's first token, "
                    f"so its gaps cover only part of the hits' window")
    return {"setting": setting + ":", "table": table}


def concurrent_scenario(model: Path, args: argparse.Namespace, log_dir: Path) -> int:
    """Write the hit prefixes with one server, then per reload path a restarted server on
    that store serves decoders plus the SSD-hit stream."""
    delay = args.read_delay_s if args.read_delay_s is not None else (0.1 if args.device == "cpu" else 0.0)
    load_start = os.getloadavg()[0]
    injector = {"class": "sglang_saria.storage.fault_injection:ReadDelay", "read_delay_s": delay}
    slow_reads = {"fault_injector": injector} if delay else {}
    flags = ["--page-size", "16", "--max-total-tokens", "8192", "--dtype", "bfloat16"]
    flags += (GPU_FLAGS if args.device == "cuda" else []) + ["--hicache-storage-prefetch-policy", "wait_complete"]
    # Each path's `transfer` section of the extra config.
    paths = {"staged": {"direct_reload": False}, "direct": {}, "blocking": {"blocking_reload": True}}
    with tempfile.TemporaryDirectory(prefix="saria-bench-store-") as data_dir:
        extra = {"data_dirs": [data_dir], "admission": "full-duplicate", "capacity": "256MiB"}
        hits = [_prefix(seed, args.hit_pages) + [3, 4, 5] for seed in range(1, args.hits + 1)]
        writer = ServerConfig(
            model, args=flags + saria_hicache_args(extra), cpu=args.device == "cpu", log_path=log_dir / "writer.log"
        )
        with SGLangServer(writer) as server:
            for prompt in tqdm(hits, desc="writing the hit prefixes", leave=False):
                server.generate(prompt[:-3], max_new_tokens=1)
            server.wait_storage_writes()
        runs = []
        for i, (path, transfer) in enumerate(tqdm(paths.items(), desc="reload paths", leave=False)):
            server_flags = flags + saria_hicache_args({**extra, **slow_reads, "transfer": transfer})
            runs.append(serve_concurrent(path, model, server_flags, hits, args, i, log_dir))
    doc = {"device": args.device, "decoders": args.decoders, "decode_tokens": args.decode_tokens, "hits": args.hits,
           "hit_pages": args.hit_pages, "hit_interval_s": args.hit_interval_s, "read_delay_s": delay,
           "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]}, "runs": [asdict(r) for r in runs]}
    rendered = render_concurrent(doc)
    print(rendered["setting"] + "\n\n" + rendered["table"])
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    if args.update_doc:
        doc_blocks.update_file(args.update_doc, "decode-gap", rendered)
    short = [r.name for r in runs if not r.decoders_outlasted]
    if short:
        print(f"note: decoders ended before the last hit in {short}: raise --decode-tokens for a full window")
    missing = [r.name for r in runs if r.storage_tokens == 0]
    if missing:
        print(f"FAIL: no SSD hit was served from storage in {missing}")
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", type=Path, default=None, help="model dir (default: build models/qwen3-tiny)")
    ap.add_argument("--weka", type=Path, default=None, help="weka-cc trace dir (default: ../shared/traces/weka-cc)")
    ap.add_argument("--admission", nargs="+", default=["full-duplicate", "eviction:E2"])
    ap.add_argument("--reload", nargs="+", choices=["direct", "staged"], default=["direct", "staged"])
    ap.add_argument("--requests-per-session", type=int, default=5)
    ap.add_argument(
        "--check", action="store_true",
        help="audited servers: fail unless tokens and logprobs match the cold server's and the KV audit is clean",
    )
    ap.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a temp dir)")
    ap.add_argument("--scenario", choices=["sessions", "concurrent"], default="sessions")
    concurrent = ap.add_argument_group("--scenario concurrent")
    concurrent.add_argument("--decoders", type=int, default=4)
    concurrent.add_argument("--decode-tokens", type=int, default=600)
    concurrent.add_argument("--hits", type=int, default=6)
    concurrent.add_argument("--hit-pages", type=int, default=32, help="pages of each SSD-hit prefix (16 tokens each)")
    concurrent.add_argument("--hit-interval-s", type=float, default=0.5)
    concurrent.add_argument("--read-delay-s", type=float, default=None, help="seconds per store read (CPU default 0.1)")
    concurrent.add_argument("--json", type=Path, default=None, help="write every run's raw records as JSON here")
    concurrent.add_argument("--update-doc", type=Path, default=None, metavar="MD",
                            help="rewrite MD's <!-- decode-gap:NAME --> blocks from --json (README.md)")
    concurrent.add_argument("--render-only", action="store_true", help="serve nothing: --update-doc from an existing --json")
    args = ap.parse_args()
    if (args.update_doc or args.render_only) and not (args.json and args.scenario == "concurrent"):
        ap.error("--update-doc and --render-only need --scenario concurrent and --json")
    if args.render_only:
        if not args.update_doc:
            ap.error("--render-only needs --update-doc")
        doc_blocks.update_file(args.update_doc, "decode-gap", render_concurrent(json.loads(args.json.read_text())))
        return 0

    model = args.model or build(FULL_ATTENTION, Path("models"))
    if args.scenario == "concurrent":
        log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="saria-bench-concurrent-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        print(f"concurrent scenario, device={args.device}, logs in {log_dir}")
        return concurrent_scenario(model, args, log_dir)
    prompts = agent_requests(args.requests_per_session, weka=args.weka)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="saria-bench-serving-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"{len(prompts)} requests of 4 WEKA sessions, device={args.device}, logs in {log_dir}")
    cold = serve("cold", model, ["--disable-radix-cache"], prompts, args.device, log_dir)
    runs = []
    for admission in args.admission:
        for reload in args.reload:
            with tempfile.TemporaryDirectory(prefix="saria-bench-store-") as data_dir:
                name = f"{admission}/{reload}"
                args_ = saria_args(admission, reload, Path(data_dir))
                runs.append(serve(name, model, args_, prompts, args.device, log_dir, audit=args.check))
    print_table(runs, cold)
    if args.check:
        worst = {run.name: max(logprob_diff(t, c).max_abs for t, c in zip(run.traces, cold.traces)) for run in runs}
        bad = [run.name for run in runs if not all(logprob_diff(t, c).within() for t, c in zip(run.traces, cold.traces))]
        bad += [run.name for run in runs if any(v for k, v in run.metrics.items() if k.startswith("sglang:saria_kv_audit_errors"))]
        if bad:
            print(f"FAIL: tokens, logprobs (tolerance {LOGPROB_TOLERANCE}) or KV audit differ from the cold server in {sorted(set(bad))}")
            return 1
        print(f"PASS: {len(runs)} configurations return the cold server's tokens, logprobs within "
              f"{LOGPROB_TOLERANCE} (worst {max(worst.values()):.1e}), KV audit clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
