"""The docs' Figure 10 tables and claims, rendered from `saria-fig10 --json` output.

`docs/fidelity.md` section 10 and README's "Against stock HiCache" hold blocks between
``<!-- fig10:NAME -->`` and ``<!-- /fig10 -->``; each is a rendering of docs/data/fig10.json
(`update_doc` writes them, `tests/replay/test_fig10_doc.py` and `test_fig10_readme.py` check
them). A claim that one configuration is faster or writes less than another is made only where
the gap exceeds the run-to-run spread: every run of one lies beyond every run of the other
(`beyond`); pairs whose runs overlap are named as such, not ordered.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from sglang_saria.bench.configs import DRAM_ONLY, HICACHE_FILE, RunResult, results_table
from sglang_saria.bench.fig10_replay import comparison_table, orderings_table, paired_ratios
from sglang_saria.replay.report import md_table

_BLOCK = re.compile(r"(<!-- fig10:([\w.-]+) -->\n)(.*?)(<!-- /fig10 -->)", re.S)


def values(runs: dict[str, list[dict]], name: str, key: str) -> list[float]:
    return [r[key] for r in runs[name]]


def beyond(runs: dict[str, list[dict]], low: str, high: str, key: str) -> bool:
    """Every run of ``low`` has a lower ``key`` than every run of ``high``: the gap between the
    two exceeds both configurations' run-to-run spread."""
    return max(values(runs, low, key)) < min(values(runs, high, key))


def _span(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def readme_table(entry: dict) -> str:
    """README's table: per configuration, medians and min-max over the runs; ratios of the
    medians with the min-max of the per-round ratios (each round runs every configuration)."""
    runs = entry["runs"]
    head = ["config", "SSD bytes written, MB", "storage-hit tokens", "TTFT mean (ms)", "SSD writes / hicache-file",
            "TTFT mean / dram-only"]
    rows = []
    for name in runs:
        med = entry["medians"][name]
        row = [name, _span([x / 1e6 for x in values(runs, name, "ssd_bytes")], "{:.1f}"),
               _span(values(runs, name, "storage_tokens"), "{:.0f}"), _span(values(runs, name, "ttft_mean_ms"), "{:.0f}")]
        for key, base in (("ssd_bytes", HICACHE_FILE), ("ttft_mean_ms", DRAM_ONLY)):
            ratios = paired_ratios(runs, name, base, key)
            base_med = entry["medians"][base][key]
            row.append(f"{med[key] / base_med:.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios and base_med else "n/a")
        rows.append(row)
    return md_table(head, rows)


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) if names else "none"


def claims(entry: dict) -> str:
    """The orderings the runs support against DRAM-only (TTFT) and stock `file` (TTFT, writes):
    only pairs where every run of one lies beyond every run of the other; the rest overlap."""
    runs = entry["runs"]
    n_runs = min(len(rs) for rs in runs.values())
    saria = [n for n in runs if n not in (DRAM_ONLY, HICACHE_FILE)]

    def split(names: list[str], base: str, key: str) -> tuple[list[str], list[str], list[str]]:
        below = [n for n in names if beyond(runs, n, base, key)]
        above = [n for n in names if beyond(runs, base, n, key)]
        return below, above, [n for n in names if n not in below and n not in above]

    faster, slower, overlap = split([HICACHE_FILE, *saria], DRAM_ONLY, "ttft_mean_ms")
    lines = [f"- Mean TTFT against DRAM-only, {n_runs} runs each: every run faster than every DRAM-only run: "
             f"{_names(faster)}; every run slower: {_names(slower)}; ranges overlap (no order claimed): {_names(overlap)}."]
    faster, slower, overlap = split(saria, HICACHE_FILE, "ttft_mean_ms")
    lines.append(f"- Mean TTFT against stock `file`: every run faster than every `file` run: {_names(faster)}; every run "
                 f"slower: {_names(slower)}; ranges overlap: {_names(overlap)}.")
    fewer, more, overlap = split(saria, HICACHE_FILE, "ssd_bytes")
    lines.append(f"- SSD writes against stock `file` (bounded to the store's {entry['store_cap_bytes']:,} bytes): every run "
                 f"wrote less than every `file` run: {_names(fewer)}; every run more: {_names(more)}; ranges overlap: "
                 f"{_names(overlap)}.")
    return "\n".join(lines)


def doc_tables(data: list[dict]) -> dict[str, str]:
    """Every generated block, by name, from the bench's JSON (one entry per model): fidelity.md's
    server, replay and orderings tables, README's table and both docs' claims."""
    out = {}
    for entry in data:
        name = Path(entry["model"]).name
        medians = {n: RunResult(**r) for n, r in entry["medians"].items()}
        out[f"server-{name}"] = results_table(medians)
        if entry.get("comparison"):
            out[f"replay-{name}"] = comparison_table(entry["comparison"])
            out[f"orders-{name}"] = orderings_table(entry["comparison"])
        if entry.get("store_cap_bytes"):  # runs with stock `file` bounded as the store
            out[f"readme-{name}"] = readme_table(entry)
            out[f"claims-{name}"] = claims(entry)
    return out


def doc_blocks(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3).rstrip("\n") for m in _BLOCK.finditer(text)}


def update_doc(text: str, data: list[dict]) -> str:
    """``text`` with every marked block rendered anew from ``data``."""
    tables = doc_tables(data)

    def fill(m: re.Match) -> str:
        if m.group(2) not in tables:
            raise ValueError(f"docs: unknown fig10 table {m.group(2)!r}; known: {', '.join(tables)}")
        return m.group(1) + tables[m.group(2)] + "\n" + m.group(4)

    return _BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    """Re-render the marked blocks of the given Markdown files from a fig10 JSON, in place."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m sglang_saria.bench.fig10_doc", description=main.__doc__)
    ap.add_argument("json", type=Path)
    ap.add_argument("docs", type=Path, nargs="+")
    args = ap.parse_args(argv)
    data = json.loads(args.json.read_text())
    for doc in args.docs:
        doc.write_text(update_doc(doc.read_text(), data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
