"""What can be checked about a store before SGLang loads the model (the plugin's launch check).

The store opens only once the model has loaded (20-60 s on CPU, minutes on a GPU host), so a
wrong data dir or capacity found there costs a load; these checks find it in the launching
process, with the path, the numbers and the mode in the message:

- every data dir is private (``private.check_private_dir``);
- a data dir, rank directory, slab or index that exists can be read and written by this
  process (a read-only one used to surface as a raw ``PermissionError`` once the model had
  loaded, or as an index "damaged" and moved aside);
- ``capacity`` holds at least one slot (4 KiB per data dir: the smallest a KV page of any
  model takes; the store names the real page size at open if a page does not fit);
- with ``preallocate`` (the default), each file system holding data dirs has the bytes
  their slabs still need free (a restart reuses its slab: only the growth counts).

Not known before the model loads: the KV page size and the number of ranks (each rank has
a slab of its own); the store checks both again at open.
"""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass, field

from sglang_saria.storage.config import ALIGN, StoreConfig
from sglang_saria.storage.index import INDEX_NAME
from sglang_saria.storage.layout import SLAB_NAME
from sglang_saria.storage.private import check_private_dir, writable_error

WHERE = "saria store"


def preflight(config: StoreConfig, source: str = WHERE) -> None:
    """Raise ValueError naming ``source`` (the flag) and the path or field at fault."""
    for data_dir in config.data_dirs:
        check_private_dir(data_dir)
        check_writable(data_dir)
    check_capacity(config, source)


def _mode(path: str) -> str:
    return f"{stat.S_IMODE(os.stat(path).st_mode):04o}"


def check_writable(data_dir: str) -> None:
    """A data dir (or a rank directory) and the store files in it and in its rank
    directories, where they exist, are readable and writable by this process; a missing
    one's nearest existing parent lets it be created."""
    if not os.path.exists(data_dir):
        parent = _existing_parent(data_dir)
        if os.statvfs(parent).f_flag & os.ST_RDONLY or not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{WHERE}: data dir {data_dir!r} cannot be created: {parent!r} (mode {_mode(parent)}) "
                             f"is not writable by this server (uid {os.geteuid()})")
        return
    checks = [(data_dir, "data dir", True)]
    for name in (SLAB_NAME, INDEX_NAME):
        for path in sorted(glob.glob(os.path.join(glob.escape(data_dir), name))):  # a rank directory's own
            checks.append((path, name, False))
        for path in sorted(glob.glob(os.path.join(glob.escape(data_dir), "*", name))):
            checks += [(os.path.dirname(path), "rank directory", True), (path, name, False)]
    for path, what, is_dir in dict.fromkeys(checks):
        error = writable_error(path, what, is_dir)
        if error is not None:
            raise ValueError(error)


def _existing_parent(path: str) -> str:
    at = os.path.abspath(path)
    while not os.path.exists(at):
        at = os.path.dirname(at)
    return at


@dataclass
class _FileSystem:
    free: int
    needs: dict[str, int] = field(default_factory=dict)  # data dir -> bytes its slab still needs


def check_capacity(config: StoreConfig, source: str = WHERE) -> None:
    """``capacity`` (bytes) holds a slot, and, preallocated, fits each file system's free space."""
    capacity = config.capacity.bytes
    if capacity is None:  # given in tokens: resolved against the KV size at open
        return
    dirs = config.data_dirs
    floor = ALIGN * len(dirs)
    if capacity < floor:
        raise ValueError(
            f"{source}: capacity={capacity} bytes holds no store slot: the minimum is {floor} bytes "
            f"(4 KiB x {len(dirs)} data dir(s)), and a slot holds one KV page of the model "
            "(page size x KV bytes per token), so real stores need many of them"
        )
    if not config.preallocate:
        return  # a sparse slab: a full disk shows up as refused writes (DiskFull), not at start
    slab = capacity // len(dirs)
    systems: dict[int, _FileSystem] = {}
    for data_dir in dirs:
        at = _existing_parent(data_dir)
        have = max((os.path.getsize(p) for p in glob.glob(os.path.join(glob.escape(data_dir), "*", SLAB_NAME))), default=0)
        vfs = os.statvfs(at)
        fs = systems.setdefault(os.stat(at).st_dev, _FileSystem(vfs.f_bavail * vfs.f_frsize))
        fs.needs[data_dir] = max(0, slab - have)
    for fs in systems.values():
        need = sum(fs.needs.values())
        if need > fs.free:
            where = ", ".join(repr(d) for d in fs.needs)
            raise ValueError(
                f"{source}: capacity={capacity} bytes needs {need} more bytes of slab in data dir(s) {where} "
                f"({slab} per data dir, less what their slabs hold) but that file system has {fs.free} bytes free; "
                "lower capacity or free space"
            )
