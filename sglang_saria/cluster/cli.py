"""`python -m sglang_saria.cluster`: saria workers behind sglang-router, stopped on SIGINT/SIGTERM.

Two forms (README "Many nodes"):
- `--workers N --model-path M`: N local workers (worker i: its own port, its store in
  STORE_ROOT/worker-i) and the router; a worker that dies is started again on its store.
- `--worker-urls URL ...`: the router alone, in front of workers already running (one per
  node), after checking they are reachable and serve the same model.
Flags after `--` go to every local worker's `sglang.launch_server`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from sglang_saria.cluster.cluster import Cluster, ClusterConfig
from sglang_saria.cluster.router import POLICIES, RouterSettings, make_router
from sglang_saria.cluster.workers import ClusterError, check_workers
from sglang_saria.launcher import AUDIT_ENV, ServerError
from sglang_saria.session_affinity import BOUND, PLACE_BY, PLACEMENT, AffinityConfig, AffinityError


def default_store_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sglang-saria" / "cluster"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_saria.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--workers", type=int, help="start this many local saria workers")
    where.add_argument("--worker-urls", nargs="+", metavar="URL", help="route to workers already running")
    p.add_argument("--model-path", type=Path, help="model of the local workers (with --workers)")
    p.add_argument("--store-root", type=Path, default=None,
                   help=f"worker i's store goes to STORE_ROOT/worker-i (default {default_store_root()})")
    p.add_argument("--capacity", default="1GiB", help="store capacity per worker (extra-config 'capacity')")
    p.add_argument("--admission", default=None, help="admission policy, e.g. eviction:E2 (default: saria's)")
    p.add_argument("--extra-config", default="{}", help="more saria extra-config keys as a JSON object")
    p.add_argument("--cpu", action="store_true", help="serve on CPU (launcher.CPU_FLAGS)")
    p.add_argument("--audit", action="store_true", help="run workers with the KV and tier audits (slow; tests)")
    p.add_argument("--host", default="127.0.0.1", help="router and local workers bind here")
    p.add_argument("--port", type=int, default=30000, help="router port")
    p.add_argument("--worker-ports", type=int, nargs="+", default=None, help="local workers' ports (default: free)")
    p.add_argument("--policy", default="cache_aware", choices=POLICIES,
                   help="router policy; session: each session on one worker, bounded load (the launcher's router)")
    p.add_argument("--session-eps", type=float, default=AffinityConfig.eps,
                   help="session policy: a worker holds at most (1 + eps) x the mean active sessions")
    p.add_argument("--session-idle", type=float, default=AffinityConfig.idle_s, metavar="S",
                   help="session policy: seconds without a request before a session stops counting")
    p.add_argument("--session-place", default=AffinityConfig.place_by, choices=PLACE_BY,
                   help="session policy: a new or moving session's worker must not exceed 1 + eps times the mean of "
                        "this too (wear: its drive's writes; tokens: its active sessions' prompt sizes; both)")
    p.add_argument("--session-wear-moves", type=int, choices=(0, 1), default=int(AffinityConfig.wear_moves),
                   help="session policy: 1: a session leaves a worker whose drive is over the wear bound (when: "
                        "--session-wear-shrink); 0: a session leaves its worker only at the bound or dead")
    p.add_argument("--session-wear-shrink", type=float, default=AffinityConfig.wear_shrink, metavar="F",
                   help="session policy: with wear moves, a session leaves a worn-out worker at a request whose body "
                        "is below F x its previous one's; 0: the worker's largest active session leaves at its next "
                        "request (without a held-prefix judgement: --session-held 0)")
    p.add_argument("--session-placement", default=AffinityConfig.placement, choices=PLACEMENT,
                   help="session policy: least: a new or moving session takes the qualifying worker least loaded in "
                        "active prompt bytes and requests; ring: the first on its ring walk")
    p.add_argument("--session-bound", default=AffinityConfig.bound, choices=BOUND,
                   help="session policy: shed: the bound holds on every worker after every request, a worker's "
                        "cheapest session (a guest whose worker is back first) moving at once; cheap: a worker at the "
                        "bound sends off its smallest sessions, and none whose prompt it holds (exact at placement "
                        "only); strict: the session that finds its worker at the bound moves")
    p.add_argument("--session-held", type=float, default=AffinityConfig.held_frac, metavar="F",
                   help="session policy: a request extends what its worker holds when the worker was sent at least F "
                        "of its messages (by bytes); 0: not judged (wear moves by --session-wear-shrink)")
    p.add_argument("--router-arg", action="append", default=[], metavar="FLAG",
                   help="extra sglang_router.launch_router flag, e.g. --router-arg=--cache-threshold=0.5 (repeat)")
    p.add_argument("--wait-workers", type=float, default=0.0, metavar="S",
                   help="with --worker-urls: wait up to S seconds for the workers to answer")
    p.add_argument("--no-restart", action="store_true", help="do not restart a local worker that exits")
    p.add_argument("--log-dir", type=Path, default=None, help="worker and router logs (default /tmp)")
    return p


class Stop(Exception):
    """SIGINT or SIGTERM arrived."""


def _raise_stop(signum: int, _frame: object) -> None:
    raise Stop(signal.Signals(signum).name)


def extra_config(args: argparse.Namespace) -> dict:
    try:
        extra = json.loads(args.extra_config)
    except json.JSONDecodeError as err:
        raise ClusterError(f"--extra-config is not valid JSON: {err}") from err
    if not isinstance(extra, dict):
        raise ClusterError(f"--extra-config must be a JSON object, got {type(extra).__name__}")
    extra.setdefault("capacity", args.capacity)
    if args.admission:
        extra["admission"] = args.admission
    return extra


def run_local(args: argparse.Namespace, launch_args: list[str], settings: RouterSettings) -> None:
    if args.model_path is None:
        raise ClusterError("--workers needs --model-path")
    config = ClusterConfig(
        args.model_path, args.store_root or default_store_root(), args.workers, args=launch_args,
        extra_config=extra_config(args), host=args.host, router_port=args.port, worker_ports=args.worker_ports,
        cpu=args.cpu, env=dict(AUDIT_ENV) if args.audit else {}, log_dir=args.log_dir, router=settings,
    )
    cluster = Cluster(config)
    try:
        cluster.start()
        announce(cluster.url, cluster.worker_urls)
        while True:
            time.sleep(1.0)
            for index in [] if args.no_restart else cluster.dead_workers():
                print(f"worker {index} ({cluster.servers[index].url}) exited; restarting it on "
                      f"{cluster.store_dir(index)}", flush=True)
                try:
                    cluster.restart_worker(index)
                except ServerError as err:
                    raise ClusterError(f"worker {index} did not come back: {err}") from err
                print(f"worker {index} is back", flush=True)
    finally:
        cluster.stop()


def run_router(args: argparse.Namespace, settings: RouterSettings) -> None:
    check_workers(args.worker_urls, wait_s=args.wait_workers)
    log = args.log_dir / "router.log" if args.log_dir else None
    router = make_router(args.worker_urls, settings, args.host, args.port, log)
    try:
        router.start()
        announce(router.url, args.worker_urls)
        while router.running():
            time.sleep(1.0)
        raise ClusterError(f"the router stopped:\n{router.log_tail()}")
    finally:
        router.stop()


def announce(url: str, workers: list[str]) -> None:
    print(f"router: {url}  (workers: {' '.join(workers)})", flush=True)
    print(f"chat with it: OpenAI(base_url='{url}/v1', api_key='none'); Ctrl-C stops all", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    launch_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, launch_args = argv[:at], argv[at + 1:]
    args = parser().parse_args(argv)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            session = AffinityConfig(eps=args.session_eps, idle_s=args.session_idle, place_by=args.session_place,
                                     wear_moves=bool(args.session_wear_moves),
                                     wear_shrink=args.session_wear_shrink, placement=args.session_placement,
                                     bound=args.session_bound, held_frac=args.session_held).validate()
        except AffinityError as err:
            raise ClusterError(f"--session-*: {err}") from err
        settings = RouterSettings(policy=args.policy, extra=tuple(args.router_arg), session=session)
        if args.workers is not None:
            run_local(args, launch_args, settings)
        else:
            if launch_args:
                raise ClusterError("flags after -- are for local workers (--workers N), not --worker-urls")
            run_router(args, settings)
    except Stop as stop:
        print(f"{stop}: stopped the router and the workers", flush=True)
        return 0
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
