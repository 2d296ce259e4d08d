"""`auto`'s load signal on a real server is the replay's for the same queue (hicache/load_signal.py).

The tokens the signal divides by the prefill rate (gauge ``sglang:saria_auto_queued_prefill_tokens``)
must be what the replay's driver computes for the same queue: each queued prompt's tokens less
the blocks its plan loads from DRAM or SSD (``ReplayRun.admit``: ``computed_tokens``), the same
token sequences keyed by the replay's own ``chain_keys`` over 16-token blocks.

A first server (every page written at insert) serves two prompts, A (200 tokens) and B (300), and
stops: its store holds their pages. A second server on that store, `auto` admission, one running
slot (``--max-running-requests 1``) and a device pool that holds everything (no eviction moves a
prefix while the test reads), twice:

- a front request of fresh tokens decodes a long reply and holds the one slot;
- five prompts arrive behind it and wait: parts of A and B with tails of their own (one of them
  B's whole pages and 5 new tokens: a 98 % cached agent turn) and one fresh prompt;
- once SGLang's queue (``/v1/loads``) holds the five, the gauge is polled until it is the replay's
  sum (or a deadline), then the front is aborted (it must still have been running) and the five are
  served; each one's cached tokens as SGLang reports them must be the replay's cached prefix.

The first time A's and B's pages are only in the store (saria's direct reload reads them for the
waiting requests; two requests that need the same pages follow one reload); the second time they
and the first five prompts are in memory, and five new prompts of the same shapes queue. The
replay serves A, B (and the first five) one at a time, then admits the queue. The order of the five
in the queue does not matter: the signal is their sum, and all five wait. No timing is asserted:
every wait polls a state with a deadline.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest

from sglang_saria.config import SariaConfig
from sglang_saria.launcher import SGLangServer, cached_tokens, saria_hicache_args, saria_metrics
from sglang_saria.model_specs import spec_from_hf_config
from sglang_saria.replay.driver import ReplayRun, ReplaySettings
from sglang_saria.replay.trace import TraceRequest, TraceSession, chain_keys, scope_seed

pytestmark = pytest.mark.e2e

PAGE = 16
A = [(7 * j) % 500 + 1 for j in range(200)]
B = [(11 * j) % 500 + 3 for j in range(300)]
FRONT = [(13 * j) % 200 + 800 for j in range(64)]
FRONT_TOKENS = 6000  # decode steps the front request would take: far more than the test holds it
QUEUED_GAUGE = "sglang:saria_auto_queued_prefill_tokens"


def fresh(n: int, salt: int) -> list[int]:
    """Tokens no other prompt has (ids 501-799, a pattern of its own per salt)."""
    return [(salt * 31 + j * (salt + 2)) % 299 + 501 for j in range(n)]


def queue(salt: int) -> dict[str, list[int]]:
    """Five prompts: known cached prefixes of A and B (page-aligned or not), tails of their own."""
    return {
        "part-of-A": A[:150] + fresh(60, salt),
        "few-pages-of-A": A[:40] + fresh(70, salt + 1),
        "B-and-more": B + fresh(40, salt + 2),
        "B-pages-and-5": B[: 18 * PAGE] + fresh(5, salt + 3),
        "cold": fresh(100, salt + 4),
    }


QUEUES = {"store": queue(1), "memory": queue(6)}


def replay_computed(served: list[list[int]], queued: dict[str, list[int]], config_json: dict) -> dict[str, int]:
    """The replay's prefill tokens for each queued prompt: ``served`` go through its driver one at
    a time (their blocks enter its tiers), then every queued prompt is admitted at once."""
    seed = scope_seed("test_auto_load_signal")

    def session(name: str, tokens: list[int]) -> TraceSession:
        n = len(tokens) // PAGE
        units = np.array(tokens[: n * PAGE], dtype=np.uint64).reshape(n, PAGE)
        return TraceSession(name, [TraceRequest(0.0, 0.0, len(tokens), 1, chain_keys(units, seed))])

    names = [f"served-{i}" for i in range(len(served))] + list(queued)
    sessions = [session(n, t) for n, t in zip(names, served + list(queued.values()))]
    cfg = SariaConfig.from_dict({
        "admission": {"policy": "auto"},
        "metadata": {"block_tokens": PAGE},
        "capacity": {"dram_tokens": 1_000_000, "ssd_tokens": 10_000_000},
    }, source="test")
    spec = spec_from_hf_config("qwen3-tiny", config_json, PAGE)
    run = ReplayRun(sessions, [0.0] * len(sessions), cfg, spec, ReplaySettings(in_flight=len(sessions)))
    run.events.heap.clear()  # the test issues the requests itself
    t = 0.0
    for sid in range(len(served)):  # one at a time, each to its first token
        run.admit(sid, 0, t, t)
        run.loop()
        t = run.end_t + 1.0
    for sid in range(len(served), len(sessions)):
        run.admit(sid, 0, t, t)
    return {run.sessions[a.sid].session_id: a.computed_tokens for a in run.active.values()}


def generate(server: SGLangServer, tokens: list[int]) -> dict:
    """Greedy, one new token, no logprobs (a logprob start would cap the prefix match)."""
    return server.post("/generate", {
        "input_ids": tokens, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
    }, timeout=600)


def loads(server: SGLangServer) -> dict:
    with urllib.request.urlopen(f"{server.url}/v1/loads", timeout=10) as response:
        return json.load(response)["loads"][0]


def wait_for(read, done, timeout_s: float = 120.0):
    """Poll ``read()`` until ``done(value)``; the last value if the deadline passes (the caller asserts)."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.2)
        value = read()
    return value


