"""The `openai` SDK against a saria server (issue 14): a coding agent's multi-turn chat with
tools reports cached prompt tokens from turn 2 on (SGLang's own cache report, by tier),
streaming and the text endpoints work, and a restart between turns keeps the SSD hits.

The store has two data dirs (issue 30 item 6, the paper's two SSDs): every page is striped
over both (bytes written to each, page data in both slab files), and the restarted server's
SSD hits read from both.

Bad input gets a clear error and the server keeps serving: text that is not valid UTF-8,
a prompt longer than the context, an unknown model name (`plugin/fixes.py`), and one of the store's
data dirs removed while serving (the store goes offline, logged with that dir and counted;
requests recompute their prefixes).

One scenario per module (two server starts): the fixture drives it, the tests check it.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

from sglang_saria.agents.report import CACHE_DETAILS, CacheReport
from sglang_saria.agents.sessions import TOOLS, agent_sessions
from sglang_saria.launcher import SGLangServer, assert_kv_audit_clean, saria_metrics
from sglang_saria.storage.layout import SLAB_NAME
from tests.faults.serving import sample

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # server starts: minutes on a busy 2-core machine

PAGE = 16
RANK = "rank_tp0of1"  # each data dir's directory for the one TP rank
# fp32 KV: a page of this tiny model is 8 KiB, one 4 KiB stripe unit on each of two data dirs
# (a bf16 page, 4 KiB, cannot be cut below the 4 KiB alignment and would sit on the first dir).
STRIPED = ("--dtype", "float32")
TOO_LONG = "x" * 9000  # 9000 tokens with the byte-level tokenizer; the context is 8192
BAD_INPUTS = {
    # case: (path, raw JSON body, expected status, words the error message must contain)
    "invalid-utf8-bytes": ("/v1/chat/completions", b'{"model": "default", "messages": [{"role": "user", "content": "ab\xff\xfe"}]}', 400, "not valid UTF-8"),
    "lone-surrogate": ("/v1/completions", b'{"model": "default", "prompt": "ab\\ud800cd"}', 400, "surrogate"),
    "longer-than-context": ("/v1/chat/completions", json.dumps({"model": "default", "messages": [{"role": "user", "content": TOO_LONG}]}).encode(), 400, "context length"),
    "longer-than-pool-ids": ("/generate", json.dumps({"input_ids": [7] * 3000}).encode(), 400, "exceeds the maximum allowed length"),
    # each of these stopped the whole server (scheduler crash) or was accepted (`plugin/fixes.py`)
    "token-id-negative": ("/generate", json.dumps({"input_ids": [5, -1, 7]}).encode(), 400, "token id -1, outside the model's vocabulary [0, 1024)"),
    "token-id-past-vocab": ("/generate", json.dumps({"input_ids": [5, 5000, 7]}).encode(), 400, "token id 5000, outside"),
    "prompt-ids-past-vocab": ("/v1/completions", json.dumps({"model": "default", "prompt": [5, 9999, 7]}).encode(), 400, "token id 9999, outside"),
    "logprob-start-below-minus-one": ("/generate", json.dumps({"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": -5}).encode(), 400, "logprob_start_len=-5: must be >= -1"),
    "negative-top-logprobs": ("/v1/chat/completions", json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": -1}).encode(), 400, "top_logprobs_num=-1: must be >= 0"),
    "negative-n": ("/v1/chat/completions", json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}], "n": -1}).encode(), 400, "n=-1: must be >= 1"),
    # a chat body that is not a JSON object was a 500 with a traceback (`plugin/requests.py`)
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


def per_dir(metrics_text: str, name: str, dirs: list[Path]) -> list[float]:
    """``name``'s samples for each data dir (the store labels its per-drive counters by dir)."""
    return [sample(metrics_text, name, device=str(d / RANK)) for d in dirs]


