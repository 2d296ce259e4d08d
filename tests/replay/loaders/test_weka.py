"""WEKA loader on the real 352-file trace set and on broken copies of it."""

import gzip
import json

import numpy as np
import pytest

from sglang_saria.replay.loaders.weka import load_weka, load_weka_file
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.trace import TraceFormatError, describe

N_FILES = 352
N_SUBAGENTS = 63  # "subagent" markers across the 352 files


@pytest.fixture(scope="module")
def weka_dir(shared_dir):
    path = shared_dir / "traces" / "weka-cc"
    if len(list(path.glob("trace_*.json*"))) != N_FILES:
        pytest.fail(f"expected {N_FILES} WEKA trace files in {path}")
    return path


@pytest.fixture(scope="module")
def weka_512(weka_dir):
    return load_trace(f"weka:{weka_dir}", 512)


def _raw(weka_dir, name):
    return json.loads(gzip.decompress((weka_dir / f"{name}.json.gz").read_bytes()))


def test_every_file_is_a_session_and_every_subagent_a_child_session(weka_512):
    top = [s for s in weka_512 if s.parent_id is None]
    children = [s for s in weka_512 if s.parent_id is not None]
    assert len(top) == N_FILES and len(children) == N_SUBAGENTS
    assert [s.session_id for s in top] == sorted(s.session_id for s in top)
    # Children follow their parent, in marker order.
    last_parent = None
    for s in weka_512:
        if s.parent_id is None:
            last_parent = s.session_id
        else:
            assert s.parent_id == last_parent and s.session_id.startswith(last_parent + "/sub")
    assert all(s.requests for s in weka_512)
    assert describe(weka_512).requests == 19_818 + 676  # parent + sub-agent requests


def test_block_count_is_full_blocks_of_the_input(weka_512):
    for s in weka_512:
        for r in s.requests:
            assert r.block_keys.dtype == np.uint64
            assert r.block_keys.size == r.input_tokens // 512


def test_keys_agree_exactly_as_far_as_recorded_hash_ids_agree(weka_dir, weka_512):
    by_id = {s.session_id: s for s in weka_512}
    checked_divergent = 0
    for name in ("trace_0001", "trace_0003", "trace_0004", "trace_0010", "trace_0256"):
        recorded = [r for r in _raw(weka_dir, name)["requests"] if r["type"] != "subagent"]
        reqs = by_id[name].requests
        assert len(reqs) == len(recorded)
        for k in range(len(recorded) - 1):
            a, b = recorded[k]["hash_ids"], recorded[k + 1]["hash_ids"]
            common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            same = common // 8  # 512-token blocks whose 8 ids all agree
            ka, kb = reqs[k].block_keys, reqs[k + 1].block_keys
            assert np.array_equal(ka[:same], kb[:same])
            if same < min(ka.size, kb.size):
                checked_divergent += 1
                assert ka[same] != kb[same]
                # a key encodes its whole prefix: nothing after the divergence is shared
                assert not np.isin(kb[same:], ka[same:]).any()
    assert checked_divergent > 0


def test_keys_are_scoped_by_file_and_model(weka_dir, weka_512):
    first = {s.session_id: s.requests[0].block_keys for s in weka_512}
    # trace_0001 and trace_0002 both number their blocks from 1: same ids, different content.
    assert _raw(weka_dir, "trace_0001")["requests"][0]["hash_ids"][:8] == list(range(1, 9))
    assert _raw(weka_dir, "trace_0002")["requests"][0]["hash_ids"][:8] == list(range(1, 9))
    assert first["trace_0001"][0] != first["trace_0002"][0]
    # Sub-agents of one file launched with the same prompt share their prefix (same model, same ids).
    sub1, sub2 = first["trace_0004/sub1"], first["trace_0004/sub2"]
    assert np.array_equal(sub1[:30], sub2[:30])


def test_subagent_is_placed_at_its_recorded_launch(weka_512):
    by_id = {s.session_id: s for s in weka_512}
    sub = by_id["trace_0003/sub1"]
    # marker t=134.227 is the completion; duration 126.015 s -> launched at 8.212 s,
    # right after the parent's request 0 (t=0, api_time 7.27) completed.
    assert sub.parent_id == "trace_0003" and sub.after_request == 0
    assert sub.start_offset_s == pytest.approx(134.227 - 126.015)
    assert sub.requests[0].t == 0.0 and len(sub.requests) == 10
    # an "async_launched" marker has no duration: its t is the launch time
    asyncs = [by_id[f"trace_0295/sub{n}"] for n in range(1, 8)]
    assert any(s.start_offset_s == pytest.approx(8783.325) for s in asyncs)


def test_idle_gap_subtracts_the_recorded_api_time(weka_512):
    reqs = next(s for s in weka_512 if s.session_id == "trace_0001").requests
    assert reqs[0].idle_before_s == 0.0
    assert reqs[1].t == 19.0 and reqs[1].idle_before_s == pytest.approx(19.0 - 0.0 - 7.34)
    assert all(r.idle_before_s >= 0 for s in weka_512 for r in s.requests)


