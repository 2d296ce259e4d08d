"""Figure 10 on the real server: SSD writes against TTFT for every admission policy.

WEKA Claude Code sessions (real traces, shortened to fit the model: `agents/weka_chat`)
replayed concurrently by SGLang's own client (`sglang.bench_serving --backend
sglang-oai-chat --dataset-name agentic-trace`), each turn after the trace's think time
times `--think-scale`, against one fresh server and store per configuration, all with the
same pools: a device pool and a host pool (`--hicache-ratio` x device) the sessions
overflow, and a saria store smaller than what full duplicate writes, so it evicts.

Configurations (`--configs`): `dram-only` (HiCache, no storage), `hicache-file` (stock
HiCache, `file` backend, bounded to the saria store's capacity in bytes by SGLang's own
`max_size`: it deletes its least recently used pages; its writes are counted as they land,
`bench/file_writes.py`), saria `full-duplicate`, `eviction:E2`, `eviction:E3`,
`budget:<DWPD>` and `loadaware` (the load-following threshold; `auto`'s ghost rule is compared in the replay, `docs/admission.md`). Unless `--dwpd` is given, the budget's DWPD is half of what the
first `eviction:E2` run wrote, over the store's capacity: the whole run lies inside the
budget's one-day window, so the cap is DWPD x capacity, half of E2's writes, and binds (the
budget policy is E2 until its cap nears). When E2 wrote nothing, full duplicate's writes set
it instead, and the report prints the cap next to what the budget wrote.

Per configuration: SSD bytes written, cached tokens by tier (SGLang's cache report), TTFT
mean and P90, requests and failures, ratios to `hicache-file` and `dram-only` of the same
run; medians, minima and maxima of `--repeats`. No configuration runs saria's KV audit: it
checks only pages a saria store moves, so it cannot run on the stock ones, and its checks
would slow the saria servers alone. The audited correctness runs of the same paths are the
e2e tests (`tests/e2e/`, `launcher.AUDIT_ENV`). The script fails if any request fails.

The same sessions and capacities then go through the replay (`bench/fig10_replay.py`) at
the prefill rate measured on the first `dram-only` server, and both orderings are compared.

    saria-fig10 --model models/qwen3-tiny [--repeats 5] [--json out.json] [--plot fig.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from sglang_saria.bench import fig10_replay
from sglang_saria.bench.configs import (
    DRAM_ONLY,
    HICACHE_FILE,
    BenchConfig,
    BenchError,
    Pools,
    RunResult,
    Workload,
    fail_if_unclean,
    median_result,
    parse_config,
    prepare,
    private_work_dir,
    results_table,
    run_config,
    serving_dtype,
    spread,
    to_json,
)
from sglang_saria.agents.weka_chat import AGENTS
from sglang_saria.launcher import SGLangServer
from sglang_saria.replay.loaders import shared_dir
from sglang_saria.tiny_models import FULL_ATTENTION

BUDGET = "budget"
CONFIGS = (DRAM_ONLY, HICACHE_FILE, "full-duplicate", "eviction:E2", "eviction:E3", BUDGET, "loadaware")
DEFAULT_TRACES = shared_dir() / "traces" / "weka-cc"


@dataclass
class ModelRun:
    """Everything one model's bench measured (the JSON's per-model record)."""

    model: str
    hybrid: bool
    workload: dict
    pools: dict
    budget: dict  # dwpd, the rule that chose it, the cap in bytes over the run
    store_cap_bytes: int  # saria's store capacity, and the stock `file` backend's max_size
    prefill: dict
    runs: dict[str, list[RunResult]]
    medians: dict[str, RunResult]
    spreads: dict[str, dict[str, float]]
    replay: dict[str, dict]
    comparison: dict


def is_hybrid(model: Path) -> bool:
    config = json.loads((model / "config.json").read_text())
    return "linear_attention" in (config.get("layer_types") or [])


def context_limit(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text()).get("max_position_embeddings", 8192))


def default_compute_threads() -> int:
    """One core fewer than this process may run on (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="saria-fig10", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, action="append", default=None,
                    help="model dir, repeatable (default models/qwen3-tiny; benchmarks: models/qwen3-bench, "
                         "models/qwen3.5-bench-hybrid from `make bench-models`)")
    ap.add_argument("--weka", type=Path, default=None, help=f"weka-cc trace dir (default {DEFAULT_TRACES})")
    ap.add_argument("--sessions", type=int, default=len(AGENTS), help=f"concurrent agent sessions, 1-{len(AGENTS)} (default all)")
    ap.add_argument("--turns", type=int, default=8, help="turns per session at most (default 8)")
    ap.add_argument("--max-chars", type=int, default=600, help="longest conversation, tokens (default 600; capped at half the model's context)")
    ap.add_argument("--output-len", type=int, default=4, help="tokens per reply (default 4)")
    ap.add_argument("--think-scale", type=float, default=0.005, help="trace think times x this (default 0.005: WEKA's ~110 s mean gap -> ~0.5 s)")
    ap.add_argument("--think-cap-s", type=float, default=2.0, help="longest think time after scaling, s (default 2)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--device-tokens", type=int, default=1024, help="device pool, tokens (default 1024)")
    ap.add_argument("--hicache-ratio", type=float, default=2.0, help="host pool = this x device pool (default 2)")
    ap.add_argument("--store-tokens", type=int, default=2048, help="saria store capacity, tokens (default 2048)")
    ap.add_argument("--compute-threads", type=int, default=default_compute_threads(),
                    help="torch threads of each server's forward pass (OMP_NUM_THREADS; 0: torch's one per core). "
                         f"Default: one core fewer than this process may use ({default_compute_threads()} here), "
                         "so the servers' I/O threads and the client never stall a forward pass (a GPU host's "
                         "prefill does not share its cores either)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), help=f"configurations (default: {' '.join(CONFIGS)}); "
                    "'budget' alone takes --dwpd")
    ap.add_argument("--dwpd", type=float, default=None, help="budget:<DWPD> (default: half of E2's writes / store capacity)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per configuration, medians and min-max reported (default 5)")
    ap.add_argument("--no-replay", action="store_true", help="skip the replay comparison")
    ap.add_argument("--json", type=Path, default=None, help="write every run, median and the replay comparison here")
    ap.add_argument("--plot", type=Path, default=None, help="write the write-vs-TTFT figure (PNG) here")
    ap.add_argument("--work-dir", type=Path, default=None, help="stores, logs, client output (default: a private temp dir)")
    ap.add_argument("--replay-from", type=Path, default=None, metavar="JSON",
                    help="no servers: re-run the replay comparison of an earlier run's --json (same sessions and prefill rate)")
    args = ap.parse_args(argv)
    if args.replay_from is not None:
        if not args.replay_from.is_file():
            ap.error(f"--replay-from {args.replay_from}: no such file")
        return args
    check_args(ap, args)
    return args


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Errors that name the flag and its value."""
    args.model = args.model or [Path("models") / FULL_ATTENTION]
    for model in args.model:
        if not (model / "config.json").is_file():
            ap.error(f"--model {model}: no config.json there (build it: make models / make bench-models)")
    weka = args.weka or DEFAULT_TRACES
    if not weka.is_dir():
        ap.error(f"--weka {weka}: not a directory (the WEKA cc traces; CI has them at ../shared/traces/weka-cc)")
    args.weka = weka
    if not 1 <= args.sessions <= len(AGENTS):
        ap.error(f"--sessions {args.sessions}: must be 1-{len(AGENTS)}")
    for flag in ("repeats", "turns", "max_chars", "output_len", "page_size", "device_tokens", "store_tokens"):
        if getattr(args, flag) <= 0:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be > 0")
    if args.think_scale < 0 or args.think_cap_s < 0:
        ap.error(f"--think-scale {args.think_scale} / --think-cap-s {args.think_cap_s}: must be >= 0")
    if args.dwpd is not None and not (args.dwpd > 0 and math.isfinite(args.dwpd)):
        ap.error(f"--dwpd {args.dwpd}: must be a positive number")
    try:
        build_configs(args.configs, args.dwpd or 1.0)
        pools_for(args, args.model[0]).validate()
    except ValueError as e:
        ap.error(str(e))
    if not args.no_replay and DRAM_ONLY not in args.configs:
        ap.error(f"--configs: the replay comparison needs {DRAM_ONLY} (its first server measures the prefill rate); "
                 "add it, or pass --no-replay")
    if BUDGET in args.configs and args.dwpd is None and "eviction:E2" not in args.configs:
        ap.error("--configs: 'budget' without --dwpd needs eviction:E2 in the run (its writes set the DWPD)")


def build_configs(names: list[str], dwpd: float) -> list[BenchConfig]:
    """The configurations in run order; `budget` becomes `budget:<dwpd>`. Budget and auto
    run after eviction:E2 (whose writes may set the DWPD)."""
    out = [parse_config(f"budget:{dwpd:g}" if n == BUDGET else n) for n in names]
    return sorted(out, key=lambda c: c.admission is not None and c.admission.split(":")[0] in ("budget", "loadaware"))


def pools_for(args: argparse.Namespace, model: Path) -> Pools:
    return Pools(args.page_size, args.device_tokens, args.hicache_ratio, args.store_tokens, is_hybrid(model),
                 dtype=serving_dtype(model), compute_threads=args.compute_threads)


def workload_for(args: argparse.Namespace, model: Path) -> Workload:
    """The same sessions for every model; the longest conversation fits half its context."""
    return Workload(AGENTS[: args.sessions], args.turns, min(args.max_chars, context_limit(model) // 2), 1,
                    args.output_len, args.think_scale, args.think_cap_s, args.weka).validate()


def binding_dwpd(runs: dict[str, list[RunResult]], pools: Pools, kv_bytes_per_token: int) -> tuple[float, str]:
    """(DWPD, why): half of the first E2 run's writes over the store's capacity, a cap E2 would
    exceed twice over (the budget policy is E2 until its cap nears); when E2 wrote nothing, half
    of full duplicate's (then nothing below it can bind, and the report says so)."""
    capacity = pools.store_tokens * kv_bytes_per_token
    for name in ("eviction:E2", "full-duplicate"):
        if runs.get(name) and runs[name][0].ssd_bytes > 0:
            return runs[name][0].ssd_bytes / 2 / capacity, f"half of the first {name} run's writes"
    return 1e-3, "nothing was written by E2 or full duplicate: 0.001"


