"""Figure 10 twice: the server run's sessions through the replay, and the comparison table.

Why: the replay chooses thresholds for production (`saria-replay`, `saria-plan`), so its
orderings of the policies must be the server's. This feeds the replay exactly the server
benchmark's workload: the same conversations with the chat template the server applies
(byte-level tokenizer: token = byte; ChatML), each assistant reply stood in for by
``output_len`` unique tokens (the real replies are random-model text nobody reuses), pages
of the server's ``page_size`` as blocks, the same think times, all sessions starting at
once, the server's host pool as DRAM (HiCache writes every device page through to host
memory, so the host pool holds the device's pages too) and the store's capacity as the SSD
(stock `file`'s too when the server bounded it to the same bytes; as large as everything the
workload computes when it did not).
The prefill rate is the one measured on the machine that served (``measure_prefill_tps``).

Configurations map as: `dram-only` -> policy `none`; `hicache-file` -> `full-duplicate` with
full promotion (HiCache stages every storage hit into host memory); saria policies -> the
same policy with saria's promotion.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from sglang_saria.bench.configs import DRAM_ONLY, HICACHE_FILE, Pools, Prepared
from sglang_saria.agents.tokenizer import IM_END, IM_START
from sglang_saria.config import AdmissionConfig, CapacityConfig, MetadataConfig, PromotionConfig, SariaConfig
from sglang_saria.model_specs import ModelSpec, spec_from_hf_config
from sglang_saria.replay.report import md_table
from sglang_saria.replay.trace import TraceRequest, TraceSession, chain_keys, scope_seed

# Token ids of the tiny models' special tokens (agents/tokenizer.py: they follow the 256 bytes).
SPECIAL_IDS = {IM_START: 257, IM_END: 258}


def _text_ids(text: str) -> list[int]:
    return list(text.encode())


def _message_ids(role: str, content_ids: list[int]) -> list[int]:
    """`<|im_start|>role\\ncontent<|im_end|>\\n`, as the ChatML template renders it."""
    return [SPECIAL_IDS[IM_START], *_text_ids(f"{role}\n"), *content_ids, SPECIAL_IDS[IM_END], *_text_ids("\n")]


def reply_ids(conversation: int, turn: int, length: int) -> list[int]:
    """A stand-in reply: ``length`` byte tokens, unique per conversation and turn."""
    digest = xxhash.xxh3_128_digest(f"{conversation}/{turn}".encode())
    return [33 + b % 90 for b in (digest * (length // len(digest) + 1))[:length]]


def turn_token_ids(conversation: list[dict], index: int, k: int, output_len: int) -> list[int]:
    """The prompt of turn ``k``: every earlier message and reply, then the generation prompt."""
    ids: list[int] = []
    for j in range(k + 1):
        for message in conversation[j]["messages"]:
            ids += _message_ids(message["role"], _text_ids(message["content"]))
        if j < k:
            ids += _message_ids("assistant", reply_ids(index, j, output_len))
    return ids + [SPECIAL_IDS[IM_START], *_text_ids("assistant\n")]


def replay_sessions(prepared: Prepared, page_size: int, output_len: int) -> list[TraceSession]:
    """The server benchmark's conversations as replay sessions: full pages as chained blocks."""
    sessions = []
    for c, (conversation, think) in enumerate(zip(prepared.conversations, prepared.think_s)):
        requests, t = [], 0.0
        for k in range(len(conversation)):
            ids = turn_token_ids(conversation, c, k, output_len)
            full = len(ids) // page_size * page_size
            units = np.asarray(ids[:full], dtype=np.uint64).reshape(-1, page_size)
            t += think[k]
            requests.append(TraceRequest(t, think[k] if k else 0.0, len(ids), output_len,
                                         chain_keys(units, scope_seed("fig10", str(c)))))
        sessions.append(TraceSession(f"conversation-{c}", requests))
    return sessions


def model_spec(model_dir: Path, page_size: int) -> ModelSpec:
    """The served model's KV geometry (and a hybrid's GDN checkpoint) as a replay ModelSpec,
    blocks = the server's pages."""
    import json

    return spec_from_hf_config(Path(model_dir).name, json.loads((Path(model_dir) / "config.json").read_text()), page_size)


@dataclass(frozen=True)
class ReplayPlan:
    """What the replay needs besides the sessions: capacities, speed, the scaled day."""

    pools: Pools
    prefill_tps: float
    in_flight: int
    budget_window_s: float = 86400.0
    # the `hicache-file` stand-in's SSD, tokens: the store's when the server bounded stock `file`
    # to it, else every token the workload computes (an unbounded `file`)
    file_ssd_tokens: int = 1 << 30


