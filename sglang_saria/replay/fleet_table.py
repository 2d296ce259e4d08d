"""Fleet table: how routing changes a fleet's SSD writes, hit ratio, TTFT and busiest drive.

The same WEKA sessions (the replay's defaults: 350 sessions, 12 h start window, seed 0) are
replayed on 1, 2, 4 and 8 nodes behind each router, for both models and the chosen policies. The
load is the same total load in every row (the same requests spread over the fleet); each node has
the single node's DRAM, SSD and prefill rate (1M / 10M tokens, 6,500 tokens/s); a hybrid model keeps its
GDN states where SGLang 0.5.23 does (``checkpoint_placement="sglang"``, ``saria-replay``'s default). Ratios are against
the 1-node replay of the same model and policy in the same run (with one node every router is the
same replay). ``--json`` keeps every record; ``--update-doc`` rewrites the generated tables of
docs/fleet.md from that JSON (``tests/replay/test_fleet_doc.py`` checks the doc against it and
recomputes the fleet numbers from the per-node records).

``--skip-sessions K`` drops the first K trace files (a held-out part); ``--copies N`` replays each
session group N times as new conversations (``workload.replicate``: a held-out part at the load of the
whole); ``--session-eps``,
``--session-idle``, ``--session-place``, ``--session-wear-moves``, ``--session-wear-shrink``, ``--session-placement``,
``--session-bound`` and ``--session-held`` override
the ``session`` router's constants (how they were chosen: docs/fleet.md). A sweep (several settings) may
run at several ``--seeds`` (other draws of the sessions' start times and the copies' order: the same
sessions arriving otherwise), its choice counting every seed's fleets; ``--baseline replay`` replays
``cache_aware``'s fleets of the same seeds into the sweep's JSON.

    nice -n 10 saria-fleet-table --jobs 2 --json docs/data/fleet.json --update-doc docs/fleet.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import re
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from sglang_saria.config import AdmissionConfig, CapacityConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings
from sglang_saria.replay.fleet import FleetSettings, fleet_replay
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.metrics import same_requests
from sglang_saria.replay.report import md_table
from sglang_saria.replay.agent_prompts import weka_dir
from sglang_saria.replay.routing import ROUTERS
from sglang_saria.replay.workload import apply_limits, replicate, session_starts
from sglang_saria.session_affinity import BOUND, PLACE_BY, PLACEMENT, AffinityConfig

MODELS = ("qwen3-8b", "qwen3.5-9b")
# E2: the paper's recommended threshold; full duplicate: the write ceiling, and the policy under which
# a session that moves node writes its prefix again on the new node
POLICIES = ("eviction:E2", "full-duplicate")
NODES = (1, 2, 4, 8)
# what the JSON keeps of each node's record (the fleet's record keeps every key)
NODE_KEYS = ("requests", "prefill_tokens", "ssd_write_bytes", "ssd_writes_norm", "dwpd", "char", "ttft_mean_s",
             "ttft_p90_s", "drain_s")

_WORK: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class Workload:
    """Which trace files: the first ``sessions``, less the first ``skip`` of them, each ``copies`` times; ``seed``
    draws the sessions' start times and the copies' order (another seed: another arrival order of the same
    sessions)."""

    sessions: int = 350
    skip: int = 0
    copies: int = 1
    seed: int = 0


def load_sessions(model: str, work: Workload) -> list:
    """The workload's sessions (a trace file's sub-agents stay with it), at the model's block size."""
    spec = get_model_spec(model)
    trace = f"weka:{weka_dir()}"
    ss = load_trace(trace, spec.default_block_tokens, max_sessions=work.sessions)
    if work.skip:
        first = {s.session_id for s in load_trace(trace, spec.default_block_tokens, max_sessions=work.skip)}
        ss = [s for s in ss if s.session_id not in first]
    return replicate(apply_limits(ss), work.copies, seed=work.seed)


