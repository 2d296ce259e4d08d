"""`saria-bench-tree` (`sglang_saria.bench.tree`) drives SGLang's Python and Rust TreeCores through the same agent
workload; its timings mean something only if both trees stay consistent. The bench checks
that every KV slot is free, locked or evictable at the end (a double free, as an insert
without `prev_prefix_len` makes, breaks it); this runs that check on a small workload."""

from __future__ import annotations

import pytest

from sglang_saria.bench import tree as bench_tree


@pytest.mark.parametrize("page_size", [16, 1])
@pytest.mark.parametrize("core", bench_tree.CORES)
def test_both_cores_run_the_workload_without_losing_a_slot(core: str, page_size: int) -> None:
    workload = bench_tree.make_workload(sessions=12, turns=2, system_tokens=64, page_size=page_size, seed=0)
    timings = bench_tree.run(core, workload, running=4, evict_chunk=256)
    assert timings.calls["match"] == timings.calls["insert"] == len(workload.requests) == 24
    assert timings.calls["evict"] > 0  # 8 of 12 sessions' paths were unlocked and evictable


def test_step_floor_counts_weights_and_running_kv() -> None:
    step = bench_tree.StepModel(running=2, output_tokens=10, context_tokens=1000.0, kv_bytes_per_token=100,
                                weights_bytes=800_000.0, hbm_bytes_per_s=1e6)
    assert step.floor_s == pytest.approx((800_000 + 2 * 1000 * 100) / 1e6)
    per_call = bench_tree.Timings(seconds={"match": 1.0, "insert": 2.0, "evict": 0.0},
                                  calls={"match": 1, "insert": 1, "evict": 0})
    assert step.turnover(per_call) == pytest.approx(2 / 10 * (1.0 + 2 * 2.0))