def replay_config(name: str, plan: ReplayPlan, dwpd: float | None = None) -> SariaConfig:
    """The replay's configuration standing for server configuration ``name``."""
    policy, promotion = {DRAM_ONLY: ("none", "saria"), HICACHE_FILE: ("full-duplicate", "full")}.get(
        name, (name.removeprefix("saria/"), "saria"))
    admission = AdmissionConfig(policy=policy, budget_window_s=plan.budget_window_s)
    if policy.split(":")[0] in ("auto", "loadaware"):
        admission = dataclasses.replace(admission, auto_prefill_tps=plan.prefill_tps)
    return SariaConfig(
        admission=admission,
        metadata=MetadataConfig(block_tokens=plan.pools.page_size, **(
            {"checkpoint_tokens": plan.pools.checkpoint_tokens, "checkpoint_placement": "prefix-end"}
            if plan.pools.hybrid else {})),
        promotion=PromotionConfig(mode=promotion),
        capacity=CapacityConfig(dram_tokens=plan.pools.host_tokens, dram_checkpoints=plan.pools.host_state_slots,
                                ssd_tokens=plan.file_ssd_tokens if name == HICACHE_FILE else plan.pools.store_tokens),
    ).validate()


def run_replay(configs: list[str], sessions: list[TraceSession], spec: ModelSpec, plan: ReplayPlan) -> dict[str, dict]:
    """One replay per configuration, all sessions starting at once (as the client starts them)."""
    from sglang_saria.replay.driver import ReplaySettings, replay

    settings = ReplaySettings(window_s=0.0, in_flight=plan.in_flight, prefill_tokens_per_s=plan.prefill_tps,
                              horizon_s=1e9).validate()
    starts = np.zeros(len(sessions))
    out = {}
    for name in configs:
        result = replay(sessions, starts, replay_config(name, plan), spec, settings)
        m = result.metrics
        out[name] = {"ssd_bytes": m["ssd_write_bytes"], "ttft_mean_ms": m["ttft_mean_s"] * 1e3,
                     "ttft_p90_ms": m["ttft_p90_s"] * 1e3, "char": m["char"], "requests": m["requests"],
                     "ssd_read_bytes": m["ssd_read_bytes"]}
    return out


def measure_prefill_tps(server: Any, lengths: tuple[int, ...] = (64, 256, 512, 768), repeats: int = 2) -> dict:
    """Direct measurement on an idle server: one-token requests of fresh (never cached)
    prompts of several lengths, the fastest of ``repeats`` per length; the rate is 1 / the
    least-squares slope of TTFT over prompt tokens (the intercept: fixed per-request cost)."""
    rng = np.random.default_rng(12345)
    xs, ys = [], []
    for length in lengths:
        best = math.inf
        for _ in range(repeats):
            ids = rng.integers(0, 256, size=length).tolist()
            started = time.perf_counter()
            server.generate(ids, max_new_tokens=1, top_logprobs=0)
            best = min(best, time.perf_counter() - started)
        xs.append(length)
        ys.append(best)
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return {"prefill_tps": float(1.0 / slope) if slope > 0 else math.inf, "overhead_s": float(intercept),
            "lengths": list(xs), "ttft_s": ys}


def order(values: dict[str, float], rel_tol: float = 1e-9) -> list[list[str]]:
    """Configurations from lowest to highest value, equal values (a replay's exact ties, a
    server's zero writes) grouped together."""
    groups: list[list[str]] = []
    for name in sorted(values, key=lambda k: (values[k], k)):
        if groups and math.isclose(values[groups[-1][0]], values[name], rel_tol=rel_tol, abs_tol=1e-12):
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def order_text(groups: list[list[str]]) -> str:
    return " < ".join(" = ".join(g) for g in groups)


def disagreements(server: dict[str, dict], replay: dict[str, dict], key: str, spreads: dict[str, dict] | None) -> list[str]:
    """Pairs the replay orders strictly one way and the server strictly the other, by more than
    the server's run-to-run spread ((max - min) / median of either configuration)."""
    spreads = spreads or {}
    out = []
    names = [n for n in server if n in replay]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ra, rb, sa, sb = replay[a][key], replay[b][key], server[a][key], server[b][key]
            if math.isclose(ra, rb, rel_tol=1e-9, abs_tol=1e-12) or (ra < rb) == (sa < sb) or sa == sb:
                continue
            gap = abs(sa - sb) / (statistics.median([sa, sb]) or 1.0)
            noise = max(spreads.get(a, {}).get(key, 0.0), spreads.get(b, {}).get(key, 0.0))
            if gap > noise:
                low, high = (a, b) if sa < sb else (b, a)
                out.append(f"{low} < {high} (server gap {gap:.2f} > spread {noise:.2f})")
    return out


def paired_ratios(runs: dict[str, list[dict]], name: str, base: str, key: str) -> list[float]:
    """Round i's ``key`` of ``name`` over round i's of ``base``: one ratio per round of servers
    (every configuration once, back to back), so a round's load on the machine is in both."""
    return [a[key] / b[key] for a, b in zip(runs[name], runs[base]) if b[key]]


def ratio_range(runs: dict[str, list[dict]] | None, name: str, base: str, key: str) -> list[float] | None:
    """[min, max] of the server's per-round ratios (None without runs or a base that is 0)."""
    values = paired_ratios(runs, name, base, key) if runs and name in runs and base in runs else []
    return [min(values), max(values)] if values else None