def run_one(model: str, policy: str, nodes: int, router: str, work: Workload,
            session: AffinityConfig = AffinityConfig()) -> dict:
    """One fleet replay at the replay's defaults; its record for the JSON."""
    if (model, work) not in _WORK:
        ss = load_sessions(model, work)
        _WORK[model, work] = (ss, session_starts(ss, ReplaySettings.window_s, work.seed))
    ss, starts = _WORK[model, work]
    spec = get_model_spec(model)
    cfg = SariaConfig(admission=AdmissionConfig(policy=policy),
                      metadata=MetadataConfig(block_tokens=spec.default_block_tokens, checkpoint_placement="sglang"),
                      capacity=CapacityConfig(dram_tokens=1_000_000, ssd_tokens=10_000_000)).validate()
    fleet = FleetSettings(nodes, router, session=session)
    res = fleet_replay(ss, starts, cfg, spec, ReplaySettings(), fleet, label=policy)
    return {"model": model, "policy": policy, "nodes": nodes, "router": router, "seed": work.seed, "metrics": res.metrics,
            "fleet": res.fleet, "per_node": [{k: n[k] for k in NODE_KEYS} for n in res.per_node]}


def runs(models: list[str], policies: list[str], nodes: list[int], routers: list[str]) -> list[tuple[str, str, int, str]]:
    """Every replay of the table: one 1-node replay per model and policy, then each fleet size x router."""
    out = []
    for m in models:
        for p in policies:
            out += [(m, p, n, r) for n in nodes for r in (routers[:1] if n == 1 else routers)]
    return out


def measure(args: argparse.Namespace, routers: list[str] | None = None, nodes: list[int] | None = None) -> list[dict]:
    """Every replay of ``runs`` (the arguments' routers and nodes unless given), at each of ``args.seeds``."""
    todo = [(*job, dataclasses.replace(args.work, seed=seed)) for seed in args.seeds
            for job in runs(args.models, args.policies, nodes or args.nodes, routers or args.routers)]
    records: list[dict] = []
    if args.jobs <= 1:
        for i, job in enumerate(todo):
            records.append(run_one(*job, args.session))
            print(f"[{i + 1}/{len(todo)}] {job[:4]} seed {job[4].seed}", file=sys.stderr, flush=True)
    else:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
            futures = {pool.submit(run_one, *job, args.session): job for job in todo}
            for i, fut in enumerate(as_completed(futures)):
                records.append(fut.result())
                job = futures[fut]
                print(f"[{i + 1}/{len(todo)}] {job[:4]} seed {job[4].seed}", file=sys.stderr, flush=True)
    order = {(*job[:4], job[4].seed): i for i, job in enumerate(todo)}
    records.sort(key=lambda r: order[r["model"], r["policy"], r["nodes"], r["router"], r["seed"]])
    for m in args.models:  # every row of a model and seed was scored over the same requests
        for seed in args.seeds:
            same_requests([r["metrics"] for r in records if (r["model"], r["seed"]) == (m, seed)])
    return records


# ----------------------------------------------------------------- tables
def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _base(records: list[dict], r: dict) -> dict:
    return next(b for b in records if (b["model"], b["policy"], b["nodes"]) == (r["model"], r["policy"], 1))