def data_bytes(data_dir: Path) -> int:
    """Non-zero bytes in the data dir's slab file (preallocated as zeros; KV pages are not)."""
    return int(np.count_nonzero(np.fromfile(data_dir / RANK / SLAB_NAME, dtype=np.uint8)))


@dataclass
class Scenario:
    dirs: list[Path]  # the store's two data dirs
    turns: list[CacheReport] = field(default_factory=list)  # the agent's turns before the restart
    streamed: tuple[str, CacheReport] | None = None
    text_endpoints: dict[str, dict] = field(default_factory=dict)
    bad: dict[str, tuple[int, str]] = field(default_factory=dict)
    after_bad: CacheReport | None = None  # a chat right after all the bad requests
    after_restart: CacheReport | None = None  # the agent's next turn on a restarted server
    after_removal: list[CacheReport] = field(default_factory=list)  # turns once a data dir is gone
    first_server_metrics: str = ""  # the first server's /metrics once its writes were stored
    data_bytes: list[int] = field(default_factory=list)  # per data dir, after the first server
    metrics_before_removal: dict[str, float] = field(default_factory=dict)
    restarted_metrics: str = ""  # the restarted server's /metrics after its SSD hits
    metrics_after_removal: str = ""
    log_after_removal: str = ""


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
    dirs = [tmp_path_factory.mktemp(f"saria-ssd{j}") for j in range(2)]
    agent, other = agent_sessions(2, tool_chars=120)
    run = Scenario(dirs)
    with start_chat_server(dirs, args=STRIPED) as server:
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
        run.first_server_metrics = server.metrics()
    run.data_bytes = [data_bytes(d) for d in dirs]
    with start_chat_server(dirs, args=STRIPED) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        reply, run.after_restart = chat(client, agent.messages)
        agent.add_turn(reply)
        server.wait_storage_writes()  # nothing writes into the store while it is removed
        run.restarted_metrics = server.metrics()
        run.metrics_before_removal = saria_metrics(run.restarted_metrics)
        shutil.rmtree(dirs[1])
        run.metrics_after_removal = wait_offline(server)
        reply, report = chat(client, agent.messages)
        run.after_removal.append(report)
        agent.add_turn(reply)
        run.after_removal.append(chat(client, agent.messages)[1])
        run.metrics_after_removal = server.metrics()
        run.log_after_removal = server.log_path.read_text(errors="replace")
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


def test_pages_are_striped_over_both_data_dirs(scenario):
    written = per_dir(scenario.first_server_metrics, "sglang:saria_ssd_bytes_written_total", scenario.dirs)
    # Each page slot is cut into one stripe unit per dir: the two dirs took the same bytes.
    assert written[0] > 0 and written[0] == written[1], written
    assert all(scenario.data_bytes), f"non-zero bytes per slab file: {scenario.data_bytes}"


def test_restart_reads_the_stored_pages_from_both_data_dirs(scenario):
    read = per_dir(scenario.restarted_metrics, "sglang:saria_ssd_bytes_read_total", scenario.dirs)
    assert scenario.after_restart.storage > 0
    assert read[0] > 0 and read[0] == read[1], read


def test_store_directory_removed_while_serving_is_logged_counted_and_requests_recompute(scenario):
    metrics = saria_metrics(scenario.metrics_after_removal)
    assert metrics["sglang:saria_store_online"] == 0
    # The second of two data dirs (the index lives in the first): the store names the one gone.
    assert f"data dir {scenario.dirs[1] / RANK} was removed while serving" in scenario.log_after_removal
    ops = [line for line in scenario.metrics_after_removal.splitlines() if line.startswith("sglang:saria_store_ops_total{")]
    assert any('op="offline"' in line and 'result="data_dir_removed"' in line for line in ops), ops
    assert any('op="put"' in line and 'result="offline"' in line and not line.endswith(" 0.0") for line in ops), ops
    for report in scenario.after_removal:  # served, without storage hits
        assert report.prompt_tokens > 0 and report.storage == 0
