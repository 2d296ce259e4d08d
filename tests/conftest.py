"""Shared fixtures: repository paths and the tiny local models (built once, never downloaded)."""

from __future__ import annotations

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
