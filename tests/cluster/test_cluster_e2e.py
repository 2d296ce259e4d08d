"""Two saria workers behind sglang-router on CPU (issue 28 item 2): real processes, one
cluster per module (started once), agents chatting through the router with the openai SDK.

Scenario: 4 agents take turn 1 at once (cache_aware spreads new prefixes by load), then
turns one at a time (each request attributed to the worker whose /metrics count it). A
prompt longer than the context gets the worker's 400 through the router and costs no
affinity. The worker holding the most sessions is SIGKILLed; right after, all 4 agents'
next turns succeed (the dead worker's sessions recomputed on the other). The killed
worker restarts on its store and the router takes it back; then the other worker is
SIGKILLed too, and the sessions of the restarted worker come back to it with storage hits.
The KV audit checks every page that moved, on both workers.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from openai import OpenAI

from sglang_saria.agents.report import CacheReport
from sglang_saria.agents.sessions import TOOLS, AgentSession
from sglang_saria.cluster import Cluster, ClusterConfig
from sglang_saria.cluster.router import router_installed
from sglang_saria.launcher import AUDIT_ENV, assert_kv_audit_clean, free_port, port_in_use, saria_metrics
from tests.cluster.model_list_server import model_list_server
from tests.conftest import CHAT_POOLS

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not router_installed(), reason="sglang-router is not installed (pip install .[cluster])"),
]

PAGE = 16
AGENTS = "abcd"
WALL_S: dict[str, float] = {}  # printed at the module's end (the test time budget)
TOO_LONG = "x" * 9000  # 9000 tokens with the byte-level tokenizer; the context is 8192


def make_agents() -> list[AgentSession]:
    """Agents whose first prompts share less than cache_aware's 30% threshold, so turn 1
    is placed by load (a shared system prompt would put every session on one worker)."""
    return [
        AgentSession(f"agent-{x}", f"Task {i + 1}: fix the failing test.", tool_chars=120, messages=[
            {"role": "system", "content": f"Repository {x * 24}: you are its coding agent."},
            {"role": "user", "content": f"Task {i + 1}: fix the failing test."},
        ])
        for i, x in enumerate(AGENTS)
    ]


def worker_counter(url: str, name: str, label: str = "") -> float:
    """Sum of a counter's samples on a worker's /metrics (those whose labels contain ``label``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and label in line)


@dataclass
class Turn:
    agent: str
    report: CacheReport | None  # None: the request failed
    error: str = ""
    worker: int | None = None  # which worker's /metrics counted it (sequential turns only)


@dataclass
class Scenario:
    first: list[Turn] = field(default_factory=list)  # turn 1, all agents at once
    sequential: list[Turn] = field(default_factory=list)  # turns 2-3, one at a time
    too_long: tuple[int, str] = (0, "")
    after_bad: list[Turn] = field(default_factory=list)  # turn 4, one at a time
    victim: int = -1
    owner: dict[str, int] = field(default_factory=dict)  # agent -> worker before the kill
    after_kill: list[Turn] = field(default_factory=list)  # turn 5, all at once, right after the kill
    router_workers_after_restart: dict[str, bool] = field(default_factory=dict)
    survivor_metrics: dict[str, float] = field(default_factory=dict)
    comeback: list[Turn] = field(default_factory=list)  # turn 6 on the restarted worker, one at a time
    prompt_before_kill: dict[str, int] = field(default_factory=dict)
    victim_ssd_tokens: float = 0.0  # sglang:saria_reload_tokens_total{source="ssd"} on it during turn 6
    victim_metrics: dict[str, float] = field(default_factory=dict)


