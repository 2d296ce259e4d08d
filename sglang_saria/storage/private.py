"""The store's files are private: its KV pages are tenants' data, and a page another user could
write would be served as KV.

Directories are created 0700 and files 0600 whatever the umask (an existing file or directory of
ours is narrowed to that). A data dir must be owned by this user and writable by no one else, and
so must each directory above it, unless that one belongs to root and is sticky (as ``/tmp`` is:
there no other user can rename or replace what is ours). Anything else is refused at start with
the path, its owner and its mode: another user could have made it first, index and checksums of
their own included.
"""

from __future__ import annotations

import os
import pwd
import stat

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def default_data_dir() -> str:
    """Where a store lives unless ``data_dirs`` says otherwise: this user's cache directory
    (``$XDG_CACHE_HOME/sglang-saria/store``, else ``~/.cache/sglang-saria/store``), never a
    shared one such as ``/tmp`` where another user could make it first."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # the XDG spec: a relative path is to be ignored
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "sglang-saria", "store")


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _refuse(path: str, st: os.stat_result, why: str) -> ValueError:
    return ValueError(
        f"saria store: data dir {path!r}: {why} (owner {_owner(st.st_uid)}, mode "
        f"{stat.S_IMODE(st.st_mode):04o}; this server runs as {_owner(os.geteuid())}): another user "
        f"could read or plant its KV; use a directory of your own, mode 0700"
    )


def _check_above(path: str, below: str) -> None:
    """A directory above a data dir: ours or root's, and writable by others only if root's and sticky."""
    st = os.stat(path)
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise _refuse(below, st, f"the directory above it, {path!r}, belongs to another user")
    sticky_root = st.st_uid == 0 and st.st_mode & stat.S_ISVTX
    if st.st_mode & _OTHERS_WRITE and not sticky_root:
        raise _refuse(below, st, f"the directory above it, {path!r}, is writable by group or others")


def _ancestors(real: str) -> list[str]:
    """The directories above ``real``, nearest first, up to ``/``."""
    above = []
    at = os.path.dirname(real)
    while True:
        above.append(at)
        if at == os.path.dirname(at):
            return above
        at = os.path.dirname(at)


def _check_own(path: str, st: os.stat_result) -> None:
    if st.st_uid != os.geteuid():
        raise _refuse(path, st, "it belongs to another user")
    if st.st_mode & _OTHERS_WRITE:
        raise _refuse(path, st, "it is writable by group or others")


def check_private_dir(path: str) -> None:
    """What ``prepare_private_dir`` would refuse, without creating anything: the launch check
    (the plugin's launch check) runs it before the model loads, the store again when it opens."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"saria store: data dir {path!r} is not a directory")
    real = os.path.realpath(path)
    for d in _ancestors(real):
        if os.path.exists(d):
            _check_above(d, path)
    if os.path.exists(real):
        _check_own(path, os.stat(real))


def prepare_private_dir(path: str) -> None:
    """Create a data dir (and missing parents) 0700, or check an existing one; errors name it.
    The directories above it are checked first, so a refused path is left as it was."""
    check_private_dir(path)
    real = os.path.realpath(path)
    for d in reversed([real] + _ancestors(real)):
        if os.path.exists(d):
            continue
        try:
            os.mkdir(d, DIR_MODE)
            os.chmod(d, DIR_MODE)  # the umask may have narrowed it further; never wider
        except FileExistsError:
            pass  # another rank made it in between: checked below like any existing dir
        except OSError as e:
            raise ValueError(f"saria store: data dir {path!r} cannot be created ({d}: {e.strerror})") from e
    st = os.stat(real)
    _check_own(path, st)
    mode = stat.S_IMODE(st.st_mode)
    if mode & ~DIR_MODE and not _read_only_fs(real):
        os.chmod(real, mode & DIR_MODE)  # readable by others (an older release made it 0755): narrow it
    error = writable_error(path, "data dir", is_dir=True)
    if error is not None:
        raise ValueError(error)


def _read_only_fs(path: str) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def writable_error(path: str, what: str, is_dir: bool) -> str | None:
    """Why this process cannot use ``path`` (an existing store directory or file), naming its
    mode, or None. Modes never widen here: a directory its owner made read-only stays so."""
    mode = f"{stat.S_IMODE(os.stat(path).st_mode):04o}"
    if _read_only_fs(path):
        return (f"saria store: {what} {path!r} (mode {mode}) is on a read-only file system; "
                "remount it read-write or use another data dir")
    if not os.access(path, os.R_OK | os.W_OK | (os.X_OK if is_dir else 0)):
        kind = "read, write and enter" if is_dir else "read and write"
        return (f"saria store: {what} {path!r} has mode {mode}: this server ({_owner(os.geteuid())}) cannot {kind} it; "
                f"give it mode {'0700' if is_dir else '0600'} or use another data dir")
    return None


def open_private(path: str, flags: int) -> int:
    """``os.open`` that creates the file 0600 whatever the umask and narrows an existing one."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_private(path: str) -> None:
    """Create ``path`` empty 0600 if missing (or narrow it): SQLite gives its -wal, -shm and
    journal files the mode of the database file, so creating that one first makes all private."""
    os.close(open_private(path, os.O_RDWR))
