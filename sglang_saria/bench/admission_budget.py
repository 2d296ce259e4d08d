"""``saria-admission-budget``: `loadaware` admission (the load-following threshold) against every fixed policy, the write budget and the clairvoyant bound.

For each workload, model and modelled GPU speed, every policy replays the same sessions (same
requests, same capacities; ``same_requests`` refuses anything else): ``loadaware``, ``loadaware`` with the
end-of-session hints an agent would send (``end``) and with clairvoyant return hints (``next``),
the fixed eviction thresholds, ``budget:<DWPD>`` and ``loadaware:<DWPD>`` at the same rating, full
duplicate and the oracle bound. Then two checks, stated as met or unmet per setting:

- budget: ``loadaware:<DWPD>`` writes within its window, with CHAR >= the best fixed threshold that
  stays within the same budget over the replayed days;
- bound: where FD keeps CHAR >= 0.95, ``loadaware`` writes <= 1.5x the oracle at CHAR within 0.02 of FD's.

    saria-admission-budget --json docs/data/admission.json --plot docs/admission.png
    saria-admission-budget --sessions 40 --loads 6500 --models qwen3-8b   # a quick look
    saria-admission-budget --render-only --json docs/data/admission.json --update-doc docs/admission.md

``--update-doc`` writes the two tables into a doc's ``<!-- admission-budget:NAME -->`` blocks
(``checks``, ``rows``) from the JSON (``--render-only``: from one written earlier, or merged).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from sglang_saria.bench import doc_blocks
from sglang_saria.config import CHECKPOINT_PLACEMENTS, AdmissionConfig, MetadataConfig, SariaConfig
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.loaders import load_trace, shared_dir
from sglang_saria.replay.metrics import same_requests
from sglang_saria.replay.report import md_table
from sglang_saria.replay.workload import apply_limits, session_starts
from sglang_saria.units import SECONDS_PER_DAY

WORKLOADS = {"weka": f"weka:{shared_dir() / 'traces' / 'weka-cc'}", "synthetic": "synthetic"}
FIXED = ("eviction:E1", "eviction:E2", "eviction:E3", "eviction:E5")
# (policy, hints) in table order; budget policies are added per rating
POLICIES = [("none", "none"), ("full-duplicate", "none"), *[(p, "none") for p in FIXED],
            ("loadaware", "none"), ("loadaware", "end"), ("loadaware", "next"), ("oracle", "none")]


@dataclass(frozen=True)
class Setting:
    workload: str
    model: str
    tps: float
    sessions: int
    placement: str = "sglang"  # a hybrid model's GDN states (MetadataConfig.checkpoint_placement)


def run_setting(s: Setting, dwpd: float, progress: bool) -> list[dict]:
    """Every policy on one setting; each row carries what the checks need."""
    spec = get_model_spec(s.model)
    bt = spec.default_block_tokens
    sessions = apply_limits(load_trace(WORKLOADS[s.workload], bt, max_sessions=s.sessions))
    policies = POLICIES + [(f"budget:{dwpd:g}", "none"), (f"loadaware:{dwpd:g}", "none")]
    rows = []
    for policy, hints in tqdm(policies, desc=f"{s.workload} {s.model} {s.tps:.0f}", disable=not progress, leave=False):
        settings = ReplaySettings(prefill_tokens_per_s=s.tps, hints=hints, dwpd=dwpd)
        metadata = MetadataConfig(block_tokens=bt, checkpoint_placement=s.placement)
        cfg = SariaConfig(admission=AdmissionConfig(policy=policy), metadata=metadata).validate()
        res = replay(sessions, session_starts(sessions, settings.window_s, settings.seed), cfg, spec, settings)
        m = res.metrics
        capacity = cfg.capacity.ssd_tokens * spec.kv_bytes_per_token
        window_peak = _peak_window(res.log, SECONDS_PER_DAY) / capacity
        rows.append({"workload": s.workload, "model": s.model, "prefill_tps": s.tps,
                     "placement": s.placement if spec.is_hybrid else None, "policy": policy, "hints": hints,
                     "requests": m["requests"], "request_set": m["request_set"], "writes_norm": m["ssd_writes_norm"],
                     "budget_norm": m["write_budget_norm"], "peak_day_norm": window_peak, "char": m["char"],
                     "ttft_mean_s": m["ttft_mean_s"], "ttft_p90_s": m["ttft_p90_s"],
                     "oracle_passes": m.get("oracle_passes", 0)})
    same_requests([{"policy": r["policy"], "requests": r["requests"], "request_set": r["request_set"]} for r in rows])
    oracle = next(r for r in rows if r["policy"] == "oracle")["writes_norm"]
    fd_char = next(r for r in rows if r["policy"] == "full-duplicate")["char"]
    for r in rows:  # no write needed and none made: at the bound
        r["vs_oracle"] = r["writes_norm"] / oracle if oracle else (1.0 if r["writes_norm"] == 0 else float("inf"))
        r["char_vs_fd"] = r["char"] - fd_char
    return rows


def _peak_window(log, window_s: float) -> float:
    from sglang_saria.replay.metrics import peak_window_bytes

    return peak_window_bytes(log.done_s, log.ssd_bytes_written, window_s)


def checks(rows: list[dict], dwpd: float) -> list[dict]:
    """The two checks per setting, met or unmet as measured."""
    out = []
    keys = sorted({(r["workload"], r["model"], r["prefill_tps"]) for r in rows})
    for key in keys:
        at = {(r["policy"], r["hints"]): r for r in rows if (r["workload"], r["model"], r["prefill_tps"]) == key}
        fd, auto, capped = at["full-duplicate", "none"], at["loadaware", "none"], at[f"loadaware:{dwpd:g}", "none"]
        day_budget = dwpd  # the rating's bytes per day, in capacities
        within = [r for (p, h), r in at.items() if p in FIXED and r["peak_day_norm"] <= day_budget]
        best_fixed = max((r["char"] for r in within), default=0.0)
        out.append({
            "workload": key[0], "model": key[1], "prefill_tps": key[2],
            "loadaware_budget_peak_day": capped["peak_day_norm"], "loadaware_budget_char": capped["char"],
            "best_fixed_within_char": best_fixed,
            "budget_met": capped["peak_day_norm"] <= day_budget * 1.001 and capped["char"] >= best_fixed,
            "fd_char": fd["char"], "loadaware_vs_oracle": auto["vs_oracle"], "loadaware_char_vs_fd": auto["char_vs_fd"],
            "loadaware_end_vs_oracle": at["loadaware", "end"]["vs_oracle"], "loadaware_end_char_vs_fd": at["loadaware", "end"]["char_vs_fd"],
            "bound_met": None if fd["char"] < 0.95 else (auto["vs_oracle"] <= 1.5 and auto["char_vs_fd"] >= -0.02),
        })
    return out


def _states(row: dict) -> str:
    """A row's GDN state placement; rows from before the field were replayed on the paper's grid."""
    if not get_model_spec(row["model"]).is_hybrid:
        return "-"
    return row.get("placement", "grid")


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old``'s rows with every setting ``new`` replays replaced by ``new``'s rows, in ``old``'s order
    (settings only ``new`` has come last)."""
    def key(r: dict) -> tuple:
        return r["workload"], r["model"], r["prefill_tps"]

    replaced = {key(r) for r in new}
    order = list(dict.fromkeys(map(key, old + new)))
    by_key: dict[tuple, list[dict]] = {k: [] for k in order}
    for r in [r for r in old if key(r) not in replaced] + new:
        by_key[key(r)].append(r)
    return [r for k in order for r in by_key[k]]


