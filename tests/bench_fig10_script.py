"""`scripts/bench_fig10.py` as a module, for the tests of its pieces, its smoke run and its doc."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_fig10.py"


def load_bench_fig10() -> ModuleType:
    """The script, imported (it is no package module: scripts/ is not on the path)."""
    spec = importlib.util.spec_from_file_location("bench_fig10", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_fig10"] = module
    spec.loader.exec_module(module)
    return module
