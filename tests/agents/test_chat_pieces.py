"""The pieces agents' requests go through, without a server: the tiny models' tokenizer and
chat template, the agent sessions, SGLang's cache report, WEKA sessions as chat turns."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from sglang_saria.agents.report import CacheReport
from sglang_saria.agents.sessions import TOOLS, agent_sessions
from sglang_saria.agents.tokenizer import SPECIAL_TOKENS
from sglang_saria.agents.weka_chat import weka_conversations


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def prompt_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_token_ids_are_bytes_and_special_tokens_fit_the_model_vocabulary(tokenizer, tiny_model):
    text = "def f(x):\n    return 'wörld ✓'"
    assert tokenizer.encode(text) == list(text.encode())
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [256, 257, 258]
    assert tokenizer.eos_token == "<|im_end|>" and len(tokenizer) <= 1024  # the models' vocabulary


def test_each_agent_turn_extends_the_previous_prompt_token_by_token(tokenizer):
    session = agent_sessions(1, tool_chars=50)[0]
    before = prompt_ids(tokenizer, session.messages)
    session.add_turn("reading the parser")
    after = prompt_ids(tokenizer, session.messages)
    assert after[: len(before)] == before and len(after) > len(before) + 50
    rendered = tokenizer.decode(after)
    assert '<tool_call>{"name": "read_file"' in rendered and "<|im_start|>tool\n" in rendered


def test_cache_report_reads_usage_and_tiers_and_names_a_missing_report():
    response = {
        "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}},
        "sglext": {"cached_tokens_details": {"device": 16, "host": 32, "storage": 16, "storage_backend": "SariaStorage"}},
    }
    report = CacheReport.from_response(response)
    assert (report.cached_tokens, report.tiers, report.computed) == (64, {"device": 16, "host": 32, "storage": 16}, 36)
    streamed = CacheReport.from_stream([{"sglext": response["sglext"]}, {"usage": response["usage"]}])
    assert streamed == report
    with pytest.raises(ValueError, match="--enable-cache-report"):
        CacheReport.from_response({"usage": {"prompt_tokens": 5}})


def test_weka_turns_keep_the_trace_reuse_and_stay_within_the_budget():
    conversations = weka_conversations(turns=4, sessions=("trace_0002", "trace_0003/sub1"), max_chars=300)
    for conversation in conversations:
        assert 1 < len(conversation) <= 4
        total = sum(len(turn["messages"][0]["content"]) for turn in conversation)
        assert total <= 300 and conversation[-1]["prompt_tokens"] == total
    # trace_0002's second request appends 3 blocks to the first (247 blocks, under 150 chars).
    assert [len(t["messages"][0]["content"]) for t in conversations[0][:2]] == [150, 3]
    with pytest.raises(ValueError, match="trace_9999"):
        weka_conversations(sessions=("trace_9999",))