def prefill_probe(config: BenchConfig, repeat: int, args: argparse.Namespace, into: dict) -> Callable | None:
    """For the first dram-only run when the replay is on: a hook that measures the machine's prefill
    rate on that server once its workload is done (idle, cache flushed), into ``into``."""
    if args.no_replay or config.name != DRAM_ONLY or repeat:
        return None

    def measure(server: SGLangServer) -> None:
        server.flush_cache()
        into.update(fig10_replay.measure_prefill_tps(server))

    return measure


def bench_model(args: argparse.Namespace, model: Path, work: Path, bar: tqdm) -> ModelRun:
    pools, workload = pools_for(args, model), workload_for(args, model)
    work.mkdir(parents=True, exist_ok=True)
    prepared = prepare(workload, work)
    spec = fig10_replay.model_spec(model, pools.page_size)
    dwpd, dwpd_rule = args.dwpd, "--dwpd"
    cap_bytes = pools.store_tokens * spec.kv_bytes_per_token
    configs = [dataclasses.replace(c, file_max_bytes=cap_bytes) if c.backend == "file" else c
               for c in build_configs(args.configs, dwpd or 1.0)]
    runs: dict[str, list[RunResult]] = {}
    prefill: dict = {}
    for i in range(args.repeats):
        for config in configs:
            if config.admission and config.admission.startswith("budget:") and args.dwpd is None:
                if dwpd is None:
                    dwpd, dwpd_rule = binding_dwpd(runs, pools, spec.kv_bytes_per_token)
                config = parse_config(f"budget:{dwpd:.3g}")
            bar.set_postfix_str(f"{model.name} {config.name} #{i + 1}")
            result, _ = run_config(config, model, prepared, pools, work / f"{config.name.replace(':', '_')}-{i}",
                                   False, prefill_probe(config, i, args, prefill))
            runs.setdefault(config.name, []).append(result)
            bar.update(1)
    medians = {name: median_result(rs) for name, rs in runs.items()}
    spreads = {name: {k: spread(rs, k) for k in ("ssd_bytes", "ttft_mean_ms", "ttft_p90_ms")} for name, rs in runs.items()}
    replayed, cmp = {}, {}
    if not args.no_replay:
        replayed, cmp = replay_side(model, prepared, pools, prefill["prefill_tps"], medians, spreads, runs, True)
    workload_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(workload).items()}
    workload_json["requests"] = prepared.requests
    budget = {"dwpd": dwpd or 0.0, "rule": dwpd_rule,
              "cap_bytes": (dwpd or 0.0) * pools.store_tokens * spec.kv_bytes_per_token}  # one-day window: the whole run
    return ModelRun(str(model), pools.hybrid, workload_json, {**asdict(pools), "host_tokens": pools.host_tokens},
                    budget, cap_bytes, prefill, runs, medians, spreads, replayed, cmp)


