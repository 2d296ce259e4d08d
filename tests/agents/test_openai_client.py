"""The `openai` SDK against a saria server (issue 14): a coding agent's multi-turn chat with
tools reports cached prompt tokens from turn 2 on (SGLang's own cache report, by tier),
streaming and the text endpoints work, and a restart between turns keeps the SSD hits.

Bad input gets a clear error and the server keeps serving: text that is not valid UTF-8,
a prompt longer than the context, an unknown model name (patch 007), and the store's
directory removed while serving (the store goes offline, logged and counted; requests
recompute their prefixes).

One scenario per module (two server starts): the fixture drives it, the tests check it.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from openai import OpenAI

from sglang_saria.agents.report import CACHE_DETAILS, CacheReport
from sglang_saria.agents.sessions import TOOLS, agent_sessions
from sglang_saria.launcher import SGLangServer, assert_kv_audit_clean, saria_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # server starts: minutes on a busy 2-core machine

PAGE = 16
TOO_LONG = "x" * 9000  # 9000 tokens with the byte-level tokenizer; the context is 8192
BAD_INPUTS = {
    # case: (path, raw JSON body, expected status, words the error message must contain)
    "invalid-utf8-bytes": ("/v1/chat/completions", b'{"model": "default", "messages": [{"role": "user", "content": "ab\xff\xfe"}]}', 400, "not valid UTF-8"),
    "lone-surrogate": ("/v1/completions", b'{"model": "default", "prompt": "ab\\ud800cd"}', 400, "surrogate"),
    "longer-than-context": ("/v1/chat/completions", json.dumps({"model": "default", "messages": [{"role": "user", "content": TOO_LONG}]}).encode(), 400, "context length"),
    "longer-than-pool-ids": ("/generate", json.dumps({"input_ids": [7] * 3000}).encode(), 400, "exceeds the maximum allowed length"),
    # each of these stopped the whole server (scheduler crash) or was accepted (patch 010)
    "token-id-negative": ("/generate", json.dumps({"input_ids": [5, -1, 7]}).encode(), 400, "token id -1, outside the model's vocabulary [0, 1024)"),
    "token-id-past-vocab": ("/generate", json.dumps({"input_ids": [5, 5000, 7]}).encode(), 400, "token id 5000, outside"),
    "prompt-ids-past-vocab": ("/v1/completions", json.dumps({"model": "default", "prompt": [5, 9999, 7]}).encode(), 400, "token id 9999, outside"),
    "logprob-start-below-minus-one": ("/generate", json.dumps({"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": -5}).encode(), 400, "logprob_start_len=-5: must be >= -1"),
    "negative-top-logprobs": ("/v1/chat/completions", json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": -1}).encode(), 400, "top_logprobs_num=-1: must be >= 0"),
    "negative-n": ("/v1/chat/completions", json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}], "n": -1}).encode(), 400, "n=-1: must be >= 1"),
    # a chat body that is not a JSON object was a 500 with a traceback (patch 011)
    "null-body": ("/v1/chat/completions", b"null", 400, "must be a JSON object"),
    "array-body": ("/v1/chat/completions", b"[1, 2]", 400, "must be a JSON object"),
    "unknown-model": ("/v1/chat/completions", json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}).encode(), 404, "`gpt-9` does not exist"),
}


def post_raw(server: SGLangServer, path: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(f"{server.url}{path}", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def chat(client: OpenAI, messages: list[dict], stream: bool = False) -> tuple[str, CacheReport]:
    """One greedy turn with tools; the reply text and SGLang's cache report."""
    kwargs = dict(model="default", messages=messages, tools=TOOLS, max_tokens=6, temperature=0, extra_body=CACHE_DETAILS)
    if not stream:
        response = client.chat.completions.create(**kwargs)
        return response.choices[0].message.content or "", CacheReport.from_response(response)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, CacheReport.from_stream(chunks)


@dataclass
class Scenario:
    turns: list[CacheReport] = field(default_factory=list)  # the agent's turns before the restart
    streamed: tuple[str, CacheReport] | None = None
    text_endpoints: dict[str, dict] = field(default_factory=dict)
    bad: dict[str, tuple[int, str]] = field(default_factory=dict)
    after_bad: CacheReport | None = None  # a chat right after all the bad requests
    after_restart: CacheReport | None = None  # the agent's next turn on a restarted server
    after_removal: list[CacheReport] = field(default_factory=list)  # turns once the store dir is gone
    metrics_before_removal: dict[str, float] = field(default_factory=dict)
    metrics_after_removal: str = ""


