"""Shared fixtures for replay tests: where the real traces live.

Traces are read, never copied: from $SARIA_SHARED_DIR, else the `shared` folder beside the
repository root. A test that needs them fails (not skips) when they are missing.
"""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    path = Path(os.environ.get("SARIA_SHARED_DIR", REPO_ROOT.parent / "shared"))
    if not (path / "traces").is_dir():
        pytest.fail(f"real traces not found: {path / 'traces'} is missing "
                    f"(set SARIA_SHARED_DIR to the folder holding traces/)")
    return path
