"""docs/fidelity.md's Figure 10 section (server vs replay) is `saria-fig10 --json` output.

Every table marked ``<!-- fig10:NAME -->`` must equal the rendering of docs/data/fig10.json, the
file the bench wrote; the orderings the doc states in words are checked against the JSON too, and
the replay side is re-run by today's code against the recorded server numbers."""

import json
import math
from pathlib import Path

import pytest

from sglang_saria.bench import fig10
from sglang_saria.bench.fig10_doc import doc_blocks, doc_tables, update_doc
from sglang_saria.tiny_models import bench_config

REPO = Path(__file__).resolve().parents[2]

DOCS = REPO / "docs"
# the hybrid's earlier run, 600-token conversations (31 min: over the bench's time target)
LONG_HYBRID = DOCS / "data" / "fig10-hybrid-600.json"


@pytest.fixture(scope="module")
def data() -> list[dict]:
    return json.loads((DOCS / "data" / "fig10.json").read_text())


def test_every_fig10_table_in_the_doc_is_the_json_rendered(data):
    blocks = doc_blocks((DOCS / "fidelity.md").read_text())
    tables = doc_tables(data)
    assert blocks, "docs/fidelity.md has no <!-- fig10:NAME --> tables"
    assert set(blocks) == {n for n in tables if not n.startswith("readme-")}  # README's: test_fig10_readme.py
    for name, text in blocks.items():
        assert text == tables[name], f"docs/fidelity.md table {name!r} differs from docs/data/fig10.json"


