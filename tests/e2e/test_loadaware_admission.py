"""`loadaware` admission and agents' hints on a real server (issue 26), pages named in advance.

One server, `loadaware` with no smoothing to speak of (``loadaware_tau_s`` 1 ms, ``loadaware_spend_backlog_s``
0.1 ms: any prefill left waiting behind a batch is load), small pools (device 512 tokens, host
1024), chat sessions of the same shape (a first prompt of ~260 tokens, distinct from the first
page on) sent through the openai SDK, and fillers of 300 tokens that push them out:

1. idle: sessions I and R, then five fillers one at a time (the queue never holds a second
   request): both are evicted from host memory once. I is not written (idle `auto` writes at the
   second eviction); R said ``expect_return_s`` and is written at that first eviction;
2. deep: sessions C and E one at a time, then six fillers in one request (the 512-token device
   pool takes them about one at a time, the rest wait): C and E, evicted once while prefill
   waits, are written;
3. hints: E's second turn says ``end``, C's has no hint: E's stored pages become the store's first
   victims (the index's eviction order: access time, then write order);
4. deep again, six new fillers: C's second turn is written, nothing of E's second turn is.
5. left behind: L's first turn and a second that rewrites its user message, both naming session L,
   then six fillers in one request: L's second turn is written, the pages of its first that the
   second no longer holds are not.

Plus malformed hints get a 400 naming the field (`plugin/requests.py`). Admissions are checked by event and
decision state, the store by its index, the moved KV by the audit; no timing is asserted.
"""

from __future__ import annotations

import importlib
import json
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from openai import OpenAI

from sglang_saria.launcher import AUDIT_ENV, SGLangServer, assert_kv_audit_clean, saria_hicache_args, saria_metrics
from sglang_saria.storage.index import INDEX_NAME

pytestmark = pytest.mark.e2e

PAGE = 16
AUTO = {"policy": "loadaware", "loadaware_spend_backlog_s": 1e-4, "loadaware_tau_s": 1e-3}
FILLERS = {
    phase: [[(k * 97 + j * step) % 250 + 1 for j in range(300)] for k in range(count)]
    for phase, step, count in (("idle", 7, 5), ("deep", 11, 6), ("again", 13, 6), ("left", 17, 6))
}
BAD_HINTS = {
    # case: (the "saria" field as JSON text, words the 400's message must contain)
    "empty-session": ('{"session": ""}', "saria.session=''"),
    "negative-return": ('{"session": "a", "expect_return_s": -1}', "saria.expect_return_s=-1"),
    "end-and-return": ('{"session": "a", "end": true, "expect_return_s": 5}', "a session that ends does not return"),
    "end-not-bool": ('{"session": "a", "end": "yes"}', "saria.end='yes'"),
    "unknown-key": ('{"session": "a", "ttl": 5}', "saria.ttl: unknown key"),
    "not-an-object": ('"a"', "saria='a': must be an object"),
}


def first_turn(name: str) -> list[dict]:
    """A session's first prompt: its name in the first page, ~260 tokens (byte-level tokenizer)."""
    system = f"[{name}] agent. " + f"Keep the {name} repository tidy and answer briefly. " * 4
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Task {name}: fix the failing test."}]


@dataclass
class Turn:
    prompt: list[int]
    output: list[int]
    reply: str

    @property
    def path(self) -> list[int]:
        """The tokens the request leaves in the tree: its last output token has no KV yet."""
        return self.prompt + self.output[:-1]


@dataclass
class Run:
    turns: dict[str, Turn] = field(default_factory=dict)  # "I1", "R1", "C1", "E1", "C2", "E2"
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # after each phase
    stored: dict[str, set[str]] = field(default_factory=dict)  # KV page hashes in the store after each phase
    order: dict[str, list[str]] = field(default_factory=dict)  # the index's eviction order after a phase
    bad: dict[str, tuple[int, str]] = field(default_factory=dict)


def chat(client: OpenAI, messages: list[dict], hint: dict | None = None) -> Turn:
    extra = {"return_token_ids": True, **({"saria": hint} if hint else {})}
    response = client.chat.completions.create(model="default", messages=messages, max_tokens=4, temperature=0,
                                              extra_body=extra)
    choice = response.choices[0]
    return Turn(choice.model_extra["prompt_token_ids"], choice.model_extra["response_token_ids"],
                choice.message.content or "")


