"""The numbers docs/fidelity.md states in its prose (sections 1-6), recomputed from the raw records of
docs/data/fidelity.json (SGLang's GDN state placement, the doc's main run) and, where the doc
compares with the paper's own volume, docs/data/fidelity-grid.json (the paper's grid): each phrase
below, formatted from the JSON, must be in the doc. A re-run that moves a number fails here until
the sentence says what the run measured."""

import json
import math
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAPER_FD_MAX_C = 1.0 / (1.0 - 0.782)  # paper 5.2: E3's -78.2% against FD fits the one-day budget


def _phrases(doc: dict) -> list[str]:
    target = {(t["model"], t["setting"]): t for t in doc["e3_target"]}
    mech = {(m["rule"], m["policy"]): m for m in doc["mechanism"]}
    k = doc["anchor_sessions"]
    fd350 = target["qwen3.5-9b", "stated load, 350 sessions"]["fd_writes_norm"]
    fd_k = target["qwen3.5-9b", f"stated load, anchor: {k} sessions"]["fd_writes_norm"]
    fd, paper_e3, robust_e3 = mech["robust", "full-duplicate"], mech["paper", "eviction:E3"], mech["robust", "eviction:E3"]
    return [
        f"wrote at most 1 / (1 - 0.782) = {PAPER_FD_MAX_C:.2f} C",
        f"make it write {fd350:.2f} C at the same capacities",
        f"**K = {k}** (FD {fd_k:.2f} C)",
        f"FD writes {fd350:.2f} C on the 350 sessions (qwen3.5-9b), {fd_k:.2f} C on the anchor set",
        f"qwen3.5-9b's FD writes {fd350:.2f} C with them",
        f"(section 5). The 350 sessions make it write {fd350:.2f} C",
        f"on the same {fd['requests']:,} requests as FD its E3 writes "
        f"{paper_e3['ssd_writes_norm'] / fd['ssd_writes_norm']:.2f}x FD ({paper_e3['ssd_writes_norm']:.1f} C, CHAR\n"
        f"{paper_e3['char']:.2f}",
        f"GPU from {fd['gpu_busy_frac']:.0%}\n   busy (FD) to {paper_e3['gpu_busy_frac']:.0%}",
        f"(`median_E_at_write`: {paper_e3['median_E_at_write']:.0f} against the robust E3's {robust_e3['median_E_at_write']:.0f})",
        f"(`parent_on_ssd_at_write`: {paper_e3['parent_on_ssd_at_write']:.1%} of the paper rule's E3 writes",
        f"(`writes_never_read`: {paper_e3['writes_never_read']:.1%})",
        f"(`rewrite_share`: {paper_e3['rewrite_share']:.0%} of its writes rewrote {paper_e3['distinct_blocks_written'] / 1e3:.0f}K distinct\n"
        f"   blocks; FD: {fd['rewrite_share']:.1%} of {fd['distinct_blocks_written'] / 1e3:.0f}K)",
    ]


def _bound_phrases(doc: dict) -> list[str]:
    """Section 3's reading of the bound table, and sections 4 and 5's figures."""
    b = {(r["model"], r["set"].split(":")[0], r["policy"]): r for r in doc["oracle_bound"]}
    q, e = "qwen3.5-9b", "qwen3-8b"
    fd_never = next(m for m in doc["mechanism"] if m["policy"] == "full-duplicate")["writes_never_read"]
    e2 = [b[m, s, "eviction:E2"] for m in (q, e) for s in ("350 sessions", "anchor")]
    fd_gpu = next(m for m in doc["mechanism"] if m["policy"] == "full-duplicate")["gpu_busy_frac"]
    passes = [r["oracle_passes"] for r in doc["oracle_bound"] if r["policy"] == "oracle"]
    assert all(r["oracle_fixed_point"] for r in doc["oracle_bound"] if r["policy"] == "oracle")
    met = {m: min(t["prefill_tps"] for t in doc["e3_target"]
                  if t["model"] == m and t["met"] and t["setting"].startswith("sensitivity")) for m in (q, e)}
    return [
        f"writes {b[q, '350 sessions', 'oracle']['writes_norm']:.2f} C (qwen3.5-9b) and {b[e, '350 sessions', 'oracle']['writes_norm']:.2f} C (qwen3-8b)",
        f"FD writes {b[q, '350 sessions', 'full-duplicate']['vs_oracle']:.2f}x / {b[e, '350 sessions', 'full-duplicate']['vs_oracle']:.2f}x "
        f"the bound; {fd_never:.0%} of its writes are never read",
        f"{b[q, '350 sessions', 'eviction:E3']['vs_oracle']:.2f}x the bound at CHAR {b[q, '350 sessions', 'eviction:E3']['char']:.3f}",
        f"with a {b[q, '350 sessions', 'eviction:E3']['ttft_mean_s']:.1f} s mean TTFT, a {b[q, '350 sessions', 'eviction:E3']['drain_h']:.1f} h "
        f"drain and a {b[q, '350 sessions', 'eviction:E3']['queue_mean_s']:.0f} s backlog against FD's "
        f"{b[q, '350 sessions', 'full-duplicate']['ttft_mean_s']:.1f} s and {b[q, '350 sessions', 'full-duplicate']['drain_h']:.1f} h",
        f"E3 writes the bound's bytes ({b[e, '350 sessions', 'eviction:E3']['vs_oracle']:.2f}x) but at CHAR {b[e, '350 sessions', 'eviction:E3']['char']:.3f}",
        f"CHAR {b[q, 'anchor', 'eviction:E3']['char']:.3f} / {b[e, 'anchor', 'eviction:E3']['char']:.3f}, less than the bound "
        f"({b[q, 'anchor', 'eviction:E3']['vs_oracle']:.2f}x / {b[e, 'anchor', 'eviction:E3']['vs_oracle']:.2f}x)",
        f"FD writes {b[q, 'anchor', 'full-duplicate']['vs_oracle']:.1f}x /\n  {b[e, 'anchor', 'full-duplicate']['vs_oracle']:.2f}x the bound there",
        f"{min(r['vs_oracle'] for r in e2):.2f}x-{max(r['vs_oracle'] for r in e2):.2f}x the bound, CHAR\n  within "
        f"{min(-r['char_vs_fd'] for r in e2):.3f}-{max(-r['char_vs_fd'] for r in e2):.3f} of FD's",
        f"every oracle below reached one, in {min(passes)}-{max(passes)} passes",
        f"FD keeps the modelled GPU {fd_gpu:.0%} busy",
        f"met from {met[q]:,} tokens/s",
        f"(met from {met[e]:,})",
        f"needs a GPU {met[q] / 6500:.1f}x faster than the stated one",
        f"on qwen3-8b {met[e] / 6500:.1f}x (met from",
        "at 6,500 E3 writes {e3_vs_fd:.3f}x FD's bytes at CHAR {e3_char:.3f}".format(
            **next(t for t in doc["e3_target"] if t["model"] == q and t["setting"] == "stated load, 350 sessions")),
    ]