def test_max_sessions_takes_first_files_with_their_subagents(weka_dir):
    sessions = load_trace(f"weka:{weka_dir}", 1024, max_sessions=4)
    assert [s.session_id for s in sessions] == [
        "trace_0001", "trace_0002", "trace_0003", "trace_0003/sub1", "trace_0003/sub2", "trace_0004",
        "trace_0004/sub1", "trace_0004/sub2"]
    assert all(r.block_keys.size == r.input_tokens // 1024 for s in sessions for r in s.requests)


def test_native_64_token_blocks_keep_one_key_per_hash_id(weka_dir):
    s64 = load_weka_file(weka_dir / "trace_0001.json.gz", 64)[0]
    s512 = load_weka_file(weka_dir / "trace_0001.json.gz", 512)[0]
    for a, b in zip(s64.requests, s512.requests):
        assert a.block_keys.size == a.input_tokens // 64 and b.block_keys.size == b.input_tokens // 512


def test_block_tokens_not_a_multiple_is_rejected(weka_dir):
    with pytest.raises(TraceFormatError, match="block_tokens=100 must be a multiple"):
        load_weka_file(weka_dir / "trace_0001.json.gz", 100)


def test_plain_json_loads_like_gzip(weka_dir, tmp_path):
    (tmp_path / "trace_0001.json").write_bytes(gzip.decompress((weka_dir / "trace_0001.json.gz").read_bytes()))
    plain = load_weka(tmp_path, 512)[0]
    gz = load_weka_file(weka_dir / "trace_0001.json.gz", 512)[0]
    assert all(np.array_equal(a.block_keys, b.block_keys) for a, b in zip(plain.requests, gz.requests))


# --- malformed input: a clear TraceFormatError naming the file and the request --------------

def _write(tmp_path, doc, name="trace_0001.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _doc(changes=()):
    reqs = [{"t": 0.0, "type": "n", "in": 1000, "out": 10, "hash_ids": list(range(15)), "api_time": 1.0},
            {"t": 5.0, "type": "n", "in": 1100, "out": 10, "hash_ids": list(range(17)), "api_time": 1.0},
            {"t": 9.0, "type": "s", "in": 1200, "out": 10, "hash_ids": list(range(18))}]
    for (i, key), value in dict(changes).items():
        if value is None:
            del reqs[i][key]
        else:
            reqs[i][key] = value
    return {"id": "trace_0001", "block_size": 64, "requests": reqs}


def test_valid_fixture_loads(tmp_path):
    _write(tmp_path, _doc())
    (s,) = load_weka(tmp_path, 64)
    assert [r.idle_before_s for r in s.requests] == [0.0, 4.0, 3.0]


def test_same_ids_under_another_model_are_other_content(tmp_path):
    doc = _doc({(1, "hash_ids"): list(range(17)), (0, "model"): "opus", (1, "model"): "haiku",
                (2, "model"): "haiku"})
    _write(tmp_path, doc)
    a, b, c = (r.block_keys for r in load_weka(tmp_path, 64)[0].requests)
    assert not np.isin(b, a).any()  # model switch: no reuse although ids agree
    assert np.array_equal(b[:17], c[:17])  # same model again: reuse


@pytest.mark.parametrize("change, message", [
    ({(1, "in"): None}, r"request 1: missing field `in`"),
    ({(2, "t"): -1.0}, r"request 2: negative value"),
    ({(2, "t"): 4.0}, r"request 2: time goes backwards"),
    ({(1, "hash_ids"): [1, "x"]}, r"request 1: hash_ids must be non-negative integers"),
    ({(1, "hash_ids"): [1, 2]}, r"request 1: 2 hash_ids for 1100 input tokens"),
    ({(0, "t"): "soon"}, r"request 0: Expected `float`"),
])
def test_malformed_request_names_file_and_index(tmp_path, change, message):
    path = _write(tmp_path, _doc(change))
    with pytest.raises(TraceFormatError, match=message) as err:
        load_weka(tmp_path, 64)
    assert str(path) in str(err.value)


def test_truncated_gzip_is_reported(tmp_path, weka_dir):
    data = (weka_dir / "trace_0002.json.gz").read_bytes()
    (tmp_path / "trace_0002.json.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"trace_0002\.json\.gz: cannot read gzip data"):
        load_weka(tmp_path, 512)


def test_bad_json_is_reported(tmp_path):
    (tmp_path / "trace_0009.json").write_text('{"block_size": 64, "requests": [{"t": 0')
    with pytest.raises(TraceFormatError, match=r"trace_0009\.json: invalid JSON"):
        load_weka(tmp_path, 64)


def test_broken_subagent_request_names_marker_and_index(tmp_path):
    doc = _doc()
    doc["requests"].insert(1, {"t": 3.0, "type": "subagent", "duration_ms": 1000.0,
                               "requests": [{"t": 0.0, "type": "n", "in": 64, "out": 1, "hash_ids": [1]},
                                            {"t": 1.0, "type": "n", "out": 1, "hash_ids": [1]}]})
    _write(tmp_path, doc)
    with pytest.raises(TraceFormatError, match=r"request 1: subagent request 1: missing field `in`"):
        load_weka(tmp_path, 64)


def test_missing_directory_is_reported(tmp_path):
    with pytest.raises(TraceFormatError, match="no trace_"):
        load_weka(tmp_path, 64)
