"""kill -9 and SIGTERM while a store write is half on disk (the test-only HeldWrites injector
holds every write half-way while a file exists), on a real server; then a restart on what it left:

- every object the index holds is whole (its checksums verify on read) and recovery dropped none;
- the half-written object is gone: no index row covers the held write's file range;
- the lock file the killed server left (its PID in it) does not block the restart;
- the restart serves the stored prompt from storage with the bytes that were computed (KV audit)
  and the held prompt recomputed, both with a cold server's output.

The store-level version: tests/storage/test_storage_held_write.py.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from sglang_saria.launcher import (AUDIT_ENV, SGLangServer, assert_kv_audit_clean, assert_matches_cold, cached_tokens,
                                   saria_hicache_args, saria_metrics)
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.index import INDEX_NAME, SQLiteIndex
from sglang_saria.storage.lock import LOCK_NAME
from sglang_saria.storage.store import SariaStore
from tests.faults.serving import FROM_STORAGE, PAGE, PROMPT, STORED, other_prompt, store_config
from tests.faults.test_store_ownership_served import group_pids

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RANK = "rank_tp0of1"
HELD_WAIT_S = 120
SIGTERM_WAIT_S = 60


@dataclass
class Audit:
    """What a killed server left in its store, opened offline."""

    rows: int
    recovered: int
    whole: int  # objects whose every stripe run verified on read
    covering_held: list[str]  # index rows over the held write's file range (must be none)
    lock_pid: int


AUDIT = ("import dataclasses, json, sys; from pathlib import Path; from tests.faults.test_kill_mid_write import read_store; "
         "print(json.dumps(dataclasses.asdict(read_store(Path(sys.argv[1]), Path(sys.argv[2])))))")


def audit_store(store: Path, held: Path) -> Audit:
    """``read_store`` in a fresh process, as a restarted server sees the store: this process's own
    SQLite connections to an index another process rewrote were seen reading it as it had been."""
    out = subprocess.run([sys.executable, "-c", AUDIT, str(store), str(held)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return Audit(**json.loads(out.stdout.splitlines()[-1]))


def read_store(store: Path, held: Path) -> Audit:
    """Open the store a killed server left, offline: count its index rows, what recovery keeps,
    what reads back whole, and the rows over the held write's file range."""
    rank = store / RANK
    index = str(rank / INDEX_NAME)
    with closing(sqlite3.connect(index)) as db:
        slot_bytes = int(db.execute("SELECT v FROM meta WHERE k = 'slot_bytes'").fetchone()[0])
        rows = db.execute("SELECT COUNT(*) FROM objects").fetchone()[0]
    dir_idx, offset = map(int, held.read_text().split())
    lock_pid = int((rank / LOCK_NAME).read_text().strip())
    stored = SQLiteIndex(index, sync_writes=True)
    entries = {e.key: e for e in stored.load()}
    stored.close()
    s = SariaStore(StoreConfig(data_dirs=[str(rank)], capacity="64MiB", slot_bytes=slot_bytes),
                   victim_order=SSDVictimOrder())
    try:
        recovered = set(s.keys())
        whole = sum(s.get(k, np.empty(entries[k].size, np.uint8)).ok for k in recovered)
        covering = [k for k, e in entries.items()
                    if any(sub.dir_idx == dir_idx and sub.file_offset <= offset < sub.file_offset + max(sub.nbytes, 1)
                           for sub in s.layout.plan(e.slots.tolist(), e.size))]
    finally:
        s.close()
    return Audit(rows, len(recovered), whole, covering, lock_pid)


@dataclass
class Life:
    tiers: dict[str, dict[str, int]] = field(default_factory=dict)
    results: dict[str, dict] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    log: str = ""
    audit: Audit | None = None  # of the store it left
    sigterm_exit_s: float | None = None  # SIGTERM: seconds until every process had exited by itself