def test_the_json_has_every_configuration_5_runs_no_failure_no_audit_and_a_bounded_file(data):
    """The run's conditions: every configuration 5 times, none with the KV audit (it cannot run on
    the stock ones), stock `file` bounded to the saria store's bytes (and within it)."""
    for entry in data:
        assert {"dram-only", "hicache-file", "full-duplicate", "eviction:E2", "eviction:E3", "loadaware"} <= set(entry["medians"])
        assert any(n.startswith("budget:") for n in entry["medians"])
        for name, runs in entry["runs"].items():
            assert len(runs) == 5, name
            assert all(r["failed"] == 0 and r["audit_pages"] == 0 for r in runs), name
        config = bench_config(Path(entry["model"]).name)
        fa_layers = sum(t == "full_attention" for t in config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"])
        kv_bytes_per_token = 2 * fa_layers * config["num_key_value_heads"] * config["head_dim"] * 4  # float32 K and V
        assert entry["store_cap_bytes"] == entry["pools"]["store_tokens"] * kv_bytes_per_token
        for r in entry["runs"]["hicache-file"]:
            assert 0 < r["store_bytes_held"] <= entry["store_cap_bytes"] and r["store_bytes_held"] <= r["ssd_bytes"]
        # the replay served the same sessions: one request count on both sides
        assert {r["requests"] for r in entry["replay"].values()} == {entry["workload"]["requests"]}


def test_the_replays_place_in_the_servers_range_recomputed_from_the_runs(data):
    """Per configuration: the server's per-round ratios (round i of it over round i of the base)
    span a range; the replay's ratio over its own base lies inside or outside it, as recorded."""
    for entry in data:
        cmp, runs = entry["comparison"], entry["runs"]
        assert cmp["bases"] == {"server": "hicache-file", "replay": "hicache-file"}
        for key, label, base in (("ssd_bytes", "fd", "hicache-file"), ("ttft_mean_ms", "fd", "hicache-file"),
                                 ("ttft_mean_ms", "dram", "dram-only")):
            for name in cmp["configs"]:
                per_round = [a[key] / b[key] for a, b in zip(runs[name], runs[base]) if b[key]]
                replayed = entry["replay"][name][key] / entry["replay"][base][key]
                assert cmp[key][f"server_range_vs_{label}"][name] == pytest.approx([min(per_round), max(per_round)])
                assert cmp[key][f"replay_inside_vs_{label}"][name] == (
                    min(per_round) * (1 - 1e-9) - 1e-12 <= replayed <= max(per_round) * (1 + 1e-9) + 1e-12), (name, key)


def test_update_doc_rewrites_only_the_marked_tables(data):
    name = next(iter(doc_tables(data)))
    text = f"intro\n<!-- fig10:{name} -->\nold\n<!-- /fig10 -->\noutro\n"
    new = update_doc(text, data)
    assert new.startswith(f"intro\n<!-- fig10:{name} -->\n| ") and new.endswith("<!-- /fig10 -->\noutro\n")
    assert doc_blocks(new)[name] == doc_tables(data)[name]
    with pytest.raises(ValueError, match="unknown fig10 table"):
        update_doc("<!-- fig10:nope -->\nx\n<!-- /fig10 -->\n", data)


def test_the_orderings_the_doc_states_hold_in_the_json(data):
    """The section's claim, on the recorded runs (5 rounds; the earlier hybrid run with longer
    conversations: 3): no pair that the replay orders one way and the server the other beyond the
    server's run-to-run spread, by SSD writes or TTFT."""
    for entry, rounds in [*((e, 5) for e in data), *((e, 3) for e in json.loads(LONG_HYBRID.read_text()))]:
        assert all(len(runs) == rounds for runs in entry["runs"].values()), entry["model"]
        cmp = entry["comparison"]
        assert cmp["disagree_writes"] == [] and cmp["disagree_ttft"] == [], entry["model"]


def test_the_qwen3_bench_prose_is_what_the_json_shows(data):
    """Section 10's sentences on `qwen3-bench`: where the replay's write ratios fall against the
    server's range, the budget's cap and writes, stock `file`'s writes and what it held."""
    entry = next(e for e in data if e["model"].endswith("qwen3-bench"))
    inside = entry["comparison"]["ssd_bytes"]["replay_inside_vs_fd"]
    below = [n for n, flag in inside.items() if flag is False
             and entry["comparison"]["ssd_bytes"]["replay_vs_fd"][n] < entry["comparison"]["ssd_bytes"]["server_range_vs_fd"][n][0]]
    assert [n.split(":")[0] for n in below] == ["full-duplicate", "eviction", "budget", "loadaware"]
    assert inside["eviction:E3"] is True
    ttft = entry["comparison"]["ttft_mean_ms"]
    outside = [(n, label) for label in ("fd", "dram") for n, flag in ttft[f"replay_inside_vs_{label}"].items() if flag is False]
    assert [(n.split(":")[0], label) for n, label in outside] == [("budget", "fd")]
    budget = next(n for n in entry["runs"] if n.startswith("budget:"))
    written = [r["ssd_bytes"] / 1e6 for r in entry["runs"][budget]]
    stock = entry["runs"]["hicache-file"]
    dram = [r["ttft_mean_ms"] for r in entry["runs"]["dram-only"]]
    text = " ".join((DOCS / "fidelity.md").read_text().split())
    assert f"half of E2's first run ({entry['budget']['cap_bytes'] / 1e6:.1f} MB); its runs wrote {min(written):.1f}-{max(written):.1f} MB" in text
    assert (f"Stock `file` wrote {min(r['ssd_bytes'] for r in stock) / 1e6:.0f}-{max(r['ssd_bytes'] for r in stock) / 1e6:.0f} MB "
            f"a run and held at most {max(r['store_bytes_held'] for r in stock) / 1e6:.1f} of its "
            f"{entry['store_cap_bytes'] / 1e6:.1f} MB cap") in text
    assert f"DRAM-only's own runs span {min(dram):,.0f}-{max(dram):,.0f} ms" in text
    budget_fd = ttft["server_range_vs_fd"][budget]
    assert f"(1.40 against {budget_fd[0]:.2f}-{budget_fd[1]:.2f})" in text and f"{ttft['replay_vs_fd'][budget]:.2f}" == "1.40"


@pytest.mark.parametrize("recorded", [DOCS / "data" / "fig10.json", LONG_HYBRID], ids=lambda p: p.name)
def test_the_replay_today_gives_the_recorded_comparison(recorded, shared_dir, tmp_path):
    """The replay side of each recorded run re-run by today's code (`--replay-from`: the same
    sessions, capacities and measured prefill rate against the recorded server numbers): the
    comparison the doc shows is what the replay computes, so a change to the replay's model that
    moves an ordering shows here. The benchmark models' geometry comes from their configs
    (`make bench-models` is not needed: no weights are read)."""
    entries = json.loads(recorded.read_text())
    for entry in entries:  # the models' config.json, as `make bench-models` writes it
        model = tmp_path / "models" / Path(entry["model"]).name
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps(bench_config(model.name)))
        entry["model"] = str(model)
    moved = tmp_path / recorded.name
    moved.write_text(json.dumps(entries))
    fresh = fig10.replay_from_json(moved, tmp_path / "work", weka=shared_dir / "traces" / "weka-cc")
    for entry, run in zip(entries, fresh):
        _assert_same(json.loads(json.dumps(run.comparison)), entry["comparison"], entry["model"])


