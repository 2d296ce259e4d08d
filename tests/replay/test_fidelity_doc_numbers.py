"""The numbers docs/fidelity.md states in its prose (sections 1, 2, 4 and 6), recomputed from the raw
records of docs/data/fidelity.json: each phrase below, formatted from the JSON, must be in the doc.
A re-run that moves a number fails here until the sentence says what the run measured."""

import json
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
    fd8b = target["qwen3-8b", "stated load, 350 sessions"]["fd_writes_norm"]
    fd, paper_e3, robust_e3 = mech["robust", "full-duplicate"], mech["paper", "eviction:E3"], mech["robust", "eviction:E3"]
    return [
        f"wrote at most 1 / (1 - 0.782) = {PAPER_FD_MAX_C:.2f} C",
        f"make it write {fd350:.2f} C at the same capacities",
        f"**K = {k}** (FD {fd_k:.2f} C)",
        f"FD writes {fd350:.2f} C on the 350 sessions (qwen3.5-9b), {fd_k:.2f} C on the anchor set",
        f"{fd350:.2f} C (qwen3.5-9b) and {fd8b:.2f} C (qwen3-8b) at the same capacities",
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


@pytest.mark.parametrize("index", range(11))
def test_each_prose_number_is_the_jsons(index):
    doc = json.loads((DOCS / "data" / "fidelity.json").read_text())
    phrases = _phrases(doc)
    assert len(phrases) == 11
    text = (DOCS / "fidelity.md").read_text()
    assert phrases[index] in text, f"docs/fidelity.md does not say {phrases[index]!r}"
