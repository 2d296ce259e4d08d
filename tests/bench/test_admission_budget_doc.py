"""docs/admission.md's `saria-admission-budget` section recomputed from docs/data/admission.json's
per-policy rows (the raw records of each replay), independently of the script: every cell of the
checks table (the two checks re-derived from the rows), every cell of the policies table, and the
figures the prose quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_saria.bench import doc_blocks
from sglang_saria.model_specs import get_model_spec

ROOT = Path(__file__).resolve().parents[2]
FIXED = ("eviction:E1", "eviction:E2", "eviction:E3", "eviction:E5")


def _data() -> dict:
    return json.loads((ROOT / "docs" / "data" / "admission.json").read_text())


def _doc() -> str:
    return (ROOT / "docs" / "admission.md").read_text()


def _table(name: str) -> list[list[str]]:
    text = doc_blocks.blocks(_doc(), "admission-budget")[name]
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]


def _settings(rows: list[dict]) -> dict[tuple, dict[tuple, dict]]:
    out: dict[tuple, dict[tuple, dict]] = {}
    for r in rows:
        out.setdefault((r["workload"], r["model"], r["prefill_tps"]), {})[r["policy"], r["hints"]] = r
    return out


def _checks(data: dict) -> dict[tuple, dict]:
    """The two checks of each setting, from its rows: budget (loadaware:R within R capacities a day, CHAR
    at least the best fixed threshold's within it), bound (where FD's CHAR >= 0.95: loadaware <= 1.5x the
    oracle's writes at CHAR within 0.02 of FD's)."""
    out = {}
    rating = data["dwpd"]
    for key, at in _settings(data["rows"]).items():
        fd, auto, oracle, capped = at["full-duplicate", "none"], at["loadaware", "none"], at["oracle", "none"], at[f"loadaware:{rating:g}", "none"]
        best = max((at[p, "none"]["char"] for p in FIXED if at[p, "none"]["peak_day_norm"] <= rating), default=0.0)
        vs = lambda r: r["writes_norm"] / oracle["writes_norm"]  # noqa: E731
        out[key] = {"capped_day": capped["peak_day_norm"], "capped_char": capped["char"], "best": best,
                    "budget": capped["peak_day_norm"] <= rating * 1.001 and capped["char"] >= best,
                    "fd_char": fd["char"], "loadaware_vs": vs(auto), "loadaware_dchar": auto["char"] - fd["char"],
                    "end_vs": vs(at["loadaware", "end"]), "end_dchar": at["loadaware", "end"]["char"] - fd["char"],
                    "bound": None if fd["char"] < 0.95 else vs(auto) <= 1.5 and auto["char"] - fd["char"] >= -0.02}
    return out


def _close(cell: str, value: float) -> None:
    body = cell.rstrip("x").replace(",", "")
    decimals = len(body.split(".")[1]) if "." in body else 0
    assert float(body) == pytest.approx(value, abs=0.5 * 10**-decimals + 1e-6), (cell, value)


def test_the_checks_table_is_recomputed_from_the_rows():
    checks = _checks(_data())
    table = _table("checks")
    assert len(table) == len(checks)
    verdict = {None: "-", True: "met", False: "**unmet**"}
    for cells in table:
        c = checks[cells[0], cells[1], float(cells[2].replace(",", ""))]
        for cell, value in zip(cells[3:6], (c["capped_day"], c["capped_char"], c["best"])):
            _close(cell, value)
        assert cells[6] == verdict[c["budget"]] and cells[12] == verdict[c["bound"]]
        for cell, value in zip(cells[7:12], (c["fd_char"], c["loadaware_vs"], c["loadaware_dchar"], c["end_vs"], c["end_dchar"])):
            _close(cell, value)


def test_every_policy_row_is_the_jsons_and_its_ratios_are_recomputed():
    data = _data()
    settings = _settings(data["rows"])
    table = _table("rows")
    assert len(table) == len(data["rows"])
    for cells in table:
        key = (cells[0], cells[1], float(cells[3].replace(",", "")))
        r, at = settings[key][cells[4], cells[5]], settings[key]
        assert cells[2] == (r["placement"] if get_model_spec(r["model"]).is_hybrid else "-")
        oracle, fd = at["oracle", "none"], at["full-duplicate", "none"]
        values = (r["writes_norm"], r["peak_day_norm"], r["writes_norm"] / oracle["writes_norm"], r["char"],
                  r["char"] - fd["char"], r["ttft_mean_s"], r["ttft_p90_s"])
        for cell, value in zip(cells[6:], values):
            _close(cell, value)


def _span(values: list[float], fmt: str, sep: str = "-") -> str:
    """"lo-hi" as the prose writes a range; one value when both ends print alike."""
    lo, hi = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return lo if lo == hi else f"{lo}{sep}{hi}"


def test_hybrid_rows_place_states_as_sglang_does():
    """Every hybrid row was replayed with SGLang 0.5.23's GDN state placement."""
    for r in _data()["rows"]:
        if get_model_spec(r["model"]).is_hybrid:
            assert r.get("placement") == "sglang", (r["workload"], r["model"], r["prefill_tps"], r["policy"])


