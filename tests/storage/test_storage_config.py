"""Extra-config parsing: store keys taken from the shared dict, bad keys named."""

import pytest

from sglang_saria.storage.config import Capacity, StoreConfig
from sglang_saria.units import parse_bytes


def test_store_keys_are_taken_and_policy_keys_are_left_alone():
    cfg = StoreConfig.from_extra_config(
        {
            "data_dirs": ["/a", "/b"],
            "capacity": "64GiB",
            "engine": "posix",
            "read_threads": 8,
            "write_threads": 2,
            "slot_bytes": "256KiB",
            "o_direct": "off",
            "drive_rating": {"capacity": "3.84TB", "dwpd": 1, "years": 5},
            "admission": "combined:E2R8",
        },
        other_known_keys={"admission"},
    )
    assert cfg.data_dirs == ["/a", "/b"]
    assert cfg.capacity.bytes == 64 * 2**30
    assert cfg.slot_bytes == 256 * 1024
    assert cfg.drive_rating.rated_write_bytes == pytest.approx(3.84e12 * 365 * 5)


def test_unknown_key_is_named():
    with pytest.raises(ValueError, match="'data_dir'"):
        StoreConfig.from_extra_config({"data_dir": "/a"})


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"data_dirs": ["/a"], "engine": "gds"}, "engine='gds'"),
        ({"data_dirs": ["/a"], "capacity": "lots"}, "capacity='lots'"),
        ({"data_dirs": ["/a"], "read_threads": 0}, "read_threads=0"),
        ({"data_dirs": ["/a"], "o_direct": "yes"}, "o_direct='yes'"),
        ({"data_dirs": []}, "data_dirs"),
        ({"data_dirs": ["/a", "/a"]}, "duplicates"),
        ({"data_dirs": ["/a"], "drive_rating": {"capacity": "1TB", "dwpd": 1}}, "drive_rating.years"),
        (
            {"data_dirs": ["/a"], "drive_rating": {"capacity": "1TB", "dwpd": 1, "years": 5, "tbw": 3}},
            "drive_rating.tbw",
        ),
        ({"data_dirs": ["/a"], "sync_writes": "yes"}, "sync_writes"),
        ({}, "data_dirs is required"),
    ],
)
def test_invalid_values_are_named(extra, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        StoreConfig.from_extra_config(extra)


def test_sizes_and_token_capacity():
    assert parse_bytes("4KiB", "x") == 4096
    assert parse_bytes("1.5GB", "x") == 1_500_000_000
    assert Capacity.parse("10M tokens").resolve(bytes_per_token=100) == 10**9
    assert Capacity.parse({"tokens": 5}).resolve(bytes_per_token=8) == 40
    with pytest.raises(ValueError, match="bytes per token"):
        Capacity.parse("10Mtok").resolve(bytes_per_token=None)
