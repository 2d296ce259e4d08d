"""One process per store (storage/lock.py), with real processes: a second opener is refused naming
the holder's PID; a holder killed with -9 leaves a lock file that never blocks the next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from sglang_saria.storage.lock import LOCK_NAME, StoreLock, StoreLocked

HOLD = """
import sys, time
from sglang_saria.storage.lock import StoreLock
lock = StoreLock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """A process holding the lock of ``tmp_path / "rank"``."""
    rank = tmp_path / "rank"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(rank)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield rank, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_a_second_opener_is_refused_naming_the_holders_pid(holder):
    rank, proc = holder
    with pytest.raises(StoreLocked, match=rf"process {proc.pid} holds its lock .*{LOCK_NAME}"):
        StoreLock.acquire(str(rank))


def test_a_holder_killed_with_9_never_blocks_the_next(holder):
    rank, proc = holder
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (rank / LOCK_NAME).read_text().strip() == str(proc.pid)  # its stale PID is still there
    lock = StoreLock.acquire(str(rank))
    assert (rank / LOCK_NAME).read_text().strip() == str(os.getpid())
    assert oct((rank / LOCK_NAME).stat().st_mode & 0o777) == oct(0o600)
    lock.release()


def test_a_second_open_in_the_same_process_is_refused_and_a_release_frees_it(tmp_path):
    lock = StoreLock.acquire(str(tmp_path / "rank"))
    with pytest.raises(StoreLocked, match=rf"this process \({os.getpid()}\) already holds"):
        StoreLock.acquire(str(tmp_path / "rank"))
    lock.release()
    lock.release()  # twice is harmless
    StoreLock.acquire(str(tmp_path / "rank")).release()
