#!/usr/bin/env python
"""The replay's DRAM as a flat LRU ("flat", every recorded number in docs/) against DRAM shaped as
SGLang 0.5.23's host tier ("tree": every DRAM block's ancestors in DRAM), on the same requests.

For each setting and each ``metadata.dram_residency`` it builds the clairvoyant frontier
(``replay/frontier.py``) and replays ``auto``, ``eviction:E2``, ``full-duplicate`` and ``oracle``
(the sweep's row: at most ``ReplaySettings.oracle_max_passes`` passes), recording writes over the SSD
capacity, CHAR, replay time, GPU -> DRAM promotions, how many requests with an SSD hit read DRAM
after SSD and the writes the sequencer refused for want of credit (the core's ``CoreStats``), and the
mean queueing delay. ``render`` prints the table: each policy against its own
residency's frontier at its own CHAR (``saria-admission-sweep``'s ``judge``), and the tree/flat ratios.

    scripts/dram_residency.py run --workload weka:1-175 --ssd-tokens 2000000 --json /tmp/dr.json
    scripts/dram_residency.py timing --workload weka:1-360 --json /tmp/dr.json   # auto / E2, flat and tree
    scripts/dram_residency.py render /tmp/dr.json [--update-doc docs/admission.md]

``run`` appends to ``--json`` (one record per setting and residency, written as each ends), so a
setting interrupted or added later keeps the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from sglang_saria.bench.admission_sweep import Setting, _replay_inputs, judge, parse_variant
from sglang_saria.config import DRAM_RESIDENCIES, AdmissionConfig
from sglang_saria.replay.driver import replay
from sglang_saria.replay.frontier import DEFAULT_SHARES, Frontier, build_frontier
from sglang_saria.replay.metrics import same_requests
from sglang_saria.replay.report import md_table

POLICIES = ("auto", "eviction:E2", "full-duplicate", "oracle")


def run_residency(s: Setting, residency: str, policies: tuple[str, ...], max_passes: int) -> dict:
    """The frontier and each policy on setting ``s`` with DRAM of ``residency``: raw records."""
    spec, sessions, settings, starts, base = _replay_inputs(s)
    base = replace(base, metadata=replace(base.metadata, dram_residency=residency)).validate()
    rows = []
    for text in policies:
        policy, changes = parse_variant(text)
        cfg = replace(base, admission=AdmissionConfig(policy=policy, **changes)).validate()
        t0 = time.perf_counter()
        res = replay(sessions, starts, cfg, spec, settings)
        m, st = res.metrics, res.core.stats
        rows.append({"policy": text, "writes_norm": m["ssd_writes_norm"], "char": m["char"],
                     "requests": m["requests"], "request_set": m["request_set"],
                     "writes_never_read_frac": m["writes_never_read_frac"], "replay_s": time.perf_counter() - t0,
                     "credit_refused": st.credit_refused, "queue_mean_s": m["queue_mean_s"],
                     "closure_forced": st.closure_forced, "dram_evictions": st.dram_evictions,
                     "decisions": dict(getattr(res.core.admission, "decisions", None) or {}),
                     "promoted_blocks": st.promoted_blocks, "ssd_hit_requests": st.ssd_hit_requests,
                     "dram_after_ssd_requests": st.dram_after_ssd_requests})
        print(f"  {residency} {text}: W/C {m['ssd_writes_norm']:.2f} CHAR {m['char']:.3f} "
              f"({rows[-1]['replay_s']:.0f} s)", file=sys.stderr, flush=True)
    same_requests(rows)
    t0 = time.perf_counter()
    frontier = build_frontier(sessions, starts, base, spec, settings, DEFAULT_SHARES, max_passes).to_json()
    return {"workload": s.workload, "model": s.model, "prefill_tps": s.prefill_tps,
            "ssd_tokens": base.capacity.ssd_tokens, "dram_tokens": base.capacity.dram_tokens,
            "dram_residency": residency, "frontier": frontier, "frontier_s": time.perf_counter() - t0, "rows": rows}


def timing(workload: str, model: str, policies: list[str], repeats: int) -> dict:
    """Replay time per (residency, policy) at the default capacities, all interleaved in each round (a
    loaded machine slows all alike)."""
    s = Setting(workload, model, 6500.0, 0)
    spec, sessions, settings, starts, base = _replay_inputs(s)
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        for residency in DRAM_RESIDENCIES:
            for policy in policies:
                cfg = replace(base, metadata=replace(base.metadata, dram_residency=residency),
                              admission=AdmissionConfig(policy=policy)).validate()
                t0 = time.perf_counter()
                replay(sessions, starts, cfg, spec, settings)
                runs.setdefault(f"{residency} {policy}", []).append(time.perf_counter() - t0)
    return {"workload": workload, "model": model, "runs": runs}


def render_timing(t: dict) -> str:
    """Median replay time per (residency, policy), against eviction:E2 with the same residency."""
    med = {k: statistics.median(v) for k, v in t["runs"].items()}
    rows = [[t["workload"], t["model"], *k.split(" ", 1), f"{m:.2f}", str(len(t["runs"][k])),
             f"{m / med[k.split(' ', 1)[0] + ' eviction:E2']:.2f}x" if k.split(" ", 1)[0] + " eviction:E2" in med else "-"]
            for k, m in med.items()]
    return md_table(["workload", "model", "DRAM residency", "policy", "median s", "runs", "vs eviction:E2 (same DRAM)"], rows)


def _key(rec: dict) -> tuple:
    return rec["workload"], rec["model"], rec["prefill_tps"], rec["ssd_tokens"]


def render(doc: dict) -> str:
    """Per setting and residency: the frontier's best CHAR and its writes, then each policy's writes,
    CHAR, the frontier's writes at that CHAR, the ratio, promotions and the DRAM-after-SSD share; then
    per setting the tree/flat ratios of each policy's writes and of its ratio to the frontier."""
    rows, deltas = [], []
    by_setting: dict[tuple, dict[str, dict]] = {}
    for rec in doc["records"]:
        by_setting.setdefault(_key(rec), {})[rec["dram_residency"]] = rec
        fr = Frontier.from_json(rec["frontier"])
        best = max(fr.points, key=lambda p: p.char)
        where = [rec["workload"], rec["model"], f"{rec['prefill_tps']:,.0f}", f"{rec['ssd_tokens'] / 1e6:g}M",
                 rec["dram_residency"]]
        rows.append(where + ["frontier", f"{best.writes_norm:.2f}", f"{fr.best_char:.3f}", "-", "-", "-", "-", "-", "-",
                             "yes" if fr.converged else "**no**"])
        for r in rec["rows"]:
            j = judge(rec, r)
            shape = (f"{r['dram_after_ssd_requests']:,} / {r['ssd_hit_requests']:,}" if r["ssd_hit_requests"] else "0 / 0")
            rows.append(where + [r["policy"], f"{r['writes_norm']:.2f}", f"{r['char']:.3f}",
                                 "-" if j["frontier_writes"] is None else f"{j['frontier_writes']:.2f}",
                                 "above frontier" if j["ratio"] is None else f"{j['ratio']:.2f}x",
                                 f"{r['promoted_blocks']:,}", shape, f"{r['credit_refused']:,}",
                                 f"{r['queue_mean_s']:.1f}", f"{r['replay_s']:.0f} s"])
    for key, recs in by_setting.items():
        if set(recs) != set(DRAM_RESIDENCIES):
            continue
        flat, tree = recs["flat"], recs["tree"]
        ff, ft = Frontier.from_json(flat["frontier"]), Frontier.from_json(tree["frontier"])
        deltas.append([*map(str, key[:2]), f"{key[2]:,.0f}", f"{key[3] / 1e6:g}M", "frontier best",
                       f"{ft.best_char - ff.best_char:+.3f}", "-", "-"])
        tree_rows = {r["policy"]: r for r in tree["rows"]}
        for r in flat["rows"]:
            t = tree_rows.get(r["policy"])
            if t is None:
                continue
            jf, jt = judge(flat, r)["ratio"], judge(tree, t)["ratio"]
            deltas.append([*map(str, key[:2]), f"{key[2]:,.0f}", f"{key[3] / 1e6:g}M", r["policy"],
                           f"{t['char'] - r['char']:+.3f}",
                           f"{t['writes_norm'] / r['writes_norm']:.2f}x" if r["writes_norm"] else "-",
                           "-" if jf is None or jt is None else f"{jf:.2f}x -> {jt:.2f}x"])
    out = [md_table(["workload", "model", "tok/s", "SSD", "DRAM residency", "policy", "W/C", "CHAR", "frontier W/C at CHAR",
                     "W / frontier", "promoted blocks", "DRAM after SSD / SSD-hit requests", "writes refused (credit)",
                     "mean queue s", "replay (frontier: all at fixed point)"], rows)]
    if doc.get("timing"):
        out += ["", render_timing(doc["timing"])]
    if deltas:
        out += ["", md_table(["workload", "model", "tok/s", "SSD", "policy", "CHAR tree - flat", "W/C tree / flat",
                              "W / frontier flat -> tree"], deltas)]
    return "\n".join(out) + "\n"


