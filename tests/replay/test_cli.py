"""``saria-replay``: JSON shape, identical workload per policy, errors, plot, real traces."""

import json

import pytest

from sglang_saria.replay.cli import main
from sglang_saria.replay.metrics import RESULT_KEYS

FRACTIONS = ("char", "char_p25_bad", "writes_never_read_frac", "dram_only_hit_request_frac")


def _run(tmp_path, *args):
    out = tmp_path / "r.json"
    rc = main([*args, "--json", str(out), "--no-progress"])
    assert rc == 0
    return json.loads(out.read_text())


def test_json_has_exactly_the_documented_shape(tmp_path, capsys):
    d = _run(tmp_path, "--trace", "synthetic:2", "--sessions", "8", "--window", "40m", "--dram-tokens", "200k",
             "--ssd-tokens", "2M", "--policy", "none", "--policy", "full-duplicate", "--policy", "eviction:E2")
    assert set(d) == {"config", "results"}
    assert [r["policy"] for r in d["results"]] == ["none", "full-duplicate", "eviction:E2"]
    for r in d["results"]:
        assert tuple(r) == RESULT_KEYS
        for k in RESULT_KEYS[1:]:
            if k != "request_set":
                assert isinstance(r[k], (int, float)) and not isinstance(r[k], bool), k
        assert len(r["request_set"]) == 16 and int(r["request_set"], 16) >= 0
        for k in FRACTIONS:
            assert 0.0 <= r[k] <= 1.0, k
    none, fd, e2 = d["results"]
    assert none["request_set"] == fd["request_set"] == e2["request_set"]  # one comparison, the same requests
    assert none["ssd_write_bytes"] == 0 and fd["ssd_write_bytes"] >= e2["ssd_write_bytes"]
    assert fd["char"] >= none["char"]
    assert d["config"]["capacity"] == {"dram_tokens": 200_000, "ssd_tokens": 2_000_000, "dram_checkpoints": 0}
    assert d["config"]["window_s"] == 2400.0
    table = capsys.readouterr().out
    assert "full-duplicate" in table and "CHAR" in table


def test_same_seed_gives_identical_json_and_plot(tmp_path):
    args = ["--trace", "synthetic:5", "--sessions", "6", "--window", "2h", "--seed", "7", "--policy", "eviction:E2",
            "--dram-tokens", "300k"]
    a = _run(tmp_path, *args)
    plot = tmp_path / "f.png"
    b = _run(tmp_path, *args, "--plot", str(plot))
    assert a == b
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_bad_flags_are_clear_errors(tmp_path, capsys):
    assert main(["--trace", "synthetic", "--policy", "eviction:E0", "--no-progress"]) == 2
    assert "eviction:E0" in capsys.readouterr().err
    assert main(["--trace", "synthetic", "--model", "gpt-9", "--no-progress"]) == 2
    assert "qwen3-8b" in capsys.readouterr().err
    assert main(["--trace", "synthetic", "--bandwidth", "48,20", "--no-progress"]) == 2
    assert "--bandwidth" in capsys.readouterr().err
    assert main(["--trace", "synthetic", "--ssd-tokens", "lots", "--no-progress"]) == 2
    assert "--ssd-tokens" in capsys.readouterr().err


def test_replays_real_weka_sessions(tmp_path, shared_dir):
    d = _run(tmp_path, "--trace", f"weka:{shared_dir / 'traces' / 'weka-cc'}", "--sessions", "4", "--window", "40m",
             "--policy", "full-duplicate", "--policy", "eviction:E2", "--dram-tokens", "200k")
    fd, e2 = d["results"]
    assert fd["requests"] > 20 and fd["blocks_achievable"] > 0
    assert fd["char"] > 0.5 and fd["ssd_write_bytes"] > e2["ssd_write_bytes"] > 0


def test_replays_hybrid_model_on_tracelab_sample(tmp_path, shared_dir):
    d = _run(tmp_path, "--trace", f"tracelab:{shared_dir / 'traces' / 'tracelab-sample' / 'round_trace.jsonl'}",
             "--model", "qwen3.5-9b", "--policy", "full-duplicate")
    assert d["config"]["metadata"]["block_tokens"] == 1024 and d["config"]["checkpoint_bytes"] > 0
    r = d["results"][0]
    assert r["requests"] > 0 and r["blocks_hit"] <= r["blocks_achievable"]


