"""docs/fidelity.md's placement table (`saria-hybrid-placement`): the anchors recomputed from the
raw scan by the anchor rule, each ratio recomputed from docs/data/hybrid-placement.json's raw metrics,
and a reduced run of the generator on real WEKA sessions."""

import json
from pathlib import Path

import pytest

from sglang_saria.fidelity import placement as hybrid_placement

DOCS = Path(__file__).resolve().parents[2] / "docs"
BOUND_C = 1.0 / (1.0 - 0.782)  # paper 5.2: E3's -78.2% against FD fits the one-day budget (1 C)


def _data() -> dict:
    return json.loads((DOCS / "data" / "hybrid-placement.json").read_text())


def _doc_rows() -> list[list[str]]:
    text = (DOCS / "fidelity.md").read_text()
    block = text.split("<!-- placement:table -->\n", 1)[1].split("<!-- /placement -->", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()[2:] if line.strip()]


def test_each_anchor_is_its_rule_applied_to_the_scanned_writes():
    data = _data()
    for placement, got in data["placements"].items():
        scan = sorted((int(k), w) for k, w in got["anchor_scan"].items())
        assert [k for k, _ in scan] == list(range(10, 10 * len(scan) + 1, 10))  # scanned up from 10, none skipped
        assert all(w <= BOUND_C for _, w in scan[:-1])
        k = scan[-1][0] - 10 if scan[-1][1] > BOUND_C else scan[-1][0]  # stopped at the first K above the bound
        assert got["anchor"] == k > 0, placement
    # each placement's saria-fidelity run found the same anchor and the same full duplicate
    for placement, name in (("grid", "fidelity-grid.json"), ("sglang", "fidelity.json")):
        fidelity = json.loads((DOCS / "data" / name).read_text())
        got = data["placements"][placement]
        assert got["anchor"] == fidelity["anchor_sessions"]
        fd350 = next(t for t in fidelity["e3_target"] if t["model"] == "qwen3.5-9b" and t["setting"] == "stated load, 350 sessions")
        assert got["sets"]["350"]["full-duplicate"]["ssd_writes_norm"] == pytest.approx(fd350["fd_writes_norm"])


def test_every_ratio_in_the_doc_is_recomputed_from_the_raw_metrics():
    data = _data()
    rows = _doc_rows()
    checked = 0
    for placement, got in data["placements"].items():
        for n, by in got["sets"].items():
            assert len({r["request_set"] for r in by.values()}) == 1  # one request set per placement and set
            mine = [r for r in rows if r[0] == placement and r[1].split()[0] == n]
            fd, e3 = by["full-duplicate"], by["eviction:E3"]
            written = [float(x) for x in mine[0][4].replace(";", ",").split(",")]
            assert written == pytest.approx([fd["ssd_writes_norm"], e3["ssd_writes_norm"], e3["char"]], abs=0.006)
            for claim, policy, metric, base, paper in hybrid_placement.CLAIMS:
                row = next(r for r in mine if r[2] == claim)
                assert float(row[3].rstrip("%")) == pytest.approx(paper * 100, abs=0.051)
                assert float(row[4].rstrip("%")) == pytest.approx((by[policy][metric] / by[base][metric] - 1) * 100, abs=0.051)
                checked += 1
    assert checked == len(rows) - len(rows) // 4 > 0


def test_the_docs_reading_of_the_table():
    """The sentences after the table: more FD writes and a smaller anchor under SGLang's placement;
    E3's saving on the 350 sessions grows; on the anchor set both TTFT rows come closer to the
    paper's and the write saving moves by the points the doc says."""
    def rel(by: dict, policy: str, metric: str, base: str) -> float:
        return by[policy][metric] / by[base][metric] - 1

    grid, sglang = (_data()["placements"][p] for p in ("grid", "sglang"))
    g350, s350 = grid["sets"]["350"], sglang["sets"]["350"]
    assert s350["full-duplicate"]["ssd_writes_norm"] > g350["full-duplicate"]["ssd_writes_norm"]
    assert sglang["anchor"] < grid["anchor"]
    assert rel(s350, "eviction:E3", "ssd_write_bytes", "full-duplicate") < rel(g350, "eviction:E3", "ssd_write_bytes", "full-duplicate")
    ga, sa = grid["sets"][str(grid["anchor"])], sglang["sets"][str(sglang["anchor"])]
    moved = []
    for claim, policy, metric, base, paper in hybrid_placement.CLAIMS:
        g, s = rel(ga, policy, metric, base), rel(sa, policy, metric, base)
        if metric == "ttft_mean_s":
            assert abs(s - paper) < abs(g - paper), claim
        else:
            moved.append(abs(s - g))
    text = " ".join((DOCS / "fidelity.md").read_text().split())
    (points,) = moved
    assert ("on the anchor set both TTFT rows come closer to the paper's while the write saving moves by "
            f"{100 * points:.1f} points") in text


def test_a_reduced_run_of_the_generator(shared_dir):
    """20 WEKA sessions: the JSON's shape, and the signs every run shows (E3 writes less than FD; the
    sglang placement's FD writes more than the grid's: it keeps a state every 8,192 tokens)."""
    data = hybrid_placement.measure(20, progress=False)
    assert set(data["placements"]) == {"grid", "sglang"}
    for got in data["placements"].values():
        for by in got["sets"].values():
            assert set(by) == set(hybrid_placement.POLICIES)
            assert by["eviction:E3"]["ssd_write_bytes"] < by["full-duplicate"]["ssd_write_bytes"]
            assert by["none"]["ssd_write_bytes"] == 0
    fd = {p: got["sets"]["20"]["full-duplicate"]["ssd_writes_norm"] for p, got in data["placements"].items()}
    assert fd["sglang"] > fd["grid"]
    assert hybrid_placement.format_table(data).count("\n") == 1 + 4 * sum(len(g["sets"]) for g in data["placements"].values())