def index_rows(store: Path) -> int:
    """Rows of the store's index, counted by a fresh process: after this process has opened and
    closed the store (``audit_store``), its own SQLite connections to that file kept reading the
    index as it was while a restarted server wrote to it (seen: 18 rows here, 36 in a new process)."""
    count = ("import sqlite3, sys; from contextlib import closing\n"
             "with closing(sqlite3.connect(sys.argv[1])) as db: print(db.execute('SELECT COUNT(*) FROM objects').fetchone()[0])")
    out = subprocess.run([sys.executable, "-c", count, str(store / RANK / INDEX_NAME)], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


def wait_committed(server: SGLangServer, store: Path, n: int) -> None:
    """Until the store's index holds ``n`` rows: HiCache hands a request's pages to the store after
    the request returns, and a put counts as held before its row commits (about once a second),
    so neither an empty write queue nor the objects gauge says the pages are durable yet."""
    deadline = time.monotonic() + HELD_WAIT_S
    while index_rows(store) < n:
        if time.monotonic() > deadline:
            saria = [line for line in server.log_path.read_text(errors="replace").splitlines()
                     if "saria" in line.lower() or "error" in line.lower() or "warn" in line.lower()]
            raise AssertionError(f"the store's index has {index_rows(store)} rows, not {n}, after {HELD_WAIT_S} s; "
                                 f"metrics {saria_metrics(server.metrics())}; log:\n" + "\n".join(saria[-40:]))
        time.sleep(0.5)


def hold_a_write(server: SGLangServer, prompt: list[int], hold: Path, held: Path) -> None:
    """Serve ``prompt`` with writes held: returns once a write of its pages is half on disk."""
    held.unlink(missing_ok=True)
    hold.touch()
    server.generate(prompt)
    deadline = time.monotonic() + HELD_WAIT_S
    while not held.exists():
        assert time.monotonic() < deadline, f"no store write was held within {HELD_WAIT_S} s"
        time.sleep(0.05)
    time.sleep(0.5)  # the held file is written after the half: it is on disk


def sigterm(server: SGLangServer) -> float | None:
    """SIGTERM the server's process group; seconds until all of it exited (None: it did not
    within SIGTERM_WAIT_S and was killed)."""
    pgid = server.process.pid
    t0 = time.monotonic()
    os.killpg(pgid, signal.SIGTERM)
    while group_pids(pgid) and time.monotonic() - t0 < SIGTERM_WAIT_S:
        time.sleep(0.1)
    if group_pids(pgid):
        server.kill()
        return None
    server.process.wait(timeout=10)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def lives(start_server, tmp_path_factory) -> list[Life]:
    root = tmp_path_factory.mktemp("held")
    store, hold, held = root / "store", root / "hold", root / "held"
    injector = {"class": "sglang_saria.storage.fault_injection:HeldWrites", "hold_file": str(hold),
                "held_file": str(held)}
    args = saria_hicache_args(store_config(store, fault_injector=injector))
    prompts = {"stored": PROMPT, "held by kill -9": other_prompt(0), "held by SIGTERM": other_prompt(1)}
    out: list[Life] = []
    for n, stop in enumerate(("kill -9", "SIGTERM", "stop")):
        life = Life()
        with start_server(args, env=AUDIT_ENV) as server:
            life.pids = group_pids(server.process.pid)
            for what, prompt in list(prompts.items())[: n + 1]:
                life.results[what] = server.generate(prompt)
                life.tiers[what] = cached_tokens(life.results[what])
            server.wait_storage_writes()
            wait_committed(server, store, (n + 1) * STORED // PAGE)  # every prompt served so far, stored
            life.metrics = saria_metrics(server.metrics())
            life.log = server.log_path.read_text(errors="replace")
            if stop != "stop":
                hold_a_write(server, list(prompts.values())[n + 1], hold, held)
                if stop == "kill -9":
                    server.kill()
                else:
                    life.sigterm_exit_s = sigterm(server)
                hold.unlink()
                life.audit = audit_store(store, held)
        out.append(life)
    return out


def test_every_object_a_killed_server_left_is_whole_and_the_half_written_one_is_gone(lives):
    for n, life in enumerate(lives[:2]):
        a = life.audit
        assert a.rows == a.recovered == a.whole == (n + 1) * STORED // PAGE, a
        assert a.covering_held == [], a


def test_sigterm_mid_write_exits_without_waiting_for_the_write(lives):
    assert lives[1].sigterm_exit_s is not None, f"the server did not exit within {SIGTERM_WAIT_S} s of SIGTERM"


def test_the_lock_a_killed_server_left_does_not_block_the_restart(lives):
    assert lives[0].audit.lock_pid in lives[0].pids  # the dead server's PID is still in the file
    assert lives[1].pids and lives[2].pids  # and the next servers started on it


def test_each_restart_serves_the_stored_and_recomputes_the_held_with_a_cold_servers_output(lives, cold_run):
    prompts = {"stored": PROMPT, "held by kill -9": other_prompt(0), "held by SIGTERM": other_prompt(1)}
    assert lives[1].tiers["stored"] == FROM_STORAGE and lives[2].tiers["stored"] == FROM_STORAGE
    assert lives[1].tiers["held by kill -9"]["storage"] == 0  # its writes never committed
    assert lives[2].tiers["held by kill -9"] == FROM_STORAGE  # stored again by the second life
    assert lives[2].tiers["held by SIGTERM"]["storage"] == 0
    for life in lives:
        for what, result in life.results.items():
            assert_matches_cold(result, cold_run(prompts[what]), what)


def test_what_each_restart_read_back_is_the_bytes_that_were_computed(lives):
    assert_kv_audit_clean(lives[0].metrics, ("device_to_host", "host_to_ssd"))
    for life in lives[1:]:
        assert_kv_audit_clean(life.metrics, ("ssd_to_device",))
        assert life.metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
        assert "Scheduler hit an exception" not in life.log