def format_rows(rows: list[dict]) -> str:
    return md_table(["workload", "model", "GDN states", "tok/s", "policy", "hints", "W/C", "peak day / C", "W / oracle", "CHAR",
                     "CHAR - FD", "TTFT s", "P90 s"],
                    [[r["workload"], r["model"], _states(r), f"{r['prefill_tps']:,.0f}", r["policy"], r["hints"],
                      f"{r['writes_norm']:.2f}", f"{r['peak_day_norm']:.2f}", f"{r['vs_oracle']:.2f}x", f"{r['char']:.3f}",
                      f"{r['char_vs_fd']:+.3f}", f"{r['ttft_mean_s']:.2f}", f"{r['ttft_p90_s']:.2f}"] for r in rows])


def format_checks(rows: list[dict]) -> str:
    def verdict(v):
        return "-" if v is None else ("met" if v else "**unmet**")

    return md_table(["workload", "model", "tok/s", "loadaware:R peak day / C", "its CHAR", "best fixed within", "budget check",
                     "FD CHAR", "loadaware W / oracle", "loadaware CHAR - FD", "+ end hints W / oracle", "CHAR - FD", "bound check"],
                    [[c["workload"], c["model"], f"{c['prefill_tps']:,.0f}", f"{c['loadaware_budget_peak_day']:.2f}",
                      f"{c['loadaware_budget_char']:.3f}", f"{c['best_fixed_within_char']:.3f}", verdict(c["budget_met"]),
                      f"{c['fd_char']:.3f}", f"{c['loadaware_vs_oracle']:.2f}x", f"{c['loadaware_char_vs_fd']:+.3f}",
                      f"{c['loadaware_end_vs_oracle']:.2f}x", f"{c['loadaware_end_char_vs_fd']:+.3f}", verdict(c["bound_met"])]
                     for c in rows])