class Agents:
    """The agents' chat turns through the router (no client-side retries: the router's own)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.client = OpenAI(base_url=f"{cluster.url}/v1", api_key="none", max_retries=0, timeout=300)
        self.sessions = make_agents()

    def turn(self, session: AgentSession) -> Turn:
        try:
            response = self.client.chat.completions.create(
                model="default", messages=session.messages, tools=TOOLS, max_tokens=6, temperature=0)
        except Exception as err:  # the failure itself is the result under test
            return Turn(session.name, None, repr(err)[:300])
        session.add_turn(response.choices[0].message.content or "")
        return Turn(session.name, CacheReport.from_response(response))

    def all_at_once(self) -> list[Turn]:
        with ThreadPoolExecutor(len(self.sessions)) as pool:
            return list(pool.map(self.turn, self.sessions))

    def one_at_a_time(self, live: list[int]) -> list[Turn]:
        """Each agent's turn, attributed to the live worker whose prefill counter moved by it."""
        turns = []
        for session in self.sessions:
            before = [self.prefill_tokens(i) for i in live]
            turn = self.turn(session)
            turn.worker = self.served_by(live, before, turn.report.prompt_tokens) if turn.report else None
            turns.append(turn)
        return turns

    def prefill_tokens(self, index: int) -> float:
        """Prompt tokens the worker's scheduler prefilled, computed or cached (its /metrics)."""
        return worker_counter(self.cluster.worker_urls[index], "sglang:realtime_tokens_total", 'mode="prefill_')

    def served_by(self, live: list[int], before: list[float], prompt_tokens: int, timeout_s: float = 10.0) -> int | None:
        """The worker whose count grew by the prompt (the router's health checks add 1-token
        prompts on idle workers); None if not exactly one did."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            moved = [i for i, b in zip(live, before) if self.prefill_tokens(i) - b >= prompt_tokens // 2]
            if moved:
                return moved[0] if len(moved) == 1 else None
            time.sleep(0.1)
        return None


def post_status(url: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@pytest.fixture(scope="module")
def cluster(tiny_model: Path, tmp_path_factory) -> Iterator[Cluster]:
    """The module's one cluster: 2 audited saria workers and the router (cache_aware)."""
    root = tmp_path_factory.mktemp("cluster")
    config = ClusterConfig(
        tiny_model, root / "stores", workers=2, args=list(CHAT_POOLS),
        extra_config={"admission": "full-duplicate", "capacity": "64MiB"}, env=dict(AUDIT_ENV), log_dir=root,
    )
    started = time.monotonic()
    with Cluster(config) as running:
        WALL_S["start"] = time.monotonic() - started
        yield running
    WALL_S["total"] = time.monotonic() - started
    print(f"\ncluster e2e wall times (s): {({k: round(v) for k, v in WALL_S.items()})}")


@pytest.fixture(scope="module")
def scenario(cluster: Cluster) -> Scenario:
    """The failover scenario; it leaves one worker killed, so it runs after the CLI tests."""
    run = Scenario()
    agents = Agents(cluster)
    run.first = agents.all_at_once()
    run.sequential = agents.one_at_a_time([0, 1]) + agents.one_at_a_time([0, 1])
    run.too_long = post_status(f"{cluster.url}/v1/chat/completions",
                               {"model": "default", "messages": [{"role": "user", "content": TOO_LONG}]})
    run.after_bad = agents.one_at_a_time([0, 1])
    run.owner = {t.agent: t.worker for t in run.after_bad}
    run.victim = max((0, 1), key=lambda i: list(run.owner.values()).count(i))
    survivor = 1 - run.victim
    run.prompt_before_kill = {t.agent: t.report.prompt_tokens for t in run.after_bad}
    for server in cluster.servers:
        server.wait_storage_writes()  # the restarted worker finds every write-through in its store

    cluster.kill_worker(run.victim)
    run.after_kill = agents.all_at_once()

    restarted = time.monotonic()
    cluster.restart_worker(run.victim)
    WALL_S["restart"] = time.monotonic() - restarted
    run.router_workers_after_restart = cluster.router.workers()
    run.survivor_metrics = saria_metrics(cluster.servers[survivor].metrics())
    cluster.kill_worker(survivor)
    ssd_before = saria_metrics(cluster.servers[run.victim].metrics()).get("sglang:saria_reload_tokens_total/ssd", 0.0)
    run.comeback = agents.one_at_a_time([run.victim])
    run.victim_metrics = saria_metrics(cluster.servers[run.victim].metrics())
    run.victim_ssd_tokens = run.victim_metrics.get("sglang:saria_reload_tokens_total/ssd", 0.0) - ssd_before
    print_turns(run)
    return run


def print_turns(run: Scenario) -> None:
    """One line per turn (shown with a failure): where it ran and what SGLang reported."""
    phases = [("turn 1", run.first), ("turns 2-3", run.sequential), ("turn 4", run.after_bad),
              ("after kill", run.after_kill), ("comeback", run.comeback)]
    print(f"\nvictim: worker {run.victim}; owners before the kill: {run.owner}")
    for phase, turns in phases:
        for t in turns:
            r = t.report
            what = f"prompt {r.prompt_tokens} cached {r.cached_tokens}" if r else t.error
            print(f"{phase:>10} {t.agent} worker {t.worker}: {what}")


