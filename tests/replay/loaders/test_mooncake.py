"""Mooncake loader on a small fixture written by the test (global 512-token hash ids)."""

import json

import numpy as np
import pytest

from sglang_saria.replay.loaders.mooncake import load_mooncake
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.trace import TraceFormatError

ROWS = [
    {"timestamp": 0, "input_length": 1500, "output_length": 20, "hash_ids": [0, 1, 2]},
    {"timestamp": 1200, "input_length": 2100, "output_length": 30, "hash_ids": [0, 1, 3, 4, 5]},
    {"timestamp": 1200, "input_length": 600, "output_length": 5, "hash_ids": [6, 7]},
    {"timestamp": 4000, "input_length": 2048, "output_length": 8, "hash_ids": [0, 1, 3, 4]},
]


def _write(tmp_path, rows, name="trace.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_each_request_is_a_session_and_prefixes_are_shared_globally(tmp_path):
    sessions = load_trace(f"mooncake:{_write(tmp_path, ROWS)}", 512)
    assert len(sessions) == 4 and all(len(s.requests) == 1 for s in sessions)
    assert [s.start_offset_s for s in sessions] == [0.0, 1.2, 1.2, 4.0]
    k = [s.requests[0].block_keys for s in sessions]
    assert [x.size for x in k] == [2, 4, 1, 4]  # full 512-token blocks only
    assert np.array_equal(k[0][:2], k[1][:2])  # ids 0,1 shared by requests 0 and 1
    assert np.array_equal(k[1], k[3])  # same ids 0,1,3,4 -> same keys
    assert k[2][0] not in k[0]


def test_regroup_to_larger_and_smaller_blocks(tmp_path):
    path = _write(tmp_path, ROWS)
    big = load_mooncake(path, 1024)
    assert [s.requests[0].block_keys.size for s in big] == [1, 2, 0, 2]
    assert big[0].requests[0].block_keys[0] == big[1].requests[0].block_keys[0]
    small = load_mooncake(path, 256)
    assert [s.requests[0].block_keys.size for s in small] == [5, 8, 2, 8]
    # request 0 and 1 agree on ids 0,1 = 1024 tokens = 4 blocks of 256, then differ
    a, b = small[0].requests[0].block_keys, small[1].requests[0].block_keys
    assert np.array_equal(a[:4], b[:4]) and a[4] != b[4]


def test_source_block_size_is_a_parameter(tmp_path):
    rows = [{"timestamp": 0, "input_length": 300, "output_length": 1, "hash_ids": [9, 8, 7]}]
    (s,) = load_mooncake(_write(tmp_path, rows), 128, source_block_tokens=128)
    assert s.requests[0].block_keys.size == 2


def test_session_field_groups_rows(tmp_path):
    rows = [dict(r, session_id="a" if i % 2 == 0 else "b") for i, r in enumerate(ROWS)]
    sessions = load_mooncake(_write(tmp_path, rows), 512)
    assert [s.session_id for s in sessions] == ["a", "b"]
    a = sessions[0].requests
    assert [r.t for r in a] == [0.0, 1.2] and [r.idle_before_s for r in a] == [0.0, 1.2]
    assert sessions[1].start_offset_s == 1.2 and sessions[1].requests[1].t == pytest.approx(2.8)


def test_max_sessions(tmp_path):
    assert len(load_mooncake(_write(tmp_path, ROWS), 512, max_sessions=2)) == 2


@pytest.mark.parametrize("bad, message", [
    ("{oops", r":2 \(request 1\): bad JSON"),
    ({"timestamp": 5, "input_length": 10, "output_length": 1}, r":2 \(request 1\): missing field `hash_ids`"),
    ({"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}, r"`timestamp` must be a non-negative"),
    ({"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": ["x"]}, r"hash_ids must be a list of non-negative"),
    ({"timestamp": 5, "input_length": 5000, "output_length": 1, "hash_ids": [1]}, r"1 hash_ids for 5000 input tokens"),
])
def test_malformed_rows_name_file_line_and_request(tmp_path, bad, message):
    path = _write(tmp_path, [ROWS[0], bad])
    with pytest.raises(TraceFormatError, match=message) as err:
        load_mooncake(path, 512)
    assert str(path) in str(err.value)


def test_time_going_backwards_is_rejected(tmp_path):
    with pytest.raises(TraceFormatError, match=r":3 \(request 2\): timestamp goes backwards"):
        load_mooncake(_write(tmp_path, [ROWS[0], ROWS[3], ROWS[1]]), 512)


def test_incompatible_block_size(tmp_path):
    with pytest.raises(TraceFormatError, match="block_tokens=300"):
        load_mooncake(_write(tmp_path, ROWS), 300)