def replay_side(model: Path, prepared, pools: Pools, prefill_tps: float, medians: dict[str, RunResult],
                spreads: dict[str, dict], runs: dict[str, list[RunResult]], file_bounded: bool) -> tuple[dict, dict]:
    """The same sessions and capacities through the replay at ``prefill_tps``, and the comparison.
    ``file_bounded``: the server's stock `file` had the store's capacity (its stand-in too, and
    both sides' ratios are over it); else it was unbounded (an earlier run's JSON: the stand-in
    holds everything, and the replay's ratios are over its full duplicate)."""
    spec = fig10_replay.model_spec(model, pools.page_size)
    sessions = fig10_replay.replay_sessions(prepared, pools.page_size, prepared_output_len(prepared))
    file_tokens = pools.store_tokens if file_bounded else sum(r.input_tokens for s in sessions for r in s.requests)
    plan = fig10_replay.ReplayPlan(pools, prefill_tps, len(prepared.conversations), file_ssd_tokens=file_tokens)
    replayed = fig10_replay.run_replay(list(medians), sessions, spec, plan)
    cmp = {}
    if {DRAM_ONLY, HICACHE_FILE, "full-duplicate"} <= set(medians):
        base = (HICACHE_FILE, HICACHE_FILE if file_bounded else "full-duplicate")
        cmp = fig10_replay.comparison({n: asdict(r) for n, r in medians.items()}, replayed, base, spreads,
                                      {n: [asdict(r) for r in rs] for n, rs in runs.items()})
    return replayed, cmp