def start_cli(*args: str) -> tuple[subprocess.Popen, "queue.Queue[str]"]:
    """`python -m sglang_saria.cluster ARGS` with its output lines arriving on a queue."""
    process = subprocess.Popen([sys.executable, "-m", "sglang_saria.cluster", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    return process, lines


def wait_line(lines: "queue.Queue[str]", prefix: str, timeout_s: float = 180.0) -> str:
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no line starting with {prefix!r} within {timeout_s:.0f} s:\n{''.join(seen)}")


# These run first (file order): the failover scenario below leaves a worker killed.
def test_cli_puts_a_router_in_front_of_running_workers_and_stops_on_sigterm(cluster, tmp_path):
    port = free_port()
    process, lines = start_cli("--worker-urls", *cluster.worker_urls, "--port", str(port), "--log-dir", str(tmp_path))
    try:
        line = wait_line(lines, "router: ")
        assert line.split()[1] == f"http://127.0.0.1:{port}"
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(model="default", max_tokens=2,
                                               messages=[{"role": "user", "content": "Run the tests."}])
        assert reply.usage.prompt_tokens > 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert wait_line(lines, "SIGTERM: stopped", 10).strip() == "SIGTERM: stopped the router and the workers"
        assert not port_in_use(port), "the router still holds its port after the launcher stopped"
    finally:
        if process.poll() is None:
            process.kill()


def test_cli_refuses_a_worker_serving_another_model(cluster):
    with model_list_server("llama-8b") as other:
        process, lines = start_cli("--worker-urls", cluster.worker_urls[0], other)
        assert process.wait(timeout=120) == 2
    error = wait_line(lines, "error: ", 10)
    assert f"{cluster.worker_urls[0]} serves '{cluster.model}'" in error and f"{other} serves 'llama-8b'" in error


def test_turn_one_of_every_agent_is_served(scenario):
    assert [t.error for t in scenario.first] == [""] * len(AGENTS)
    assert all(t.report.prompt_tokens > 200 and t.report.cached_tokens < t.report.prompt_tokens for t in scenario.first)


def test_each_session_stays_on_the_worker_holding_its_prefix(scenario):
    turns = scenario.sequential + scenario.after_bad
    by_agent: dict[str, list[Turn]] = {}
    for t in turns:
        by_agent.setdefault(t.agent, []).append(t)
    for agent, agent_turns in by_agent.items():
        workers = {t.worker for t in agent_turns}
        assert len(workers) == 1 and None not in workers, f"{agent} was served by {workers}"
    # SGLang's cache report through the router: each turn found the previous turn's whole pages.
    for agent, agent_turns in by_agent.items():
        first = next(t for t in scenario.first if t.agent == agent)
        previous = first.report.prompt_tokens
        for t in agent_turns:
            assert t.report.cached_tokens >= previous // PAGE * PAGE, f"{agent}: {t.report} after {previous}"
            previous = t.report.prompt_tokens


def test_a_bad_request_gets_the_workers_400_through_the_router(scenario):
    status, body = scenario.too_long
    assert status == 400 and "context length" in body, body


def test_every_request_right_after_a_sigkill_succeeds_and_is_recomputed_on_the_other(scenario):
    assert [t.error for t in scenario.after_kill] == [""] * len(AGENTS)
    moved = [t for t in scenario.after_kill if scenario.owner[t.agent] == scenario.victim]
    assert moved, f"no session was on the killed worker: {scenario.owner}"
    for t in moved:  # its history was only on the dead worker: most of the prompt is computed
        assert t.report.computed > scenario.prompt_before_kill[t.agent] // 2, t.report


def test_the_restarted_worker_is_back_in_the_router(scenario):
    assert len(scenario.router_workers_after_restart) == 2
    assert all(scenario.router_workers_after_restart.values()), scenario.router_workers_after_restart


def test_its_sessions_get_storage_hits_on_the_restarted_worker(scenario):
    assert [t.error for t in scenario.comeback] == [""] * len(AGENTS)
    assert {t.worker for t in scenario.comeback} == {scenario.victim}
    own = [t for t in scenario.comeback if scenario.owner[t.agent] == scenario.victim]
    assert own, f"no session was on the restarted worker before the kill: {scenario.owner}"
    for t in own:  # its pages up to the kill come from the restarted worker's store
        assert t.report.cached_tokens >= scenario.prompt_before_kill[t.agent] // PAGE * PAGE - PAGE, t.report
    # ... read from its SSD store by saria's reload (its /metrics), all but the prefix every
    # agent shares (chat template and tool schemas), which the first turn there brought back
    shared = min(t.report.cached_tokens for t in scenario.after_kill)
    assert scenario.victim_ssd_tokens >= sum(
        scenario.prompt_before_kill[t.agent] // PAGE * PAGE - PAGE - shared for t in own), scenario.victim_ssd_tokens


def test_nothing_corrupt_on_either_worker(scenario):
    assert_kv_audit_clean(scenario.survivor_metrics, ("device_to_host", "host_to_ssd"))
    # The restarted worker read what it wrote before the SIGKILL, byte for byte.
    assert_kv_audit_clean(scenario.victim_metrics, ("ssd_to_device",))
