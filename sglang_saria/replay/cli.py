"""``saria-replay``: replay agent traces against Saria policies and print the trade-off.

Every ``--policy`` is replayed on the identical workload (same sessions, same start
times), so the rows of the table differ only by policy. Ctrl-C prints what finished.
``--nodes N --router R`` replays a fleet of N nodes behind a router (``replay/fleet.py``): the
table is the fleet's, followed by each policy's per-node table.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from sglang_saria.config import (
    ADMISSION_RULES,
    CHECKPOINT_PLACEMENTS,
    PLANNERS,
    PROMOTION_MODES,
    SGLANG_CHUNKED_PREFILL_TOKENS,
    TRANSFER_MODES,
    AdmissionConfig,
    BandwidthConfig,
    CapacityConfig,
    ConfigError,
    MetadataConfig,
    PromotionConfig,
    SariaConfig,
    TransferConfig,
)
from sglang_saria.model_specs import MODEL_SPECS, get_model_spec
from sglang_saria.replay.driver import ReplaySettings, replay
from sglang_saria.replay.fleet import FleetSettings, fleet_replay, format_nodes
from sglang_saria.replay.metrics import format_table, same_requests
from sglang_saria.replay.routing import ROUTERS
from sglang_saria.units import parse_count, parse_duration_s

logger = logging.getLogger(__name__)

DEFAULT_POLICIES = ["none", "full-duplicate", "eviction:E2"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="saria-replay", description=__doc__.splitlines()[0])
    add_replay_args(p)
    p.add_argument("--policy", action="append", default=None, help=f"admission policy, repeatable (default {' '.join(DEFAULT_POLICIES)}); "
                   "'oracle' is the clairvoyant write bound (reads the trace's future; several passes, docs/fidelity.md)")
    p.add_argument("--json", dest="json_path", default=None, help="write config + results JSON here")
    p.add_argument("--plot", default=None, help="write the write-vs-TTFT figure (PNG) here")
    p.add_argument("--report", default=None, metavar="DIR", help="write a Markdown report with tables and PNG figures into DIR")
    return p


def add_replay_args(p: argparse.ArgumentParser) -> None:
    """Workload, model, capacity and transfer flags shared with ``saria-plan``."""
    p.add_argument("--trace", required=True, help="weka:DIR | tracelab:FILE | mooncake:FILE | synthetic[:SEED]")
    p.add_argument("--sessions", type=int, default=None, help="first N sessions in dataset order")
    p.add_argument("--window", default="12h", help="session-start window (12h, 4h, 2h, 40m, ...)")
    p.add_argument("--seed", type=int, default=0, help="seed of the Gamma(k=1) start gaps")
    p.add_argument("--model", default="qwen3-8b", help=f"one of {', '.join(sorted(MODEL_SPECS))}")
    p.add_argument("--block-tokens", type=int, default=None, help="tokens per block (default 512 FA / 1024 hybrid)")
    p.add_argument("--checkpoint-tokens", type=int, default=16384, help="GDN checkpoint spacing (hybrid models)")
    p.add_argument("--checkpoint-placement", choices=CHECKPOINT_PLACEMENTS, default="sglang",
                   help="sglang: GDN states where SGLang 0.5.23's --mamba-radix-cache-strategy extra_buffer keeps them "
                        "(each prefill chunk's end, the branching point of a longer full-attention hit); grid: one every "
                        "--checkpoint-tokens (the paper); prefix-end: one per computed prefix at its last aligned block")
    p.add_argument("--prefill-chunk-tokens", type=int, default=SGLANG_CHUNKED_PREFILL_TOKENS,
                   help="--checkpoint-placement sglang: SGLang's --chunked-prefill-size (its default on an H100/H200)")
    p.add_argument("--dram-tokens", default="1M")
    p.add_argument("--dram-checkpoints", type=int, default=0,
                   help="hybrid models: 0 = checkpoints count in --dram-tokens by their bytes (the paper); N = DRAM "
                        "also holds up to N checkpoints in a pool of their own (SGLang's HiCache host pool for GDN states)")
    p.add_argument("--ssd-tokens", default="10M")
    p.add_argument("--promotion", choices=PROMOTION_MODES, default="saria")
    p.add_argument("--promotion-ratio", type=float, default=0.4)
    p.add_argument("--p-tau", type=float, default=60.0, help="promotion recency threshold, seconds")
    p.add_argument("--bandwidth", default="48,20,48", help="ingress,gds,dram in GB/s")
    p.add_argument("--transfer", choices=TRANSFER_MODES, default="coordinated")
    p.add_argument("--planner", choices=PLANNERS, default="saria",
                   help="saria | lmcache (LMCache+ tier-prefix lookup) | gds-only (implies --dram-tokens 0)")
    p.add_argument("--no-prewrite", action="store_true", help="disable prewrite (E+1) of DRAM-tail nodes")
    p.add_argument("--admission-rule", choices=ADMISSION_RULES, default="robust",
                   help="robust (prefix-closed writes; default) | paper (section 4.2 verbatim; see docs/fidelity.md)")
    p.add_argument("--metadata-window", default="2h", help="metadata reclamation window")
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--prefill-tps", type=float, default=ReplaySettings.prefill_tokens_per_s,
                   help="the modelled GPU's computed prefill tokens per second (default: the paper's 6,500; "
                        "docs/fidelity.md sweeps 6,500-20,000 as a sensitivity analysis; for planning, your GPU's rate)")
    p.add_argument("--hints", choices=("none", "end", "next"), default="none",
                   help="agents' hints for policies that take them (auto): each session's end, or also each "
                        "request's next arrival (clairvoyant)")
    p.add_argument("--ssd-write-gbps", type=float, default=ReplaySettings.ssd_write_gbps,
                   help="the drives' write bandwidth; SSD writes take it out of the GDS read budget while they drain")
    p.add_argument("--context-limit", default="450000", help="drop requests past this context length")
    p.add_argument("--horizon", default="24h", help="24 h truncation: keep the requests recorded to arrive within this time of the replay start (a filter on the workload; every kept request is served, however long the replay runs)")
    p.add_argument("--nodes", type=int, default=1, help="nodes in the fleet, each with its own DRAM, SSD and GPU "
                   "(the capacities and prefill rate above are per node); the sessions are spread over them")
    p.add_argument("--router", default=None, help=f"routing of requests to nodes: {' | '.join(ROUTERS)} (sglang-router "
                   "0.3.2's policies, and session: the launcher's session router; default cache_aware when --nodes > 1; "
                   "random is seeded by --seed)")
    p.add_argument("--no-progress", action="store_true")


def _parse_bandwidth(s: str) -> BandwidthConfig:
    parts = s.split(",")
    if len(parts) != 3:
        raise ConfigError(f"--bandwidth={s!r}: expected ingress,gds,dram in GB/s (e.g. 48,20,48)")
    try:
        ingress, gds, dram = (float(x) for x in parts)
    except ValueError:
        raise ConfigError(f"--bandwidth={s!r}: values must be numbers") from None
    return BandwidthConfig(ingress, gds, dram)


def build_config(args: argparse.Namespace, policy: str) -> SariaConfig:
    spec = get_model_spec(args.model)
    cfg = SariaConfig(
        admission=AdmissionConfig(policy=policy, prewrite=not args.no_prewrite, rule=args.admission_rule),
        metadata=MetadataConfig(
            block_tokens=args.block_tokens or spec.default_block_tokens,
            checkpoint_tokens=args.checkpoint_tokens,
            checkpoint_placement=args.checkpoint_placement,
            prefill_chunk_tokens=args.prefill_chunk_tokens,
            metadata_window_s=parse_duration_s(args.metadata_window, "--metadata-window"),
        ),
        promotion=PromotionConfig(mode=args.promotion, ratio=args.promotion_ratio, p_tau_s=args.p_tau),
        bandwidth=_parse_bandwidth(args.bandwidth),
        transfer=TransferConfig(mode=args.transfer, planner=args.planner),
        capacity=CapacityConfig(
            dram_tokens=0 if args.planner == "gds-only" else parse_count(args.dram_tokens, "--dram-tokens"),
            ssd_tokens=parse_count(args.ssd_tokens, "--ssd-tokens"),
            dram_checkpoints=args.dram_checkpoints,
        ),
    )
    return cfg.validate()


def fleet_settings(args: argparse.Namespace) -> FleetSettings | None:
    """The fleet of ``--nodes``/``--router`` (validated), or None for today's single node."""
    if args.nodes == 1 and args.router is None:
        return None
    return FleetSettings(nodes=args.nodes, router=args.router or "cache_aware", seed=args.seed).validate()