def format_main(doc: dict) -> str:
    """One row per model, policy, fleet size and router: writes, DWPD, CHAR, TTFT, imbalance, against 1 node."""
    recs = doc["records"]
    rows = []
    for r in recs:
        b, m, f = _base(recs, r)["metrics"], r["metrics"], r["fleet"]
        router = "(any)" if r["nodes"] == 1 else r["router"]
        rows.append([r["model"], r["policy"], str(r["nodes"]), router,
                     f"{m['ssd_write_bytes'] / 1e12:.1f}", _ratio(m["ssd_write_bytes"], b["ssd_write_bytes"]),
                     f"{f['dwpd_per_drive_mean']:.2f} / {f['dwpd_per_drive_max']:.2f}",
                     f"{m['char']:.3f}", f"{m['char'] - b['char']:+.3f}",
                     f"{m['ttft_mean_s']:.2f}", _ratio(m["ttft_mean_s"], b["ttft_mean_s"]),
                     f"{m['ttft_p90_s']:.2f}", _ratio(m["ttft_p90_s"], b["ttft_p90_s"]),
                     f"{f['requests_max_over_mean']:.2f}", f"{f['prefill_max_over_mean']:.2f}",
                     f"{f['moved_frac']:.1%}"])
    return md_table(["model", "policy", "nodes", "router", "SSD W TB", "W vs 1", "DWPD/drive mean / max", "CHAR",
                     "CHAR vs 1", "TTFT s", "vs 1", "P90 s", "vs 1", "reqs max/mean", "prefill max/mean", "moved"], rows)


def format_shared(doc: dict) -> str:
    """The shared-tier estimate: what the moved sessions' previous nodes still held, per fleet row."""
    rows = []
    for r in doc["records"]:
        if r["nodes"] == 1:
            continue
        m, f = r["metrics"], r["fleet"]
        st = f["shared_tier"]
        rows.append([r["model"], r["policy"], str(r["nodes"]), r["router"], f"{f['moved_frac']:.1%}",
                     f"{m['char']:.3f}", f"{st['char']:.3f}",
                     f"{st['prefill_tokens_saved'] / f['prefill_tokens']:.1%}" if f["prefill_tokens"] else "-",
                     f"{st['read_bytes'] / 1e12:.2f}"])
    return md_table(["model", "policy", "nodes", "router", "moved", "CHAR", "CHAR with shared tier (bound)",
                     "prefill saved (bound)", "shared-tier reads TB"], rows)


def format_nodes(doc: dict) -> str:
    """Where each router's requests went: requests and DWPD per node, busiest first as node order has it."""
    rows = []
    for r in doc["records"]:
        if r["nodes"] == 1 or r["router"] not in ("cache_aware", "round_robin", "session"):
            continue
        rows.append([r["model"], r["policy"], str(r["nodes"]), r["router"],
                     " / ".join(f"{n['requests']:,}" for n in r["per_node"]),
                     " / ".join(f"{n['dwpd']:.2f}" for n in r["per_node"])])
    return md_table(["model", "policy", "nodes", "router", "requests per node", "DWPD per node"], rows)


def format_setup(doc: dict) -> str:
    b = next(r for r in doc["records"] if r["nodes"] == 1)
    skip = doc.get("skip_sessions", 0)
    which = f"WEKA sessions {skip + 1}-{doc['sessions']}" if skip else f"{doc['sessions']} WEKA sessions"
    if doc.get("copies", 1) > 1:
        which += (f", each {doc['copies']} times as new conversations (keys salted per copy, the copies in a "
                  f"seeded random order)")
    line = (f"{which}, {b['metrics']['requests']:,} requests, 12 h start window, seed {b.get('seed', 0)}; per node "
            f"1M DRAM / 10M SSD tokens, 6,500 prefill tokens/s, 4 in flight, hybrid GDN states at SGLang's placement; "
            f"{b['fleet']['days']:.3f} days replayed "
            f"(DWPD = writes / (drive capacity x days)).")
    if any(r["router"] == "session" for r in doc["records"]):
        c = setting(doc)
        moves = "off" if not c["wear_moves"] else (
            f"on, at a prompt of which its node holds less than {c['held_frac']}" if c["held_frac"] else
            f"on, at a prompt below {c['wear_shrink']}x the session's previous" if c.get("wear_shrink")
            else "on, the largest session at its next request")
        if c["placement"] == "ring":
            line += (f" session router: eps {c['eps']}, idle {c['idle_s']:.0f} s, {c['vnodes']} ring points per node, "
                     f"new sessions placed by {c['place_by']}, wear moves {moves}.")
        else:
            leaves = {"cheap": "cheapest sessions first", "shed": "cheapest session at once (every node held to it)"}.get(
                c["bound"], "returning session")
            line += (f" session router: eps {c['eps']}, idle {c['idle_s']:.0f} s, {c['vnodes']} ring points per node, "
                     f"new sessions on the least loaded (tokens and requests) within the bounds of {c['place_by']}, "
                     f"a node at the bound sends off its {leaves}, wear moves {moves}.")
    return line


