"""One units module: sizes, token counts, durations and drive ratings parse the same everywhere."""

import pytest

from sglang_saria.units import ConfigError, DriveRating, parse_bytes, parse_count, parse_duration_s, parse_positive


@pytest.mark.parametrize("text, seconds", [("12h", 43200), ("40m", 2400), ("90s", 90), ("3600", 3600), (3600, 3600),
                                           ("1.5h", 5400), ("2d", 172800), (" 4H ", 14400)])
def test_durations(text, seconds):
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "12x", "-3h", "1h30m", "twelve", 0, True])
def test_bad_durations_name_the_field_and_value(text):
    with pytest.raises(ConfigError, match=rf"--window={text!r}"):
        parse_duration_s(text, "--window")


@pytest.mark.parametrize("text, tokens", [("1M", 1_000_000), ("10M", 10_000_000), ("512k", 512_000),
                                          ("2.5M", 2_500_000), ("4096", 4096), (65536, 65536), ("1G", 10**9), (0, 0)])
def test_token_counts(text, tokens):
    assert parse_count(text) == tokens


@pytest.mark.parametrize("text", ["", "M", "1T", "-1M", "lots", -5, 1.5, False])
def test_bad_token_counts_name_the_field_and_value(text):
    with pytest.raises(ConfigError, match=rf"--ssd-tokens={text!r}"):
        parse_count(text, "--ssd-tokens")


@pytest.mark.parametrize("text, n", [("4KiB", 4096), ("1.5GB", 1_500_000_000), ("1.92TB", 1_920_000_000_000),
                                     ("4TiB", 4 * 2**40), (4096, 4096)])
def test_sizes_use_decimal_and_binary_units(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["lots", "1XB", "0", -1, True])
def test_bad_sizes_name_the_field_and_value(text):
    with pytest.raises(ConfigError, match=rf"capacity={text!r}"):
        parse_bytes(text, "capacity")


def test_drive_rating_parses_each_key_and_names_a_bad_one():
    d = DriveRating.parse({"capacity": "1.92TB", "dwpd": 1, "years": 5})
    assert d.rated_write_bytes == pytest.approx(1.92e12 * 365 * 5) and d.bytes_per_day == 1.92e12
    with pytest.raises(ConfigError, match=r"drive_rating.dwpd=0: must be a positive number"):
        DriveRating.parse({"capacity": "1TB", "dwpd": 0, "years": 5})
    with pytest.raises(ConfigError, match=r"drive_rating.years is required"):
        DriveRating.parse({"capacity": "1TB", "dwpd": 1})
    with pytest.raises(ConfigError, match=r"--years='x': not a number"):
        parse_positive("x", "--years")
