"""`saria-restart-turns`: storage-hit tokens per agent session on the first turn after a server
restart, saria's direct reload against stock HiCache `file`, in the same run.

The scenario is `make demo`'s (`sglang_saria/demo.py`): N agent sessions share a system prompt
and tools, take ``--rounds-before`` turns all at once on a server with the demo's pools (1,280
device tokens), which writes every page to its store; the server restarts on the same store
(device and host memory empty) and every session takes one more turn, all at once. A session's
history is then entirely in the store; what SGLang reports as its storage hit
(``sglext.cached_tokens_details.storage``) is what the backend got back to the device before
the request was admitted. The restart turns run with logprobs, so a cold server (no cache) can
check the outputs (`cold_traces`).

Prints one table (per session count and session: storage-hit tokens, computed tokens, saria's
cached tokens over `file`'s, latency) and writes the records as JSON (``--out``);
`markdown` renders docs/reload-admission.md's table from them.

``--stress N --runs R``: the stress scenario instead, R times: N saria sessions (histories far
above the device pool) restarted as above, then the same N restart prompts all at once on a
server that has cached nothing (`cold_latencies`); per run the slowest restart turn over the
cold server's slowest, measured in the same run, and their median (`stress_markdown`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from openai import OpenAI

from sglang_saria.agents.report import CACHE_DETAILS, CacheReport
from sglang_saria.agents.sessions import TOOLS, AgentSession, agent_sessions
from sglang_saria.bench.configs import settled_file_bytes
from sglang_saria.launcher import AUDIT_ENV, LOGPROB_TOLERANCE, SGLangServer, ServerConfig, hicache_args, saria_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "qwen3-tiny"
BACKENDS = ("saria", "file")
POOLS = ["--page-size", "16", "--max-total-tokens", "1280", "--dtype", "bfloat16", "--enable-cache-report",
         "--skip-server-warmup"]
MAX_TOKENS = 8
TOP_LOGPROBS = 3


@dataclass
class RestartTurn:
    """One session's first turn after the restart."""

    session: str
    prompt: int
    storage: int
    computed: int
    latency_s: float
    messages: list = field(repr=False)
    trace: list = field(repr=False)  # [(token, logprob, [top logprobs])] of the reply

    @property
    def cached(self) -> int:
        """Prompt tokens not computed: after a restart all came back from the store in this turn
        (a prefix shared with another session is its storage hit and a device hit here)."""
        return self.prompt - self.computed


@dataclass
class RestartRun:
    backend: str
    sessions: int
    turns: list[RestartTurn]
    metrics: dict[str, float]  # the restarted server's sglang:saria_* samples (saria only)


def backend_args(backend: str, store: Path) -> list[str]:
    if backend == "saria":
        return hicache_args("saria", {"data_dirs": [str(store)], "admission": "full-duplicate", "capacity": "64MiB"})
    if backend == "file":
        return hicache_args("file", {"file_storage_path": str(store)})
    raise ValueError(f"--backends: {backend!r}: expected one of {', '.join(BACKENDS)}")


def settle_store(server: SGLangServer, backend: str, store: Path) -> None:
    """Every write of the last turns is in the store before the server stops (SIGTERM drops
    what HiCache has not written yet): saria's acknowledged writes are durable in its index;
    `file`'s once its write-through has stopped adding files."""
    if backend == "saria":
        server.wait_storage_writes()
    else:
        settled_file_bytes(store)


def chat(client: OpenAI, messages: list, logprobs: bool = False) -> Any:
    extra = {"logprobs": True, "top_logprobs": TOP_LOGPROBS} if logprobs else {}
    return client.chat.completions.create(
        model="default", messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS, temperature=0,
        extra_body=CACHE_DETAILS, **extra,
    )


def reply_trace(response: Any) -> list:
    content = response.choices[0].logprobs.content or []
    return [(c.token, c.logprob, sorted((t.logprob for t in c.top_logprobs), reverse=True)) for c in content]


def settle(client: OpenAI) -> None:
    """One chat request sharing no page with the sessions (shorter than a page, no tools),
    before the timed turns: a restarted server's first steps (the KV audit's setup among them)
    are not charged to the first session."""
    client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=1)


def _turn(client: OpenAI, session: AgentSession) -> None:
    response = chat(client, session.messages)
    session.add_turn(response.choices[0].message.content or "")


def _restart_turn(client: OpenAI, session: AgentSession) -> RestartTurn:
    messages = [dict(m) for m in session.messages]
    started = time.perf_counter()
    response = chat(client, messages, logprobs=True)
    latency = time.perf_counter() - started
    report = CacheReport.from_response(response)
    return RestartTurn(session.name, report.prompt_tokens, report.storage, report.computed, latency, messages,
                       reply_trace(response))