# The session router's targets: busiest drive and busiest node against the fleet's mean, CHAR against
# cache_aware's on the same fleet, and the requests that changed node.
TARGETS = {"dwpd": 1.5, "requests": 1.3, "char_drop": 0.01, "moved": 0.03}


def targets(doc: dict, r: dict) -> dict[str, tuple[float, bool]]:
    """A session-router record's numbers against ``TARGETS``: name -> (value, met); no ``char_drop``
    without a cache_aware record of the same fleet."""
    f, m = r["fleet"], r["metrics"]
    dwpd = f["dwpd_per_drive_max"] / f["dwpd_per_drive_mean"] if f["dwpd_per_drive_mean"] else 1.0
    out = {"dwpd": (dwpd, dwpd <= TARGETS["dwpd"]),
           "requests": (f["requests_max_over_mean"], f["requests_max_over_mean"] <= TARGETS["requests"]),
           "moved": (f["moved_frac"], f["moved_frac"] <= TARGETS["moved"])}
    for c in doc["records"]:
        if (c["model"], c["policy"], c["nodes"], c["router"], c.get("seed", 0)) == (
                r["model"], r["policy"], r["nodes"], "cache_aware", r.get("seed", 0)):
            char = m["char"] - c["metrics"]["char"]
            out["char_drop"] = (char, char >= -TARGETS["char_drop"])
    return out


def session_bound(r: dict) -> float | None:
    """The largest single session's SSD writes over the fleet's mean drive: a placement that never moves a
    session cannot bring its busiest drive below it, if each session wrote what it wrote in this run
    (None: a record without per-session writes)."""
    top, total = r["fleet"].get("session_writes_max_bytes"), r["metrics"]["ssd_write_bytes"]
    if top is None:
        return None
    return top * r["nodes"] / total if total else 0.0


def format_targets(doc: dict) -> str:
    """One row per session-router fleet: each target's value and whether it is met, and the single-session
    bound on the busiest drive of a placement without moves (``session_bound``) for it and cache_aware."""
    rows = []
    for r in doc["records"]:
        if r["nodes"] == 1 or r["router"] != "session":
            continue
        t = targets(doc, r)
        mark = {k: "met" if ok else "**unmet**" for k, (_, ok) in t.items()}
        ca = next((c for c in doc["records"] if (c["model"], c["policy"], c["nodes"], c["router"]) ==
                   (r["model"], r["policy"], r["nodes"], "cache_aware")), None)
        bounds = [session_bound(x) for x in (r, ca) if x is not None]
        rows.append([r["model"], r["policy"], str(r["nodes"]),
                     f"{t['dwpd'][0]:.2f} {mark['dwpd']}", f"{t['requests'][0]:.2f} {mark['requests']}",
                     f"{t['char_drop'][0]:+.3f} {mark['char_drop']}" if "char_drop" in t else "-",
                     f"{t['moved'][0]:.1%} {mark['moved']}",
                     " / ".join("-" if b is None else f"{b:.2f}" for b in bounds)])
    return md_table(["model", "policy", "nodes", f"busiest / mean drive DWPD (<= {TARGETS['dwpd']})",
                     f"busiest / mean node requests (<= {TARGETS['requests']})",
                     f"CHAR - cache_aware's (>= -{TARGETS['char_drop']})", f"moved (<= {TARGETS['moved']:.0%})",
                     "largest session's writes / mean drive (session / cache_aware)"], rows)


