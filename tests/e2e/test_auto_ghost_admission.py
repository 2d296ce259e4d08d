"""`auto` admission on a real server: the ghost of evicted blocks decides, and it survives a restart.

`auto` (``mem_cache/learned.py``) writes a block at its host-memory eviction when the reuse chance
learned for its class (reuses R, evictions E, idle time) says it pays. A class's chance is
``(reused + 1) / (seen + 2)`` over the blocks of that class seen evicted (the ghost) and wanted
again afterwards: a block whose class has never been wanted back is cold (1/3 at its first
eviction, under the bar of odds 1 on an idle GPU); one whose class was wanted back is hot.

One store, tiny model, small pools (device 512 tokens, host 1024), prompts sent one at a time (the
queue stays empty: the load signal is 0 and the bar is odds 1). Each round ``i``:

- ``H_i`` (200 tokens, 12 full pages) is sent twice (its node reused once: R = 1), ``C_i`` once (R = 0);
- after ``IDLE_BEFORE_FILLERS_S`` (so the idle time in a block's class does not depend on the
  machine's speed), four fillers of 300 tokens, new in every round, push both out of host memory:
  the eviction asks ``auto``;
- ``H_i`` is sent again: its pages come back (recomputed, or read from the store if it was
  written), so the ghost counts a reuse of ``H_i``'s class. ``C_i`` and the fillers never return.

Round 1: every class is new, so ``H_1`` and ``C_1`` are rejected as cold
(``sglang:saria_auto_decisions_total{reason="cold"}``) and nothing is stored. Later rounds: the
class of a block reused once and evicted once has been wanted back, so some ``H_i`` is admitted
(``reason="admit"``) and its pages are in the store, while no page of a ``C_i`` or a filler ever is.
Then the server stops (its state went to ``auto-admission.json`` beside the store's index, 0600,
at most every ``auto_state_save_s``: 1 s here)
and a new one starts on the same store: its first round admits ``H`` at once, which a fresh
policy never does (its first eviction of a class is cold).
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sglang_saria.hicache.admission_state import FILE_NAME
from sglang_saria.launcher import saria_hicache_args, saria_metrics
from sglang_saria.storage.index import INDEX_NAME

pytestmark = pytest.mark.e2e

PAGE = 16
ROUNDS = 5


def prompt(kind: int, i: int, n: int) -> list[int]:
    """``n`` tokens, distinct from the first page on for each (kind, i)."""
    return [kind * 100 + i + 5, *[(kind * 7919 + i * 104729 + 31 * j) % 1000 + 5 for j in range(n - 1)]]


def hot(i: int) -> list[int]:
    return prompt(1, i, 200)


def cold(i: int) -> list[int]:
    return prompt(2, i, 200)


def fillers(i: int) -> list[list[int]]:
    return [prompt(3, 10 * i + k, 300) for k in range(4)]


HASH_MODULES = ("sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.utils")


def page_hashes(tokens: list[int]) -> set[str]:
    """The store keys' page hashes of a prompt's full pages (SGLang's storage hash chain)."""
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    return set(get_storage_hash_str(RadixKey(tokens[: len(tokens) // PAGE * PAGE]), None, page_size=PAGE))


def stored_pages(store: Path) -> set[str]:
    (index,) = store.rglob(INDEX_NAME)
    with sqlite3.connect(index) as db:
        stems = [k.split("@")[0] for (k,) in db.execute("SELECT key FROM objects")]
    return {s for s in stems if "." not in s}


def saved_reuses(store: Path) -> int:
    """Reuses in the state file (0 while there is none): the file is written off the scheduler thread."""
    try:
        (path,) = store.rglob(FILE_NAME)
        return sum(json.loads(path.read_text())["reused"])
    except (ValueError, KeyError):
        return 0


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.2)


def decisions(metrics: dict[str, float]) -> dict[str, float]:
    prefix = "sglang:saria_auto_decisions_total/"
    return {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix) and v}


@dataclass
class Runs:
    metrics: list[dict[str, float]] = field(default_factory=list)  # after each round's fillers
    stored: list[set[str]] = field(default_factory=list)  # the store's KV pages then
    state: dict = field(default_factory=dict)  # the state file after the first server stopped
    state_mode: int = 0
    restarted: dict[str, float] = field(default_factory=dict)  # the second server after its round
    restarted_stored: set[str] = field(default_factory=set)


# A block's class includes its idle time at eviction in doubling buckets (``learned.block_class``); each
# round waits this long before its fillers, so H's and C's idle times fall in [8, 16) s whatever the
# machine's speed (the fillers take 1-6 s): the restarted round's H is in a class the first server learned.
IDLE_BEFORE_FILLERS_S = 9.0


def one_round(server, i: int) -> None:
    server.generate(hot(i))
    server.generate(hot(i))
    server.generate(cold(i))
    time.sleep(IDLE_BEFORE_FILLERS_S)
    for filler in fillers(i):
        server.generate(filler)
        server.wait_storage_writes()


@pytest.fixture(scope="module")
def runs(start_server, tmp_path_factory) -> Runs:
    store = tmp_path_factory.mktemp("auto-ghost")
    # odds 1 (not the default 4): a class is admitted once its blocks came back more often than not, which
    # these few rounds reach
    extra = {"data_dirs": [str(store)], "capacity": "64MiB",
             "admission": {"policy": "auto", "auto_odds": 1.0, "auto_state_save_s": 1.0}}
    args = saria_hicache_args(extra)
    result = Runs()
    warm = threading.Thread(target=lambda: [importlib.import_module(m) for m in HASH_MODULES], daemon=True)
    warm.start()
    with start_server(args) as server:
        for i in range(1, ROUNDS + 1):
            one_round(server, i)
            result.metrics.append(saria_metrics(server.metrics()))
            result.stored.append(stored_pages(store))
            server.generate(hot(i))  # wanted back: a reuse of its class
            server.wait_storage_writes()
        time.sleep(1.5)
        server.generate(prompt(4, 0, 40))  # a step past the save interval: the state with every round's reuses is saved
        wait_for(lambda: saved_reuses(store) > 0)
    (path,) = store.rglob(FILE_NAME)
    result.state = json.loads(path.read_text())
    result.state_mode = stat.S_IMODE(os.stat(path).st_mode)
    with start_server(args) as server:
        one_round(server, ROUNDS + 1)
        result.restarted = saria_metrics(server.metrics())
        result.restarted_stored = stored_pages(store)
    warm.join()
    return result


def test_the_first_eviction_of_a_class_never_wanted_back_is_rejected_as_cold(runs):
    first = runs.metrics[0]
    assert first["sglang:saria_host_evictions_total"] > 0
    assert decisions(first).keys() == {"cold"}  # H_1, C_1 and the first fillers: every class new
    assert runs.stored[0] == set()


def test_a_block_whose_class_was_wanted_back_is_admitted_and_stored(runs):
    last = runs.metrics[-1]
    assert decisions(last).get("admit", 0) > 0 and decisions(last)["cold"] > decisions(runs.metrics[0])["cold"]
    stored = runs.stored[-1]
    admitted_hot = [i for i in range(2, ROUNDS + 1) if page_hashes(hot(i)) <= stored]
    assert admitted_hot, "no H_i was written"
    never = set().union(*(page_hashes(cold(i)) for i in range(1, ROUNDS + 1)),
                        *(page_hashes(f) for i in range(1, ROUNDS + 1) for f in fillers(i)))
    assert not stored & never  # classes never wanted back stay cold
    assert last.get("sglang:saria_auto_ghost_blocks", 0) > 0 and last["sglang:saria_auto_bar"] == 1.0


def test_the_learned_state_is_kept_beside_the_store_and_restored_at_restart(runs):
    state = runs.state
    assert runs.state_mode == 0o600
    assert sum(state["reused"]) > 0 and len(state["ghost"]) > 0
    assert all(r <= s for r, s in zip(state["reused"], state["seen"]))
    # A fresh policy rejects the first eviction of every class; the restored one admits H at once.
    assert decisions(runs.restarted).get("admit", 0) > 0
    assert page_hashes(hot(ROUNDS + 1)) <= runs.restarted_stored
    assert not page_hashes(cold(ROUNDS + 1)) & runs.restarted_stored