def inside(value: float, bounds: list[float] | None, rel_tol: float = 1e-9) -> bool | None:
    """Whether ``value`` lies in ``bounds`` (None when either is missing)."""
    if bounds is None or value is None or math.isnan(value):
        return None
    lo, hi = bounds
    return lo * (1 - rel_tol) - 1e-12 <= value <= hi * (1 + rel_tol) + 1e-12


def comparison(server: dict[str, dict], replay: dict[str, dict], fd_base: tuple[str, str] = (HICACHE_FILE, "full-duplicate"),
               spreads: dict[str, dict] | None = None, runs: dict[str, list[dict]] | None = None) -> dict:
    """Ratios of SSD writes and TTFT mean, server and replay, each over its ``fd_base`` (server,
    replay: stock `file` on both sides when the server bounded it as the store, else the replay's
    full duplicate) and over dram-only; with the server's ``runs``, each server ratio's min-max
    over its rounds and whether the replay's ratio lies inside it; both orderings."""
    names = [n for n in server if n in replay]

    def ratios(side: dict[str, dict], base: str, key: str) -> dict[str, float]:
        ref = side[base][key]
        return {n: (side[n][key] / ref if ref else math.nan) for n in names}

    out = {"configs": names, "bases": {"server": fd_base[0], "replay": fd_base[1]}}
    for key in ("ssd_bytes", "ttft_mean_ms"):
        out[key] = {
            "server_vs_fd": ratios(server, fd_base[0], key), "server_vs_dram": ratios(server, DRAM_ONLY, key),
            "replay_vs_fd": ratios(replay, fd_base[1], key), "replay_vs_dram": ratios(replay, DRAM_ONLY, key),
        }
        for base, label in ((fd_base[0], "fd"), (DRAM_ONLY, "dram")) if runs is not None else ():
            bounds = {n: ratio_range(runs, n, base, key) for n in names}
            out[key][f"server_range_vs_{label}"] = bounds
            out[key][f"replay_inside_vs_{label}"] = {n: inside(out[key][f"replay_vs_{label}"][n], bounds[n]) for n in names}
    writers = [n for n in names if n != DRAM_ONLY]
    out["order_writes"] = {"server": order({n: server[n]["ssd_bytes"] for n in writers}),
                           "replay": order({n: replay[n]["ssd_bytes"] for n in writers})}
    out["order_ttft"] = {"server": order({n: server[n]["ttft_mean_ms"] for n in names}),
                         "replay": order({n: replay[n]["ttft_mean_ms"] for n in names})}
    out["disagree_writes"] = disagreements({n: server[n] for n in writers}, replay, "ssd_bytes", spreads)
    out["disagree_ttft"] = disagreements(server, replay, "ttft_mean_ms", spreads)
    return out


def _r(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def _with_range(cmp: dict, key: str, label: str, n: str) -> str:
    """The server's ratio, and its min-max over the rounds when the JSON has them."""
    bounds = cmp[key].get(f"server_range_vs_{label}", {}).get(n)
    ratio = _r(cmp[key][f"server_vs_{label}"][n])
    return f"{ratio} ({_r(bounds[0])}-{_r(bounds[1])})" if bounds else ratio


def _inside(cmp: dict, key: str, label: str, n: str) -> str:
    flag = cmp[key].get(f"replay_inside_vs_{label}", {}).get(n)
    return "n/a" if flag is None else ("inside" if flag else "outside")


def comparison_table(cmp: dict) -> str:
    """The doc's table: per configuration, server and replay ratios side by side; with the
    server's rounds, each server ratio's min-max over them and whether the replay's lies inside."""
    bases = cmp.get("bases", {"server": HICACHE_FILE, "replay": "full-duplicate"})
    ranged = "server_range_vs_fd" in cmp["ssd_bytes"]
    server_col = " (min-max)" if ranged else ""
    head, rows = ["config"], []
    columns = (("ssd_bytes", "fd", f"SSD writes: server / {bases['server']}", f"replay / {bases['replay']}"),
               ("ttft_mean_ms", "fd", f"TTFT mean: server / {bases['server']}", f"replay / {bases['replay']}"),
               ("ttft_mean_ms", "dram", "server / dram-only", "replay / dram-only"))
    for _, _, server_label, replay_label in columns:
        head += [server_label + server_col, replay_label] + (["replay in server's range"] if ranged else [])
    for n in cmp["configs"]:  # writes over dram-only's (nothing) are no ratio
        row = [n]
        for key, label, _, _ in columns:
            row += [_with_range(cmp, key, label, n), _r(cmp[key][f"replay_vs_{label}"][n])]
            row += [_inside(cmp, key, label, n)] if ranged else []
        rows.append(row)
    return md_table(head, rows)


def orderings_table(cmp: dict) -> str:
    """Both orderings, lowest first, server and replay."""
    rows = []
    for label, key, dis in (("SSD writes", "order_writes", "disagree_writes"), ("TTFT mean", "order_ttft", "disagree_ttft")):
        rows.append([f"{label} (lowest first)", order_text(cmp[key]["server"]), order_text(cmp[key]["replay"]),
                     "; ".join(cmp.get(dis) or []) or "none"])
    return md_table(["ordering", "server", "replay", "server orders otherwise, beyond its run-to-run spread"], rows)
