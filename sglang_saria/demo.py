"""`make demo`: coding agents chat with a tiny model served by SGLang with HiCache + the
`saria` SSD store, through the `openai` SDK, and each turn shows where its prompt was cached.

Why this shape: it is what an agent user runs. Several sessions share a system prompt and
tool schemas; each turn appends the model's reply, a tool call and the tool's result to a
growing history. The sessions take turns concurrently, so with small pools one session's
history is pushed out of the device by the others and comes back from host memory. Halfway
the server restarts on the same store (warm SSD, device and host memory empty). The demo
writes every page to the store (`full-duplicate`); saria's default `eviction:E2` persists a
node only at its second DRAM eviction, which a few short turns rarely reach (`--admission
eviction:E2` shows it; scripts/bench_vs_hicache.py measures what E2 saves on a longer agent
workload).

Per turn: SGLang's own cache report (`--enable-cache-report`: usage.prompt_tokens_details,
split by tier in sglext.cached_tokens_details) and the request's latency. The summary then
states, from those reports (`restart_summary`):
- before the restart: the prompt tokens found cached, by tier;
- the first round after the restart: the prompt tokens found in the store;
- how many sessions found their whole history before the restart (the last prompt before it,
  in whole pages) cached at their first turn after it, and at their second: on an idle machine
  every one, at both. The first turns after the restart run at once: the sessions' direct
  reloads claim the 1,280-token device pool in turn (`mem_cache/reload_admission.py`), and a
  session whose match ends on the system prompt another session's reload brought back reads
  only its own pages past it. A session that does not find its history had its reload given
  up, counted in the reloads line's fallbacks: a reload the pool cannot take yet is given up
  when its read, as measured, is slower than computing its tokens (`read_slower`), which the
  tiny model's prefill can be on a loaded machine.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from openai import OpenAI

from sglang_saria.agents.report import CACHE_DETAILS, TIERS, CacheReport
from sglang_saria.agents.sessions import TOOLS, AgentSession, agent_sessions
from sglang_saria.launcher import SGLangServer, ServerConfig, saria_hicache_args, saria_metrics

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "qwen3-tiny"
# No warmup request: with a tokenizer it is a real prompt that would land in the store.
PAGE_TOKENS = 16
POOLS = ["--page-size", str(PAGE_TOKENS), "--max-total-tokens", "1280", "--dtype", "bfloat16", "--enable-cache-report",
         "--skip-server-warmup"]


@dataclass
class TurnResult:
    server: int  # 1 before the restart, 2 after
    session: str
    turn: int
    report: CacheReport
    latency_s: float


def take_turn(client: OpenAI, session: AgentSession, server: int) -> TurnResult:
    """One chat turn of one agent; its reply, a tool call and the result join its history."""
    started = time.perf_counter()
    response = client.chat.completions.create(
        model="default", messages=session.messages, tools=TOOLS, max_tokens=8, temperature=0, extra_body=CACHE_DETAILS
    )
    latency = time.perf_counter() - started
    result = TurnResult(server, session.name, session.turn + 1, CacheReport.from_response(response), latency)
    session.add_turn(response.choices[0].message.content or "")
    return result


def print_turn(r: TurnResult) -> None:
    t = r.report
    print(f"{r.server:>6} {r.session:<8} {r.turn:>4} {t.prompt_tokens:>6} {t.device:>6} {t.host:>6} "
          f"{t.storage:>7} {t.computed:>8} {r.latency_s * 1e3:>8.0f}", flush=True)


def run_rounds(url: str, sessions: list[AgentSession], rounds: int, server: int) -> list[TurnResult]:
    """`rounds` rounds; in each, every session takes one turn, all at once."""
    client = OpenAI(base_url=f"{url}/v1", api_key="none")
    results = []
    with ThreadPoolExecutor(len(sessions)) as pool:
        for _ in range(rounds):
            for result in pool.map(lambda s: take_turn(client, s, server), sessions):
                print_turn(result)
                results.append(result)
    return results


def plot_turns(results: list[TurnResult], path: Path) -> None:
    """Stacked bars, one per turn: prompt tokens by where SGLang found them."""
    from sglang_saria.replay.plot import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    x = list(range(len(results)))
    bottom = [0] * len(results)
    colours = {"device": "tab:green", "host": "tab:blue", "storage": "tab:orange", "computed": "tab:gray"}
    for part, colour in colours.items():
        heights = [getattr(r.report, part) for r in results]
        ax.bar(x, heights, bottom=bottom, color=colour, label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    restart = next((i for i, r in enumerate(results) if r.server == 2), None)
    if restart is not None:
        ax.axvline(restart - 0.5, color="black", linestyle="--", label="server restart")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("request (all sessions' turns, in order)")
    ax.set_ylabel("prompt tokens")
    ax.set_title("where each agent turn's prompt was found", fontsize=9)
    save_figure(fig, ax, path, legend_loc="upper left")


def restart_summary(results: list[TurnResult]) -> list[str]:
    """The module docstring's three statements, from the turns' cache reports: the lines the
    summary prints about the restart (`tests/agents/test_demo.py` checks them against the table)."""
    before = [r for r in results if r.server == 1]
    after = [r for r in results if r.server == 2]
    cached = {tier: sum(getattr(r.report, tier) for r in before) for tier in TIERS}
    lines = [f"before the restart: {sum(cached.values())} of {sum(r.report.prompt_tokens for r in before)} prompt "
             f"tokens cached (device {cached['device']}, host {cached['host']}, storage {cached['storage']})"]
    if not before or not after:
        return lines
    first_round = after[: len({r.session for r in after})]
    lines.append(f"first round after the restart: {sum(r.report.storage for r in first_round)} prompt tokens "
                 f"found in the store")
    history = {r.session: r.report.prompt_tokens // PAGE_TOKENS * PAGE_TOKENS for r in before}  # the last one
    for nth, name in ((0, "first"), (1, "second")):
        turns = {s: [r for r in after if r.session == s] for s in history}
        found = [s for s, ts in turns.items() if len(ts) > nth and ts[nth].report.cached_tokens >= history[s]]
        with_turn = sum(len(ts) > nth for ts in turns.values())
        if with_turn:
            lines.append(f"sessions that found their whole history from before the restart at their {name} turn "
                         f"after it: {len(found)} of {with_turn}")
    return lines


def summarise(results: list[TurnResult], metrics: list[dict[str, float]], admission: str, out: Path) -> None:
    def total(name: str) -> float:
        return sum(m.get(name, 0.0) for m in metrics)

    tokens = {tier: sum(getattr(r.report, tier) for r in results) for tier in (*TIERS, "computed")}
    admissions = sorted({k.split("/")[1] for m in metrics for k in m if k.startswith("sglang:saria_ssd_admissions_total/")})
    print(f"\nprompt tokens served from: device {tokens['device']}, host {tokens['host']}, storage {tokens['storage']}; "
          f"computed {tokens['computed']}")
    print("\n".join(restart_summary(results)))
    print(f"admission ({admission}): " + (", ".join(
        f"{event} {total(f'sglang:saria_ssd_admissions_total/{event}'):.0f}" for event in admissions) or "no SSD writes"))
    print(f"SSD: {total('sglang:saria_ssd_bytes_written_total') / 2**20:.2f} MiB written, "
          f"{total('sglang:saria_ssd_bytes_read_total') / 2**20:.2f} MiB read")
    fallbacks = {name.split("/")[1]: total(name) for name in sorted({k for m in metrics for k in m})
                 if name.startswith("sglang:saria_reload_fallbacks_total/")}
    print(f"reloads: {total('sglang:saria_reload_tokens_total/dram'):.0f} tokens from DRAM, "
          f"{total('sglang:saria_reload_tokens_total/ssd'):.0f} from SSD straight into the device pool; "
          f"{total('sglang:saria_promoted_tokens_total'):.0f} SSD-hit tokens promoted to DRAM; "
          f"fallbacks {sum(fallbacks.values()):.0f}"
          + "".join(f", {reason} {count:.0f}" for reason, count in fallbacks.items()))
    print(f"\nplot: {out / 'turns.png'}\nmetrics (each server's /metrics at its end): {out / 'metrics-1.prom'}, "
          f"{out / 'metrics-2.prom'}\nserver logs: {out / 'server-1.log'}, {out / 'server-2.log'}\n"
          f"a running server shows the same on http://<host>:<port>/metrics (sglang:saria_*); replay plots: "
          f"saria-replay --plot FILE.png (README, 'Replay and planning')")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--data-dir", type=Path, default=None, help="saria store folder (default: a temp dir)")
    parser.add_argument("--admission", default="full-duplicate",
                        help="admission policy (default full-duplicate; see the module docstring)")
    parser.add_argument("--sessions", type=int, default=4, help="concurrent agent sessions (default 4)")
    parser.add_argument("--rounds", type=int, nargs=2, default=(3, 2), metavar=("BEFORE", "AFTER"),
                        help="turns per session before and after the restart (default 3 2)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "demo", help="plot, metrics and logs")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    sessions = agent_sessions(args.sessions, tool_chars=100)
    results: list[TurnResult] = []
    metrics: list[dict[str, float]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="saria-demo-") as scratch:
        data_dir = args.data_dir or Path(scratch) / "ssd0"
        extra = {"data_dirs": [str(data_dir)], "admission": args.admission, "capacity": "64MiB"}
        print(f"{args.sessions} coding agents, SGLang on CPU with HiCache + saria store at {data_dir} "
              f"(admission {args.admission})", flush=True)
        print(f"{'server':>6} {'session':<8} {'turn':>4} {'prompt':>6} {'device':>6} {'host':>6} {'storage':>7} "
              f"{'computed':>8} {'ms':>8}")
        for server_no, rounds in enumerate(args.rounds, start=1):
            config = ServerConfig(args.model, args=POOLS + saria_hicache_args(extra), log_path=args.out / f"server-{server_no}.log")
            with SGLangServer(config) as server:
                results += run_rounds(server.url, sessions, rounds, server_no)
                server.wait_storage_writes()  # the restart finds every write of the last turns
                text = server.metrics()
            (args.out / f"metrics-{server_no}.prom").write_text(text)
            metrics.append(saria_metrics(text))
            if server_no == 1:
                print("--- server restarted: device and host memory empty, the SSD store kept ---", flush=True)
    plot_turns(results, args.out / "turns.png")
    summarise(results, metrics, args.admission, args.out)
    print(f"\ndemo took {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