def _grid_phrases(grid: dict, main: dict) -> list[str]:
    """Where the doc compares with the paper's own volume: the paper's grid of GDN states."""
    target = {(t["model"], t["setting"]): t for t in grid["e3_target"]}
    fd350 = target["qwen3.5-9b", "stated load, 350 sessions"]["fd_writes_norm"]
    fd8b = target["qwen3-8b", "stated load, 350 sessions"]["fd_writes_norm"]
    met = min(t["prefill_tps"] for t in grid["e3_target"]
              if t["model"] == "qwen3.5-9b" and t["met"] and t["setting"].startswith("sensitivity"))
    return [
        f"{fd350:.2f} C (qwen3.5-9b) and {fd8b:.2f} C (qwen3-8b) at the same capacities",
        f"at least\n{math.floor(fd350 / PAPER_FD_MAX_C * 100) / 100:.2f}x the paper's distinct KV",  # a floor: "at least"
        f"(on the paper's grid: {fd350:.2f} C, section 5)",
        f"under the paper's grid of GDN states the same rule gives K = {grid['anchor_sessions']}",
        f"Under the\npaper's grid of GDN states qwen3.5-9b needed {met:,} tokens/s",
        f"Figure 11's {next(r for r in main['rows'] if r['figure'] == '11')['replay']:.1%} against the paper's",
    ]


@pytest.mark.parametrize("index", range(6))
def test_each_number_compared_on_the_papers_grid_is_the_grid_runs(index):
    grid, main = (json.loads((DOCS / "data" / f).read_text()) for f in ("fidelity-grid.json", "fidelity.json"))
    assert grid.get("placement", "grid") == "grid" and main["placement"] == "sglang"
    phrase = _grid_phrases(grid, main)[index]
    assert phrase in (DOCS / "fidelity.md").read_text(), f"docs/fidelity.md does not say {phrase!r}"


@pytest.mark.parametrize("index", range(15))
def test_each_number_of_the_bound_reading_is_the_jsons(index):
    doc = json.loads((DOCS / "data" / "fidelity.json").read_text())
    phrase = _bound_phrases(doc)[index]
    assert phrase in (DOCS / "fidelity.md").read_text(), f"docs/fidelity.md does not say {phrase!r}"


@pytest.mark.parametrize("index", range(12))
def test_each_prose_number_is_the_jsons(index):
    doc = json.loads((DOCS / "data" / "fidelity.json").read_text())
    phrases = _phrases(doc)
    assert len(phrases) == 12
    text = (DOCS / "fidelity.md").read_text()
    assert phrases[index] in text, f"docs/fidelity.md does not say {phrases[index]!r}"


def test_the_readmes_anchor_and_volume_are_the_jsons():
    doc, grid = (json.loads((DOCS / "data" / f).read_text()) for f in ("fidelity.json", "fidelity-grid.json"))
    fd350 = next(t for t in grid["e3_target"] if t["model"] == "qwen3.5-9b" and t["setting"] == "stated load, 350 sessions")
    readme = " ".join((DOCS.parent / "README.md").read_text().split())
    assert f"at least {math.floor(fd350['fd_writes_norm'] / PAPER_FD_MAX_C * 100) / 100:.2f}x the paper's KV volume" in readme
    assert f"an anchor set (the first {doc['anchor_sessions']} sessions" in readme
