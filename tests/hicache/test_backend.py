"""The `saria` HiCache backend through SGLang's own host pool objects, on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.hicache.sglang_pools import PAGE, fill_random, mamba_host_pool, mha_host_pool, pages, storage_config

warnings.filterwarnings("ignore", category=UserWarning)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)

from sglang_saria.hicache.backend import SariaStorage, check_extra_config, configs_from_extra  # noqa: E402
from sglang_saria.mem_cache.admission_factory import make_admission_policy  # noqa: E402


def page_bytes(pool, index: int) -> torch.Tensor:
    return pool.get_data_page(index, flat=True).view(torch.uint8).clone()


@pytest.fixture
def extra(tmp_path):
    return {"data_dirs": [str(tmp_path / "nvme0"), str(tmp_path / "nvme1")], "capacity": "32MiB"}


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_v1_zero_copy_round_trip_through_mha_host_pool(extra, layout):
    pool = mha_host_pool(layout)
    fill_random(pool.get_hybrid_pool_buffer())
    backend = SariaStorage(storage_config(extra), pool)
    assert backend._views["kv"].zero_copy
    keys = [f"h{i}" for i in range(6)]
    src = pages(pool, 1, 6)
    originals = [page_bytes(pool, int(i)) for i in src[::PAGE]]
    assert backend.batch_set_v1(keys, src) == [True] * 6
    assert backend.batch_exists(keys + ["nope"]) == 6

    dst = pages(pool, 20, 6)
    assert backend.batch_get_v1(keys, dst) == [True] * 6
    for orig, i in zip(originals, dst[::PAGE]):
        assert torch.equal(page_bytes(pool, int(i)), orig)

    # SGLang's generic path (flat dummy pages + set_from_flat_data_page) reads the same bytes.
    flats = [pool.get_dummy_flat_data_page() for _ in keys]
    got = backend.batch_get(keys, flats)
    for orig, flat in zip(originals, got):
        assert flat is not None and torch.equal(flat.view(torch.uint8), orig)
    stats = backend.get_stats()
    assert stats.backup_pgs == [6] and stats.prefetch_pgs == [6]
    backend.close()

    # Restart: a new backend on the same dirs serves the pages.
    again = SariaStorage(storage_config(extra), pool)
    assert again.batch_exists(keys) == 6
    assert again.batch_get_v1(keys[:1], pages(pool, 40, 1)) == [True]
    assert torch.equal(page_bytes(pool, 40 * PAGE), originals[0])
    again.close()


def test_legacy_set_get_and_wrong_size_page(extra):
    pool = mha_host_pool("page_first")
    fill_random(pool.get_hybrid_pool_buffer())
    backend = SariaStorage(storage_config(extra), pool)
    page = pool.get_data_page(PAGE, flat=True)
    assert backend.set("p", page)
    out = pool.get_dummy_flat_data_page()
    assert backend.get("p", out) is out and torch.equal(out.view(torch.uint8), page.view(torch.uint8))
    assert backend.get("p", torch.zeros(10, dtype=torch.bfloat16)) is None  # wrong size: miss
    assert backend.batch_set(["q", "r"], [page, page])
    assert backend.batch_get_v1(["p"], torch.arange(5)) == [False]  # index count mismatch
    backend.close()


def test_mamba_sidecar_through_v2_pool_transfers(extra):
    kv_pool = mha_host_pool("page_first")
    mamba = mamba_host_pool()
    fill_random(kv_pool.get_hybrid_pool_buffer())
    fill_random(mamba.get_hybrid_pool_buffer())
    backend = SariaStorage(storage_config(extra), kv_pool)
    backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    assert backend._views[str(PoolName.MAMBA)].zero_copy
    keys = [f"m{i}" for i in range(4)]
    assert backend.batch_set_v1(keys, pages(kv_pool, 1, 4)) == [True] * 4
    # A Mamba checkpoint only for the last page (trailing-pages policy).
    tail = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([2]), keys=keys[-1:])
    saved = page_bytes(mamba, 2)
    assert backend.batch_set_v2([tail]) == {PoolName.MAMBA: [True]}

    query = PoolTransfer(name=PoolName.MAMBA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    hit = backend.batch_exists_v2(keys, [query])
    assert hit.kv_hit_pages == 4 and hit.restorable_prefix_pages == [4]
    assert hit.extra_pool_hit_pages[PoolName.MAMBA] == 4
    # Without the checkpoint the prefix is not restorable at 4 pages.
    other = PoolTransfer(name=PoolName.MAMBA, keys=keys[:1], hit_policy=PoolHitPolicy.ALL_PAGES)
    assert backend.batch_exists_v2(keys, [other]).kv_hit_pages == 0

    load = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([6]), keys=keys[-1:])
    assert backend.batch_get_v2([load]) == {PoolName.MAMBA: [True]}
    assert torch.equal(page_bytes(mamba, 6), saved)
    backend.close()


def test_store_evictions_reach_listeners_as_page_hashes(extra, tmp_path):
    pool = mha_host_pool("page_first")
    fill_random(pool.get_hybrid_pool_buffer())
    small = {**extra, "capacity": str(4 * 16 * 1024)}  # room for 4 pages of 16 KiB
    backend = SariaStorage(storage_config(small), pool)
    seen = []
    backend.add_evict_listener(seen.extend)
    keys = [f"{i:04x}" for i in range(6)]
    assert backend.batch_set_v1(keys, pages(pool, 1, 6)) == [True] * 6
    # Two write threads commit concurrently, so which two pages were least recent is not fixed.
    assert len(seen) == 2 and all(pool_name == "kv" for _, pool_name in seen)
    evicted = {key for key, _ in seen}
    assert evicted < set(keys)
    assert [backend.exists(k) for k in keys] == [k not in evicted for k in keys]
    assert backend.split_storage_key(backend.storage_key("ab12", "mamba")) == ("ab12", "mamba")
    backend.close()


def test_extra_config_unknown_key_is_named_policy_keys_accepted(extra):
    with pytest.raises(ValueError, match="'capacty'"):
        SariaStorage(storage_config({**extra, "capacty": "1GiB"}))
    backend = SariaStorage(storage_config({**extra, "admission": "combined:E2R8", "interface_v1": 1}))
    assert backend.policy_config.admission.policy == "combined:E2R8"
    assert backend.store is None  # opened when SGLang registers the host pool
    backend.close()


def test_without_data_dirs_the_store_lives_in_this_users_cache_dir(monkeypatch, tmp_path):
    """Not in shared /tmp, where another user could make the directory first."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store_config, _ = configs_from_extra({"capacity": "32MiB"})
    assert store_config.data_dirs == [str(tmp_path / "cache" / "sglang-saria" / "store")]