def _assert_same(fresh, recorded, where: str) -> None:
    """Equal structure, names and orderings; ratios equal up to float rounding (another CPU may
    sum in another order), NaN (no base) equal to NaN."""
    if isinstance(recorded, dict):
        assert set(fresh) == set(recorded), where
        for key in recorded:
            _assert_same(fresh[key], recorded[key], f"{where}.{key}")
    elif isinstance(recorded, list):
        assert len(fresh) == len(recorded), where
        for i, (a, b) in enumerate(zip(fresh, recorded)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(recorded, float):
        assert (math.isnan(fresh) and math.isnan(recorded)) or math.isclose(fresh, recorded, rel_tol=1e-9, abs_tol=1e-12), where
    else:
        assert fresh == recorded, where


def test_the_hybrid_prose_is_what_the_json_shows(data):
    """Section 10's sentences on `qwen3.5-bench-hybrid`: who wrote nothing, E2's and the budget's
    largest run, no storage hits, the budget's rule and cap, the replay's place in the ranges."""
    entry = next(e for e in data if e["model"].endswith("qwen3.5-bench-hybrid"))
    runs, cmp = entry["runs"], entry["comparison"]
    budget = next(n for n in runs if n.startswith("budget:"))
    assert all(r["ssd_bytes"] == 0 for n in ("eviction:E3", "loadaware") for r in runs[n])
    assert [r["ssd_bytes"] == 0 for r in runs["eviction:E2"]].count(True) == 2
    assert [r["ssd_bytes"] == 0 for r in runs[budget]].count(True) == 1
    largest = max(r["ssd_bytes"] for n in ("eviction:E2", budget) for r in runs[n]) / 1e6
    assert all(r["storage_tokens"] == 0 for rs in runs.values() for r in rs)
    assert entry["budget"]["rule"] == "half of the first full-duplicate run's writes"
    assert [n for n, f in cmp["ssd_bytes"]["replay_inside_vs_fd"].items() if not f] == ["full-duplicate"]
    assert [(n, label) for label in ("fd", "dram") for n, f in cmp["ttft_mean_ms"][f"replay_inside_vs_{label}"].items()
            if not f] == [(budget, "dram")]
    stock, dram = runs["hicache-file"], [r["ttft_mean_ms"] for r in runs["dram-only"]]
    low, high = cmp["ttft_mean_ms"]["server_range_vs_dram"][budget]
    text = " ".join((DOCS / "fidelity.md").read_text().split())
    for sentence in (
        f"E2 and the budget at most {largest:.1f} MB (two of E2's runs and one of the budget's nothing)",
        f"full duplicate's first run (a {entry['budget']['cap_bytes'] / 1e6:.1f} MB cap)",
        f"DRAM-only's own runs span {min(dram):,.0f}-{max(dram):,.0f} ms",
        f"({cmp['ttft_mean_ms']['replay_vs_dram'][budget]:.2f} against {low:.2f}-{high:.2f})",
        f"Stock `file` wrote {min(r['ssd_bytes'] for r in stock) / 1e6:.0f}-{max(r['ssd_bytes'] for r in stock) / 1e6:.0f} MB a "
        f"run and held at most {max(r['store_bytes_held'] for r in stock) / 1e6:.1f} of its {entry['store_cap_bytes'] / 1e6:.1f} MB cap",
    ):
        assert sentence in text, sentence
