"""`saria-admission-sweep` end to end on the TraceLab sample (a real trace, replayed in well under a second):
a run, rows added to it with its frontier kept, the render, and bad input named."""

import json

import pytest

from sglang_saria.bench.admission_sweep import main


@pytest.fixture()
def sweep(shared_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SARIA_SHARED_DIR", str(shared_dir))
    out = tmp_path / "sweep.json"
    assert main(["run", "--workload", "tracelab", "--models", "qwen3-8b", "--loads", "6500",
                 "--policies", "none,eviction:E2", "--shares", "0.5,1", "--json", str(out)]) == 0
    return out


def test_run_records_the_frontier_and_every_policy_on_the_same_requests(sweep):
    doc = json.loads(sweep.read_text())
    (s,) = doc["settings"]
    assert [r["policy"] for r in s["rows"]] == ["none", "eviction:E2"]
    assert len({r["request_set"] for r in s["rows"]}) == 1
    assert s["frontier"]["points"][0]["k"] == 0 and all(p["fixed_point"] for p in s["frontier"]["points"])


def test_rows_only_keeps_the_frontier_and_replaces_rows_of_the_same_policy(sweep, capsys):
    before = json.loads(sweep.read_text())["settings"][0]
    assert main(["run", "--workload", "tracelab", "--models", "qwen3-8b", "--loads", "6500", "--rows-only",
                 "--policies", "eviction:E2,oracle", "--variant", "auto@auto_odds=2", "--json", str(sweep)]) == 0
    after = json.loads(sweep.read_text())["settings"][0]
    assert after["frontier"] == before["frontier"]
    assert [(r["policy"], r["variant"]) for r in after["rows"]] == [
        ("none", ""), ("eviction:E2", ""), ("oracle", ""), ("auto", "auto_odds=2")]
    oracle = after["rows"][2]
    assert oracle["oracle_fixed_point"] and oracle["oracle_passes"] >= 1
    rendered = capsys.readouterr().out
    assert "### Other constants and closures" in rendered and "auto (auto_odds=2)" in rendered


def test_bad_input_is_named(shared_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SARIA_SHARED_DIR", str(shared_dir))
    out = str(tmp_path / "x.json")
    with pytest.raises(ValueError, match="no field 'auto_oddz'"):
        main(["run", "--workload", "tracelab", "--variant", "auto@auto_oddz=2", "--json", out])
    with pytest.raises(ValueError, match="hints must be one of none, end, next, got 'all'"):
        main(["run", "--workload", "tracelab", "--variant", "auto@hints=all", "--json", out])
    with pytest.raises(ValueError, match="expected weka:A-B"):
        main(["run", "--workload", "weka:x", "--models", "qwen3-8b", "--loads", "6500", "--json", out])
    with pytest.raises(SystemExit):
        main(["run", "--workload", "tracelab", "--rows-only", "--models", "qwen3-8b", "--loads", "6500", "--json", out])


def test_timing_records_wall_and_cpu_seconds_per_policy_interleaved(sweep, capsys):
    """Each policy gets one wall and one CPU time per round; the table shows both medians against E2's."""
    assert main(["timing", "--workload", "tracelab", "--policies", "eviction:E2,auto", "--repeats", "2",
                 "--json", str(sweep)]) == 0
    t = json.loads(sweep.read_text())["timing"]
    for key in ("runs", "cpu_runs"):
        assert list(t[key]) == ["eviction:E2", "auto"]
        assert all(len(v) == 2 and all(x > 0 for x in v) for v in t[key].values())
    table = capsys.readouterr().out.split("### Replay time", 1)[1]
    assert "| tracelab | qwen3-8b | eviction:E2 | 2 |" in table and "| 1.00x |" in table
    with pytest.raises(SystemExit):  # the baseline must be among the policies
        main(["timing", "--workload", "tracelab", "--policies", "auto", "--json", str(sweep)])


def test_a_hints_variant_replays_with_the_agents_hints_in_its_own_table(sweep, capsys):
    assert main(["run", "--workload", "tracelab", "--models", "qwen3-8b", "--loads", "6500", "--rows-only",
                 "--policies", "", "--variant", "auto@hints=end", "--variant", "auto@auto_odds=2,hints=end",
                 "--json", str(sweep)]) == 0
    rows = json.loads(sweep.read_text())["settings"][0]["rows"]
    assert [(r["policy"], r["variant"]) for r in rows] == [
        ("none", ""), ("eviction:E2", ""), ("auto", "hints=end"), ("auto", "auto_odds=2,hints=end")]
    assert len({r["request_set"] for r in rows}) == 1
    rendered = capsys.readouterr().out
    hinted = rendered.split("### With agents' hints", 1)[1]
    assert "auto (hints=end)" in hinted and "auto (auto_odds=2,hints=end)" in hinted
    assert "### Other constants and closures" not in rendered  # a hinted row is not a constants row


def test_labels_name_a_hinted_policy_by_its_variant(sweep):
    assert main(["labels", "--workload", "tracelab", "--policies", "auto,auto@hints=end", "--json", str(sweep)]) == 0
    (rec,) = json.loads(sweep.read_text())["labels"]
    assert [r["policy"] for r in rec["rows"]] == ["auto", "auto (hints=end)"]
    for r in rec["rows"]:
        assert r["useful"] + r["wasted_admitted"] + r["wasted_closure"] == r["writes"]


def test_perturb_replays_each_policy_at_each_load_factor_and_replaces_its_record(sweep, capsys):
    """One run per factor, on the same requests; the run at factor 1 is the setting's own row (the same
    replay); a second perturb of the setting replaces the first; a factor <= 0 is refused."""
    args = ["perturb", "--workload", "tracelab", "--model", "qwen3-8b", "--policies", "eviction:E2,auto@hints=end",
            "--factors", "0.5,1", "--json", str(sweep)]
    assert main(args) == 0 and main(args) == 0
    doc = json.loads(sweep.read_text())
    (p,) = doc["perturb"]
    assert p["factors"] == [0.5, 1.0] and [(r["policy"], r["variant"]) for r in p["rows"]] == [
        ("eviction:E2", ""), ("auto", "hints=end")]
    runs = p["rows"][0]["runs"]
    assert [r["factor"] for r in runs] == [0.5, 1.0] and len({r["request_set"] for r in runs}) == 1
    row = next(r for r in doc["settings"][0]["rows"] if r["policy"] == "eviction:E2")
    assert (runs[1]["writes_norm"], runs[1]["char"]) == (row["writes_norm"], row["char"])
    assert "### The same requests at a load a few percent off" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["perturb", "--workload", "tracelab", "--factors", "0,1", "--json", str(sweep)])


def test_hindsight_replays_auto_learned_then_with_its_final_chances_at_each_bar(sweep, capsys):
    """One learned run and one run per bar, all on the same requests, judged against the setting's frontier
    in their own table; a second run of the setting replaces its record; a setting the JSON has no
    frontier for, and a bar <= 0, are refused before any replay."""
    args = ["hindsight", "--workload", "tracelab", "--models", "qwen3-8b", "--loads", "6500", "--bars", "1,4",
            "--json", str(sweep)]
    assert main(args) == 0 and main(args) == 0
    (h,) = json.loads(sweep.read_text())["hindsight"]
    assert (h["hints"], h["learned"]["bar"], [r["bar"] for r in h["rows"]]) == ("none", 4.0, [1.0, 4.0])
    assert len({r["request_set"] for r in [h["learned"], *h["rows"]]}) == 1
    table = capsys.readouterr().out.split("### `auto`'s classes with hindsight chances", 1)[1]
    assert "| tracelab | qwen3-8b | 6,500 | 10M | none |" in table
    with pytest.raises(ValueError, match="no setting tracelab qwen3-8b 13000"):
        main(["hindsight", "--workload", "tracelab", "--models", "qwen3-8b", "--loads", "13000", "--json", str(sweep)])
    with pytest.raises(SystemExit):
        main(["hindsight", "--workload", "tracelab", "--bars", "0,4", "--json", str(sweep)])