def sweep_scores(doc: dict) -> list[tuple[int, float, float]]:
    """Per setting of a sweep: (fleets meeting the busiest-drive, busiest-node and moved targets, and
    CHAR against cache_aware's where the sweep has ``baseline`` records, the largest and the mean
    busiest / mean drive DWPD over its fleets); the chosen setting meets the most, then has the
    smallest largest, then the smallest mean."""
    out = []
    for part in doc["sweep"]:
        scored = {"records": part["records"] + doc.get("baseline", [])}
        t = [targets(scored, r) for r in part["records"] if r["nodes"] > 1 and r["router"] == "session"]
        dwpd = [x["dwpd"][0] for x in t]
        out.append((sum(all(ok for _, ok in x.values()) for x in t), max(dwpd), sum(dwpd) / len(dwpd)))
    return out


# the bounds that hold every live node to the session bound after every pick (the bound at every moment,
# not only at placement): where a sweep has one, only those are candidates
EXACT_BOUNDS = ("shed",)


def chosen_setting(doc: dict) -> dict:
    """The sweep's chosen session-router constants: ``sweep_scores``' rule, among the settings whose bound is
    exact (``EXACT_BOUNDS``) where the sweep has any."""
    scores = sweep_scores(doc)
    exact = [i for i, part in enumerate(doc["sweep"]) if setting(part)["bound"] in EXACT_BOUNDS]
    best = min(exact or range(len(scores)), key=lambda i: (-scores[i][0], scores[i][1], scores[i][2]))
    return setting(doc["sweep"][best])


def setting(part: dict) -> dict:
    """A sweep part's session-router constants; an older sweep's JSON lacks the later ones (what it ran)."""
    return {"place_by": "wear", "wear_moves": False, "wear_shrink": 0.0, "placement": "ring", "bound": "strict",
            "held_frac": 0.0, **part["session_router"]}


# constants are chosen on the first this many WEKA trace files only; the rest are held out
TUNING_SESSIONS = 175


def chooses(doc: dict) -> bool:
    """Whether a sweep ran on the sessions constants are chosen on (the first ``TUNING_SESSIONS``, at any
    ``copies``); on any other sessions a sweep only shows how the constants move the targets."""
    return (doc["sessions"], doc["skip_sessions"]) == (TUNING_SESSIONS, 0)


def format_sweep(doc: dict) -> str:
    """One row per session-router setting: the worst of its fleets by nodes, and how many meet the targets;
    the chosen setting marked where the sweep ran on the sessions constants are chosen on (``chooses``)."""
    rows = []
    scores, best = sweep_scores(doc), chosen_setting(doc)
    for part, (met, _, mean) in zip(doc["sweep"], scores):
        c = setting(part)
        moves = "no" if not c["wear_moves"] else (
            f"yes, at a prompt its node holds < {c['held_frac']}" if c["held_frac"] else
            f"yes, at a prompt below {c['wear_shrink']}x" if c["wear_shrink"] else "yes, largest")
        if c["bound"] == "cheap":
            moves += "; bound: cheapest first"
        elif c["bound"] == "shed":
            moves += "; bound: exact, cheapest at once"
        placed = c["place_by"] + (", least loaded" if c["placement"] == "least" else "")
        cells = [placed, moves, f"{c['eps']}", f"{c['idle_s']:.0f}"]
        fleets = [r for r in part["records"] if r["nodes"] > 1 and r["router"] == "session"]
        for n in sorted({r["nodes"] for r in fleets}):
            t = [targets(part, r) for r in fleets if r["nodes"] == n]
            cells.append(f"{max(x['dwpd'][0] for x in t):.2f} / {max(x['requests'][0] for x in t):.2f} / "
                         f"{max(x['moved'][0] for x in t):.1%}")
        cells += [f"{mean:.2f}", f"{met} of {len(fleets)}" + (" (chosen)" if c == best and chooses(doc) else "")]
        rows.append(cells)
    nodes = sorted({r["nodes"] for r in doc["sweep"][0]["records"] if r["nodes"] > 1})
    met = "fleets meeting all four (CHAR vs cache_aware's)" if doc.get("baseline") else "fleets meeting all three"
    return md_table(["placed by", "wear moves", "eps", "idle s", *(f"{n} nodes: worst DWPD / requests / moved" for n in nodes),
                     "mean DWPD ratio", met], rows)


