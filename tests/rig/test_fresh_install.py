"""A fresh environment as `scripts/setup.sh` builds it (stock SGLang 0.5.23, the CPU rig, then
sglang-saria): the plugin's entry point is listed and the only SGLang files that differ from the
wheel's RECORD are the rig's (`tests/test_plugin_install.py`, run by that environment's own
interpreter); after `pip uninstall sglang-saria` a server of that environment starts and serves
with stock HiCache (`file` backend), and its entry point is gone."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_saria.launcher import SGLangServer, ServerConfig, hicache_args

from tests.conftest import SMALL_POOLS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETUP_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def fresh_repo(tmp_path_factory, repo_root: Path) -> Path:
    """The tracked files copied to a new folder and set up from scratch there (pip's and uv's
    caches reused, as CI may)."""
    root = tmp_path_factory.mktemp("fresh") / "repo"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=repo_root, check=True, capture_output=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source = repo_root / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=root, capture_output=True, text=True,
                          timeout=SETUP_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root


def _python(root: Path) -> str:
    return str(root / ".venv" / "bin" / "python")


def test_a_fresh_install_edits_no_sglang_file_outside_the_rig_and_lists_the_plugin(fresh_repo: Path):
    done = subprocess.run([_python(fresh_repo), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_plugin_install.py"], cwd=fresh_repo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout


def test_after_uninstall_a_server_serves_with_stock_hicache(fresh_repo: Path, tiny_model: Path, tmp_path: Path):
    python = _python(fresh_repo)
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "sglang-saria"], check=True, timeout=300)
    listed = subprocess.run([python, "-c", "from importlib.metadata import entry_points as e; "
                             "print(sorted(p.name for p in e(group='sglang.srt.plugins')))"],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "saria" not in listed
    assert importlib.util.find_spec("sglang_saria") is not None  # this test process keeps its own copy
    run_dir = tmp_path / "run"  # not the copied repository: its sources must not be importable
    run_dir.mkdir()
    config = ServerConfig(
        tiny_model, python=python, cwd=run_dir, log_path=tmp_path / "server.log",
        args=SMALL_POOLS + hicache_args("file", {"file_storage_path": str(tmp_path / "files")}),
        env={"TORCH_EXTENSIONS_DIR": str(fresh_repo / ".venv" / "torch_extensions")},
    )
    prompt = [(7 * i) % 200 + 1 for i in range(96)]
    with SGLangServer(config) as server:
        first = server.generate(prompt, max_new_tokens=4)
        again = server.generate(prompt, max_new_tokens=4)
    assert len(first["output_ids"]) == 4 and again["output_ids"] == first["output_ids"]
    assert again["meta_info"]["cached_tokens"] > 0
    log = (tmp_path / "server.log").read_text()
    assert "sglang_saria" not in log