def restart_run(model: Path, backend: str, sessions: int, rounds_before: int, scratch: Path,
                env: dict[str, str] | None = None, log_dir: Path | None = None) -> RestartRun:
    """``sessions`` sessions, ``rounds_before`` rounds on a first server, then one round on a
    server restarted on the same store; ``env`` for both servers (e.g. the KV audit's)."""
    store = scratch / f"{backend}-{sessions}"
    store.mkdir(parents=True)
    agents = agent_sessions(sessions, tool_chars=100)
    turns: list[RestartTurn] = []
    text = ""
    with ThreadPoolExecutor(sessions) as pool:
        for server_no in (1, 2):
            log = None if log_dir is None else log_dir / f"{backend}-{sessions}-server-{server_no}.log"
            config = ServerConfig(model, args=POOLS + backend_args(backend, store), log_path=log, env=env or {})
            with SGLangServer(config) as server:
                client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
                if server_no == 1:
                    for _ in range(rounds_before):
                        list(pool.map(lambda s: _turn(client, s), agents))
                    settle_store(server, backend, store)
                else:
                    settle(client)
                    turns = list(pool.map(lambda s: _restart_turn(client, s), agents))
                    text = server.metrics()
    return RestartRun(backend, sessions, turns, saria_metrics(text))


def timed_chat(client: OpenAI, messages: list) -> float:
    started = time.perf_counter()
    chat(client, messages)
    return time.perf_counter() - started


def cold_latencies(model: Path, messages: list[list], log: Path | None = None) -> list[float]:
    """The same prompts, all at once, on a server with the same pools that has cached nothing
    yet (its prefix cache on, as a cold server's is)."""
    with SGLangServer(ServerConfig(model, args=POOLS, log_path=log)) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        settle(client)
        with ThreadPoolExecutor(len(messages)) as pool:
            return list(pool.map(lambda m: timed_chat(client, m), messages))


def stress_record(run: RestartRun, cold: list[float]) -> dict:
    """One stress run's raw record: per session its restart turn, the cold server's latencies
    (same prompts, same order), the restarted server's reload counters."""
    return {"turns": [{"session": t.session, "prompt": t.prompt, "storage": t.storage, "computed": t.computed,
                       "latency_s": t.latency_s} for t in run.turns],
            "cold_latency_s": cold,
            "metrics": {k: v for k, v in run.metrics.items() if "reload" in k and v}}


def stress_ratio(record: dict) -> float:
    """The slowest restart turn over the cold server's slowest turn."""
    return max(t["latency_s"] for t in record["turns"]) / max(record["cold_latency_s"])


