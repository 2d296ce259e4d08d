"""The pieces of `saria-fig10` and `scripts/bench_vs_hicache.py` that need no
server: configuration names and server flags, think-time pacing of SGLang's client,
medians, ratios and tables, and the replay's view of the server's workload."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sglang_saria.bench import fig10, think_serving
from sglang_saria.bench.configs import (
    Pools,
    Prepared,
    RunResult,
    median_result,
    parse_config,
    ratios,
    results_table,
    spread,
)
from sglang_saria.bench.fig10_replay import (
    comparison,
    comparison_table,
    model_spec,
    orderings_table,
    replay_config,
    replay_sessions,
    turn_token_ids,
    ReplayPlan,
)

REPO = Path(__file__).resolve().parents[2]

def _run(name: str, ssd: float, ttft: float, p90: float | None = None, failed: int = 0) -> RunResult:
    return RunResult(name, 10, failed, ssd, 100, 200, 50, ttft, p90 if p90 is not None else 2 * ttft)


def test_config_names_map_to_backends_and_flags(tmp_path):
    pools = Pools(store_tokens=2048)
    dram = parse_config("dram-only").server_args(pools, tmp_path)
    assert "--enable-hierarchical-cache" in dram and "--hicache-storage-backend" not in dram
    stock = parse_config("hicache-file").server_args(pools, tmp_path)
    assert stock[stock.index("--hicache-storage-backend") + 1] == "file"
    saria = parse_config("saria/eviction:E3")
    args = saria.server_args(pools, tmp_path)
    extra = json.loads(args[args.index("--hicache-storage-backend-extra-config") + 1])
    assert extra["admission"] == {"policy": "eviction:E3"} and extra["capacity"] == "2048 tokens"
    assert saria.name == "saria/eviction:E3" and saria.saria


@pytest.mark.parametrize("bad", ["oracle", "none", "eviction:E0", "lru"])
def test_bad_config_names_are_refused_naming_the_flag(bad):
    with pytest.raises(ValueError, match=rf"--configs: '{bad}'"):
        parse_config(bad)


def test_budget_and_loadaware_run_after_e2_and_budget_takes_the_dwpd():
    names = [c.name for c in fig10.build_configs(list(fig10.CONFIGS), 0.25)]
    assert names[:5] == ["dram-only", "hicache-file", "full-duplicate", "eviction:E2", "eviction:E3"]
    assert set(names[5:]) == {"budget:0.25", "loadaware"}


def test_binding_dwpd_is_half_of_e2_writes_over_capacity():
    pools = Pools(store_tokens=1000)
    dwpd, why = fig10.binding_dwpd({"eviction:E2": [_run("eviction:E2", 100_000, 1)]}, pools, kv_bytes_per_token=100)
    assert dwpd == pytest.approx(0.5) and "eviction:E2" in why
    # E2 wrote nothing: full duplicate's writes set it, and the rule says so
    runs = {"eviction:E2": [_run("eviction:E2", 0, 1)], "full-duplicate": [_run("full-duplicate", 400_000, 1)]}
    dwpd, why = fig10.binding_dwpd(runs, pools, kv_bytes_per_token=100)
    assert dwpd == pytest.approx(2.0) and "full-duplicate" in why


def test_cli_errors_name_the_flag(capsys):
    with pytest.raises(SystemExit):
        fig10.parse_args(["--model", str(REPO / "models" / "qwen3-tiny"), "--repeats", "0"])
    assert "--repeats 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fig10.parse_args(["--model", "/nonexistent-model"])
    assert "--model /nonexistent-model" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the replay's prefill rate is measured on dram-only's first server
        fig10.parse_args(["--model", str(REPO / "models" / "qwen3-tiny"), "--configs", "hicache-file", "eviction:E2"])
    assert "needs dram-only" in capsys.readouterr().err
    assert fig10.parse_args(["--model", str(REPO / "models" / "qwen3-tiny"), "--configs", "eviction:E2", "--no-replay"])


def test_only_the_first_dram_only_server_measures_the_prefill_rate():
    args = fig10.parse_args(["--model", str(REPO / "models" / "qwen3-tiny")])
    into: dict = {}
    assert fig10.prefill_probe(parse_config("dram-only"), 0, args, into) is not None
    assert fig10.prefill_probe(parse_config("dram-only"), 1, args, into) is None
    assert fig10.prefill_probe(parse_config("eviction:E2"), 0, args, into) is None
    args.no_replay = True
    assert fig10.prefill_probe(parse_config("dram-only"), 0, args, into) is None


def test_medians_keep_the_worst_failure_count():
    runs = [_run("x", 10, 5, failed=0), _run("x", 30, 1, failed=2), _run("x", 20, 3, failed=0)]
    med = median_result(runs)
    assert (med.ssd_bytes, med.ttft_mean_ms, med.failed) == (20, 3, 2)
    assert spread(runs, "ssd_bytes") == pytest.approx((30 - 10) / 20)


def test_ratios_are_to_the_base_of_the_same_run():
    results = {"hicache-file": _run("hicache-file", 200, 10), "dram-only": _run("dram-only", 0, 20),
               "eviction:E2": _run("eviction:E2", 50, 5)}
    to_stock = ratios(results, "hicache-file")
    assert to_stock["eviction:E2"]["ssd_bytes"] == pytest.approx(0.25)
    assert to_stock["eviction:E2"]["ttft_mean_ms"] == pytest.approx(0.5)
    assert math.isnan(ratios(results, "dram-only")["eviction:E2"]["ssd_bytes"])  # dram-only writes nothing


def test_results_table_has_a_row_per_config_and_ratio_columns_per_base():
    results = {"hicache-file": _run("hicache-file", 200, 10), "dram-only": _run("dram-only", 0, 20),
               "eviction:E2": _run("eviction:E2", 50, 5, failed=1)}
    lines = results_table(results).splitlines()
    assert len(lines) == 2 + 3
    head = lines[0]
    assert "SSD writes / hicache-file" in head and "TTFT mean / dram-only" in head
    e2 = lines[-1].split(" | ")
    assert e2[0] == "| eviction:E2" and "1/10" in e2 and "0.25" in e2 and "0.50" in e2 and "0.25" in e2


def test_round_delay_finds_the_conversation_by_its_first_message():
    think = {"first-a": [0.0, 1.5, 2.5], "first-b": [0.3]}
    history = [{"role": "user", "content": "first-a"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    assert think_serving.round_delay(think, history) == 1.5
    assert think_serving.round_delay(think, history[:1]) == 0.0
    assert think_serving.round_delay(think, [{"role": "user", "content": "first-b"}]) == 0.3
    assert think_serving.round_delay(think, [{"role": "user", "content": "unknown"}]) == 0.0


def test_paced_request_sleeps_before_it_is_sent_not_inside_its_ttft(monkeypatch):
    slept, sent = [], []

    async def fake_sleep(s):
        slept.append(s)

    async def request(inp, pbar=None):
        sent.append((list(slept), inp.prompt))
        return "ok"

    monkeypatch.setattr(think_serving.asyncio, "sleep", fake_sleep)
    run = think_serving.paced(request, {"a": [0.0, 0.7]})
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "r"}, {"role": "user", "content": "b"}]
    assert asyncio.run(run(SimpleNamespace(prompt=history))) == "ok"
    assert sent == [([0.7], history)]


def test_think_flag_is_taken_out_of_the_client_flags(tmp_path):
    path, rest = think_serving.split_argv(["--backend", "x", "--think-times", str(tmp_path / "t.json"), "--seed", "1"])
    assert path == tmp_path / "t.json" and rest == ["--backend", "x", "--seed", "1"]
    with pytest.raises(SystemExit, match="--think-times"):
        think_serving.split_argv(["--backend", "x"])


def _prepared() -> Prepared:
    conversations = [
        [{"messages": [{"role": "user", "content": "a" * 40}]}, {"messages": [{"role": "user", "content": "b" * 30}]}],
        [{"messages": [{"role": "user", "content": "c" * 20}]}],
    ]
    return Prepared(conversations, [[0.0, 1.25], [0.0]], Path("trace.json"), None, [])


def test_replay_sessions_are_the_served_prompts_in_full_pages():
    prepared = _prepared()
    sessions = replay_sessions(prepared, page_size=16, output_len=4)
    first, second = sessions[0].requests
    ids = turn_token_ids(prepared.conversations[0], 0, 1, 4)
    assert second.input_tokens == len(ids) and len(second.block_keys) == len(ids) // 16
    # turn 2 extends turn 1's prompt: its leading full pages are the same blocks
    assert np.array_equal(second.block_keys[: len(first.block_keys)], first.block_keys)
    assert second.idle_before_s == 1.25 and first.idle_before_s == 0.0
    # different conversations never share a block
    assert not set(sessions[1].requests[0].block_keys.tolist()) & set(first.block_keys.tolist())


def test_replay_stands_in_for_each_server_configuration():
    plan = ReplayPlan(Pools(page_size=16, device_tokens=512, hicache_ratio=2, store_tokens=4096), 2000.0, 8)
    assert replay_config("dram-only", plan).admission.policy == "none"
    stock = replay_config("hicache-file", plan)
    assert (stock.admission.policy, stock.promotion.mode) == ("full-duplicate", "full")
    e2 = replay_config("eviction:E2", plan)
    assert (e2.capacity.dram_tokens, e2.capacity.ssd_tokens, e2.metadata.block_tokens) == (1024, 4096, 16)
    assert replay_config("loadaware", plan).admission.auto_prefill_tps == 2000.0


def test_a_hybrid_is_served_and_replayed_on_one_checkpoint_grid():
    pools = Pools(page_size=16, device_tokens=512, store_tokens=4096, hybrid=True)
    flags = pools.flags()
    assert flags[flags.index("--mamba-radix-cache-strategy") + 1] == "extra_buffer"
    assert int(flags[flags.index("--mamba-track-interval") + 1]) == pools.checkpoint_tokens == 64
    plan = ReplayPlan(pools, 2000.0, 8)
    metadata = replay_config("eviction:E2", plan).metadata
    # one state per inserted prefix on the server (extra_buffer): the replay places them so too
    assert (metadata.checkpoint_tokens, metadata.checkpoint_placement) == (64, "prefix-end")
    # its states in a host pool of their own: device slots x --hicache-ratio, plus one (SGLang's sizing)
    assert int(flags[flags.index("--max-mamba-cache-size") + 1]) * 2 + 1 == pools.host_state_slots == 33
    assert replay_config("eviction:E2", plan).capacity.dram_checkpoints == 33
    assert Pools().host_state_slots == 0
    assert Pools().checkpoint_tokens == 0 and "--mamba-track-interval" not in Pools().flags()


def test_the_replay_reads_a_hybrids_gdn_geometry_from_its_config(tmp_path):
    config = {"num_hidden_layers": 8, "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
              + ["full_attention"], "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 1024, "num_attention_heads": 16,
              "linear_num_key_heads": 8, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = model_spec(tmp_path, 16)
    assert (spec.fa_layers, spec.gdn_layers, spec.kv_bytes_per_token) == (2, 6, 2 * 2 * 8 * 256 * 4)
    # per GDN layer: fp32 recurrent state 16 x 128 x 128, conv state (2*8*128 + 16*128) x 3 in the served fp32
    assert spec.checkpoint_bytes == 6 * (16 * 128 * 128 * 4 + 4096 * 3 * 4)
    (tmp_path / "config.json").write_text(json.dumps({**config, "torch_dtype": "int8"}))
    with pytest.raises(ValueError, match="int8"):
        model_spec(tmp_path, 16)


def test_compute_threads_reach_the_server_as_omp_threads():
    assert "OMP_NUM_THREADS" not in Pools().server_env()
    assert Pools(compute_threads=1).server_env()["OMP_NUM_THREADS"] == "1"
    with pytest.raises(ValueError, match="compute_threads=-1"):
        Pools(compute_threads=-1).validate()


def test_comparison_orders_and_ratios_both_sides():
    server = {"dram-only": {"ssd_bytes": 0, "ttft_mean_ms": 100}, "hicache-file": {"ssd_bytes": 100, "ttft_mean_ms": 60},
              "full-duplicate": {"ssd_bytes": 100, "ttft_mean_ms": 50}, "eviction:E2": {"ssd_bytes": 40, "ttft_mean_ms": 70}}
    replay = {"dram-only": {"ssd_bytes": 0, "ttft_mean_ms": 80}, "hicache-file": {"ssd_bytes": 200, "ttft_mean_ms": 45},
              "full-duplicate": {"ssd_bytes": 200, "ttft_mean_ms": 40}, "eviction:E2": {"ssd_bytes": 100, "ttft_mean_ms": 60}}
    cmp = comparison(server, replay)
    assert cmp["ssd_bytes"]["server_vs_fd"]["eviction:E2"] == pytest.approx(0.4)
    assert cmp["ssd_bytes"]["replay_vs_fd"]["eviction:E2"] == pytest.approx(0.5)
    assert cmp["ttft_mean_ms"]["server_vs_dram"]["eviction:E2"] == pytest.approx(0.7)
    assert cmp["order_writes"]["server"][0] == ["eviction:E2"] == cmp["order_writes"]["replay"][0]
    assert cmp["order_writes"]["server"][1] == ["full-duplicate", "hicache-file"]  # a tie is a group
    assert cmp["order_ttft"]["server"] == [["full-duplicate"], ["hicache-file"], ["eviction:E2"], ["dram-only"]]
    assert cmp["disagree_writes"] == [] and cmp["disagree_ttft"] == []
    table = comparison_table(cmp)
    assert "| eviction:E2 | 0.40 | 0.50 | 1.17 | 1.50 | 0.70 | 0.75 |" in table
    assert "| full-duplicate < hicache-file < eviction:E2 < dram-only |" in orderings_table(cmp)


def test_a_disagreement_counts_only_beyond_the_servers_spread():
    server = {"dram-only": {"ssd_bytes": 0, "ttft_mean_ms": 100}, "hicache-file": {"ssd_bytes": 100, "ttft_mean_ms": 60},
              "full-duplicate": {"ssd_bytes": 100, "ttft_mean_ms": 50}, "eviction:E2": {"ssd_bytes": 40, "ttft_mean_ms": 90}}
    replay = {"dram-only": {"ssd_bytes": 0, "ttft_mean_ms": 80}, "hicache-file": {"ssd_bytes": 200, "ttft_mean_ms": 45},
              "full-duplicate": {"ssd_bytes": 200, "ttft_mean_ms": 40}, "eviction:E2": {"ssd_bytes": 100, "ttft_mean_ms": 85}}
    quiet = comparison(server, replay, spreads={"eviction:E2": {"ttft_mean_ms": 0.05}, "dram-only": {"ttft_mean_ms": 0.05}})
    assert quiet["disagree_ttft"] == ["eviction:E2 < dram-only (server gap 0.11 > spread 0.05)"]
    noisy = comparison(server, replay, spreads={"eviction:E2": {"ttft_mean_ms": 0.3}})
    assert noisy["disagree_ttft"] == []


def test_the_replays_ratio_is_placed_in_the_servers_per_round_range():
    """Each round of servers (every configuration once) gives one ratio per configuration; the
    table shows their min-max and whether the replay's ratio lies inside it."""
    def r(ssd, ttft):
        return {"ssd_bytes": ssd, "ttft_mean_ms": ttft}
    runs = {"dram-only": [r(0, 100), r(0, 120)], "hicache-file": [r(100, 50), r(100, 80)],
            "full-duplicate": [r(150, 60), r(130, 72)], "eviction:E2": [r(40, 90), r(60, 96)]}
    server = {n: {"ssd_bytes": sum(x["ssd_bytes"] for x in rs) / 2, "ttft_mean_ms": sum(x["ttft_mean_ms"] for x in rs) / 2}
              for n, rs in runs.items()}
    replay = {"dram-only": r(0, 100), "hicache-file": r(200, 60), "full-duplicate": r(260, 70), "eviction:E2": r(40, 95)}
    cmp = comparison(server, replay, ("hicache-file", "hicache-file"), runs=runs)
    w, t = cmp["ssd_bytes"], cmp["ttft_mean_ms"]
    assert w["server_range_vs_fd"]["full-duplicate"] == pytest.approx([1.3, 1.5])
    assert w["replay_inside_vs_fd"]["full-duplicate"] is True  # 260 / 200 = 1.3, the low end
    assert w["server_range_vs_fd"]["eviction:E2"] == pytest.approx([0.4, 0.6])
    assert w["replay_inside_vs_fd"]["eviction:E2"] is False  # 0.2
    assert w["server_range_vs_dram"]["eviction:E2"] is None and w["replay_inside_vs_dram"]["eviction:E2"] is None
    assert t["server_range_vs_dram"]["eviction:E2"] == pytest.approx([0.8, 0.9])
    assert t["replay_inside_vs_dram"]["eviction:E2"] is False  # 0.95
    table = comparison_table(cmp)
    assert "SSD writes: server / hicache-file (min-max) | replay / hicache-file | replay in server's range" in table
    assert "| eviction:E2 | 0.50 (0.40-0.60) | 0.20 | outside | 1.43 (1.20-1.80) | 1.58 | inside | 0.85 (0.80-0.90) | 0.95 | outside |" in table


def test_stock_file_takes_sglangs_own_cap():
    """`hicache-file` bounded: SGLang's `max_size` in its extra config (HiCacheFile's LRU evictor),
    nothing of saria's."""
    import dataclasses

    stock = dataclasses.replace(parse_config("hicache-file"), file_max_bytes=65536)
    args = stock.server_args(Pools(), Path("/x/store"))
    assert json.loads(args[args.index("--hicache-storage-backend-extra-config") + 1]) == {
        "file_storage_path": "/x/store", "max_size": "65536"}
    assert args[args.index("--hicache-storage-backend") + 1] == "file"
