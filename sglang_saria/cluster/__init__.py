"""Many nodes: saria workers (one store each, on their node's NVMe) behind SGLang's router.

Why here: the router (`sglang-router`, a Rust load balancer) decides which worker a request
reaches, and with it which node's store holds the session's KV. This package starts N
workers and the router with settings that move a dead worker's sessions to a live one
(`router.py`), or its own session router for `--policy session` (`session_router.py`: each session
on one worker, bounded load), checks the workers before the router takes traffic (`workers.py`), and runs
it all as `python -m sglang_saria.cluster` (`cli.py`). `sglang-router` is an optional
dependency: `pip install .[cluster]`.
"""

from sglang_saria.cluster.cluster import Cluster, ClusterConfig
from sglang_saria.cluster.router import RouterProcess, RouterSettings
from sglang_saria.cluster.session_router import SessionRouter
from sglang_saria.cluster.workers import ClusterError

__all__ = ["Cluster", "ClusterConfig", "ClusterError", "RouterProcess", "RouterSettings", "SessionRouter"]
