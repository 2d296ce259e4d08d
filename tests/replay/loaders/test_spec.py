"""The --trace spec dispatcher."""

import pytest

from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.trace import TraceFormatError


@pytest.mark.parametrize("spec", ["weka", "weka:", "bogus:x", "synthetic:abc", "tracelab"])
def test_bad_spec_is_a_clear_error(spec):
    with pytest.raises(ValueError, match="bad trace spec"):
        load_trace(spec, 512)


def test_missing_path_names_it(tmp_path):
    with pytest.raises(TraceFormatError, match="does not exist"):
        load_trace(f"weka:{tmp_path / 'nope'}", 512)
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_trace(f"tracelab:{tmp_path / 'nope.jsonl'}", 512)


def test_bad_block_tokens():
    with pytest.raises(ValueError, match="block_tokens must be positive"):
        load_trace("synthetic", 0)