def render(doc: dict) -> dict[str, str]:
    """A doc's generated blocks from a ``--json`` file: the checks and every policy's row."""
    return {"checks": format_checks(doc["checks"]), "rows": format_rows(doc["rows"])}


def plot(rows: list[dict], path: str) -> None:
    """Writes against mean TTFT, one panel per (workload, model), one marker per load."""
    from sglang_saria.replay.plot import pyplot, save_figure

    plt = pyplot()
    panels = sorted({(r["workload"], r["model"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.0), squeeze=False)
    for ax, (wl, model) in zip(axes[0], panels):
        for tps in sorted({r["prefill_tps"] for r in rows}):
            pts = [r for r in rows if (r["workload"], r["model"], r["prefill_tps"]) == (wl, model, tps) and r["policy"] != "none"]
            ax.scatter([r["ttft_mean_s"] for r in pts], [r["writes_norm"] for r in pts], s=18, label=f"{tps:,.0f} tok/s")
            for r in pts:
                label = r["policy"] + ("" if r["hints"] == "none" else f"+{r['hints']}")
                ax.annotate(label, (r["ttft_mean_s"], r["writes_norm"]), fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.set_title(f"{wl} {model}", fontsize=9)
        ax.set_xlabel("mean TTFT (s, modelled)")
        ax.set_ylabel("SSD writes / capacity")
        ax.legend(fontsize=7)
    save_figure(fig, None, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="saria-admission-budget", description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="weka,synthetic")
    p.add_argument("--models", default="qwen3.5-9b,qwen3-8b")
    p.add_argument("--loads", default="6500,20000", help="modelled GPU prefill tokens/s")
    p.add_argument("--sessions", type=int, default=350)
    p.add_argument("--dwpd", type=float, default=8.0,
                   help="the drive rating of the budget:/loadaware: rows (8: the first rating within which a fixed threshold, "
                        "E2, fits on the 350 WEKA sessions at 6,500 tokens/s, so the budget check compares something)")
    p.add_argument("--placement", choices=CHECKPOINT_PLACEMENTS, default="sglang",
                   help="a hybrid model's GDN states: where SGLang 0.5.23 keeps them (default), or the paper's grid")
    p.add_argument("--json", dest="json_path")
    p.add_argument("--keep-others", action="store_true",
                   help="--json exists: replay only these settings, keep its other rows, recompute the checks")
    p.add_argument("--plot")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--update-doc", metavar="MD", help="rewrite MD's <!-- admission-budget:NAME --> blocks from --json")
    p.add_argument("--render-only", action="store_true", help="replay nothing: --update-doc from an existing --json")
    args = p.parse_args(argv)
    if (args.update_doc or args.render_only) and not args.json_path:
        p.error("--update-doc and --render-only need --json (the doc is rendered from that file)")
    if args.render_only:
        if not args.update_doc:
            p.error("--render-only needs --update-doc")
        with open(args.json_path) as fh:
            doc = json.load(fh)
        doc_blocks.update_file(Path(args.update_doc), "admission-budget", render(doc))
        if args.plot:
            plot(doc["rows"], args.plot)
        return 0
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        p.error(f"--workloads: unknown {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    settings = [Setting(w, m, float(t), args.sessions, args.placement) for w in args.workloads.split(",")
                for m in args.models.split(",") for t in args.loads.split(",")]
    kept: list[dict] = []
    if args.keep_others:
        if not args.json_path or not Path(args.json_path).exists():
            p.error("--keep-others needs an existing --json")
        with open(args.json_path) as fh:
            before = json.load(fh)
        if (before["sessions"], before["dwpd"]) != (args.sessions, args.dwpd):
            p.error(f"--keep-others: {args.json_path} holds --sessions {before['sessions']} --dwpd {before['dwpd']:g}; "
                    f"this run's {args.sessions} and {args.dwpd:g} would not compare")
        kept = before["rows"]
    rows = []
    for s in tqdm(settings, desc="settings", disable=args.no_progress):
        rows += run_setting(s, args.dwpd, not args.no_progress)
    rows = merge_rows(kept, rows)
    found = checks(rows, args.dwpd)
    print(format_rows(rows))
    print()
    print(format_checks(found))
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"sessions": args.sessions, "dwpd": args.dwpd, "rows": rows, "checks": found}, fh, indent=2)
    if args.update_doc:
        doc_blocks.update_file(Path(args.update_doc), "admission-budget", render({"rows": rows, "checks": found}))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
