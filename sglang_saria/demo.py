"""`make demo`: replay synthetic agent sessions against three admission policies, then
serve a tiny model on CPU with HiCache + the `saria` storage backend, run agent-style
multi-turn sessions against it, and print where each turn's prefix was cached.

Why this shape: it is the product's main path in miniature. Two agent sessions share a
system prompt and tool schemas, their histories grow turn by turn, and small pools force
the shared prefix out of the device and host tiers so later turns reload it from the store.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_saria.launcher import SGLangServer, ServerConfig, cached_tokens, saria_hicache_args, saria_metrics
from sglang_saria.replay import cli as replay_cli

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "models" / "qwen3-tiny"


@dataclass
class Turn:
    session: str
    turn: int
    prompt: list[int]


def agent_turns(vocab: int = 1000, system_tokens: int = 256, turns: int = 3, neighbours: int = 3) -> list[Turn]:
    """Two sessions sharing a system+tools prefix, interleaved with unrelated sessions."""
    system = [1 + i % (vocab - 1) for i in range(system_tokens)]
    history = {"agent-a": list(system), "agent-b": list(system)}
    plan: list[Turn] = []
    for turn in range(1, turns + 1):
        for offset, name in enumerate(history):
            history[name] += [(97 * turn + 13 * offset + j) % vocab + 1 for j in range(48)]
            plan.append(Turn(name, turn, list(history[name])))
        for n in range(neighbours):
            plan.append(Turn(f"other-{n}", turn, [(311 * turn + 53 * n + j) % vocab + 1 for j in range(400)]))
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--data-dir", type=Path, default=None, help="saria store folder (default: a temp dir)")
    parser.add_argument("--admission", default="eviction:E2", help="admission policy of the server (default eviction:E2)")
    args = parser.parse_args(argv)

    replay_args = [
        "--trace", "synthetic", "--sessions", "40", "--window", "1h",
        "--dram-tokens", "300K", "--ssd-tokens", "3M", "--no-progress",
        "--policy", "none", "--policy", "full-duplicate", "--policy", "eviction:E2",
    ]
    print("1) replay: saria-replay " + " ".join(replay_args), flush=True)
    replay_cli.main(replay_args)
    print("\n2) serving", flush=True)
    with tempfile.TemporaryDirectory(prefix="saria-demo-") as scratch:
        data_dir = args.data_dir or Path(scratch) / "ssd0"
        server_args = [
            "--page-size", "16", "--max-total-tokens", "640", "--dtype", "bfloat16",
            *saria_hicache_args({"data_dirs": [str(data_dir)], "admission": args.admission, "capacity": "64MiB"}),
        ]
        print(f"starting SGLang on CPU with HiCache + saria store at {data_dir} (about 30 s) ...", flush=True)
        started = time.monotonic()
        with SGLangServer(ServerConfig(args.model, args=server_args)) as server:
            print(f"server ready in {time.monotonic() - started:.0f} s\n")
            print(f"{'session':<10} {'turn':>4} {'prompt':>6} {'device':>6} {'host':>6} {'storage':>7} {'computed':>8} {'latency':>8}")
            totals = {"device": 0, "host": 0, "storage": 0, "computed": 0}
            for turn in agent_turns():
                result = server.generate(turn.prompt, max_new_tokens=2)
                tiers = cached_tokens(result)
                computed = len(turn.prompt) - sum(tiers.values())
                for tier, count in tiers.items():
                    totals[tier] += count
                totals["computed"] += computed
                latency = result["meta_info"].get("e2e_latency", float("nan"))
                print(f"{turn.session:<10} {turn.turn:>4} {len(turn.prompt):>6} {tiers['device']:>6} "
                      f"{tiers['host']:>6} {tiers['storage']:>7} {computed:>8} {latency:>7.3f}s")
            metrics = saria_metrics(server.metrics())
        admissions = {k.split("/")[1]: int(v) for k, v in metrics.items() if k.startswith("sglang:saria_ssd_admissions_total/")}
        print(f"\ntokens served from: device {totals['device']}, host {totals['host']}, "
              f"storage {totals['storage']}; recomputed {totals['computed']}")
        print(f"saria store ({args.admission}): admissions by event {admissions or 'none'}, "
              f"SSD written {metrics.get('sglang:saria_ssd_bytes_written_total', 0) / 1024:.0f} KiB, "
              f"read {metrics.get('sglang:saria_ssd_bytes_read_total', 0) / 1024:.0f} KiB, "
              f"host reclaims {int(metrics.get('sglang:saria_host_evictions_total', 0))}")
        print(f"reloads: {int(metrics.get('sglang:saria_reload_tokens_total/ssd', 0))} tokens SSD -> device "
              f"directly ({int(metrics.get('sglang:saria_store_pages_read_total/host', 0))} store pages staged "
              f"in host memory), {int(metrics.get('sglang:saria_reload_tokens_total/dram', 0))} tokens from DRAM, "
              f"{int(metrics.get('sglang:saria_promoted_tokens_total', 0))} SSD-hit tokens promoted to DRAM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