def rewritten_turn(name: str) -> list[dict]:
    """The session's first prompt with its user message replaced (a rewritten history)."""
    return first_turn(name)[:1] + [{"role": "user", "content": f"Task {name}: start over and explain the design."}]


def second_turn(name: str, first: Turn) -> list[dict]:
    return first_turn(name) + [{"role": "assistant", "content": first.reply},
                               {"role": "user", "content": f"Now run the {name} suite and report the failures."}]


HASH_MODULES = ("sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.utils")


def page_hashes(prompt: list[int]) -> list[str]:
    """The store keys' page hashes of a prompt's full pages (SGLang's storage hash chain)."""
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    return get_storage_hash_str(RadixKey(prompt[: len(prompt) // PAGE * PAGE]), None, page_size=PAGE)


def index_order(store: Path) -> list[str]:
    """KV page hashes in the order a store recovered from this index would evict them."""
    (index,) = store.rglob(INDEX_NAME)
    with sqlite3.connect(index) as db:
        stems = [k.split("@")[0] for (k,) in db.execute("SELECT key FROM objects ORDER BY atime, seq")]
    return [s for s in stems if "." not in s]  # KV pages (sidecars carry ".pool")


def post_hint(server: SGLangServer, hint_json: str) -> tuple[int, str]:
    """A one-message chat with the raw ``saria`` field (``1e400`` is JSON that parses to inf)."""
    chat_body = json.dumps({"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    body = chat_body[:-1] + f', "saria": {hint_json}}}'
    request = urllib.request.Request(f"{server.url}/v1/chat/completions", body.encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    """The store commits its index about once a second: wait for a state (the tests check it)."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.2)


def snapshot(run: Run, phase: str, server: SGLangServer, store: Path) -> None:
    server.wait_storage_writes()
    run.metrics[phase] = saria_metrics(server.metrics())
    run.order[phase] = index_order(store)
    run.stored[phase] = set(run.order[phase])


@pytest.fixture(scope="module")
def run(start_server, tmp_path_factory) -> Run:
    store = tmp_path_factory.mktemp("auto")
    extra = {"data_dirs": [str(store)], "capacity": "64MiB", "admission": AUTO}
    result = Run()
    # Importing SGLang here takes ~15 s: done while the server starts, before the first page_hashes.
    warm = threading.Thread(target=lambda: [importlib.import_module(m) for m in HASH_MODULES], daemon=True)
    warm.start()
    with start_server(saria_hicache_args(extra) + ["--enable-cache-report"], env=AUDIT_ENV) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        result.turns["I1"] = chat(client, first_turn("I"))
        result.turns["R1"] = chat(client, first_turn("R"), {"session": "R", "expect_return_s": 600})
        for filler in FILLERS["idle"]:
            server.generate(filler)
            server.wait_storage_writes()
        snapshot(result, "idle", server, store)

        result.turns["C1"] = chat(client, first_turn("C"))
        result.turns["E1"] = chat(client, first_turn("E"))
        server.wait_storage_writes()
        server.post("/generate", {"input_ids": FILLERS["deep"], "sampling_params": {"max_new_tokens": 4}})
        snapshot(result, "deep", server, store)

        result.turns["E2"] = chat(client, second_turn("E", result.turns["E1"]), {"session": "E", "end": True})
        result.turns["C2"] = chat(client, second_turn("C", result.turns["C1"]))
        warm.join()
        ended = set(page_hashes(result.turns["E1"].prompt)) & result.stored["deep"]
        wait_for(lambda: set(index_order(store)[: len(ended)]) == ended)  # the demotion committed
        snapshot(result, "hints", server, store)

        server.post("/generate", {"input_ids": FILLERS["again"], "sampling_params": {"max_new_tokens": 4}})
        snapshot(result, "again", server, store)

        result.turns["L1"] = chat(client, first_turn("L"), {"session": "L"})
        result.turns["L2"] = chat(client, rewritten_turn("L"), {"session": "L"})
        server.post("/generate", {"input_ids": FILLERS["left"], "sampling_params": {"max_new_tokens": 4}})
        snapshot(result, "left", server, store)
        result.bad = {case: post_hint(server, hint) for case, (hint, _) in BAD_HINTS.items()}
    return result


def pages(run: Run, turn: str) -> set[str]:
    """The turn's prompt pages."""
    return set(page_hashes(run.turns[turn].prompt))


def path_pages(run: Run, turn: str) -> set[str]:
    """All the pages the turn left in the tree (prompt and reply)."""
    return set(page_hashes(run.turns[turn].path))


def by_label(metrics: dict[str, float], name: str) -> dict[str, float]:
    prefix = f"sglang:saria_{name}/"
    return {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix) and v}


def test_with_an_empty_queue_a_page_evicted_once_is_not_written_unless_its_session_returns(run):
    idle = run.metrics["idle"]
    assert idle["sglang:saria_auto_backlog_seconds"] == 0 and idle["sglang:saria_loadaware_theta_e"] == 2
    assert idle["sglang:saria_host_evictions_total"] > 0
    assert not pages(run, "I1") & run.stored["idle"]  # evicted once (before R1: LRU), not written
    assert run.stored["idle"] == path_pages(run, "R1")  # the hint: written at its first eviction, nothing else
    assert by_label(idle, "loadaware_decisions_total") == {"save": sum(by_label(idle, "ssd_admissions_total").values())}
    assert by_label(idle, "hints_total") == {"expect_return": 1, "hinted_writes": 1}


def test_with_prefill_waiting_the_same_shape_of_session_is_written_at_its_first_eviction(run):
    idle, deep = run.metrics["idle"], run.metrics["deep"]
    assert pages(run, "C1") <= run.stored["deep"] and pages(run, "E1") <= run.stored["deep"]
    spent = by_label(deep, "loadaware_decisions_total").get("spend", 0)
    assert spent > 0 and by_label(deep, "loadaware_decisions_total")["save"] == by_label(idle, "loadaware_decisions_total")["save"]
    admitted = by_label(deep, "ssd_admissions_total")
    assert sum(admitted.values()) - sum(by_label(idle, "ssd_admissions_total").values()) == spent
    assert set(admitted) <= {"evict", "prewrite", "closure"}  # at or just before an eviction: no insert, no reuse


def test_an_ended_sessions_stored_pages_are_the_first_ssd_victims(run):
    ended = pages(run, "E1") & run.stored["deep"]
    assert len(ended) == len(pages(run, "E1")) > 0
    oldest = path_pages(run, "R1")  # written first, never read: the next victims before the hint
    assert set(run.order["deep"][: len(oldest)]) == oldest
    for phase in ("hints", "again"):
        assert set(run.order[phase][: len(ended)]) == ended, phase
    assert by_label(run.metrics["hints"], "hints_total")["end"] == 1


def test_nothing_of_an_ended_session_is_written_after_the_hint_while_its_twin_is(run):
    again = run.metrics["again"]
    new_e, new_c = path_pages(run, "E2") - run.stored["deep"], path_pages(run, "C2") - run.stored["deep"]
    assert new_e and new_c
    assert not new_e & run.stored["again"]  # evicted under load like C's, never written
    assert new_c <= run.stored["again"]
    assert by_label(again, "hints_total")["skipped_writes"] >= 1
    assert_kv_audit_clean(again, ("device_to_host", "host_to_ssd", "ssd_to_device"))
    assert again.get("sglang:saria_tier_audit_errors_total", 0) == 0


def test_pages_a_sessions_next_turn_no_longer_holds_are_not_written_while_that_turn_is(run):
    left = run.metrics["left"]
    behind = path_pages(run, "L1") - path_pages(run, "L2")
    new_l2 = path_pages(run, "L2") - run.stored["again"]
    assert behind and new_l2
    assert not behind & run.stored["left"]  # evicted under load like L2's, never written
    assert new_l2 <= run.stored["left"]
    hints = by_label(left, "hints_total")
    assert hints["left_behind"] == 1 and hints["left_skipped_writes"] >= 1
    assert_kv_audit_clean(left, ("device_to_host", "host_to_ssd", "ssd_to_device"))


@pytest.mark.parametrize("case", list(BAD_HINTS))
def test_a_malformed_hint_is_a_400_naming_the_field(run, case):
    status, body = run.bad[case]
    assert status == 400, body
    assert BAD_HINTS[case][1] in body