DOC_TABLES = {"setup": format_setup, "main": format_main, "nodes": format_nodes, "shared": format_shared,
              "targets": format_targets, "sweep": format_sweep}
# a generated block: <!-- PREFIX:TABLE --> ... <!-- /PREFIX -->; each prefix is rendered from its own JSON
_BLOCK = re.compile(r"(<!-- (\w+):(\w+) -->\n)(.*?)(<!-- /\2 -->)", re.S)


def doc_blocks(text: str, prefix: str = "fleet") -> dict[str, str]:
    return {m.group(3): m.group(4).rstrip("\n") for m in _BLOCK.finditer(text) if m.group(2) == prefix}


def update_doc(text: str, doc: dict, prefix: str = "fleet") -> str:
    """``text`` with every generated block of ``prefix`` rendered anew from ``doc``."""
    def fill(m: re.Match) -> str:
        if m.group(2) != prefix:
            return m.group(0)
        if m.group(3) not in DOC_TABLES:
            raise ValueError(f"unknown generated table {m.group(3)!r}; known: {', '.join(DOC_TABLES)}")
        return f"{m.group(1)}{DOC_TABLES[m.group(3)](doc)}\n{m.group(5)}"

    return _BLOCK.sub(fill, text)


def _work_of(d: dict) -> tuple[int, int, int, list[int]]:
    """(sessions, skip, copies, seeds) of a JSON doc or of the parsed arguments (a doc before ``copies``: 1, before
    ``seeds``: seed 0)."""
    return d["sessions"], d["skip_sessions"], d.get("copies", 1), list(d.get("seeds", [0]))


def _describe(d: dict) -> str:
    n, skip, copies, seeds = _work_of(d)
    return (f"sessions {n} less {skip}" + (f", {copies} copies" if copies > 1 else "")
            + (f", seeds {','.join(map(str, seeds))}" if seeds != [0] else ""))


def baseline_records(path: str, args: argparse.Namespace) -> list[dict]:
    """The cache_aware fleet records of ``path``, which must be of this run's sessions (else a clear error)."""
    with open(path) as fh:
        old = json.load(fh)
    if _work_of(old) != _work_of(vars(args)):
        raise SystemExit(f"saria-fleet-table: --baseline {path}: {_describe(old)}; this run: {_describe(vars(args))}")
    return [r for r in old.get("records", old.get("baseline", [])) if r["router"] == "cache_aware" and r["nodes"] > 1]


def keep_from(args: argparse.Namespace, settings: list[AffinityConfig]) -> list[list[dict]]:
    """Per setting, the records of ``--keep-from`` that this run does not replay; the file must be of the
    same sessions and session-router settings (else a clear error naming it)."""
    with open(args.keep_from) as fh:
        old = json.load(fh)
    parts = old.get("sweep", [old])
    want = [dataclasses.asdict(c) for c in settings]
    if _work_of(old) != _work_of(vars(args)) or [setting(p) for p in parts] != want:
        raise SystemExit(f"saria-fleet-table: --keep-from {args.keep_from}: {_describe(old)}, settings "
                         f"{[setting(p) for p in parts]}; this run: {_describe(vars(args))}, {want}")
    return [[r for r in p["records"] if r["policy"] not in args.policies] for p in parts]