def run(args: argparse.Namespace, logs: list | None = None) -> dict[str, Any]:
    """Replay every policy; ``logs`` (if given) receives each replay's ``RequestLog``."""
    from sglang_saria.replay.loaders import load_trace
    from sglang_saria.replay.workload import apply_limits, session_starts

    policies = args.policy or DEFAULT_POLICIES
    spec = get_model_spec(args.model)
    cfgs = [build_config(args, p) for p in policies]  # validate every policy before replaying any
    fleet = fleet_settings(args)
    if fleet is not None and "oracle" in policies:
        raise ConfigError("--policy oracle: the clairvoyant bound is single-node only (no --nodes/--router)")
    settings = ReplaySettings(
        window_s=parse_duration_s(args.window, "--window"),
        seed=args.seed,
        in_flight=args.in_flight,
        prefill_tokens_per_s=args.prefill_tps,
        ssd_write_gbps=args.ssd_write_gbps,
        hints=args.hints,
        horizon_s=parse_duration_s(args.horizon, "--horizon"),
    ).validate()
    context_limit = parse_count(args.context_limit, "--context-limit")
    block_tokens = cfgs[0].metadata.block_tokens
    sessions = load_trace(args.trace, block_tokens, max_sessions=args.sessions)
    sessions = apply_limits(sessions, context_limit_tokens=context_limit)
    starts = session_starts(sessions, settings.window_s, settings.seed)
    results, fleets = [], []
    interrupted = False
    for policy, cfg in zip(policies, cfgs):
        if fleet is None:
            res = replay(sessions, starts, cfg, spec, settings, progress=not args.no_progress, label=policy)
        else:
            res = fleet_replay(sessions, starts, cfg, spec, settings, fleet, progress=not args.no_progress, label=policy)
            fleets.append({"policy": policy, **res.fleet, "per_node": res.per_node})
        results.append(res.metrics)
        if logs is not None:
            logs.append(res.log)
        if res.interrupted:
            interrupted = True
            break
    if not interrupted:
        same_requests(results)
    base = cfgs[0].to_dict()
    base.pop("admission")
    out = {
        "config": {
            "trace": args.trace,
            "sessions": len(sessions),
            "top_level_sessions": sum(1 for s in sessions if getattr(s, "parent_id", None) is None),
            "requests": sum(len(s.requests) for s in sessions),
            "window_s": settings.window_s,
            "seed": settings.seed,
            "in_flight": settings.in_flight,
            "prefill_tokens_per_s": settings.prefill_tokens_per_s,
            "horizon_s": settings.horizon_s,
            "context_limit_tokens": context_limit,
            "model": spec.name,
            "kv_bytes_per_token": spec.kv_bytes_per_token,
            "checkpoint_bytes": spec.checkpoint_bytes,
            "prewrite": not args.no_prewrite,
            "admission_rule": args.admission_rule,
            "policies": policies,
            "interrupted": interrupted,
            "nodes": args.nodes,
            "router": fleet.router if fleet else None,
            **base,
        },
        "results": results,
    }
    if fleet is not None:
        out["fleet"] = fleets
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    logs: list = []
    try:
        out = run(args, logs)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"saria-replay: error: {e}", file=sys.stderr)
        return 2
    print(format_table(out["results"]))
    for metrics, f in zip(out["results"], out.get("fleet", [])):
        print(f"\n{format_nodes(metrics, f, f['per_node'])}")
    if out["config"]["interrupted"]:
        print("(interrupted: partial results)")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(out, f, indent=2)
    if args.plot:
        from sglang_saria.replay.plot import plot_tradeoff

        plot_tradeoff(out, args.plot)
    if args.report:
        from sglang_saria.replay.report import write_report

        print(f"report: {write_report(out, logs, args.report)}")
    return 130 if out["config"]["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
