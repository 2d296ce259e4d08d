"""TraceLab loader: prefixes rebuilt from within-session lengths, times from events."""

import json
from datetime import datetime

import numpy as np
import pytest

from sglang_saria.replay.loaders.tracelab import load_tracelab
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.trace import TraceFormatError


@pytest.fixture(scope="module")
def sample(shared_dir):
    path = shared_dir / "traces" / "tracelab-sample" / "round_trace.jsonl"
    if not path.is_file():
        pytest.fail(f"TraceLab sample missing: {path}")
    return path


@pytest.fixture(scope="module")
def rows(sample):
    return [json.loads(line) for line in sample.read_text().splitlines() if line.strip()]


def _ts(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_sessions_grouped_and_ordered_by_start(sample, rows):
    sessions = load_trace(f"tracelab:{sample}", 512)
    # the codex session starts in March, the claude one in June
    assert [s.session_id.split(":")[0] for s in sessions] == ["codex", "claude"]
    by_id = {s.session_id: s for s in sessions}
    for sid, session in by_id.items():
        mine = sorted((r for r in rows if r["session_id"] == sid), key=lambda r: r["round_index"])
        assert [r.input_tokens for r in session.requests] == [r["input_tokens_total"] for r in mine]
        assert [r.output_tokens for r in session.requests] == [r["output_tokens"] for r in mine]
        assert all(r.block_keys.size == r.input_tokens // 512 for r in session.requests)


@pytest.mark.parametrize("block_tokens", [256, 512, 1024])
def test_round_reuses_exactly_the_recorded_prefix(sample, rows, block_tokens):
    sessions = {s.session_id: s for s in load_tracelab(sample, block_tokens)}
    checked = 0
    for sid, session in sessions.items():
        mine = sorted((r for r in rows if r["session_id"] == sid), key=lambda r: r["round_index"])
        for k in range(1, len(mine)):
            prev, cur = mine[k - 1], mine[k]
            shared = min(cur["prefix_tokens"], prev["input_tokens_total"] + prev["output_tokens"])
            same = min(shared // block_tokens, session.requests[k - 1].block_keys.size)
            a, b = session.requests[k - 1].block_keys, session.requests[k].block_keys
            assert np.array_equal(a[:same], b[:same])
            assert not np.isin(b[same:], a).any()  # everything after the prefix is new content
            checked += b.size > same
    assert checked > 5


def test_prefix_drop_breaks_reuse(sample):
    """codex round 3 reuses only 3456 of ~10K tokens (a partial cache hit in the recording)."""
    codex = next(s for s in load_tracelab(sample, 512) if s.session_id.startswith("codex"))
    a, b = codex.requests[2].block_keys, codex.requests[3].block_keys
    assert np.array_equal(a[:6], b[:6]) and a[6] != b[6]


def test_arrival_is_last_input_event_and_idle_follows_previous_completion(sample, rows):
    claude = next(s for s in load_tracelab(sample, 512) if s.session_id.startswith("claude"))
    r0, r1 = [r for r in rows if r["session_id"] == claude.session_id][:2]
    origin = _ts(r0["timing_events"][0]["timestamp"])
    assert claude.requests[0].t == 0.0 and claude.requests[0].idle_before_s == 0.0
    # round 1 waits for its second tool result (05:40:50.938) before it can be sent
    assert claude.requests[1].t == pytest.approx(_ts("2026-06-01T05:40:50.938Z") - origin)
    assert claude.requests[1].idle_before_s == pytest.approx(
        _ts("2026-06-01T05:40:50.938Z") - _ts(r0["timing_events"][-1]["timestamp"]))
    assert all(b.t >= a.t for a, b in zip(claude.requests, claude.requests[1:]))


def test_sessions_do_not_share_keys(sample):
    a, b = load_tracelab(sample, 256)
    keys_a = np.concatenate([r.block_keys for r in a.requests])
    keys_b = np.concatenate([r.block_keys for r in b.requests])
    assert not np.isin(keys_a, keys_b).any()


def test_max_sessions(sample):
    assert len(load_tracelab(sample, 512, max_sessions=1)) == 1


def _round(i, t0="2026-01-01T00:00:00.000Z", **extra):
    row = {"session_id": "s1", "round_index": i, "input_tokens_total": 1000 + 100 * i,
           "prefix_tokens": 900, "output_tokens": 10,
           "timing_events": [{"event_type": "user_message", "timestamp": t0}]}
    row.update(extra)
    return json.dumps(row)


@pytest.mark.parametrize("lines, message", [
    ([_round(0), "{not json"], r":2: bad JSON"),
    ([_round(0), _round(1, output_tokens=None)], r":2: missing field\(s\) output_tokens"),
    ([_round(0), _round(1, timing_events=[{"timestamp": "yesterday"}])], r":2: session s1 round 1: bad timing_events"),
    ([_round(0, t0="2026-01-01T00:00:10.000Z"), _round(1)], r":2: session s1 round 1: round arrives before"),
    ([_round(0), _round(0)], r"duplicate round_index"),
    ([_round(0, prefix_tokens=-5)], r":1: session s1 round 0: negative token count"),
])
def test_malformed_rows_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "round_trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=message) as err:
        load_tracelab(path, 512)
    assert str(path) in str(err.value)