def test_checkpoint_placement_flag_reaches_the_replay(tmp_path, shared_dir, capsys):
    """sglang (the default: SGLang's states, at each prefill chunk's end and branching points) keeps
    more checkpoints than prefix-end (one per computed prefix) and fewer than the paper's 2,048-token
    grid here: the same hybrid sessions write checkpoint bytes in that order under full duplicate."""
    trace = f"tracelab:{shared_dir / 'traces' / 'tracelab-sample' / 'round_trace.jsonl'}"
    common = ("--trace", trace, "--model", "qwen3.5-9b", "--policy", "full-duplicate", "--checkpoint-tokens", "2048")
    runs = {}
    for name, flags in (("grid", ("--checkpoint-placement", "grid")), ("sglang", ()),
                        ("end", ("--checkpoint-placement", "prefix-end", "--dram-checkpoints", "8"))):
        (tmp_path / name).mkdir()
        runs[name] = _run(tmp_path / name, *common, *flags)
    grid, sglang, end = runs["grid"], runs["sglang"], runs["end"]
    assert (sglang["config"]["metadata"]["checkpoint_placement"], sglang["config"]["metadata"]["prefill_chunk_tokens"]) \
        == ("sglang", 8192)
    assert end["config"]["metadata"]["checkpoint_placement"] == "prefix-end"
    assert end["config"]["capacity"]["dram_checkpoints"] == 8
    assert end["results"][0]["requests"] == grid["results"][0]["requests"] == sglang["results"][0]["requests"]
    written = [r["results"][0]["ssd_write_bytes"] for r in (end, sglang, grid)]
    assert 0 < written[0] <= written[1] < written[2], written
    with pytest.raises(SystemExit) as exit_:
        main(["--trace", "synthetic", "--checkpoint-placement", "every-block", "--no-progress"])
    assert exit_.value.code == 2
    assert "--checkpoint-placement" in capsys.readouterr().err
    assert main(["--trace", "synthetic", "--dram-checkpoints", "-1", "--no-progress"]) == 2
    assert "capacity.dram_checkpoints" in capsys.readouterr().err


def test_baselines_lmcache_and_gds_only_run_on_the_same_workload(tmp_path):
    common = ["--trace", "synthetic:3", "--sessions", "6", "--window", "40m", "--dram-tokens", "150k",
              "--policy", "full-duplicate"]
    saria = _run(tmp_path, *common)["results"][0]
    lmc = _run(tmp_path, *common, "--planner", "lmcache", "--transfer", "serial", "--promotion", "zero")["results"][0]
    gds = _run(tmp_path, *common, "--planner", "gds-only", "--promotion", "zero")
    assert gds["config"]["capacity"]["dram_tokens"] == 0
    g = gds["results"][0]
    assert g["dram_only_hit_request_frac"] == 0.0 and g["dram_evictions"] == 0
    assert saria["blocks_hit"] >= lmc["blocks_hit"] * 0.9  # unified planning never loses much to tier-prefix lookup
    assert g["ssd_read_bytes"] > 0


def test_ctrl_c_prints_the_partial_table_and_skips_remaining_policies(tmp_path, capsys, monkeypatch):
    from sglang_saria.replay.core import SariaCore

    real = SariaCore.finish_request
    calls = {"n": 0}

    def interrupting(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 30:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(SariaCore, "finish_request", interrupting)
    out = tmp_path / "r.json"
    rc = main(["--trace", "synthetic:2", "--sessions", "6", "--policy", "none", "--policy", "full-duplicate",
               "--json", str(out), "--no-progress"])
    assert rc == 130
    text = capsys.readouterr().out
    assert "interrupted" in text and "none" in text
    d = json.loads(out.read_text())
    assert d["config"]["interrupted"] and len(d["results"]) == 1 and d["results"][0]["requests"] == 29
