"""Shared fixtures: repository paths and the tiny local models (built once, never downloaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random full-attention Qwen3 model under models/ (built if missing)."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        from make_tiny_models import FULL_ATTENTION, build
    finally:
        sys.path.pop(0)
    return build(FULL_ATTENTION, REPO_ROOT / "models")


@pytest.fixture(scope="session")
def run_interpreted():
    """run_interpreted(script) -> {case: result}: run a check script in a fresh Python with
    TRITON_INTERPRET=1 (it only takes effect before triton is imported, which this process may
    have done) and collect the JSON object it prints per line, keyed by its "case"."""

    def run(script: Path) -> dict[str, dict]:
        env = {
            **os.environ,
            "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout}\n{proc.stderr}"
        results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return {r["case"]: r for r in results}

    return run
