"""The launcher's session router (``cluster/session_router.py``) over local HTTP workers: session keys,
placement 2/2/2, stickiness, a worker that dies and comes back. The e2e on SGLang workers is
``test_cluster_session_e2e.py``."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter

import pytest

from sglang_saria.cluster.router import RouterSettings
from sglang_saria.cluster.session_router import WORKER_HEADER, SessionRouter, request_prefixes, session_key
from sglang_saria.session_affinity import HeldPrefixes
from sglang_saria.cluster.workers import ClusterError
from tests.cluster.model_list_server import EchoWorker


def post(url: str, body: dict, headers: dict | None = None) -> tuple[str, dict]:
    request = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers[WORKER_HEADER], json.load(response)


def chat(session: str, turn: int) -> dict:
    return {"model": "m", "saria": {"session": session},
            "messages": [{"role": "user", "content": f"{session} turn {t}"} for t in range(turn + 1)]}


def test_the_session_key_is_the_saria_session_then_a_header_then_the_conversation_head():
    body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    assert session_key({**body, "saria": {"session": "a"}}, {"x-smg-routing-key": "k"}) == "saria:a"
    assert session_key(body, {"x-smg-routing-key": "k"}) == "header:k"
    longer = {"messages": body["messages"] + [{"role": "assistant", "content": "r"}, {"role": "user", "content": "v"}]}
    assert session_key(body, {}) == session_key(longer, {}) and session_key(body, {}).startswith("prefix:")
    assert session_key({"text": "x" * 600}, {}) == session_key({"text": "x" * 512 + "y"}, {})
    assert session_key(None, {}) is None and session_key({"model": "m"}, {}) is None


def test_a_requests_prefixes_are_its_messages_so_far_and_a_next_turn_extends_them():
    held = HeldPrefixes(0.5)
    ids, weights = request_prefixes(chat("a", 2))
    assert len(ids) == len(weights) == 3 and len(set(ids)) == 3
    held.record("a", 0, ids)
    assert held.extends("a", *request_prefixes(chat("a", 4))) is True  # 3 of its 5 messages held
    compacted = {**chat("a", 0), "messages": [{"role": "user", "content": "summary " * 50}]}
    assert held.extends("a", *request_prefixes(compacted)) is False  # larger, but nothing its worker was sent
    text = request_prefixes({"text": "x" * 1100})
    assert len(text[0]) == 3 and text[1] == [512.0, 512.0, 76.0]
    assert request_prefixes({"text": "x" * 1100 + "y"})[0][:2] == text[0][:2]
    assert request_prefixes(None) == ([], []) and request_prefixes({"model": "m"}) == ([], [])


@pytest.fixture
def workers():
    ws = [EchoWorker(f"w{i}").start() for i in range(3)]
    yield ws
    for w in ws:
        w.stop()


def test_sessions_spread_2_2_2_stay_and_a_dead_workers_sessions_spread_and_come_back(workers):
    router = SessionRouter([w.url for w in workers], probe_interval_s=0.2).start()
    try:
        first = {f"agent-{k}": post(router.url, chat(f"agent-{k}", 0))[0] for k in range(6)}
        assert sorted(Counter(first.values()).values()) == [2, 2, 2]
        for turn in (1, 2):
            for s, url in first.items():
                served, answer = post(router.url, chat(s, turn))
                assert served == url and answer["body"]["saria"] == {"session": s}  # forwarded as sent
        victim = workers[0]
        orphans = [s for s, url in first.items() if url == victim.url]
        victim.stop()
        after = {s: post(router.url, chat(s, 3))[0] for s in first}  # no request fails
        assert victim.url not in after.values()
        assert len({after[s] for s in orphans}) == 2  # its two sessions on two different workers
        assert all(after[s] == first[s] for s in first if s not in orphans)
        victim.start()
        router.wait_workers({victim.url}, 10)
        back = {s: post(router.url, chat(s, 4))[0] for s in first}
        assert back == first  # the bound allows: they come back
        assert router.core.stats["moved_dead"] == 2 and router.core.stats["returned"] == 2
    finally:
        router.stop()


def test_new_sessions_avoid_the_worker_whose_drive_wrote_most_and_a_restart_keeps_its_count():
    ws = [EchoWorker(f"w{i}", written_bytes=b).start() for i, b in enumerate((1e6, 9e9, 2e6))]
    router = SessionRouter([w.url for w in ws], wear_interval_s=0.2).start()
    try:
        assert router.liveness.wear == [1e6, 9e9, 2e6]
        placed = [post(router.url, chat(f"s{k}", 0))[0] for k in range(2)]
        assert ws[1].url not in placed  # 9e9 is over 1.25 x the mean drive
        ws[1].stop()
        ws[1].written_bytes = 5e5  # the worker restarted: its counter began again
        ws[1].start()
        deadline = time.monotonic() + 10
        while router.liveness.wear[1] != 9e9 + 5e5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert router.liveness.wear[1] == 9e9 + 5e5
    finally:
        router.stop()
        for w in ws:
            w.stop()


def test_a_session_leaves_a_worn_out_drive_when_its_conversation_shrinks(workers):
    """Wear moves in the launcher: body bytes against the session's previous body (``wear_shrink``)."""
    router = SessionRouter([w.url for w in workers], wear_interval_s=0.1).start()
    try:
        first = {f"agent-{k}": post(router.url, chat(f"agent-{k}", 3))[0] for k in range(2)}  # a worker free
        session = "agent-0"
        worn = next(w for w in workers if w.url == first[session])
        worn.written_bytes = 9e9  # above 1.25 x the mean drive
        deadline = time.monotonic() + 10
        while max(router.liveness.wear) != 9e9 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert post(router.url, chat(session, 4))[0] == worn.url  # the conversation grew: it stays
        compacted = {**chat(session, 0), "messages": [{"role": "user", "content": "summary"}]}
        assert post(router.url, compacted)[0] != worn.url  # shorter than 0.9 x its last body: it leaves
        assert router.core.stats["moved_wear"] == 1
    finally:
        router.stop()


def test_a_request_without_a_session_key_goes_to_a_live_worker(workers):
    router = SessionRouter([w.url for w in workers]).start()
    try:
        with urllib.request.urlopen(f"{router.url}/v1/models", timeout=10) as response:
            assert json.load(response)["data"][0]["id"] == "m" and response.headers[WORKER_HEADER] == workers[0].url
    finally:
        router.stop()


def test_session_policy_settings_are_checked():
    with pytest.raises(ClusterError, match="the session policy runs no sglang-router"):
        RouterSettings(policy="session", extra=("--cache-threshold=0.5",))
    with pytest.raises(ClusterError, match="at least one worker"):
        SessionRouter([])