def wait_offline(server: SGLangServer, timeout_s: float = 15.0) -> str:
    """The store checks its data dirs about once a second."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = server.metrics()
        if saria_metrics(text).get("sglang:saria_store_online") == 0:
            return text
        time.sleep(0.5)
    raise AssertionError(f"the store did not go offline within {timeout_s} s of its directory's removal")


@pytest.fixture(scope="module")
def scenario(start_chat_server, tmp_path_factory) -> Scenario:
    store = tmp_path_factory.mktemp("saria-store")
    agent, other = agent_sessions(2, tool_chars=120)
    run = Scenario()
    with start_chat_server(store) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        for _ in range(3):
            reply, report = chat(client, agent.messages)
            run.turns.append(report)
            agent.add_turn(reply)
        run.streamed = chat(client, other.messages, stream=True)
        completion = client.completions.create(model="default", prompt="def parse(text):", max_tokens=4, temperature=0)
        run.text_endpoints["completions"] = completion.model_dump()
        run.text_endpoints["generate-text"] = server.post("/generate", {"text": "def parse(text):", "sampling_params": {"max_new_tokens": 4}})
        run.text_endpoints["generate-ids"] = server.generate(list(range(1, 301)))
        run.bad = {case: post_raw(server, path, body) for case, (path, body, _, _) in BAD_INPUTS.items()}
        run.after_bad = chat(client, other.messages)[1]
        server.wait_storage_writes()  # the restart finds the last write-through in the store
    with start_chat_server(store) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        reply, run.after_restart = chat(client, agent.messages)
        agent.add_turn(reply)
        server.wait_storage_writes()  # nothing writes into the store while it is removed
        run.metrics_before_removal = saria_metrics(server.metrics())
        shutil.rmtree(store)
        run.metrics_after_removal = wait_offline(server)
        reply, report = chat(client, agent.messages)
        run.after_removal.append(report)
        agent.add_turn(reply)
        run.after_removal.append(chat(client, agent.messages)[1])
        run.metrics_after_removal = server.metrics()
    return run


def test_multi_turn_chat_reports_cached_tokens_from_turn_2_on(scenario):
    first, *later = scenario.turns
    assert first.cached_tokens == 0 and first.prompt_tokens > 300
    previous = first
    for turn, report in enumerate(later, start=2):
        # The whole previous prompt (whole pages of it) comes back from the cache.
        assert report.cached_tokens >= previous.prompt_tokens // PAGE * PAGE, f"turn {turn}: {report}"
        assert sum(report.tiers.values()) == report.cached_tokens, f"turn {turn}: tiers {report.tiers}"
        previous = report


def test_streaming_chat_reports_usage_and_cached_tiers(scenario):
    text, report = scenario.streamed
    # The second session shares the system prompt and tools (~290 tokens) with the first.
    assert report.prompt_tokens > 300 and report.cached_tokens >= 256
    assert sum(report.tiers.values()) == report.cached_tokens


def test_completions_and_generate_take_text_and_token_ids(scenario):
    completion = scenario.text_endpoints["completions"]
    assert completion["usage"]["prompt_tokens"] == len("def parse(text):")
    assert completion["usage"]["completion_tokens"] >= 1
    assert scenario.text_endpoints["generate-text"]["meta_info"]["prompt_tokens"] == len("def parse(text):")
    assert len(scenario.text_endpoints["generate-ids"]["output_ids"]) >= 1


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_a_clear_error(scenario, case):
    _, _, status, words = BAD_INPUTS[case]
    got_status, body = scenario.bad[case]
    assert got_status == status, body
    assert words in body


def test_server_keeps_serving_after_bad_input(scenario):
    assert scenario.after_bad.prompt_tokens > 300 and scenario.after_bad.cached_tokens > 0


def test_restart_between_turns_keeps_the_ssd_hits(scenario):
    before, after = scenario.turns[-1], scenario.after_restart
    assert after.device == 0 and after.host == 0
    # Full duplicate wrote the previous turn through; after the restart it comes from SSD.
    assert after.storage >= before.prompt_tokens // PAGE * PAGE - PAGE, after
    # Read straight into the device pool by saria's direct reload.
    assert scenario.metrics_before_removal["sglang:saria_reload_tokens_total/ssd"] >= after.storage
    # Byte for byte the pages the first server wrote (the audit log beside the store).
    assert_kv_audit_clean(scenario.metrics_before_removal, ("ssd_to_device",))


def test_store_directory_removed_while_serving_is_logged_counted_and_requests_recompute(scenario):
    metrics = saria_metrics(scenario.metrics_after_removal)
    assert metrics["sglang:saria_store_online"] == 0
    ops = [line for line in scenario.metrics_after_removal.splitlines() if line.startswith("sglang:saria_store_ops_total{")]
    assert any('op="offline"' in line and 'result="data_dir_removed"' in line for line in ops), ops
    assert any('op="put"' in line and 'result="offline"' in line and not line.endswith(" 0.0") for line in ops), ops
    for report in scenario.after_removal:  # served, without storage hits
        assert report.prompt_tokens > 0 and report.storage == 0