DOC_BEGIN, DOC_END = "<!-- dram-residency:tables -->", "<!-- /dram-residency -->"


def update_doc(doc: dict, path: Path) -> None:
    """Replace the block between ``DOC_BEGIN`` and ``DOC_END`` in ``path`` by ``render(doc)``."""
    text = path.read_text()
    if DOC_BEGIN not in text or DOC_END not in text:
        raise ValueError(f"{path}: no {DOC_BEGIN} ... {DOC_END} block to update")
    head, rest = text.split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1]
    path.write_text(f"{head}{DOC_BEGIN}\n{render(doc)}{DOC_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="replay one setting with both residencies, appending to --json")
    r.add_argument("--workload", default="weka:1-175")
    r.add_argument("--model", default="qwen3-8b")
    r.add_argument("--prefill-tps", type=float, default=6500.0)
    r.add_argument("--ssd-tokens", type=int, default=0, help="0: the default capacity")
    r.add_argument("--residency", choices=DRAM_RESIDENCIES, action="append",
                   help="only these (default: both)")
    r.add_argument("--policies", nargs="+", default=list(POLICIES),
                   help="policies, or POLICY@field=value,... (AdmissionConfig fields changed)")
    r.add_argument("--max-passes", type=int, default=40, help="the frontier's guard per point")
    r.add_argument("--json", type=Path, required=True)
    t = sub.add_parser("timing", help="replay time, flat and tree, into --json's \"timing\"")
    t.add_argument("--workload", default="weka:1-360")
    t.add_argument("--model", default="qwen3-8b")
    t.add_argument("--policies", nargs="+", default=["auto", "eviction:E2"])
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--json", type=Path, required=True)
    d = sub.add_parser("render", help="the tables of a run's JSON")
    d.add_argument("json", type=Path)
    d.add_argument("--update-doc", type=Path, help="rewrite this doc's generated block instead of printing")
    args = ap.parse_args(argv)
    if args.cmd == "render":
        doc = json.loads(args.json.read_text())
        if args.update_doc:
            update_doc(doc, args.update_doc)
        else:
            print(render(doc), end="")
        return 0
    if args.cmd == "timing":
        t = timing(args.workload, args.model, args.policies, args.repeats)
        doc = json.loads(args.json.read_text()) if args.json.exists() else {"records": []}
        doc["timing"] = t
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(render_timing(t))
        return 0
    s = Setting(args.workload, args.model, args.prefill_tps, args.ssd_tokens)
    for residency in args.residency or DRAM_RESIDENCIES:
        print(f"{s} {residency}", file=sys.stderr, flush=True)
        rec = run_residency(s, residency, tuple(args.policies), args.max_passes)
        doc = json.loads(args.json.read_text()) if args.json.exists() else {"records": []}
        doc["records"] = [x for x in doc["records"] if (_key(x), x["dram_residency"]) != (_key(rec), residency)]
        doc["records"].append(rec)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