def _loads(keys) -> str:
    """Loads as the prose lists them: "6,500, 8,000 and 10,000"."""
    names = [f"{k[2]:,.0f}" for k in sorted(keys, key=lambda k: k[2])]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def test_each_figure_the_prose_quotes_is_recomputed():
    data, text = _data(), " ".join(_doc().split())
    checks, settings = _checks(data), _settings(data["rows"])
    fa = {k: c for k, c in checks.items() if k[:2] == ("weka", "qwen3-8b")}
    hybrid = {k: c for k, c in checks.items() if k[:2] == ("weka", "qwen3.5-9b")}
    weka = {**fa, **hybrid}
    synthetic = {k: c for k, c in checks.items() if k[0] == "synthetic"}
    over_budget = {k: c for k, c in hybrid.items() if not c["budget"]}
    off_bound = {k: c for k, c in hybrid.items() if not c["bound"]}
    synthetic_met = [k for k, c in synthetic.items() if c["bound"]]
    synthetic_off = [c for c in synthetic.values() if not c["bound"]]
    e1 = [at["eviction:E1", "none"]["writes_norm"] for k, at in settings.items() if k[0] == "synthetic"]
    phrases = [
        f"`loadaware` writes {_span([c['loadaware_vs'] for c in fa.values()], '.2f')}x the oracle bound at CHAR within "
        f"{_span([-c['loadaware_dchar'] for c in fa.values()], '.3f')} of full duplicate's",
        f"`loadaware:8` keeps its budget with CHAR {_span([c['capped_char'] for c in fa.values()], '.3f')}",
        f"the budget check is unmet at {len(over_budget)} of {len(hybrid)} loads ({_loads(over_budget)} tokens/s)",
        f"`loadaware:8` reaches CHAR {_span([c['capped_char'] for c in over_budget.values()], '.3f')} against E2's "
        f"{_span([c['best'] for c in over_budget.values()], '.3f')}",
        f"(peak day {_span([c['capped_day'] for c in hybrid.values()], '.2f')} C against the {data['dwpd']:g}-C budget",
        *(f"at {k[2]:,.0f} tokens/s {c['capped_day']:.3f} C, just over it" for k, c in hybrid.items()
          if c["capped_day"] > data["dwpd"]),
        *([f"bound is unmet at {_loads(off_bound)} tokens/s (CHAR "
           f"{_span([-c['loadaware_dchar'] for c in off_bound.values()], '.4f')} below FD's"] if off_bound else
          [f"The bound holds at all {len(hybrid)} loads"]),
        f"`loadaware` writes {_span([c['loadaware_vs'] for c in hybrid.values()], '.2f')}x the oracle bound there",
        f"E1 writes {max(e1):.1f} C in a {data['dwpd']:g}-C day",
        f"leaves the budget unspent (CHAR {_span([c['capped_char'] for c in synthetic.values()], '.3f')})",
        f"the bound holds only on {synthetic_met[0][1]} at {synthetic_met[0][2]:,.0f} tokens/s",
        f"elsewhere `loadaware`'s CHAR is {_span([-c['loadaware_dchar'] for c in synthetic_off], '.3f')} below FD's",
        f"With `end` hints `loadaware` writes {_span([c['end_vs'] for c in weka.values()], '.2f', 'x-')}x the bound on WEKA",
        f"Clairvoyant return hints reach CHAR {_span([at['loadaware', 'next']['char'] for at in settings.values()], '.3f')} on every setting",
    ]
    assert all(c["budget"] and c["bound"] for c in fa.values())
    assert all(c["best"] == settings[k]["eviction:E2", "none"]["char"] for k, c in weka.items())  # "E2's"
    assert not any(c["budget"] for c in synthetic.values()) and len(synthetic_met) == 1
    for phrase in phrases:
        assert phrase in text, f"docs/admission.md does not say {phrase!r}"
