"""Benchmark models: KV size, CPU prefill time and the time to read the same KV from the store.

Why: caching KV on SSD pays only when recomputing a prefix costs far more than reading its KV
back. With the tiny test models (256 B of KV per token, millisecond prefills) it hardly does;
the benchmark models (`make bench-models`, 16 KiB of KV per token) are sized so it does on
this machine as it does on a GPU with a real model. This script checks that, per model:

- KV bytes per token and per page: the model's full-attention layers' K and V (bf16), the
  bytes one stored page holds (the hybrid adds one GDN checkpoint object per prefix);
- prefill: the TTFT of a real SGLang server on CPU (`sglang_saria.launcher.SGLangServer`,
  `--disable-radix-cache`, a fresh random prompt of input ids, streamed `/generate` with
  max_new_tokens=1): one full cold prefill plus the HTTP round trip and scheduling that a
  cache hit pays too. Not the bare model forward: this is the time a hit saves a request;
- store read: the same tokens' pages (and the hybrid's checkpoint) put into a fresh
  `SariaStore` in a private temp dir (real files, O_DIRECT as the server's store uses them,
  default read threads) and read back with get_batch into aligned host buffers;
- ratio = prefill / store read, which must be >= --min-ratio (exit status 1 otherwise).

Every time is the median of --repeats, after one unmeasured run per prompt length; the ratio
is formed from the two medians of the same run. Before measuring, one chat request checks
that the server serves the model through the OpenAI endpoint. ``--json`` keeps every timed
run (the raw records); ``--update-doc`` renders docs/bench-models.md's table and summary
(``<!-- bench-models:NAME -->``) from that JSON, ``--render-only`` from one committed earlier.

    saria-bench-models [--lengths 512 2048] [--repeats 3] [--json out.json] [--update-doc MD]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from sglang_saria.bench import doc_blocks
from sglang_saria.gpukit.timing import sample_seconds
from sglang_saria.launcher import SGLangServer, ServerConfig
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.buffers import aligned_empty
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import SariaStore
from sglang_saria.tiny_models import FULL_ATTENTION_BENCH, HYBRID_BENCH, KVGeometry, build, kv_geometry, model_dtype

PAGE = 16
# A hybrid server's GDN state slots and concurrent requests (one request at a time here).
HYBRID_ARGS = ["--max-mamba-cache-size", "8", "--max-running-requests", "2"]


@dataclass
class Row:
    """One model at one prompt length: every timed run (s), the table's figures their medians (ms)."""

    model: str
    tokens: int
    kv_bytes_per_token: int
    page_bytes: int
    state_bytes: int  # the hybrid's GDN checkpoint, read with the pages; 0 for full attention
    prefill_s: list[float]
    store_read_s: list[float]

    @property
    def prefill_ms(self) -> float:
        return 1e3 * statistics.median(self.prefill_s)

    @property
    def store_read_ms(self) -> float:
        return 1e3 * statistics.median(self.store_read_s)

    @property
    def prefill_ms_per_token(self) -> float:
        return self.prefill_ms / self.tokens

    @property
    def read_mib(self) -> float:
        return (self.tokens // PAGE * self.page_bytes + self.state_bytes) / 2**20

    @property
    def ratio(self) -> float:
        return self.prefill_ms / self.store_read_ms


# ---------------------------------------------------------------- prefill (real server)
def server_args(geometry: KVGeometry, lengths: list[int], dtype: str) -> list[str]:
    """Pools that fit the longest prompt in one prefill chunk, no prefix cache (every
    request is a cold prefill), page size 16 as the store's pages, the model's own dtype."""
    longest = max(lengths) + 64
    args = ["--dtype", dtype, "--page-size", str(PAGE), "--disable-radix-cache",
            "--max-total-tokens", str(2 * longest), "--max-prefill-tokens", str(longest),
            "--chunked-prefill-size", str(longest)]
    return args + (HYBRID_ARGS if geometry.gdn else [])


def chat_once(server: SGLangServer) -> str:
    """One short chat completion: the model serves through the OpenAI endpoint."""
    reply = server.post("/v1/chat/completions", {
        "model": "default", "max_tokens": 8, "temperature": 0.0,
        "messages": [{"role": "user", "content": "Say hello."}],
    })
    return reply["choices"][0]["message"]["content"]


def ttft_s(server: SGLangServer, prompt: list[int]) -> float:
    """Seconds from sending ``prompt`` to its first streamed token (the prefill)."""
    result = server.generate_stream(prompt, max_new_tokens=1, top_logprobs=0)
    return result.first_token_at - result.sent


def prefill_s(model: Path, lengths: list[int], repeats: int, threads: int, log: Path) -> dict[int, list[float]]:
    """TTFTs (s) per prompt length of a fresh server of ``model``, ``repeats`` each."""
    rng = random.Random(0)
    prompt = lambda n: [rng.randrange(1, 1000) for _ in range(n)]  # noqa: E731
    config = ServerConfig(model, args=server_args(kv_geometry(model), lengths, model_dtype(model)), log_path=log,
                          env={"OMP_NUM_THREADS": str(threads), "SGLANG_MP_START_METHOD": "fork"})
    out = {}
    with SGLangServer(config) as server:
        tqdm.write(f"{model.name}: chat reply {chat_once(server)!r}")
        for n in tqdm(lengths, desc=f"{model.name} prefill", unit="len", leave=False):
            out[n] = sample_seconds(lambda: ttft_s(server, prompt(n)), repeats, cuda=False)
    return out


# ---------------------------------------------------------------- store read (real files)
def store_read_s(geometry: KVGeometry, lengths: list[int], repeats: int, directory: str) -> dict[int, list[float]]:
    """Times (s) to read each length's pages (+ the hybrid's checkpoint) from a fresh store, ``repeats`` each."""
    page = geometry.page_bytes(PAGE)
    state = geometry.gdn.state_bytes if geometry.gdn else 0
    total = sum(n // PAGE * page + state for n in lengths)
    cfg = StoreConfig(data_dirs=[f"{directory}/store"], capacity=str(total + 2 * page + state), slot_bytes=str(page), engine="posix")
    out = {}
    with SariaStore(cfg, victim_order=SSDVictimOrder()) as store:
        for n in tqdm(lengths, desc="store read", unit="len", leave=False):
            objects = [(f"{n}-{i}", page) for i in range(n // PAGE)] + ([(f"{n}-state", state)] if state else [])
            bufs = [aligned_empty(size) for _, size in objects]
            for b in bufs:
                b[:] = 7
            assert all(f.result().ok for f in store.put_batch([(k, b) for (k, _), b in zip(objects, bufs)]))
            keys = [k for k, _ in objects]

            def read() -> None:
                assert all(f.result().ok for f in store.get_batch(keys, bufs))

            out[n] = sample_seconds(read, repeats, cuda=False)
    return out


# ---------------------------------------------------------------- report
COLUMNS = ("model", "tokens", "KV B/token", "page KiB", "read MiB", "prefill ms", "prefill ms/token",
           "store read ms", "prefill / read")


def cells(row: Row) -> list[str]:
    return [row.model, str(row.tokens), str(row.kv_bytes_per_token), f"{row.page_bytes / 1024:.0f}",
            f"{row.read_mib:.2f}", f"{row.prefill_ms:.0f}", f"{row.prefill_ms_per_token:.2f}",
            f"{row.store_read_ms:.1f}", f"{row.ratio:.1f}"]


def markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(cells(r)) + " |" for r in rows])


def to_json(rows: list[Row], args: argparse.Namespace, load: tuple[float, float]) -> dict:
    """The run's setting and raw records: every timed run per row (the doc recomputes from these)."""
    return {"repeats": args.repeats, "threads": args.threads, "page_size": PAGE, "min_ratio": args.min_ratio,
            "load_average_1min": {"start": load[0], "end": load[1]}, "rows": [asdict(r) for r in rows]}


def rows_of(doc: dict) -> list[Row]:
    return [Row(**r) for r in doc["rows"]]


def _span(values: list[float], fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def summary(doc: dict) -> str:
    """The sentence docs/bench-models.md (and the README) quote: the ratio range, per model the
    prefill per token."""
    rows = rows_of(doc)
    per_model = "; ".join(
        f"{_span([r.prefill_ms_per_token for r in rows if r.model == m], '.2f')} ms of prefill per token for `{m}`"
        for m in dict.fromkeys(r.model for r in rows))
    return (f"Prefill costs {_span([r.ratio for r in rows], '.0f')}x the store read of the same tokens' KV "
            f"(required: >= {doc['min_ratio']:g}): {per_model} (medians of {doc['repeats']}, "
            f"1-minute load average {doc['load_average_1min']['start']:.1f} at the start, "
            f"{doc['load_average_1min']['end']:.1f} at the end).")


def render(doc: dict) -> dict[str, str]:
    """docs/bench-models.md's generated blocks from a ``--json`` file."""
    return {"table": markdown(rows_of(doc)), "summary": summary(doc)}


def measure(model: Path, args: argparse.Namespace, work: Path) -> list[Row]:
    geometry = kv_geometry(model)
    read = store_read_s(geometry, args.lengths, args.repeats, str(work))
    prefill = prefill_s(model, args.lengths, args.repeats, args.threads, work / f"{model.name}.log")
    state = geometry.gdn.state_bytes if geometry.gdn else 0
    return [Row(model.name, n, geometry.bytes_per_token, geometry.page_bytes(PAGE), state, prefill[n], read[n])
            for n in args.lengths]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="saria-bench-models", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, nargs="+", default=None,
                    help=f"model dirs (default: models/{FULL_ATTENTION_BENCH} and models/{HYBRID_BENCH}, built if missing)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048], help="prompt lengths in tokens (default 512 2048)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per figure; medians reported (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="OMP threads of the server (default 2: the whole 2-core box)")
    ap.add_argument("--min-ratio", type=float, default=10.0, help="fail unless prefill / store read reaches this (default 10)")
    ap.add_argument("--dir", type=Path, default=None, help="parent of the private work dir (store files, server logs)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows, every timed run, as JSON here")
    ap.add_argument("--update-doc", type=Path, default=None, metavar="MD",
                    help="rewrite MD's <!-- bench-models:NAME --> blocks from --json (docs/bench-models.md)")
    ap.add_argument("--render-only", action="store_true", help="measure nothing: --update-doc from an existing --json")
    args = ap.parse_args(argv)
    if (args.update_doc or args.render_only) and not args.json:
        ap.error("--update-doc and --render-only need --json (the doc is rendered from that file)")
    if args.render_only and not args.update_doc:
        ap.error("--render-only needs --update-doc")
    if min(args.lengths) < PAGE or any(n % PAGE for n in args.lengths):
        ap.error(f"--lengths must be positive multiples of the page size {PAGE}")
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be at least 1")
    for model in args.models or []:
        if not (model / "config.json").is_file():
            ap.error(f"--models: {model} has no config.json (build the benchmark models: make bench-models)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render_only:
        doc_blocks.update_file(args.update_doc, "bench-models", render(json.loads(args.json.read_text())))
        return 0
    load_start = os.getloadavg()[0]
    models = args.models or [build(name, Path("models")) for name in (FULL_ATTENTION_BENCH, HYBRID_BENCH)]
    work = Path(tempfile.mkdtemp(prefix="saria-bench-models-", dir=args.dir))
    try:
        rows = [row for model in tqdm(models, desc="models", unit="model") for row in measure(model, args, work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nCPU prefill (server TTFT, {args.threads} threads) vs saria store read of the same tokens' KV, "
          f"page {PAGE} tokens, medians of {args.repeats}\n")
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(to_json(rows, args, (load_start, os.getloadavg()[0])), indent=2))
    if args.update_doc:
        doc_blocks.update_file(args.update_doc, "bench-models", render(json.loads(args.json.read_text())))
    low = [r for r in rows if r.ratio < args.min_ratio]
    for r in low:
        print(f"FAIL: {r.model} at {r.tokens} tokens: prefill / read = {r.ratio:.1f} < {args.min_ratio:g}")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
