"""`make demo` says what it shows: its printed summary agrees with its own per-turn table (SGLang's
cache reports), and its docstring promises each summary line and no more than the run shows."""

from __future__ import annotations

import re

import pytest

from sglang_saria import demo

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROW = re.compile(r"^\s*([12])\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+$")


def table(out: str) -> list[dict]:
    """The per-turn rows the demo printed."""
    keys = ("server", "session", "turn", "prompt", "device", "host", "storage", "computed")
    rows = []
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            row = dict(zip(keys, m.groups()))
            rows.append({k: v if k == "session" else int(v) for k, v in row.items()})
    return rows


def expected_summary(rows: list[dict], page: int) -> list[str]:
    """The summary's restart lines recomputed from the table alone."""
    before = [r for r in rows if r["server"] == 1]
    after = [r for r in rows if r["server"] == 2]
    cached = {t: sum(r[t] for r in before) for t in ("device", "host", "storage")}
    total = sum(cached.values())
    lines = [f"before the restart: {total} of {sum(r['prompt'] for r in before)} prompt tokens cached "
             f"(device {cached['device']}, host {cached['host']}, storage {cached['storage']})"]
    sessions = sorted({r["session"] for r in rows})
    first_turn = {s: min(r["turn"] for r in after if r["session"] == s) for s in sessions}
    lines.append("first round after the restart: "
                 f"{sum(r['storage'] for r in after if r['turn'] == first_turn[r['session']])} prompt tokens found in the store")
    last_prompt = {s: max((r for r in before if r["session"] == s), key=lambda r: r["turn"])["prompt"] for s in sessions}
    for nth, name in ((0, "first"), (1, "second")):
        hits = [r["device"] + r["host"] + r["storage"] >= last_prompt[r["session"]] // page * page
                for r in after if r["turn"] == first_turn[r["session"]] + nth]
        lines.append(f"sessions that found their whole history from before the restart at their {name} turn after it: "
                     f"{sum(hits)} of {len(hits)}")
    return lines


def test_the_demos_summary_is_its_table_and_its_docstring_promises_it(tmp_path, capsys):
    assert demo.main(["--out", str(tmp_path), "--rounds", "2", "2"]) == 0
    out = capsys.readouterr().out
    rows = table(out)
    assert len(rows) == 4 * (2 + 2)
    for r in rows:  # every prompt token is cached in one tier or computed
        assert r["device"] + r["host"] + r["storage"] + r["computed"] == r["prompt"]
    summary = expected_summary(rows, demo.PAGE_TOKENS)
    printed = out.splitlines()
    for line in summary:
        assert line in printed, f"the demo did not print {line!r}"
    doc = " ".join(demo.__doc__.split())
    for promise in ("before the restart: the prompt tokens found cached, by tier",
                    "the first round after the restart: the prompt tokens found in the store",
                    "how many sessions found their whole history before the restart"):
        assert promise in doc
    # what a run shows: the restart keeps the store (the first round finds tokens there) ...
    first_round_storage = int(re.search(r"first round after the restart: (\d+)", summary[1]).group(1))
    assert first_round_storage > 0
    # ... and every session finds its whole history there at its first and second turn after it,
    # but for the reloads the server gave up (read slower than computing, on a loaded machine)
    assert "at their second: on an idle machine every one, at both" in doc
    assert "had its reload given up, counted in the reloads line's fallbacks" in doc
    missed = sum(int(n) - int(found) for found, n in (re.search(r"(\d+) of (\d+)$", line).groups() for line in summary[2:]))
    fallbacks = int(re.search(r"^reloads: .*; fallbacks (\d+)", out, re.MULTILINE).group(1))
    assert missed <= fallbacks, out
