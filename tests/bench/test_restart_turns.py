"""The restart-turns bench's pieces without a server: cold-output comparison, backend flags,
the table (its servers run in tests/e2e/test_reload_admission.py)."""

from __future__ import annotations

import json

import pytest

from sglang_saria.bench.restart_turns import RestartRun, RestartTurn, backend_args, matches_cold, table, trace_diff


def test_trace_diff_compares_tokens_and_ranked_top_logprobs():
    cold = [("a", -0.10, [-0.10, -2.0]), ("b", -0.50, [-0.5, -1.0])]
    assert trace_diff(cold, cold) == (True, 0.0)
    near = [("a", -0.105, [-0.105, -2.0]), ("b", -0.50, [-0.5, -1.002])]
    assert matches_cold(near, cold)
    assert trace_diff([("a", -0.1, [-0.1, -2.0]), ("c", -0.5, [-0.5, -1.0])], cold)[0] is False
    assert not matches_cold([("a", -0.2, [-0.2, -2.0]), ("b", -0.5, [-0.5, -1.0])], cold)


def test_backend_flags_name_the_store(tmp_path):
    saria = backend_args("saria", tmp_path)
    assert json.loads(saria[saria.index("--hicache-storage-backend-extra-config") + 1])["data_dirs"] == [str(tmp_path)]
    stock = backend_args("file", tmp_path)
    assert stock[stock.index("--hicache-storage-backend") + 1] == "file"
    with pytest.raises(ValueError, match="'mooncake'"):
        backend_args("mooncake", tmp_path)


def test_table_puts_saria_beside_file_per_session():
    def turn(name: str, storage: int) -> RestartTurn:
        return RestartTurn(name, 800, storage, 800 - storage, 0.3, [], [])

    runs = [RestartRun("saria", 2, [turn("agent-a", 784), turn("agent-b", 480)], {"sglang:saria_reload_tokens_wasted_total": 0.0}),
            RestartRun("file", 2, [turn("agent-a", 784), turn("agent-b", 392)], {})]
    rows = table(runs).splitlines()
    assert rows[1].split()[:5] == ["2", "agent-a", "784", "784", "1.00"]
    assert rows[2].split()[:5] == ["2", "agent-b", "480", "392", "1.22"]  # cached: 480 / 392
