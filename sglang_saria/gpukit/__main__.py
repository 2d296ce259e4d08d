"""``python -m sglang_saria.gpukit [--dry-run] [--out DIR] [--only STEP ...]`` (scripts/gpu_kit.sh).

``--step NAME --result FILE`` is the runner's child mode: run one step, write its result.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import json
import os
import sys
import traceback
from pathlib import Path

from sglang_saria.gpukit.steps import STEPS


class _BlockSGLang(importlib.abc.MetaPathFinder):
    """Make any `sglang` import fail: the kit's modules must not need SGLang."""

    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ImportError(f"the GPU kit runs without SGLang, but something imported {name!r}")
        return None


def run_child(name: str, result: Path, workdir: Path, dry_run: bool) -> int:
    sys.meta_path.insert(0, _BlockSGLang())
    from sglang_saria.gpukit.steps.common import StepContext, StepFailed, StepSkipped

    workdir.mkdir(parents=True, exist_ok=True)
    try:
        module = importlib.import_module(f"sglang_saria.gpukit.steps.{name}")
        out = {"status": "PASS", "figures": module.run(StepContext(dry_run, workdir))}
    except StepSkipped as e:
        out = {"status": "SKIP", "reason": str(e)}
    except StepFailed as e:
        out = {"status": "FAIL", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - any error is this step's FAIL, with its traceback in the log
        traceback.print_exc()
        out = {"status": "FAIL", "reason": f"{type(e).__name__}: {e}"}
    result.write_text(json.dumps(out))
    return 0


def main() -> int:
    names = [s.name for s in STEPS]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="run the steps on CPU (no GPU, no kvikio)")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                    help="folder for gpu_kit.json and gpu_kit.log (default: $OUT when set)")
    ap.add_argument("--only", nargs="+", choices=names, help="run these steps only")
    ap.add_argument("--step", choices=names, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:
        return run_child(args.step, args.result, args.workdir, args.dry_run)
    from sglang_saria.gpukit.runner import run_kit

    return run_kit(args.dry_run, args.out, args.only)


if __name__ == "__main__":
    sys.exit(main())
