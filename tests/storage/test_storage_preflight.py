"""What the launch check (the plugin's check, `storage/preflight.py`) finds before the model loads: a
capacity that holds no slot (naming the minimum), a capacity above the free space of the data
dir's file system (naming both numbers and the path; a restart's own slab counts as space
it has), and a read-only data dir, slab or index (naming the path and the mode), which the
store itself, opened anyway, also names instead of raising a raw PermissionError."""

from __future__ import annotations

import os
import re

import pytest

from sglang_saria.hicache.backend import check_extra_config
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.index import INDEX_NAME
from sglang_saria.storage.layout import SLAB_NAME
from sglang_saria.storage.preflight import check_capacity, preflight
from sglang_saria.storage.store import SariaStore
from tests.faults.injection import read_only

FLAG = "--hicache-storage-backend-extra-config"
RANK = "rank_tp0of1"  # the backend's directory for a tp=1 rank


def config(*dirs, capacity="1MiB", **kw) -> StoreConfig:
    return StoreConfig(data_dirs=[str(d) for d in dirs], capacity=capacity, **kw)


def free_bytes(path) -> int:
    vfs = os.statvfs(path)
    return vfs.f_bavail * vfs.f_frsize


@pytest.mark.parametrize(("ndirs", "minimum"), [(1, 4096), (2, 8192)])
def test_a_capacity_holding_no_slot_is_refused_naming_the_minimum(tmp_path, ndirs, minimum):
    dirs = [tmp_path / f"d{i}" for i in range(ndirs)]
    with pytest.raises(ValueError, match=rf"{FLAG}: capacity=1024 bytes holds no store slot: the minimum is {minimum} bytes"):
        check_extra_config(f'{{"data_dirs": {[str(d) for d in dirs]!r}, "capacity": "1KiB"}}'.replace("'", '"'))
    check_capacity(config(*dirs, capacity=minimum))


def test_a_capacity_above_the_free_space_is_refused_naming_both_numbers_and_the_path(tmp_path):
    data_dir = tmp_path / "store"
    capacity = free_bytes(tmp_path) + 2**40  # a TiB more than there is
    with pytest.raises(ValueError) as e:
        check_extra_config(f'{{"data_dirs": ["{data_dir}"], "capacity": {capacity}}}')
    message = str(e.value)
    assert message.startswith(f"{FLAG}: capacity={capacity} bytes needs {capacity} more bytes")
    assert repr(str(data_dir)) in message
    free = int(re.search(r"has (\d+) bytes free", message).group(1))
    assert 0 < free < capacity
    assert not data_dir.exists()  # checked, not created


def test_a_restart_counts_its_own_slab_as_space_it_has(tmp_path):
    data_dir = tmp_path / "store"
    (data_dir / RANK).mkdir(parents=True)
    capacity = free_bytes(tmp_path) + 2**30
    # The slab an earlier server preallocated (sparse here: the file system's free space stays).
    os.truncate(os.open(data_dir / RANK / SLAB_NAME, os.O_CREAT | os.O_WRONLY, 0o600), capacity)
    check_capacity(config(data_dir, capacity=capacity))


def test_data_dirs_on_one_file_system_need_their_slabs_together(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    capacity = 2 * (free_bytes(tmp_path) // 2 + 2**30)  # each half fits alone, both do not
    with pytest.raises(ValueError, match=r"in data dir\(s\) '.*a', '.*b' "):
        check_capacity(config(*dirs, capacity=capacity))


def test_sparse_slabs_and_capacities_in_tokens_are_not_held_to_the_free_space(tmp_path):
    huge = free_bytes(tmp_path) + 2**40
    check_capacity(config(tmp_path / "s", capacity=huge, preallocate=False))
    check_capacity(config(tmp_path / "t", capacity=f"{huge} tokens"))


def closed_store(data_dir) -> str:
    """A rank directory as a stopped server leaves it (slab and index)."""
    rank_dir = data_dir / RANK
    SariaStore(config(rank_dir, slot_bytes="64KiB"), victim_order=SSDVictimOrder()).close()
    return rank_dir


def test_a_read_only_data_dir_is_refused_naming_path_and_mode(tmp_path):
    data_dir = tmp_path / "store"
    data_dir.mkdir(mode=0o700)
    with read_only(data_dir):
        with pytest.raises(ValueError, match=rf"data dir '{data_dir}' (\(mode 0700\) is on a read-only file system|has mode 0500)"):
            preflight(config(data_dir))
        with pytest.raises(ValueError, match=rf"data dir '{data_dir}' .*mode 0[57]00"):
            SariaStore(config(data_dir, slot_bytes="64KiB"), victim_order=SSDVictimOrder())


@pytest.mark.parametrize("name", [SLAB_NAME, INDEX_NAME])
def test_a_read_only_store_file_is_refused_at_launch_naming_path_and_mode(tmp_path, name):
    data_dir = tmp_path / "store"
    path = closed_store(data_dir) / name
    with read_only(path):
        with pytest.raises(ValueError, match=rf"{name} '{path}' (\(mode 0600\) is on a read-only|has mode 0400)"):
            preflight(config(data_dir))
    preflight(config(data_dir))  # writable again: nothing else in the way


def test_a_read_only_slab_opened_anyway_is_named_not_a_raw_permission_error(tmp_path):
    rank_dir = closed_store(tmp_path / "store")
    with read_only(rank_dir / SLAB_NAME):
        with pytest.raises(ValueError, match=rf"slab '{rank_dir / SLAB_NAME}' .*mode 0[46]00"):
            SariaStore(config(rank_dir, slot_bytes="64KiB"), victim_order=SSDVictimOrder())