def stress_markdown(records: list[dict]) -> str:
    """Per stress run: slowest restart turn and cold turn (s), their ratio, the reloads given up
    for a faster prefill, storage-hit and computed tokens summed; then the median ratio."""
    lines = ["| run | slowest restart turn (s) | slowest cold turn (s) | ratio | reloads given up (read slower) "
             "| storage-hit tokens | computed tokens |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(records, 1):
        gave_up = sum(v for k, v in r["metrics"].items() if k.startswith("sglang:saria_reload_fallbacks_total")
                      and "read_slower" in k)
        lines.append(f"| {i} | {max(t['latency_s'] for t in r['turns']):.2f} | {max(r['cold_latency_s']):.2f} "
                     f"| {stress_ratio(r):.2f}x | {gave_up:.0f} | {sum(t['storage'] for t in r['turns']):,} "
                     f"| {sum(t['computed'] for t in r['turns']):,} |")
    lines.append(f"| median | | | {statistics.median(stress_ratio(r) for r in records):.2f}x | | | |")
    return "\n".join(lines)


def markdown(records: list[dict]) -> str:
    """docs/reload-admission.md's table from ``--out``'s records: per session count and session,
    the storage-hit and computed tokens of each backend, saria's wasted reload tokens."""
    by = {(r["backend"], r["sessions"]): {t["session"]: t for t in r["turns"]} for r in records}
    wasted = {r["sessions"]: r["metrics"].get("sglang:saria_reload_tokens_wasted_total", 0.0)
              for r in records if r["backend"] == "saria"}
    lines = ["| sessions | session | storage hit: saria | storage hit: file | computed: saria | computed: file "
             "| saria wasted |", "|---|---|---|---|---|---|---|"]
    for n in sorted({r["sessions"] for r in records}):
        saria, stock = by.get(("saria", n), {}), by.get(("file", n), {})
        for name in sorted(set(saria) | set(stock)):
            s, f = saria.get(name), stock.get(name)
            lines.append(f"| {n} | {name} | {s['storage'] if s else '-'} | {f['storage'] if f else '-'} "
                         f"| {s['computed'] if s else '-'} | {f['computed'] if f else '-'} | {wasted.get(n, 0):.0f} |")
        lines.append(f"| {n} | sum | {sum(t['storage'] for t in saria.values())} "
                     f"| {sum(t['storage'] for t in stock.values())} | {sum(t['computed'] for t in saria.values())} "
                     f"| {sum(t['computed'] for t in stock.values())} | |")
    return "\n".join(lines)


def cold_traces(model: Path, turns: list[RestartTurn], log: Path | None = None) -> list[list]:
    """The same prompts on a cold server (no prefix cache), one at a time."""
    config = ServerConfig(model, args=POOLS + ["--disable-radix-cache"], log_path=log)
    with SGLangServer(config) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        return [reply_trace(chat(client, t.messages, logprobs=True)) for t in turns]


def trace_diff(trace: list, cold: list) -> tuple[bool, float]:
    """Whether the greedy tokens are the cold run's, and the largest logprob difference
    (the tokens' and the top-k's rank by rank)."""
    same = [t[0] for t in trace] == [t[0] for t in cold]
    diffs = [abs(a[1] - b[1]) for a, b in zip(trace, cold)]
    for a, b in zip(trace, cold):
        same = same and len(a[2]) == len(b[2])
        diffs += [abs(x - y) for x, y in zip(a[2], b[2])]
    return same, max(diffs, default=0.0)


def matches_cold(trace: list, cold: list) -> bool:
    same, worst = trace_diff(trace, cold)
    return same and worst <= LOGPROB_TOLERANCE


def table(runs: list[RestartRun]) -> str:
    """Per session count and session: storage hits and computed tokens of each backend,
    saria's cached tokens over file's, latencies; saria's wasted reload tokens per session count."""
    by = {(r.backend, r.sessions): {t.session: t for t in r.turns} for r in runs}
    lines = [f"{'sessions':>8} {'session':<8} {'saria hit':>9} {'file hit':>8} {'cached':>6} "
             f"{'saria comp':>10} {'file comp':>9} {'saria s':>7} {'file s':>6} {'wasted':>6}"]
    for n in sorted({r.sessions for r in runs}):
        saria, stock = by.get(("saria", n), {}), by.get(("file", n), {})
        wasted = next((r.metrics.get("sglang:saria_reload_tokens_wasted_total", 0.0) for r in runs
                       if r.backend == "saria" and r.sessions == n), float("nan"))
        for name in sorted(set(saria) | set(stock)):
            s, f = saria.get(name), stock.get(name)
            ratio = f"{s.cached / f.cached:.2f}" if s and f and f.cached else "-"
            lines.append(
                f"{n:>8} {name:<8} {s.storage if s else '-':>9} {f.storage if f else '-':>8} {ratio:>6} "
                f"{s.computed if s else '-':>10} {f.computed if f else '-':>9} "
                f"{f'{s.latency_s:.2f}' if s else '-':>7} {f'{f.latency_s:.2f}' if f else '-':>6} {wasted:>6.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="saria-restart-turns", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--rounds-before", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "restart_turns.json")
    parser.add_argument("--logs", type=Path, default=None, help="folder for the servers' logs")
    parser.add_argument("--stress", type=int, default=None, metavar="N",
                        help="the stress scenario instead: N saria sessions against a cold server")
    parser.add_argument("--runs", type=int, default=5, help="stress runs (default 5)")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.sessions):
        parser.error(f"--sessions: {args.sessions}: each must be >= 1")
    if args.stress is not None and (args.stress < 1 or args.runs < 1):
        parser.error(f"--stress {args.stress} --runs {args.runs}: both must be >= 1")
    if args.stress is not None:
        return stress_main(args)
    started = time.monotonic()
    runs = []
    with tempfile.TemporaryDirectory(prefix="saria-restart-") as scratch:
        for n in args.sessions:
            for backend in args.backends:
                runs.append(restart_run(args.model, backend, n, args.rounds_before, Path(scratch),
                                        AUDIT_ENV if backend == "saria" else None, args.logs))
                print(f"{backend}, {n} sessions: done ({time.monotonic() - started:.0f} s)", flush=True)
    print(table(runs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"setting": {"model": args.model.name, "rounds_before": args.rounds_before,
                                                "pools": POOLS}, "runs": [asdict(r) for r in runs]}, indent=1))
    print(f"records: {args.out} ({time.monotonic() - started:.0f} s)")
    return 0


def stress_main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    records = []
    with tempfile.TemporaryDirectory(prefix="saria-stress-") as scratch:
        for i in range(args.runs):
            run_dir = Path(scratch) / f"run-{i}"
            run = restart_run(args.model, "saria", args.stress, args.rounds_before, run_dir, log_dir=args.logs)
            cold = cold_latencies(args.model, [t.messages for t in run.turns])
            records.append(stress_record(run, cold))
            print(f"run {i + 1}: {stress_ratio(records[-1]):.2f}x ({time.monotonic() - started:.0f} s)", flush=True)
    print(stress_markdown(records))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"setting": {"model": args.model.name, "rounds_before": args.rounds_before,
                                                "sessions": args.stress, "pools": POOLS}, "runs": records}, indent=1))
    print(f"records: {args.out} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