def merge_records(kept: list[dict], new: list[dict]) -> list[dict]:
    """The kept and the new records, by model, then policy as ``POLICIES`` and the run order them, then nodes."""
    order = {p: i for i, p in enumerate([*POLICIES, "eviction:E2", "auto"])}
    out = sorted([*kept, *new], key=lambda r: (MODELS.index(r["model"]), order.get(r["policy"], 99), r["policy"],
                                               r["nodes"], r["router"] != "cache_aware"))
    for m in {r["model"] for r in out}:  # every row of a model was scored over the same requests
        same_requests([r["metrics"] for r in out if r["model"] == m])
    return out


def _csv(value: str, known: tuple | None, flag: str, cast=str) -> list:
    items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    bad = [v for v in items if known is not None and v not in known]
    if bad or not items:
        raise SystemExit(f"saria-fleet-table: {flag} {value!r}: choose from {', '.join(map(str, known or ()))}")
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="saria-fleet-table", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=350, help="the first N WEKA trace files")
    p.add_argument("--skip-sessions", type=int, default=0, metavar="K", help="less the first K of them (held out)")
    p.add_argument("--copies", type=int, default=1, metavar="N",
                   help="replay each session group N times as new conversations (a held-out part at the whole's load)")
    p.add_argument("--seeds", default="0", metavar="S[,S...]",
                   help="seeds of the sessions' start times and the copies' order; several: a sweep judged over all of them")
    p.add_argument("--session-eps", default=str(AffinityConfig.eps),
                   help="session router's load bound; several (comma-separated) with --session-idle: a sweep")
    p.add_argument("--session-idle", default=str(AffinityConfig.idle_s), metavar="S",
                   help="session router: seconds without a request before a session stops counting (or several)")
    p.add_argument("--session-place", default=AffinityConfig.place_by,
                   help=f"session router: what a new session's node must not exceed ({', '.join(PLACE_BY)}; or several)")
    p.add_argument("--session-wear-moves", default=str(int(AffinityConfig.wear_moves)), metavar="0|1",
                   help="session router: 1: sessions leave a worn-out drive (when: --session-wear-shrink; or 0,1: both)")
    p.add_argument("--session-wear-shrink", default=str(AffinityConfig.wear_shrink), metavar="F",
                   help="session router: a session leaves a worn-out drive at a prompt below F x its previous one "
                        "(0: the drive's largest session leaves at its next request; or several)")
    p.add_argument("--session-placement", default=AffinityConfig.placement,
                   help=f"session router: a new session's node ({', '.join(PLACEMENT)}; or several)")
    p.add_argument("--session-bound", default=AffinityConfig.bound,
                   help=f"session router: who leaves a node at the bound ({', '.join(BOUND)}; or several)")
    p.add_argument("--session-held", default=str(AffinityConfig.held_frac), metavar="F",
                   help="session router: a prompt extends what its node holds at F of its prefix "
                        "(0: not judged; or several)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--nodes", default=",".join(map(str, NODES)))
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--jobs", type=int, default=1, help="parallel replay processes")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--update-doc", default=None, metavar="MD", help="rewrite the generated tables of this file from --json")
    p.add_argument("--doc-prefix", default="fleet", help="which generated blocks of --update-doc (<!-- PREFIX:TABLE -->)")
    p.add_argument("--render-only", action="store_true", help="replay nothing: render --update-doc from --json")
    p.add_argument("--baseline", default=None, metavar="JSON|replay",
                   help="a sweep: the cache_aware records of an earlier --json of the same sessions (or 'replay': replayed "
                        "now), kept in the sweep's JSON, so its choice also judges CHAR against cache_aware's")
    p.add_argument("--keep-from", default=None, metavar="JSON",
                   help="an earlier --json of the same sessions and settings: its records of the policies not replayed now "
                        "are kept (same order), e.g. when only one policy's code changed")
    args = p.parse_args(argv)
    if args.update_doc and not args.json_path:
        p.error("--update-doc needs --json (the doc's tables are checked against that file)")
    if args.render_only:
        with open(args.json_path) as fh:
            doc = json.load(fh)
        if args.baseline:  # added to a sweep already run: written back to its JSON
            args.sessions, args.skip_sessions, args.copies, args.seeds = _work_of(doc)
            doc["baseline"] = baseline_records(args.baseline, args)
            with open(args.json_path, "w") as fh:
                json.dump(doc, fh, indent=1)
    else:
        args.models = _csv(args.models, MODELS, "--models")
        args.policies = _csv(args.policies, None, "--policies")
        args.nodes = _csv(args.nodes, None, "--nodes", int)
        args.routers = _csv(args.routers, ROUTERS, "--routers")
        args.seeds = _csv(args.seeds, None, "--seeds", int)
        if args.copies < 1:
            p.error(f"--copies {args.copies}: must be >= 1")
        args.work = Workload(args.sessions, args.skip_sessions, args.copies)
        settings = [AffinityConfig(eps=e, idle_s=i, place_by=pl, wear_moves=bool(mv), wear_shrink=f, placement=pm,
                                   bound=b, held_frac=h).validate()
                    for pm in _csv(args.session_placement, PLACEMENT, "--session-placement")
                    for b in _csv(args.session_bound, BOUND, "--session-bound")
                    for h in _csv(args.session_held, None, "--session-held", float)
                    for pl in _csv(args.session_place, PLACE_BY, "--session-place")
                    for mv in _csv(args.session_wear_moves, (0, 1), "--session-wear-moves", int)
                    for f in _csv(args.session_wear_shrink, None, "--session-wear-shrink", float)
                    for e in _csv(args.session_eps, None, "--session-eps", float)
                    for i in _csv(args.session_idle, None, "--session-idle", float)]
        if 1 not in args.nodes and len(settings) == 1:
            args.nodes = [1, *args.nodes]  # the ratios' base (a sweep shows no ratios)
        if len(args.seeds) > 1 and len(settings) == 1:
            p.error(f"--seeds {','.join(map(str, args.seeds))}: several seeds only in a sweep (several session-router "
                    f"settings), whose choice counts the fleets of every seed")
        if args.baseline == "replay" and len(settings) == 1:
            p.error("--baseline replay: a sweep's baseline (several session-router settings)")
        doc = {"sessions": args.sessions, "skip_sessions": args.skip_sessions,
               **({"copies": args.copies} if args.copies > 1 else {}),
               **({"seeds": args.seeds} if args.seeds != [0] else {})}
        if args.baseline == "replay":
            args.session = settings[0]
            doc["baseline"] = measure(args, routers=["cache_aware"], nodes=[n for n in args.nodes if n > 1])
        elif args.baseline:
            doc["baseline"] = baseline_records(args.baseline, args)
        kept = keep_from(args, settings) if args.keep_from else None
        for i, args.session in enumerate(settings):
            print(f"session router {args.session}", file=sys.stderr, flush=True)
            records = measure(args)
            if kept is not None:
                records = merge_records(kept[i], records)
            part = {"session_router": dataclasses.asdict(args.session), "records": records}
            doc.setdefault("sweep", []).append(part) if len(settings) > 1 else doc.update(part)
        if args.json_path:
            with open(args.json_path, "w") as fh:
                json.dump(doc, fh, indent=1)
    if "sweep" in doc:
        tables = ["sweep"]
    else:
        tables = [n for n in DOC_TABLES if n not in ("targets", "sweep") or (
            n == "targets" and any(r["router"] == "session" for r in doc["records"]))]
    print(*(DOC_TABLES[name](doc) for name in tables), sep="\n\n")
    if args.update_doc:
        with open(args.update_doc) as fh:
            text = fh.read()
        with open(args.update_doc, "w") as fh:
            fh.write(update_doc(text, doc, args.doc_prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
