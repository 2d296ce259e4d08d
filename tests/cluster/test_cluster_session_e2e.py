"""`python -m sglang_saria.cluster --workers 3 --policy session` on CPU: 6 agent sessions through the
launcher's session router, then a worker SIGKILLed.

Each session sends its saria session id (``"saria": {"session": ...}``, what agents send saria); the
router answers with the worker that served it (``x-saria-worker``). Checked: 3 turns per session on
one worker each, its cached tokens growing every turn; the sessions spread 2/2/2; right after the
SIGKILL of a worker every session's next turn succeeds, the dead worker's two sessions on two
different workers and the others where they were; once the launcher has restarted it, its two
sessions are back on it.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from openai import OpenAI

from sglang_saria.agents.report import CacheReport
from sglang_saria.agents.sessions import TOOLS, AgentSession
from sglang_saria.cluster.session_router import WORKER_HEADER
from sglang_saria.launcher import free_port
from tests.cluster.test_cluster_e2e import start_cli, wait_line
from tests.conftest import CHAT_POOLS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]

PAGE = 16
SESSIONS = 6


def turn(client: OpenAI, session: AgentSession) -> tuple[str, CacheReport | None, str]:
    """(worker, cache report, error) of one chat turn; no client retries: the router's own."""
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="default", messages=session.messages, tools=TOOLS, max_tokens=4, temperature=0,
            extra_body={"saria": {"session": session.name}})
    except Exception as err:  # the failure itself is the result under test
        return "", None, repr(err)[:300]
    response = raw.parse()
    session.add_turn(response.choices[0].message.content or "")
    return raw.headers.get(WORKER_HEADER, ""), CacheReport.from_response(response), ""


def kill_worker(url: str) -> None:
    """SIGKILL the process group of the SGLang server listening on ``url``'s port (a crash)."""
    port = f"--port {url.rsplit(':', 1)[1]}"
    servers = [p for p in psutil.process_iter(["cmdline"])
               if "sglang.launch_server" in " ".join(p.info["cmdline"] or []) and port in " ".join(p.info["cmdline"])]
    assert servers, f"no SGLang server on {url}"
    os.killpg(os.getpgid(servers[0].pid), signal.SIGKILL)


def test_six_sessions_on_three_workers_stay_spread_and_survive_a_sigkill(tiny_model: Path, tmp_path: Path):
    port = free_port()
    process, lines = start_cli(
        # wear moves off: they follow each worker's written bytes, which depend on when its writes land, so
        # which session one moves is timing; their rule is tested in tests/test_session_affinity.py
        "--workers", "3", "--policy", "session", "--session-wear-moves", "0",
        "--model-path", str(tiny_model), "--cpu", "--port", str(port),
        "--store-root", str(tmp_path / "stores"), "--log-dir", str(tmp_path), "--capacity", "64MiB",
        "--admission", "full-duplicate", "--", *CHAT_POOLS)
    try:
        line = wait_line(lines, "router: ", timeout_s=900)
        workers = line.split("(workers: ")[1].rstrip(")\n").split()
        assert line.split()[1] == f"http://127.0.0.1:{port}" and len(workers) == 3
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        sessions = [AgentSession(f"agent-{k}", f"Task {k + 1}: fix the failing test.", tool_chars=120)
                    for k in range(SESSIONS)]
        served: dict[str, list[str]] = {s.name: [] for s in sessions}
        reports: dict[str, list[CacheReport]] = {s.name: [] for s in sessions}
        for _ in range(3):
            for s in sessions:
                worker, report, error = turn(client, s)
                assert not error, f"{s.name}: {error}"
                served[s.name].append(worker)
                reports[s.name].append(report)
        for name, where in served.items():  # one worker per session, its cache growing every turn
            assert len(set(where)) == 1 and where[0] in workers, f"{name} was served by {where}"
            r = reports[name]
            for before, after in zip(r, r[1:]):
                assert after.cached_tokens >= before.prompt_tokens // PAGE * PAGE - PAGE, f"{name}: {r}"
                assert after.cached_tokens > before.cached_tokens, f"{name}: {r}"
        owner = {name: where[0] for name, where in served.items()}
        assert sorted(Counter(owner.values()).values()) == [2, 2, 2], owner

        victim = workers[0]
        kill_worker(victim)
        with ThreadPoolExecutor(SESSIONS) as pool:  # every session's next turn, at once, right after
            after = dict(zip((s.name for s in sessions), pool.map(lambda s: turn(client, s), sessions)))
        assert {name: error for name, (_, _, error) in after.items() if error} == {}
        orphans = [name for name, w in owner.items() if w == victim]
        assert len({after[name][0] for name in orphans}) == 2, {name: after[name][0] for name in orphans}
        assert victim not in {w for w, _, _ in after.values()}
        assert all(after[name][0] == owner[name] for name in owner if name not in orphans)

        wait_line(lines, "worker 0 is back", timeout_s=600)  # the launcher restarted it on its store
        time.sleep(3)  # the router's probe (every second) sees it answer
        back = {s.name: turn(client, s) for s in sessions}
        assert {name: error for name, (_, _, error) in back.items() if error} == {}
        assert {name: w for name, (w, _, _) in back.items()} == owner  # the bound allows: they come back
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:  # the launcher stops its router and workers on SIGTERM
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except Exception:
                process.kill()
