"""``saria-admission-sweep``: admission policies against the clairvoyant frontier, on the same requests.

For each setting (workload, model, modelled GPU prefill rate, SSD capacity) it builds the frontier
(``replay/frontier.py``) and replays every policy on the same requests (``same_requests`` refuses
anything else), recording each policy's writes over the SSD capacity, CHAR and replay time. The JSON
holds only raw records (frontier points, policy rows); ``render`` derives from them, each time, the
frontier's writes at a policy's own CHAR and the two checks:

- **writes**: the policy writes <= ``WRITES_BOUND`` x the frontier at its own CHAR;
- **CHAR**: its CHAR >= the frontier's best CHAR - ``CHAR_SLACK``.

A policy whose CHAR is above the frontier's best has no frontier value there (the frontier does not
dominate it): its writes check is unmet and the row says so.

    saria-admission-sweep run --workload weka:176-360 --models qwen3-8b --loads 6500 --json out.json
    saria-admission-sweep render out.json          # the Markdown tables of docs/admission.md
    saria-admission-sweep timing --repeats 3       # auto / loadaware vs eviction:E2 on the 350 WEKA sessions
    saria-admission-sweep perturb --workload weka:176-360 --ssd-tokens 2000000 --json out.json  # the load's spread

``--variant auto@auto_odds=0.5`` adds a row of a policy with one constant changed (the halved and
doubled constants of ``docs/admission.md``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from sglang_saria.config import CHECKPOINT_PLACEMENTS, AdmissionConfig, CapacityConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import HINT_MODES, ReplayRun, ReplaySettings, replay, replay_oracle
from sglang_saria.replay.frontier import DEFAULT_SHARES, Frontier, build_frontier
from sglang_saria.replay.loaders import load_trace, shared_dir
from sglang_saria.replay.loaders.weka import load_weka_file
from sglang_saria.replay.metrics import same_requests
from sglang_saria.replay.oracle import FutureNeeds, request_id
from sglang_saria.replay.report import md_table
from sglang_saria.replay.workload import apply_limits, session_starts

DOC_BEGIN, DOC_END = "<!-- frontier-tables:begin -->", "<!-- frontier-tables:end -->"
WRITES_BOUND = 1.3
_PLACEMENT_HELP = "a hybrid model's GDN states: where SGLang 0.5.23 keeps them (default), or the paper's grid"
CHAR_SLACK = 0.02
TIME_BOUND = 1.2  # issue 37: the 350-session replay with `auto` takes <= this x `eviction:E2`'s time
POLICIES = ("none", "full-duplicate", "eviction:E2", "eviction:E3", "auto", "loadaware", "oracle")
PERTURB_FACTORS = (0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03)
PERTURB_POLICIES = ("full-duplicate", "eviction:E2", "auto", "auto@hints=end")
HINDSIGHT_BARS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0)
_WEKA_FILE = re.compile(r"trace_(\d+)\.json(\.gz)?")


def load_workload(spec: str, block_tokens: int) -> list:
    """``weka:A-B`` (the WEKA files numbered A..B), ``synthetic[:SEED]:N`` (N sessions), ``tracelab``
    (the TraceLab sample); traces under ``$SARIA_SHARED_DIR/traces``."""
    kind, _, arg = spec.partition(":")
    traces = shared_dir() / "traces"
    if kind == "weka":
        m = re.fullmatch(r"(\d+)-(\d+)", arg)
        if not m:
            raise ValueError(f"workload {spec!r}: expected weka:A-B (file numbers)")
        lo, hi = int(m.group(1)), int(m.group(2))
        root = traces / "weka-cc"
        if not root.is_dir():
            raise ValueError(f"workload {spec!r}: {root} is not a directory (SARIA_SHARED_DIR)")
        files = sorted(p for p in root.iterdir() if (f := _WEKA_FILE.fullmatch(p.name)) and lo <= int(f.group(1)) <= hi)
        if not files:
            raise ValueError(f"workload {spec!r}: no trace_NNNN files numbered {lo}..{hi} in {root}")
        sessions = [s for p in files for s in load_weka_file(p, block_tokens)]
    elif kind == "synthetic":
        seed, _, n = arg.rpartition(":")
        if not n.isdigit():
            raise ValueError(f"workload {spec!r}: expected synthetic[:SEED]:N")
        sessions = load_trace(f"synthetic:{seed}" if seed else "synthetic", block_tokens, int(n))
    elif kind == "tracelab" and not arg:
        sessions = load_trace(f"tracelab:{traces / 'tracelab-sample' / 'round_trace.jsonl'}", block_tokens)
    else:
        raise ValueError(f"workload {spec!r}: expected weka:A-B, synthetic[:SEED]:N or tracelab")
    return apply_limits(sessions)


@dataclass(frozen=True)
class Setting:
    workload: str
    model: str
    prefill_tps: float
    ssd_tokens: int  # 0: the default capacity
    placement: str = "sglang"  # a hybrid model's GDN states (MetadataConfig.checkpoint_placement)


def parse_variant(text: str) -> tuple[str, dict]:
    """``POLICY@field=value,...`` (fields of AdmissionConfig, or ``hints=end|next``: the agents' hints the
    replay sends, ``ReplaySettings.hints``) -> (policy, changes)."""
    policy, _, rest = text.partition("@")
    changes = {}
    for part in filter(None, rest.split(",")):
        field, _, value = part.partition("=")
        if field == "hints":
            if value not in HINT_MODES:
                raise ValueError(f"--variant {text!r}: hints must be one of {', '.join(HINT_MODES)}, got {value!r}")
            changes[field] = value
            continue
        if not hasattr(AdmissionConfig, field):
            raise ValueError(f"--variant {text!r}: AdmissionConfig has no field {field!r}")
        changes[field] = type(getattr(AdmissionConfig(), field))(float(value))
    return policy, changes


def variant_text(changes: dict, hints: str) -> str:
    """How a row names its variant: ``field=value,...`` then ``hints=MODE`` (empty: the policy's defaults)."""
    return ",".join([f"{k}={v:g}" for k, v in changes.items()] + ([f"hints={hints}"] if hints != "none" else []))


def _replay_inputs(s: Setting) -> tuple:
    """What every replay of setting ``s`` shares: (model spec, sessions, replay settings, session
    starts, the base config with the setting's block size and capacities)."""
    spec = get_model_spec(s.model)
    bt = spec.default_block_tokens
    sessions = load_workload(s.workload, bt)
    settings = ReplaySettings(prefill_tokens_per_s=s.prefill_tps)
    starts = session_starts(sessions, settings.window_s, settings.seed)
    capacity = CapacityConfig(ssd_tokens=s.ssd_tokens) if s.ssd_tokens else CapacityConfig()
    metadata = MetadataConfig(block_tokens=bt, checkpoint_placement=s.placement)
    base = SariaConfig(metadata=metadata, capacity=capacity).validate()
    return spec, sessions, settings, starts, base


def run_setting(s: Setting, policies: list[str], variants: list[str], shares: list[float], max_passes: int,
                frontier: dict | None = None) -> dict:
    """The frontier (``frontier``: one built before on the same setting, kept) and every policy (and
    variant) on one setting: raw records. ``oracle`` rows are the replay's ``--policy oracle`` (at most
    ``ReplaySettings.oracle_max_passes`` passes; the row says whether it reached its fixed point)."""
    spec, sessions, settings, starts, base = _replay_inputs(s)
    rows = []
    for text in [*policies, *variants]:
        policy, changes = parse_variant(text)
        hints = changes.pop("hints", "none")
        cfg = replace(base, admission=AdmissionConfig(policy=policy, **changes)).validate()
        t0 = time.perf_counter()
        m = replay(sessions, starts, cfg, spec, replace(settings, hints=hints)).metrics
        rows.append({"policy": policy, "variant": variant_text(changes, hints),
                     "writes_norm": m["ssd_writes_norm"], "char": m["char"], "requests": m["requests"],
                     "request_set": m["request_set"], "writes_never_read_frac": m["writes_never_read_frac"],
                     "replay_s": time.perf_counter() - t0,
                     **({"oracle_passes": m["oracle_passes"], "oracle_fixed_point": m["oracle_fixed_point"]}
                        if policy == "oracle" else {})})
    same_requests(rows)
    t0 = time.perf_counter()
    if frontier is None:
        frontier = build_frontier(sessions, starts, base, spec, settings, shares, max_passes).to_json()
    return {"workload": s.workload, "model": s.model, "prefill_tps": s.prefill_tps,
            "ssd_tokens": base.capacity.ssd_tokens, "dram_tokens": base.capacity.dram_tokens,
            "placement": placement_of(s.model, s.placement), "frontier": frontier, "frontier_s": time.perf_counter() - t0, "rows": rows}


def perturb(s: Setting, policies: list[str], factors: list[float]) -> dict:
    """Each policy replayed at the setting's prefill rate times each factor, on the same requests (only
    the modelled GPU's speed moves): how far CHAR and writes move for a load a few percent off. Near the
    GPU's saturation the replay is bistable (a few more misses lengthen the queue, sessions' gaps in
    service time grow, hits fall further), so one replay there draws one basin; the spread says what a
    check at that setting decides. Raw records."""
    spec, sessions, settings, starts, base = _replay_inputs(s)
    rows = []
    for text in policies:
        policy, changes = parse_variant(text)
        hints = changes.pop("hints", "none")
        cfg = replace(base, admission=AdmissionConfig(policy=policy, **changes)).validate()
        runs = []
        for f in factors:
            m = replay(sessions, starts, cfg, spec,
                       replace(settings, prefill_tokens_per_s=s.prefill_tps * f, hints=hints)).metrics
            runs.append({"policy": text, "factor": f, "writes_norm": m["ssd_writes_norm"], "char": m["char"],
                         "queue_mean_s": m["queue_mean_s"], "requests": m["requests"], "request_set": m["request_set"]})
        rows.append({"policy": policy, "variant": variant_text(changes, hints), "runs": same_requests(runs)})
    same_requests([r for row in rows for r in row["runs"]])
    return {"workload": s.workload, "model": s.model, "prefill_tps": s.prefill_tps,
            "ssd_tokens": base.capacity.ssd_tokens, "placement": placement_of(s.model, s.placement),
            "factors": list(factors), "rows": rows}


def hindsight(s: Setting, hints: str, bars: list[float]) -> dict:
    """How far ``auto``'s classes can go on these requests: ``auto`` replayed as it runs (``learned``),
    then with each class's chance fixed to what that run had learned by its end (hindsight: the classes'
    own statistics of these very requests, no learning transient) at each bar (``auto_odds``). Where no
    bar meets both checks with hindsight chances, no way of learning the classes' chances would: what is
    missing is what a class can tell at the moment of a write. Raw records, judged by ``render`` against
    the setting's frontier."""
    spec, sessions, settings, starts, base = _replay_inputs(s)
    settings = replace(settings, hints=hints)

    def record(res, bar: float) -> dict:
        m = res.metrics
        return {"bar": bar, "writes_norm": m["ssd_writes_norm"], "char": m["char"], "requests": m["requests"],
                "request_set": m["request_set"]}

    def cfg(bar: float) -> SariaConfig:
        return replace(base, admission=AdmissionConfig(policy="auto", auto_odds=bar)).validate()

    bar0 = AdmissionConfig().auto_odds
    res = replay(sessions, starts, cfg(bar0), spec, settings)
    chances = res.core.admission.chances()
    learned, rows = record(res, bar0), []
    for bar in bars:
        run = ReplayRun(sessions, starts, cfg(bar), spec, settings)
        run.core.admission.fix_chances(chances)
        run.loop()
        rows.append(record(run.result(), bar))
    same_requests([learned, *rows])
    return {"workload": s.workload, "model": s.model, "prefill_tps": s.prefill_tps,
            "ssd_tokens": base.capacity.ssd_tokens, "placement": placement_of(s.model, s.placement), "hints": hints,
            "learned": learned, "rows": rows}


def hindsight_setting(doc: dict, rec: dict) -> dict:
    """The setting (with its frontier) a hindsight record was replayed on."""
    for s in doc["settings"]:
        if all(s[k] == rec[k] for k in ("workload", "model", "prefill_tps", "ssd_tokens")):
            return s
    raise ValueError(f"no setting {rec['workload']} {rec['model']} {rec['prefill_tps']:g} {rec['ssd_tokens']} for a "
                     "hindsight record (saria-admission-sweep run it first)")


def placement_of(model: str, placement: str) -> str | None:
    """What a record says of its GDN states: the placement on a hybrid model, None on an FA model
    (it has no states, so the setting changes nothing)."""
    return placement if get_model_spec(model).is_hybrid else None


# ---------------------------------------------------------------- derived values and rendering
def judge(setting: dict, row: dict) -> dict:
    """A row against its setting's frontier: the frontier's writes at its CHAR and the two checks."""
    fr = Frontier.from_json(setting["frontier"])
    at = fr.writes_at(row["char"])
    ratio = None if at is None else (row["writes_norm"] / at if at > 0 else (1.0 if row["writes_norm"] == 0 else float("inf")))
    gap = row["char"] - fr.best_char
    return {"frontier_writes": at, "ratio": ratio, "char_gap": gap,
            "writes_met": ratio is not None and ratio <= WRITES_BOUND, "char_met": gap >= -CHAR_SLACK}


def _label(row: dict) -> str:
    return row["policy"] + (f" ({row['variant']})" if row["variant"] else "")


def _hindsight_cells(s: dict, h: dict) -> list[str]:
    def pair(row: dict) -> str:
        j = judge(s, row)
        return ("above frontier" if j["ratio"] is None else f"{j['ratio']:.2f}x") + f", {j['char_gap']:+.3f}"

    judged = [(r, judge(s, r)) for r in h["rows"]]
    both = [f"{r['bar']:g}" for r, j in judged if j["writes_met"] and j["char_met"]]
    char_met = [(j["ratio"], r["bar"]) for r, j in judged if j["char_met"] and j["ratio"] is not None]
    at4 = next((r for r in h["rows"] if r["bar"] == h["learned"]["bar"]), None)
    return [s["workload"], s["model"], f"{s['prefill_tps']:,.0f}", f"{s['ssd_tokens'] / 1e6:g}M", h["hints"],
            pair(h["learned"]), "-" if at4 is None else pair(at4), ", ".join(both) or "**none**",
            "-" if not char_met else "{:.2f}x ({:g})".format(*min(char_met))]


def render(doc: dict, policies: tuple[str, ...] = ("auto", "loadaware", "eviction:E2", "eviction:E3", "full-duplicate", "oracle")) -> str:
    """The Markdown tables: per setting the frontier, then each policy against it."""
    def yn(v: bool) -> str:
        return "met" if v else "**unmet**"

    def ssd(s: dict) -> str:
        return f"{s['ssd_tokens'] / 1e6:g}M"

    def states(s: dict) -> str:  # records from before the field were replayed on the grid
        return placement_of(s["model"], s.get("placement", "grid")) or "-"

    frontier_rows, rows, variant_rows, hinted_rows = [], [], [], []
    for s in doc["settings"]:
        fr = Frontier.from_json(s["frontier"])
        best = max(fr.points, key=lambda p: p.char)
        dominated = [r for r in s["rows"] if not r["variant"] and r["char"] > fr.best_char]
        frontier_rows.append([s["workload"], s["model"], states(s), f"{s['prefill_tps']:,.0f}", ssd(s), str(len(fr.points) - 1),
                              f"{fr.best_char:.3f}", f"{best.writes_norm:.2f}", "yes" if fr.converged else "**no**",
                              ", ".join(_label(r) for r in dominated) or "none"])
        for r in s["rows"]:
            if r["policy"] not in policies:
                continue
            j = judge(s, r)
            cells = [s["workload"], s["model"], f"{s['prefill_tps']:,.0f}", ssd(s), _label(r), f"{r['writes_norm']:.2f}",
                     f"{r['char']:.3f}", "-" if j["frontier_writes"] is None else f"{j['frontier_writes']:.2f}",
                     "above frontier" if j["ratio"] is None else f"{j['ratio']:.2f}x", f"{j['char_gap']:+.3f}",
                     yn(j["writes_met"]), yn(j["char_met"])]
            (hinted_rows if "hints=" in r["variant"] else variant_rows if r["variant"] else rows).append(cells)
    head = ["workload", "model", "tok/s", "SSD", "policy", "W/C", "CHAR", "frontier W/C at CHAR", "W / frontier",
            "CHAR - best", f"writes <= {WRITES_BOUND}x", f"CHAR >= best - {CHAR_SLACK}"]
    out = ["### The frontier", "",
           md_table(["workload", "model", "GDN states", "tok/s", "SSD", "points", "best CHAR", "its W/C", "all at fixed point",
                     "policies above its best CHAR"], frontier_rows),
           "", "### Policies against the frontier", "", md_table(head, rows)]
    if hinted_rows:
        out += ["", "### With agents' hints (each request names its session; the last one says `end`)", "",
                md_table(head, hinted_rows)]
    if variant_rows:
        out += ["", "### Other constants and closures", "", md_table(head, variant_rows)]
    if doc.get("labels"):
        lab_rows = []
        for s in doc["labels"]:
            for r in s["rows"]:
                lab_rows.append([s["workload"], s["model"], states(s), f"{s['prefill_tps']:,.0f}", ssd(s), r["policy"],
                                 f"{r['writes']:,}", f"{r['useful'] / r['writes']:.0%}" if r["writes"] else "-",
                                 f"{r['wasted_admitted']:,}", f"{r['wasted_closure']:,}", f"{r['wanted']:,}",
                                 f"{r['missed']:,}"])
        out += ["", "### Where policies go wrong, by the oracle's labels", "",
                md_table(["workload", "model", "GDN states", "tok/s", "SSD", "policy", "block writes", "useful (wanted later)",
                          "wasted: admitted block", "wasted: closed-over ancestor", "oracle-wanted blocks",
                          "missed (never written)"], lab_rows)]
    if doc.get("timing"):
        t = doc["timing"]
        med = {k: {p: statistics.median(v) for p, v in t[k].items()} for k in ("runs", "cpu_runs")}
        out += ["", "### Replay time", "",
                md_table(["workload", "model", "policy", "runs", "median wall s", "vs eviction:E2", "median CPU s",
                          "vs eviction:E2 (CPU)"],
                         [[t["workload"], t["model"], p, str(len(t["runs"][p])),
                           *(x for k in ("runs", "cpu_runs")
                             for x in (f"{med[k][p]:.2f}", f"{med[k][p] / med[k]['eviction:E2']:.2f}x"))]
                          for p in t["runs"]])]
    if doc.get("hindsight"):
        out += ["", "### `auto`'s classes with hindsight chances", "", md_table(
            ["workload", "model", "tok/s", "SSD", "hints", "learned (bar 4): W / frontier, CHAR - best",
             "hindsight at bar 4", "bars meeting both with hindsight", "fewest writes with CHAR met (bar)"],
            [_hindsight_cells(hindsight_setting(doc, h), h) for h in doc["hindsight"]])]
    if doc.get("perturb"):
        pert_rows = []
        for p in doc["perturb"]:
            for r in p["rows"]:
                char = [x["char"] for x in r["runs"]]
                writes = [x["writes_norm"] for x in r["runs"]]
                queue = [x["queue_mean_s"] for x in r["runs"]]
                pert_rows.append([p["workload"], p["model"], f"{p['prefill_tps']:,.0f}", ssd(p), _label(r),
                                  f"{min(p['factors']):.2f}-{max(p['factors']):.2f}", str(len(r["runs"])),
                                  f"{min(char):.3f}", f"{statistics.median(char):.3f}", f"{max(char):.3f}",
                                  f"{min(writes):.2f}", f"{statistics.median(writes):.2f}", f"{max(writes):.2f}",
                                  f"{min(queue):.1f}-{max(queue):.1f}"])
        out += ["", "### The same requests at a load a few percent off", "",
                md_table(["workload", "model", "tok/s", "SSD", "policy", "load factor", "runs", "CHAR min", "CHAR median",
                          "CHAR max", "W/C min", "W/C median", "W/C max", "mean queue s"], pert_rows)]
    return "\n".join(out) + "\n"


def labels(s: Setting, policies: list[str], max_passes: int) -> dict:
    """The fixed-point oracle's wants as labels for each policy's writes: a write is useful when, at that
    moment, a request not yet begun wants the block from below DRAM (the oracle's own rule, with the
    wants it recorded under its timing), else wasted (split: the block the policy admitted, or an
    ancestor its chain closed over, at once or, under lazy closure, at the ancestor's own eviction); a block the oracle wanted and the policy never wrote is missed.
    Counts of block writes and of blocks."""
    spec, sessions, settings, starts, base = _replay_inputs(s)
    oracle, needs = replay_oracle(sessions, starts, replace(base, admission=AdmissionConfig(policy="oracle")), spec,
                                  settings, {}, None, max_passes)
    wanted = set().union(*needs.values()) if needs else set()
    rows = []
    for text in policies:
        policy, changes = parse_variant(text)
        hints = changes.pop("hints", "none")
        future = FutureNeeds.of(needs)
        written: list[tuple[int, bool, bool]] = []  # (block, closed over, wanted later)
        forced: list = [None]  # the block of the sequencer's last decision if a lazy closure forced it

        def hook(key, node, event, parent_on_ssd, written=written, future=future, forced=forced):
            closed = event == "closure" or key == forced[0]  # AdmissionEvent.CLOSURE: a str enum
            written.append((key, closed, future.wanted_later(key)))

        run = ReplayRun(sessions, starts, replace(base, admission=AdmissionConfig(policy=policy, **changes)), spec,
                        replace(settings, hints=hints), on_write=hook)
        _track_forced_closure(run.core.sequencer, forced)
        admit = run.admit

        def labelled_admit(sid, ridx, t, issue_t, admit=admit, future=future):
            future.begun(request_id(sid, ridx))  # as the oracle is told
            admit(sid, ridx, t, issue_t)

        run.admit = labelled_admit
        run.loop()
        keys = {k for k, _, _ in written}
        variant = variant_text(changes, hints)
        rows.append({"policy": policy + (f" ({variant})" if variant else ""), "writes": len(written),
                     "useful": sum(u for _, _, u in written),
                     "wasted_admitted": sum(not u and not c for _, c, u in written),
                     "wasted_closure": sum(not u and c for _, c, u in written),
                     "wanted": len(wanted), "missed": len(wanted - keys)})
    return {"workload": s.workload, "model": s.model, "prefill_tps": s.prefill_tps,
            "ssd_tokens": base.capacity.ssd_tokens, "placement": placement_of(s.model, s.placement),
            "oracle_fixed_point": oracle.metrics["oracle_fixed_point"], "rows": rows}


def _track_forced_closure(seq, forced: list) -> None:
    """Wrap ``seq.admit`` so that ``forced[0]`` names the block of its last decision when a lazy closure
    forced it (an ancestor written at its own eviction because a descendant's SSD copy needs it): such
    a write is the closure's cost, not the policy's choice of that block."""
    decide = seq.admit

    def admit(view, key, node, event, evictions=0, hbm=()):
        before = seq.stats.closure_forced
        chain = decide(view, key, node, event, evictions, hbm)
        forced[0] = key if chain and seq.stats.closure_forced > before else None
        return chain

    seq.admit = admit


def timing(workload: str, model: str, policies: list[str], repeats: int, tps: float) -> dict:
    """Replay time per policy, the policies interleaved in each round (a loaded machine slows all alike):
    wall seconds (``runs``) and this process's CPU seconds (``cpu_runs``: what another job on the machine
    does not add to; the replay is single-threaded, so on an idle machine the two agree)."""
    spec = get_model_spec(model)
    sessions = load_workload(workload, spec.default_block_tokens)
    settings = ReplaySettings(prefill_tokens_per_s=tps)
    starts = session_starts(sessions, settings.window_s, settings.seed)
    runs: dict[str, list[float]] = {p: [] for p in policies}
    cpu_runs: dict[str, list[float]] = {p: [] for p in policies}
    for _ in range(repeats):
        for p in policies:
            policy, changes = parse_variant(p)
            hints = changes.pop("hints", "none")
            cfg = SariaConfig(admission=AdmissionConfig(policy=policy, **changes),
                              metadata=MetadataConfig(block_tokens=spec.default_block_tokens)).validate()
            t0, c0 = time.perf_counter(), time.process_time()
            replay(sessions, starts, cfg, spec, replace(settings, hints=hints))
            runs[p].append(time.perf_counter() - t0)
            cpu_runs[p].append(time.process_time() - c0)
    return {"workload": workload, "model": model, "prefill_tps": tps, "runs": runs, "cpu_runs": cpu_runs}


def _load(path: str) -> dict:
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else {"settings": []}


def _save(doc: dict, path: str) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="saria-admission-sweep", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="replay settings; each is appended to --json as it finishes")
    r.add_argument("--workload", required=True, help="weka:A-B | synthetic[:SEED]:N | tracelab")
    r.add_argument("--models", default="qwen3-8b,qwen3.5-9b")
    r.add_argument("--loads", default="6500,13000,20000", help="modelled GPU prefill tokens/s")
    r.add_argument("--ssd-tokens", default="0", help="SSD capacities (tokens; 0: the default), comma-separated")
    r.add_argument("--policies", default=",".join(POLICIES))
    r.add_argument("--variant", action="append", default=[], help="POLICY@field=value (repeatable)")
    r.add_argument("--shares", default=",".join(f"{s:g}" for s in DEFAULT_SHARES))
    r.add_argument("--max-passes", type=int, default=40)
    r.add_argument("--placement", choices=CHECKPOINT_PLACEMENTS, default="sglang", help=_PLACEMENT_HELP)
    r.add_argument("--rows-only", action="store_true",
                   help="keep the frontier the JSON holds for each setting; replay only --policies and --variant")
    r.add_argument("--json", dest="json_path", required=True)
    d = sub.add_parser("render", help="print the Markdown tables of a JSON, or write them into --doc")
    d.add_argument("json_path")
    d.add_argument("--doc", help=f"a Markdown file whose block between {DOC_BEGIN} and {DOC_END} is replaced")
    g = sub.add_parser("merge", help="merge JSONs of separate runs (settings in order, the last timing)")
    g.add_argument("out")
    g.add_argument("inputs", nargs="+")
    lb = sub.add_parser("labels", help="the fixed-point oracle's labels on each policy's writes, added to --json")
    lb.add_argument("--workload", required=True)
    lb.add_argument("--model", default="qwen3-8b")
    lb.add_argument("--load", type=float, default=6500.0)
    lb.add_argument("--ssd-tokens", type=int, default=0)
    lb.add_argument("--policies", default="auto,loadaware,eviction:E2")
    lb.add_argument("--max-passes", type=int, default=40)
    lb.add_argument("--placement", choices=CHECKPOINT_PLACEMENTS, default="sglang", help=_PLACEMENT_HELP)
    lb.add_argument("--json", dest="json_path", required=True)
    t = sub.add_parser("timing", help="replay time of policies against eviction:E2, added to --json")
    t.add_argument("--workload", default="weka:1-360")
    t.add_argument("--model", default="qwen3-8b")
    t.add_argument("--load", type=float, default=6500.0)
    t.add_argument("--policies", default="eviction:E2,auto,loadaware")
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--json", dest="json_path", required=True)
    pt = sub.add_parser("perturb", help="policies at the setting's load times each factor (same requests), added to --json")
    pt.add_argument("--workload", required=True)
    pt.add_argument("--model", default="qwen3.5-9b")
    pt.add_argument("--load", type=float, default=6500.0)
    pt.add_argument("--ssd-tokens", type=int, default=0)
    pt.add_argument("--policies", default=",".join(PERTURB_POLICIES))
    pt.add_argument("--factors", default=",".join(f"{f:g}" for f in PERTURB_FACTORS))
    pt.add_argument("--placement", choices=CHECKPOINT_PLACEMENTS, default="sglang", help=_PLACEMENT_HELP)
    pt.add_argument("--json", dest="json_path", required=True)
    hs = sub.add_parser("hindsight", help="auto with its classes' hindsight chances at each bar, added to --json")
    hs.add_argument("--workload", required=True)
    hs.add_argument("--models", default="qwen3-8b,qwen3.5-9b")
    hs.add_argument("--loads", default="6500,13000,20000")
    hs.add_argument("--ssd-tokens", default="0", help="SSD capacities (tokens; 0: the default), comma-separated")
    hs.add_argument("--hints", choices=HINT_MODES, default="none")
    hs.add_argument("--bars", default=",".join(f"{b:g}" for b in HINDSIGHT_BARS), help="auto_odds values")
    hs.add_argument("--placement", choices=CHECKPOINT_PLACEMENTS, default="sglang", help=_PLACEMENT_HELP)
    hs.add_argument("--json", dest="json_path", required=True,
                    help="a JSON of `run` that holds each setting's frontier; the records are added to it")
    args = p.parse_args(argv)
    if args.cmd == "hindsight":
        bars = [float(b) for b in args.bars.split(",")]
        if not bars or min(bars) <= 0:
            p.error(f"--bars {args.bars}: need positive auto_odds values")
        doc = _load(args.json_path)
        key = ("workload", "model", "prefill_tps", "ssd_tokens", "hints")
        for model in args.models.split(","):
            for tps in args.loads.split(","):
                for ssd in args.ssd_tokens.split(","):
                    s = Setting(args.workload, model, float(tps), int(float(ssd)), args.placement)
                    hindsight_setting(doc, {"workload": s.workload, "model": model, "prefill_tps": s.prefill_tps,
                                            "ssd_tokens": s.ssd_tokens or CapacityConfig().ssd_tokens})
                    rec = hindsight(s, args.hints, bars)
                    doc["hindsight"] = [x for x in doc.get("hindsight", []) if [x[k] for k in key]
                                        != [rec[k] for k in key]] + [rec]
                    _save(doc, args.json_path)
        sys.stdout.write(render(doc))
        return 0
    if args.cmd == "render":
        tables = render(_load(args.json_path))
        if not args.doc:
            sys.stdout.write(tables)
            return 0
        text = Path(args.doc).read_text()
        if DOC_BEGIN not in text or DOC_END not in text:
            p.error(f"--doc {args.doc}: no {DOC_BEGIN} ... {DOC_END} block to replace")
        head, rest = text.split(DOC_BEGIN, 1)
        Path(args.doc).write_text(head + DOC_BEGIN + "\n" + tables + rest[rest.index(DOC_END):])
        return 0
    if args.cmd == "merge":
        merged: dict = {"settings": []}
        for path in args.inputs:
            part = _load(path)
            merged["settings"] += part["settings"]
            if "timing" in part:
                merged["timing"] = part["timing"]
            merged.setdefault("labels", []).extend(part.get("labels", []))
            merged.setdefault("perturb", []).extend(part.get("perturb", []))
            merged.setdefault("hindsight", []).extend(part.get("hindsight", []))
        _save(merged, args.out)
        return 0
    if args.cmd == "labels":
        doc = _load(args.json_path)
        rec = labels(Setting(args.workload, args.model, args.load, args.ssd_tokens, args.placement), args.policies.split(","),
                     args.max_passes)
        doc["labels"] = [x for x in doc.get("labels", []) if (x["workload"], x["model"], x["prefill_tps"], x["ssd_tokens"])
                         != (rec["workload"], rec["model"], rec["prefill_tps"], rec["ssd_tokens"])] + [rec]
        _save(doc, args.json_path)
        sys.stdout.write(render(doc))
        return 0
    if args.cmd == "perturb":
        factors = [float(f) for f in args.factors.split(",")]
        if not factors or min(factors) <= 0:
            p.error(f"--factors {args.factors}: need positive factors of --load")
        for v in args.policies.split(","):
            parse_variant(v)
        doc = _load(args.json_path)
        rec = perturb(Setting(args.workload, args.model, args.load, args.ssd_tokens, args.placement),
                      args.policies.split(","), factors)
        key = ("workload", "model", "prefill_tps", "ssd_tokens")
        doc["perturb"] = [x for x in doc.get("perturb", []) if [x[k] for k in key] != [rec[k] for k in key]] + [rec]
        _save(doc, args.json_path)
        sys.stdout.write(render(doc))
        return 0
    if args.cmd == "timing":
        pols = args.policies.split(",")
        if "eviction:E2" not in pols:
            p.error("--policies: eviction:E2 is the baseline and must be among them")
        doc = _load(args.json_path)
        doc["timing"] = timing(args.workload, args.model, pols, args.repeats, args.load)
        _save(doc, args.json_path)
        sys.stdout.write(render(doc))
        return 0
    for v in args.variant:
        parse_variant(v)  # a bad variant stops the run before any replay
    doc = _load(args.json_path)
    for model in args.models.split(","):
        for tps in args.loads.split(","):
            for ssd in args.ssd_tokens.split(","):
                s = Setting(args.workload, model, float(tps), int(float(ssd)), args.placement)
                t0 = time.perf_counter()
                old = next((i for i, x in enumerate(doc["settings"]) if (x["workload"], x["model"], x["prefill_tps"])
                            == (s.workload, s.model, s.prefill_tps) and x["ssd_tokens"] == (s.ssd_tokens or
                            CapacityConfig().ssd_tokens)), None)
                if args.rows_only and old is None:
                    p.error(f"--rows-only: {args.json_path} has no {s} to add rows to")
                rec = run_setting(s, [x for x in args.policies.split(",") if x], args.variant,
                                  [float(x) for x in args.shares.split(",")], args.max_passes,
                                  doc["settings"][old]["frontier"] if args.rows_only else None)
                if args.rows_only:  # the new rows replace those of the same policy and variant, the rest stay
                    prev = doc["settings"][old]
                    new = {(r["policy"], r["variant"]): r for r in rec["rows"]}
                    rec["rows"] = [new.pop((r["policy"], r["variant"]), r) for r in prev["rows"]] + list(new.values())
                    same_requests(rec["rows"])
                    rec["frontier_s"] = prev["frontier_s"]
                if old is None:
                    doc["settings"].append(rec)
                else:
                    doc["settings"][old] = rec
                _save(doc, args.json_path)
                print(f"{s}: {time.perf_counter() - t0:.0f} s", flush=True)
    sys.stdout.write(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