@pytest.mark.parametrize(("raw", "message"), [
    ('{"data_dirs": [', "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ("null", "must be a JSON object"),
])
def test_launch_check_names_the_flag_of_malformed_extra_config(raw, message):
    with pytest.raises(ValueError, match=f"--hicache-storage-backend-extra-config: {message}"):
        check_extra_config(raw)


def test_launch_check_refuses_a_foreign_or_shared_data_dir_before_creating_anything(tmp_path):
    """The store's own refusal, at launch (the plugin's check) rather than after the model loads."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match=r"writable by group or others.*mode 0777"):
        check_extra_config(f'{{"data_dirs": ["{shared}"]}}')
    fresh = tmp_path / "not-yet" / "store"
    check_extra_config(f'{{"data_dirs": ["{fresh}"], "capacity": "64MiB"}}')
    assert not fresh.parent.exists()  # checked, not created: the store makes it when it opens


@pytest.mark.parametrize("name", ["saria-index.sqlite", "saria-slab.dat"])
def test_a_read_only_store_file_found_when_the_backend_opens_is_named_with_its_mode(tmp_path, name):
    """At runtime attach no launch check ran: the backend checks its rank directory before the
    store opens it (a read-only index would otherwise be a raw OSError, or moved aside as damaged)."""
    from tests.faults.injection import read_only

    config = storage_config({"data_dirs": [str(tmp_path / "store")], "capacity": "32MiB"})
    SariaStorage(config, mha_host_pool("page_first_direct")).close()
    path = tmp_path / "store" / "rank_tp0of1" / name
    with read_only(path):
        with pytest.raises(ValueError, match=rf"{name} '{path}' (\(mode 0600\) is on a read-only file system|has mode 0400)"):
            SariaStorage(config, mha_host_pool("page_first_direct"))
    assert sorted(p.name for p in path.parent.iterdir() if "damaged" in p.name) == []


def test_auto_on_a_rated_drive_holds_that_drives_budget():
    """`auto` with a drive_rating in the extra-config is auto:<its DWPD> on the rated capacity (issue 26)."""
    rating = {"capacity": "1.92TB", "dwpd": 1, "years": 5}
    _, config = configs_from_extra({"capacity": "32MiB", "admission": "auto", "drive_rating": rating})
    assert config.admission.policy == "auto:1" and config.admission.budget_capacity_bytes == 1_920_000_000_000
    admission = make_admission_policy(config.admission.policy, config.admission, ssd_capacity_bytes=32 << 20)
    assert admission.name == "auto:1" and admission.budget.budget == pytest.approx(1.92e12)  # a day's bytes
    _, unrated = configs_from_extra({"capacity": "32MiB", "admission": "auto"})
    assert unrated.admission.policy == "auto"
    _, fixed = configs_from_extra({"capacity": "32MiB", "admission": "eviction:E2", "drive_rating": rating})
    assert fixed.admission.policy == "eviction:E2"  # a rating alone changes no other policy
