"""Run the kit's steps, each in its own process under a time limit, and report them.

A step process blocks `sglang` imports (the kit must run where SGLang is not installed),
writes its result as JSON, and prints its own notes; the runner relays that output, prints
one PASS/FAIL/SKIP line per step, and writes `gpu_kit.json` and `gpu_kit.log` to --out.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from sglang_saria.gpukit.steps import STEPS, Step

_TAIL_LINES = 20


@dataclass
class StepResult:
    name: str
    status: str  # PASS, FAIL or SKIP
    seconds: float
    reason: str = ""  # why it failed or skipped
    measures: str = ""  # what the step measures on a GPU host
    figures: dict = field(default_factory=dict)


def _step_env(step: Step, dry_run: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if dry_run and step.interpret:
        env["TRITON_INTERPRET"] = "1"  # read when triton is imported: set before the step starts
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _relay(stream: TextIO, sinks: list[TextIO], tail: list[str]) -> None:
    for line in stream:
        tail.append(line.rstrip("\n"))
        del tail[:-_TAIL_LINES]
        for sink in sinks:
            sink.write("    " + line)
            sink.flush()


def run_step(step: Step, dry_run: bool, workdir: Path, sinks: list[TextIO]) -> StepResult:
    """One step in a child process; killed (with its children) when it outlives its limit."""
    result_path = workdir / f"{step.name}.result.json"
    cmd = [sys.executable, "-m", "sglang_saria.gpukit", "--step", step.name, "--result", str(result_path),
           "--workdir", str(workdir / step.name)]
    if dry_run:
        cmd.append("--dry-run")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=_step_env(step, dry_run), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    tail: list[str] = []
    reader = threading.Thread(target=_relay, args=(proc.stdout, sinks, tail), daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=step.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=5)
        return StepResult(step.name, "FAIL", time.perf_counter() - start, f"timed out after {step.timeout_s} s", step.measures)
    reader.join(timeout=5)
    seconds = time.perf_counter() - start
    if not result_path.exists():
        last = " | ".join(tail[-3:])
        return StepResult(step.name, "FAIL", seconds, f"step process exited {code} without a result: {last}", step.measures)
    data = json.loads(result_path.read_text())
    return StepResult(step.name, data["status"], seconds, data.get("reason", ""), step.measures, data.get("figures", {}))


def _line(r: StepResult) -> str:
    figures = " ".join(f"{k}={v}" for k, v in r.figures.items())
    why = f" -- {r.reason}" if r.reason else ""
    return f"{r.status}: {r.name} ({r.seconds:.1f} s){why}" + (f"\n      {figures}" if figures else "")


def run_kit(dry_run: bool, out_dir: Path | None, only: list[str] | None = None) -> int:
    """Run the steps in order; exit status 0 only when every step passed."""
    steps = [s for s in STEPS if not only or s.name in only]
    log_file = None
    sinks: list[TextIO] = [sys.stdout]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(out_dir / "gpu_kit.log", "w")
        sinks.append(log_file)

    def say(msg: str) -> None:
        for sink in sinks:
            sink.write(msg + "\n")
            sink.flush()

    mode = "dry-run (CPU: POSIX engine, Triton interpreter, CPU pools)" if dry_run else "gpu"
    say(f"gpu kit: {mode}, {len(steps)} steps, host {platform.node()}")
    workdir = Path(tempfile.mkdtemp(prefix="saria-gpukit-", dir=os.environ.get("SARIA_KIT_DIR")))
    results = []
    started = time.time()
    try:
        for step in steps:
            say(f"== {step.name}: {step.measures}")
            result = run_step(step, dry_run, workdir, sinks)
            results.append(result)
            say(_line(result))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    passed = all(r.status == "PASS" for r in results)
    say(f"gpu kit: {'ALL PASS' if passed else 'FAIL'} ({sum(r.status == 'PASS' for r in results)}/{len(results)} steps) "
        f"in {time.time() - started:.1f} s")
    if out_dir is not None:
        report = {"mode": "dry-run" if dry_run else "gpu", "host": platform.node(), "started": started,
                  "seconds": round(time.time() - started, 2), "passed": passed,
                  "steps": [asdict(r) | {"seconds": round(r.seconds, 2)} for r in results]}
        (out_dir / "gpu_kit.json").write_text(json.dumps(report, indent=2) + "\n")
        log_file.close()
    return 0 if passed else 1
