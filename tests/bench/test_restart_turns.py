"""The restart-turns bench's pieces without a server: cold-output comparison, backend flags,
the tables (its servers run in tests/e2e/test_reload_admission.py); docs/reload-admission.md's
tables recomputed from the records the bench wrote (docs/data/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_saria.bench.restart_turns import (
    RestartRun,
    RestartTurn,
    backend_args,
    markdown,
    matches_cold,
    stress_markdown,
    stress_ratio,
    table,
    trace_diff,
)


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


def _record(latencies: list[float], cold: list[float], gave_up: float = 0.0) -> dict:
    turns = [{"session": f"agent-{i}", "prompt": 1012, "storage": 480, "computed": 228, "latency_s": t}
             for i, t in enumerate(latencies)]
    metrics = {"sglang:saria_reload_fallbacks_total/read_slower": gave_up} if gave_up else {}
    return {"turns": turns, "cold_latency_s": cold, "metrics": metrics}


def test_stress_table_is_the_slowest_turn_over_the_cold_servers_per_run_then_the_median():
    records = [_record([0.5, 2.0], [1.0, 0.8]), _record([3.0, 1.0], [1.0, 1.0], gave_up=3), _record([1.2], [1.0])]
    assert [stress_ratio(r) for r in records] == [2.0, 3.0, 1.2]
    rows = stress_markdown(records).splitlines()
    assert rows[2] == "| 1 | 2.00 | 1.00 | 2.00x | 0 | 960 | 456 |"
    assert rows[3].split("|")[5].strip() == "3"
    assert rows[-1] == "| median | | | 2.00x | | | |"


def test_doc_table_sums_each_backend_per_session_count():
    def run(backend: str, storages: list[int]) -> dict:
        turns = [{"session": f"agent-{c}", "storage": s, "computed": 1012 - s} for c, s in zip("ab", storages)]
        return {"backend": backend, "sessions": len(storages), "turns": turns,
                "metrics": {"sglang:saria_reload_tokens_wasted_total": 0.0} if backend == "saria" else {}}

    rows = markdown([run("saria", [784, 480]), run("file", [784, 0])]).splitlines()
    assert rows[2] == "| 2 | agent-a | 784 | 784 | 228 | 228 | 0 |"
    assert rows[3] == "| 2 | agent-b | 480 | 0 | 532 | 1012 | 0 |"
    assert rows[4] == "| 2 | sum | 1264 | 784 | 760 | 1240 | |"


DOCS = Path(__file__).resolve().parents[2] / "docs"


def _block(marker: str) -> str:
    text = (DOCS / "reload-admission.md").read_text()
    return text.split(f"<!-- {marker}:table -->\n", 1)[1].split(f"<!-- /{marker} -->", 1)[0].strip()


@pytest.mark.parametrize("marker, data, render", [
    ("restart-turns", "restart-turns.json", markdown),
    ("reload-stress", "reload-stress.json", stress_markdown),
])
def test_doc_tables_are_rendered_from_the_committed_records(marker, data, render):
    """docs/reload-admission.md's tables, recomputed from the raw records the script wrote."""
    records = json.loads((DOCS / "data" / data).read_text())["runs"]
    assert _block(marker) == render(records)


def test_committed_stress_records_are_five_runs_of_eight_sessions_each_served():
    data = json.loads((DOCS / "data" / "reload-stress.json").read_text())
    assert data["setting"]["sessions"] == 8 and len(data["runs"]) >= 5
    for record in data["runs"]:
        assert len(record["turns"]) == len(record["cold_latency_s"]) == 8
        assert record["metrics"].get("sglang:saria_reload_tokens_wasted_total", 0.0) == 0.0
