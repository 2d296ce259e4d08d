"""The store's files are private: directories 0700 and files 0600 whatever the umask, a data dir
another user owns or may write is refused at start, and the default data dir is this user's."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.private import default_data_dir
from sglang_saria.storage.store import SariaStore

SLOT = 64 * 1024
OTHER_UID = 65534  # nobody


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    """A umask that narrows nothing: whatever the store gets, it asked for."""
    old = os.umask(0)
    yield
    os.umask(old)


def open_store(*dirs, **kw) -> SariaStore:
    cfg = StoreConfig(data_dirs=[str(d) for d in dirs], capacity="1MiB", slot_bytes="64KiB", **kw)
    return SariaStore(cfg, victim_order=SSDVictimOrder())


def test_store_files_are_0600_and_dirs_0700_under_a_permissive_umask(tmp_path, open_umask, payload):
    data_dir = tmp_path / "new" / "rank_tp0of1"  # the parent is made too, as the server's rank dirs are
    with open_store(data_dir) as store:
        assert store.put("k", payload("k", SLOT)).ok  # the index now has its -wal and -shm
        files = sorted(os.listdir(data_dir))
        assert {"saria-slab.dat", "saria-index.sqlite", "saria-index.sqlite-wal", "saria-index.sqlite-shm"} <= set(files)
        assert {f: mode(data_dir / f) for f in files} == {f: 0o600 for f in files}
    assert mode(data_dir) == 0o700 and mode(tmp_path / "new") == 0o700


def test_files_an_older_release_left_readable_are_narrowed_at_open(tmp_path, open_umask, payload):
    data_dir = tmp_path / "old"
    with open_store(data_dir) as store:
        assert store.put("k", payload("k", SLOT)).ok
    os.chmod(data_dir, 0o755)
    for f in os.listdir(data_dir):
        os.chmod(data_dir / f, 0o644)
    with open_store(data_dir) as store:
        assert store.exists("k")
        assert mode(data_dir) == 0o700
        assert {mode(data_dir / f) for f in os.listdir(data_dir)} == {0o600}


@pytest.mark.parametrize("bad_mode", [0o770, 0o707, 0o777])
def test_a_data_dir_writable_by_group_or_others_is_refused_naming_path_owner_and_mode(tmp_path, bad_mode):
    data_dir = tmp_path / "shared"
    data_dir.mkdir()
    os.chmod(data_dir, bad_mode)
    with pytest.raises(ValueError) as e:
        open_store(data_dir)
    msg = str(e.value)
    assert str(data_dir) in msg and f"mode {bad_mode:04o}" in msg and f"uid {os.geteuid()}" in msg
    assert "writable by group or others" in msg
    assert os.listdir(data_dir) == []  # nothing written into it


def test_a_data_dir_below_a_directory_others_may_write_is_refused(tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)  # not sticky: another user could swap the data dir for their own
    with pytest.raises(ValueError, match=f"the directory above it, '{parent}', is writable by group or others"):
        open_store(parent / "store")
    assert os.listdir(parent) == []  # refused before anything was made in it


@pytest.fixture
def reachable_dir():
    """A directory like /tmp (root's, 1777: anyone may create in it) that another user can reach
    (pytest's own are 0700)."""
    base = tempfile.mkdtemp(prefix="saria-private-", dir="/tmp")
    os.chmod(base, 0o1777)
    yield Path(base)
    shutil.rmtree(base)


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_a_data_dir_another_user_made_first_is_refused(reachable_dir):
    """Another user creates the data dir before the server (with an index and slab of their own
    in it): the store refuses it instead of serving their KV."""
    data_dir = reachable_dir / "planted"
    pid = os.fork()
    if pid == 0:  # the other user: makes the dir 0700 and plants files in it
        try:
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            os.mkdir(data_dir, 0o700)
            for name in ("saria-index.sqlite", "saria-slab.dat"):
                with open(data_dir / name, "wb") as f:
                    f.write(b"planted")
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0 and os.stat(data_dir).st_uid == OTHER_UID
    with pytest.raises(ValueError) as e:
        open_store(data_dir)
    msg = str(e.value)
    assert str(data_dir) in msg and "belongs to another user" in msg and f"owner uid {OTHER_UID}" in msg
    assert "mode 0700" in msg
    assert os.path.getsize(data_dir / "saria-index.sqlite") == len(b"planted")  # untouched


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_data_dir_below_another_users_directory_is_refused(tmp_path):
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, OTHER_UID, OTHER_UID)
    with pytest.raises(ValueError, match=f"the directory above it, '{parent}', belongs to another user"):
        open_store(parent / "store")


def test_a_store_under_sticky_tmp_is_allowed(tmp_path):
    """/tmp itself (root's, sticky) is not a reason to refuse: no one else can rename our entries."""
    assert os.stat("/tmp").st_mode & stat.S_ISVTX
    with open_store(tmp_path / "ok") as store:
        assert store.capacity_bytes == 1 << 20


def test_the_default_data_dir_is_this_users_cache_not_shared_tmp(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == str(tmp_path / "xdg" / "sglang-saria" / "store")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir() == str(tmp_path / "home" / ".cache" / "sglang-saria" / "store")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_data_dir() == str(tmp_path / "home" / ".cache" / "sglang-saria" / "store")
