"""The GPU check kit (scripts/gpu_kit.sh): its dry run passes on CPU, reports every step in
gpu_kit.json, and its modules import without SGLang; a GPU run on a CPU host says why it skips."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from sglang_saria.gpukit.steps import STEPS

STEP_NAMES = [s.name for s in STEPS]


def run_kit(repo_root, out, *args: str, script: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    env.pop("TRITON_INTERPRET", None)
    cmd = ["bash", "scripts/gpu_kit.sh", *args] if script else [sys.executable, "-m", "sglang_saria.gpukit", *args]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")]))
    return subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def dry_run(repo_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("kit-out")
    proc = run_kit(repo_root, out, "--dry-run")
    return proc, out


def test_dry_run_passes_every_step(dry_run):
    proc, _ = dry_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in STEP_NAMES:
        assert f"PASS: {name} (" in proc.stdout, name
    assert f"gpu kit: ALL PASS ({len(STEPS)}/{len(STEPS)} steps)" in proc.stdout


def test_dry_run_says_what_each_step_measures_on_a_gpu(dry_run):
    proc, _ = dry_run
    assert proc.stdout.count("dry run: ") == len(STEPS)
    for step in STEPS:
        assert f"== {step.name}: {step.measures}" in proc.stdout


def test_dry_run_report_has_every_step_with_its_figures(dry_run):
    _, out = dry_run
    report = json.loads((out / "gpu_kit.json").read_text())
    assert report["mode"] == "dry-run" and report["passed"] is True
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == STEP_NAMES
    assert all(s["status"] == "PASS" and s["seconds"] > 0 and s["reason"] == "" for s in steps.values())
    assert steps["env"]["figures"]["modules_import_without_sglang"] >= 7
    store = steps["store"]["figures"]
    assert store["engine"] == "posix" and store["corrupt_detected"] is True
    assert store["read_gbps"] > 0 and store["raw_read_gbps"] > 0 and store["read_vs_raw"] > 0
    queues = steps["queues"]["figures"]
    assert queues["write_engine"] == "posix" and queues["repeats"] >= 5
    assert queues["read_ms_idle"] > 0 and queues["read_ms_with_writes"] > 0 and queues["with_writes_vs_idle"] > 0
    assert queues["stream_write_gbps"] > 0
    gather = steps["gather"]["figures"]
    cases = [f"{plan}-{dt}" for plan in ("fa", "mixed") for dt in ("fp16", "bf16", "fp32")]
    assert [k for k, v in gather.items() if v is True] == [f"{c}_exact" for c in cases]
    assert all(gather[f"{c}_gbps"] > 0 and gather[f"{c}_vs_index_copy"] > 0 for c in cases)
    checksum = steps["checksum"]["figures"]
    assert checksum["device_matches_store"] and checksum["flip_detected"] and checksum["digest_vs_torch_sum"] > 0
    reload = steps["reload"]["figures"]
    assert reload["direct_vs_staged"] > 0 and reload["model_s"] > 0 and reload["wall_vs_model"] > 0
    assert reload["ssd_to_device_gbps"] > 0 and reload["h2d_gbps"] > 0
    assert (out / "gpu_kit.log").read_text().count("PASS: ") == len(STEPS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA host the env step runs instead of skipping")
def test_gpu_run_on_a_cpu_host_skips_with_the_reason_and_fails(repo_root, tmp_path):
    proc = run_kit(repo_root, tmp_path, "--only", "env", script=False)
    assert proc.returncode == 1
    step = json.loads((tmp_path / "gpu_kit.json").read_text())["steps"][0]
    assert step["status"] == "SKIP" and step["reason"].startswith("needs CUDA GPU: ")
    assert "SKIP: env" in proc.stdout and "gpu kit: FAIL (0/1 steps)" in proc.stdout


def test_kit_modules_import_with_sglang_blocked(repo_root):
    code = (
        "import sys; from sglang_saria.gpukit.__main__ import _BlockSGLang; sys.meta_path.insert(0, _BlockSGLang()); "
        "from sglang_saria.gpukit.steps.env import KIT_MODULES; import importlib; "
        "[importlib.import_module(m) for m in KIT_MODULES]; "
        "[importlib.import_module('sglang_saria.gpukit.steps.' + s) for s in ('store', 'queues', 'gather', 'checksum', 'reload')]; "
        "import sglang"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "ImportError: the GPU kit runs without SGLang, but something imported 'sglang'" in proc.stderr
    assert proc.stderr.count("Traceback") == 1  # only the final, deliberate import failed
