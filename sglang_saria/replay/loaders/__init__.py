"""Trace loaders and the `--trace` spec dispatcher.

Specs: `weka:DIR`, `tracelab:FILE`, `mooncake:FILE`, `synthetic` or `synthetic:SEED`.
Every loader returns sessions in dataset order with chained block keys (see replay.trace).
"""

from __future__ import annotations

import os
from pathlib import Path

from sglang_saria.replay.loaders.mooncake import load_mooncake
from sglang_saria.replay.loaders.tracelab import load_tracelab
from sglang_saria.replay.loaders.weka import load_weka
from sglang_saria.replay.synthetic import DEFAULT_SEED, generate
from sglang_saria.replay.trace import TraceSession

__all__ = ["shared_dir", "load_trace", "load_weka", "load_tracelab", "load_mooncake", "SPEC_HELP"]

SPEC_HELP = "weka:DIR | tracelab:FILE | mooncake:FILE | synthetic[:SEED]"


def shared_dir() -> Path:
    """The folder holding ``traces/`` and ``paper/``: ``$SARIA_SHARED_DIR``, else ``shared`` beside the
    repository (an editable install's checkout)."""
    return Path(os.environ.get("SARIA_SHARED_DIR", Path(__file__).resolve().parents[4] / "shared"))


def load_trace(spec: str, block_tokens: int, max_sessions: int | None = None) -> list[TraceSession]:
    """Load `weka:DIR | tracelab:FILE | mooncake:FILE | synthetic[:SEED]`: the first `max_sessions` sessions."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    if max_sessions is not None and max_sessions < 0:
        raise ValueError(f"max_sessions must be >= 0, got {max_sessions}")
    kind, _, arg = spec.partition(":")
    if kind == "synthetic":
        try:
            seed = int(arg) if arg else DEFAULT_SEED
        except ValueError:
            raise ValueError(f"bad trace spec {spec!r}: synthetic seed must be an integer") from None
        return generate(seed, block_tokens, max_sessions)
    loaders = {"weka": load_weka, "tracelab": load_tracelab, "mooncake": load_mooncake}
    if kind not in loaders or not arg:
        raise ValueError(f"bad trace spec {spec!r}: expected {SPEC_HELP}")
    return loaders[kind](arg, block_tokens, max_sessions)