@dataclass
class Held:
    """What the server showed with a queue held behind the front request, and what it served."""

    queue: dict  # /v1/loads once the queue held every prompt
    gauge: float | None  # the queued-tokens gauge, last read
    seen: list[float | None]  # its values while polled
    results: dict[str, dict]
    front: dict


def hold_queue(server: SGLangServer, prompts: dict[str, list[int]], expected_tokens: int, front_rid: str) -> Held:
    """The front request takes the one slot, ``prompts`` arrive behind it; the gauge is polled
    until it is ``expected_tokens`` (or the deadline), then the front is aborted. Each hold names
    its front anew: SGLang may finish a request that reuses the rid of one aborted just before."""
    with ThreadPoolExecutor(len(prompts) + 1) as pool:
        decoding = threading.Event()
        front = pool.submit(lambda: server.generate_stream(FRONT, FRONT_TOKENS, ignore_eos=True, rid=front_rid,
                                                           first_chunk=decoding))
        assert decoding.wait(180), server.log_tail()
        served = {name: pool.submit(generate, server, tokens) for name, tokens in prompts.items()}
        held = wait_for(lambda: loads(server), lambda v: v.get("num_waiting_reqs") == len(prompts) or front.done())
        assert not front.done(), ("the front request ended before the queue formed", front.result().result)
        seen: list[float | None] = []

        def read() -> float | None:
            value = saria_metrics(server.metrics()).get(QUEUED_GAUGE)
            if not seen or seen[-1] != value:
                seen.append(value)
            return value

        gauge = wait_for(read, lambda v: v == expected_tokens)
        server.abort(front_rid)
        results = {name: future.result() for name, future in served.items()}
        return Held(held, gauge, seen, results, front.result().result)


@pytest.fixture(scope="module")
def expected(tiny_model) -> dict[str, dict[str, int]]:
    config_json = json.loads((tiny_model / "config.json").read_text())
    return {
        "store": replay_computed([A, B], QUEUES["store"], config_json),
        "memory": replay_computed([A, B, *QUEUES["store"].values()], QUEUES["memory"], config_json),
    }


@pytest.fixture(scope="module")
def held(start_server, expected, tmp_path_factory) -> dict[str, Held]:
    store = tmp_path_factory.mktemp("load-signal-store")

    def args(admission: dict) -> list[str]:
        extra = {"data_dirs": [str(store)], "capacity": "64MiB", "admission": admission}
        return saria_hicache_args(extra) + ["--max-running-requests", "1", "--max-total-tokens", "16384"]

    with start_server(args({"policy": "full-duplicate"})) as server:
        for tokens in (A, B):
            generate(server, tokens)
        server.wait_storage_writes()
    with start_server(args({"policy": "auto"})) as server:
        return {where: hold_queue(server, QUEUES[where], sum(expected[where].values()), f"front-{where}") for where in QUEUES}


@pytest.mark.parametrize("where", list(QUEUES))
def test_the_servers_queued_prefill_tokens_are_the_replays_for_the_same_queue(held, expected, where):
    got, want = held[where], expected[where]
    print(f"{where}: server queued {got.gauge} (seen {got.seen}), replay {sum(want.values())} {want}; "
          f"SGLang's own estimate {got.queue.get('num_waiting_uncached_tokens')}")
    assert got.queue.get("num_waiting_reqs") == len(QUEUES[where]), got.queue
    assert got.front["meta_info"]["finish_reason"]["type"] == "abort"  # it held the slot throughout
    assert got.gauge == sum(want.values()), (got.seen, want)
    for name, result in got.results.items():
        assert sum(cached_tokens(result).values()) == len(QUEUES[where][name]) - want[name], (name, result["meta_info"])