def prepared_output_len(prepared) -> int:
    """Reply length the client asked for (`--sharegpt-output-len` of the prepared dataset)."""
    args = prepared.dataset_args
    return int(args[args.index("--sharegpt-output-len") + 1])


def replay_from_json(path: Path, work: Path, weka: Path | None = None) -> list[ModelRun]:
    """Re-run only the replay side of an earlier bench's JSON (its server numbers, its measured
    prefill rate, the same sessions rebuilt from its workload): the replay takes seconds.
    ``weka``: the traces' directory here, if not where the JSON's run read them."""
    model_runs = []
    for entry in json.loads(path.read_text()):
        model = Path(entry["model"])
        w = dict(entry["workload"])
        w.pop("requests", None)
        traces = weka or (Path(w["weka"]) if w["weka"] else None)
        workload = Workload(**{**w, "sessions": tuple(w["sessions"]), "weka": traces})
        pools = Pools(**{k: v for k, v in entry["pools"].items() if k != "host_tokens"})
        (work / model.name).mkdir(parents=True, exist_ok=True)
        prepared = prepare(workload, work / model.name)
        runs = {n: [RunResult(**r) for r in rs] for n, rs in entry["runs"].items()}
        medians = {n: RunResult(**r) for n, r in entry["medians"].items()}
        replayed, cmp = replay_side(model, prepared, pools, entry["prefill"]["prefill_tps"], medians, entry["spreads"],
                                    runs, bool(entry.get("store_cap_bytes")))
        model_runs.append(ModelRun(entry["model"], entry["hybrid"], entry["workload"], entry["pools"], entry["budget"],
                                   entry.get("store_cap_bytes", 0), entry["prefill"], runs, medians, entry["spreads"], replayed, cmp))
    return model_runs


def write_json(model_runs: list[ModelRun], path: Path) -> None:
    path.write_text(json.dumps([{**asdict(mr), "runs": {n: [asdict(r) for r in rs] for n, rs in mr.runs.items()},
                                 "medians": to_json(mr.medians)} for mr in model_runs], indent=2) + "\n")


