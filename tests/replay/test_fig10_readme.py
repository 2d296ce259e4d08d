"""README's Figure 10 section against the recorded runs of docs/data/fig10.json (`qwen3-bench`):
its table is the JSON rendered, and each ordering it states is recomputed here from the raw
runs: a claim only where every run of one configuration lies beyond every run of the other."""

import json
import statistics
from pathlib import Path

from sglang_saria.bench.fig10_doc import doc_blocks, doc_tables

ROOT = Path(__file__).resolve().parents[2]


def _entry() -> dict:
    return next(r for r in json.loads((ROOT / "docs" / "data" / "fig10.json").read_text()) if r["model"].endswith("qwen3-bench"))


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def _split(runs: dict, names: list[str], base: str, key: str) -> tuple[list[str], list[str], list[str]]:
    lo = {n: min(r[key] for r in rs) for n, rs in runs.items()}
    hi = {n: max(r[key] for r in rs) for n, rs in runs.items()}
    below = [n for n in names if hi[n] < lo[base]]
    above = [n for n in names if lo[n] > hi[base]]
    return below, above, [n for n in names if n not in below + above]


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "none"


def test_the_readme_blocks_are_the_json_rendered():
    blocks, tables = doc_blocks(_readme()), doc_tables([_entry()])
    assert {"readme-qwen3-bench", "claims-qwen3-bench"} <= set(blocks)
    for name, text in blocks.items():
        assert text == tables[name], f"README block {name!r} differs from docs/data/fig10.json"


def test_the_table_recomputed_from_the_raw_runs():
    """Each row's medians and min-max, and its ratios' per-round min-max, from the runs."""
    entry = _entry()
    runs, table = entry["runs"], doc_blocks(_readme())["readme-qwen3-bench"]
    assert all(len(rs) == 5 for rs in runs.values())
    for name, rs in runs.items():
        ttft = [r["ttft_mean_ms"] for r in rs]
        dram = [r["ttft_mean_ms"] for r in runs["dram-only"]]
        per_round = [a / b for a, b in zip(ttft, dram)]
        cells = f"| {statistics.median(ttft):.0f} ({min(ttft):.0f}-{max(ttft):.0f}) |"
        ratio = f"| {statistics.median(ttft) / statistics.median(dram):.2f} ({min(per_round):.2f}-{max(per_round):.2f}) |"
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert cells in row and row.endswith(ratio), row


def test_every_ordering_the_readme_states_holds_beyond_the_spread():
    entry = _entry()
    runs = entry["runs"]
    saria = [n for n in runs if n not in ("dram-only", "hicache-file")]
    text = " ".join(_readme().split())
    faster, slower, overlap = _split(runs, ["hicache-file", *saria], "dram-only", "ttft_mean_ms")
    assert (f"every run faster than every DRAM-only run: {_names(faster)}; every run slower: {_names(slower)}; "
            f"ranges overlap (no order claimed): {_names(overlap)}.") in text
    faster, slower, overlap = _split(runs, saria, "hicache-file", "ttft_mean_ms")
    assert (f"every run faster than every `file` run: {_names(faster)}; every run slower: {_names(slower)}; "
            f"ranges overlap: {_names(overlap)}.") in text
    fewer, more, overlap = _split(runs, saria, "hicache-file", "ssd_bytes")
    assert (f"every run wrote less than every `file` run: {_names(fewer)}; every run more: {_names(more)}; "
            f"ranges overlap: {_names(overlap)}.") in text


def test_the_readmes_reading_is_what_the_runs_show():
    """The prose under the claims: which saria policies wrote less than stock in every run, that
    full duplicate overlaps it, and that no configuration's TTFT is ordered against DRAM-only or
    stock beyond the spread."""
    runs = _entry()["runs"]
    saria = [n for n in runs if n not in ("dram-only", "hicache-file")]
    fewer, more, overlap = _split(runs, saria, "hicache-file", "ssd_bytes")
    assert [n.split(":")[0] for n in fewer] == ["eviction", "eviction", "budget", "loadaware"] and overlap == ["full-duplicate"]
    for base in ("dram-only", "hicache-file"):
        below, above, _ = _split(runs, [n for n in runs if n != base], base, "ttft_mean_ms")
        assert below == [] and above == [], base
    text = " ".join(_readme().split())
    assert ("by SSD writes, E2, E3, the budget and `loadaware` wrote less than stock `file` in every run, and full "
            "duplicate's runs overlap stock's") in text
    assert "By mean TTFT these 5 runs order nothing: every configuration's range overlaps DRAM-only's and stock's." in text
