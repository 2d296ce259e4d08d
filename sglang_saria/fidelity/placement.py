"""Figure 10's WEKA hybrid rows under both GDN state placements: the paper's grid (a state every
16,384 tokens, what docs/fidelity.md's other tables replay) and SGLang 0.5.23's (``"sglang"``: a
state at each 8,192-token prefill chunk's end and at branching points; what a server keeps).

For each placement: the anchor set by its rule (``table.anchor_sessions``: the first K WEKA
sessions, K the largest multiple of 10 whose full duplicate writes at most the paper's 4.59 C,
scanning up from 10), every scanned K's full-duplicate writes kept as raw records; then DRAM-only,
full duplicate and E3 (robust rule) of qwen3.5-9b on N sessions and on the anchor set at the paper's
settings (``runs.Setup``), and Figure 10's three ratios against the baselines of the same
placement and set, next to the paper's. ``--json`` keeps the raw metrics; ``--update-doc`` renders
the table into docs/fidelity.md (``<!-- placement:table -->``); tests/replay/test_hybrid_placement_doc.py
recomputes the anchors and the ratios from the raw records.

    saria-hybrid-placement --sessions 350 --json docs/data/hybrid-placement.json \\
        --update-doc docs/fidelity.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from sglang_saria.fidelity.runs import PAPER_FD_WRITES_MAX_C, WEKA, Runner, Setup, rel_same
from sglang_saria.fidelity.table import ANCHOR_STEP
from sglang_saria.replay.report import md_table

MODEL = "qwen3.5-9b"
PLACEMENTS = ("grid", "sglang")
POLICIES = ("none", "full-duplicate", "eviction:E3")
METRICS = ("ssd_write_bytes", "ssd_writes_norm", "ttft_mean_s", "char", "requests")
# Figure 10, WEKA, qwen3.5-9b: (claim, policy, metric, baseline, the paper's change)
CLAIMS = (
    ("E3 SSD writes vs FD", "eviction:E3", "ssd_write_bytes", "full-duplicate", -0.782),
    ("E3 mean TTFT vs FD", "eviction:E3", "ttft_mean_s", "full-duplicate", 0.784),
    ("E3 mean TTFT vs DRAM-only", "eviction:E3", "ttft_mean_s", "none", -0.949),
)
_BLOCK = re.compile(r"(<!-- placement:table -->\n)(.*?)(<!-- /placement -->)", re.S)


def anchor_scan(run: Runner, limit: int) -> dict[int, float]:
    """Full duplicate's writes (C) at each K the anchor rule scans: up from ANCHOR_STEP, to the first
    K above the paper's bound (or ``limit``)."""
    scan: dict[int, float] = {}
    for k in range(ANCHOR_STEP, limit + 1, ANCHOR_STEP):
        scan[k] = run(Setup(WEKA, MODEL, k))["ssd_writes_norm"]
        if scan[k] > PAPER_FD_WRITES_MAX_C:
            break
    return scan


def anchor_of(scan: dict[int, float]) -> int:
    """The anchor rule's K from its scan: the last K before the first one above the bound."""
    k_ok = 0
    for k in sorted(scan):
        if scan[k] > PAPER_FD_WRITES_MAX_C:
            break
        k_ok = k
    return k_ok


def measure(sessions: int, progress: bool) -> dict:
    """Raw metrics per placement, session set and policy, one replay each on the same requests."""
    out: dict = {"model": MODEL, "sessions": sessions, "fd_bound_c": PAPER_FD_WRITES_MAX_C, "placements": {}}
    for p in PLACEMENTS:
        run = Runner(progress=progress, placement=p)
        scan = anchor_scan(run, sessions)
        sets = {str(n): {pol: {m: r[m] for m in METRICS} | {"request_set": r["request_set"]}
                         for pol in POLICIES for r in [run(Setup(WEKA, MODEL, n, policy=pol))]}
                for n in dict.fromkeys((sessions, anchor_of(scan)))}
        out["placements"][p] = {"anchor_scan": {str(k): w for k, w in scan.items()}, "anchor": anchor_of(scan),
                                "sets": sets}
    return out


def format_table(doc: dict) -> str:
    """Figure 10's ratios per placement and session set, from the raw metrics (each against the
    baselines of its own placement and set)."""
    rows = []
    for p, got in doc["placements"].items():
        for n, by in got["sets"].items():
            label = f"{n} sessions" + (" (anchor)" if int(n) == got["anchor"] else "")
            fd, e3 = by["full-duplicate"], by["eviction:E3"]
            rows.append([p, label, "FD W/C; E3 W/C, CHAR", "", f"{fd['ssd_writes_norm']:.2f}; "
                         f"{e3['ssd_writes_norm']:.2f}, {e3['char']:.3f}"])
            for claim, policy, metric, base, paper in CLAIMS:
                rows.append([p, label, claim, f"{paper:+.1%}", f"{rel_same(by[policy], by[base], metric):+.1%}"])
    return md_table(["placement", "WEKA set", f"{doc['model']}", "paper", "replay"], rows)


def update_doc(text: str, doc: dict) -> str:
    return _BLOCK.sub(lambda m: f"{m.group(1)}{format_table(doc)}\n{m.group(3)}", text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="saria-hybrid-placement", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=350)
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--update-doc", default=None, metavar="MD")
    p.add_argument("--render-only", action="store_true", help="replay nothing: render --update-doc from --json")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.render_only and not (args.json_path and args.update_doc):
        p.error("--render-only needs --json and --update-doc")
    if args.render_only:
        with open(args.json_path) as fh:
            doc = json.load(fh)
    else:
        doc = measure(args.sessions, not args.no_progress)
    print(format_table(doc))
    if args.json_path and not args.render_only:
        with open(args.json_path, "w") as fh:
            json.dump(doc, fh, indent=2)
    if args.update_doc:
        with open(args.update_doc) as fh:
            text = fh.read()
        with open(args.update_doc, "w") as fh:
            fh.write(update_doc(text, doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