def plot(model_runs: list[ModelRun], path: Path) -> None:
    """SSD writes (x hicache-file) against TTFT mean (x dram-only), one point per configuration:
    filled the server, hollow the replay (over its own hicache-file and dram-only stand-ins)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(model_runs), figsize=(6 * len(model_runs), 4.5), squeeze=False)
    for ax, mr in zip(axes[0], model_runs):
        base_w = mr.medians[HICACHE_FILE].ssd_bytes if HICACHE_FILE in mr.medians else 1.0
        base_t = mr.medians[DRAM_ONLY].ttft_mean_ms if DRAM_ONLY in mr.medians else 1.0
        replay = mr.replay
        for i, (name, r) in enumerate(mr.medians.items()):
            color = f"C{i % 10}"
            x, y = r.ssd_bytes / base_w if base_w else 0.0, r.ttft_mean_ms / base_t if base_t else 0.0
            ax.scatter([x], [y], s=40, color=color, label="server" if i == 0 else None)
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
            if name in replay and {HICACHE_FILE, DRAM_ONLY} <= set(replay):
                rw, rt = replay[HICACHE_FILE]["ssd_bytes"], replay[DRAM_ONLY]["ttft_mean_ms"]
                ax.scatter([replay[name]["ssd_bytes"] / rw if rw else 0.0], [replay[name]["ttft_mean_ms"] / rt if rt else 0.0],
                           s=60, facecolors="none", edgecolors=color, label="replay" if i == 0 else None)
        if replay:
            ax.legend(fontsize=8)
        ax.set_xlabel("SSD bytes written / hicache-file")
        ax.set_ylabel("TTFT mean / dram-only")
        ax.set_title(f"{Path(mr.model).name}: medians of {len(next(iter(mr.runs.values())))} run(s)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(mr: ModelRun) -> str:
    lines = [f"## {Path(mr.model).name} ({'GDN hybrid' if mr.hybrid else 'full attention'}): "
             f"{len(mr.workload['sessions'])} sessions, {mr.workload['requests']} requests, pools device "
             f"{mr.pools['device_tokens']} / host {mr.pools['host_tokens']} / store {mr.pools['store_tokens']} tokens, "
             f"budget DWPD {mr.budget['dwpd']:.3g} ({mr.budget['rule']})", "", results_table(mr.medians), ""]
    budget = next((r for n, r in mr.medians.items() if n.startswith("budget:")), None)
    if budget is not None:
        lines += [f"The budget's cap over the run: {mr.budget['cap_bytes']:.0f} bytes; it wrote {budget.ssd_bytes:.0f} "
                  f"(median), E2 {mr.medians['eviction:E2'].ssd_bytes:.0f}." if "eviction:E2" in mr.medians else "", ""]
    stock = mr.runs.get(HICACHE_FILE)
    if stock and mr.store_cap_bytes:
        lines += [f"Stock `file` bounded to the store's {mr.store_cap_bytes} bytes (SGLang's max_size): it held "
                  f"{max(r.store_bytes_held for r in stock):.0f} at most at the end of a run, and wrote "
                  f"{min(r.ssd_bytes for r in stock):.0f}-{max(r.ssd_bytes for r in stock):.0f}.", ""]
    lines.append("Run-to-run spread ((max - min) / median): " + ", ".join(
        f"{n} writes {s['ssd_bytes']:.2f} TTFT {s['ttft_mean_ms']:.2f}" for n, s in mr.spreads.items()))
    if mr.comparison:
        lines += ["", f"Replay at {mr.prefill['prefill_tps']:.0f} prefill tokens/s (measured on the first dram-only server once its run was done, cache flushed):", "",
                  fig10_replay.comparison_table(mr.comparison), "", fig10_replay.orderings_table(mr.comparison)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    work = args.work_dir or private_work_dir("saria-fig10-")
    work.mkdir(parents=True, exist_ok=True)
    if args.replay_from:
        model_runs = replay_from_json(args.replay_from, work, args.weka)
        print("\n\n".join(report(mr) for mr in model_runs))
        if args.json:
            write_json(model_runs, args.json)
        if args.plot:
            plot(model_runs, args.plot)
        return 0
    total = len(args.model) * len(args.configs) * args.repeats
    print(f"{total} server runs ({len(args.model)} model(s) x {len(args.configs)} configurations x {args.repeats}); work dir {work}")
    model_runs = []
    try:
        with tqdm(total=total, desc="runs") as bar:
            for model in args.model:
                model_runs.append(bench_model(args, model, work / model.name, bar))
        for mr in model_runs:
            print("\n" + report(mr))
            try:
                fail_if_unclean(mr.runs)
            except BenchError as e:
                raise BenchError(f"{mr.model}: {e} (see {work}/*/*/client/bench_serving.log)") from None
    except BenchError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        if model_runs and args.json:
            write_json(model_runs, args.json)
        print(f"\ntotal wall time {time.monotonic() - started:.0f} s")
    if args.plot:
        plot(model_runs, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
