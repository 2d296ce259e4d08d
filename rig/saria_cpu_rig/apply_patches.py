"""Apply (or check, or revert) the CPU rig's patches (patches/sglang-<version>/) to the installed SGLang.

All or none: the patched files are first built in a scratch copy, in patch order (so a
patch may build on an earlier one touching the same file), and copied over the
installed files only when every patch applied. Re-running is a no-op: a patch whose
reverse applies cleanly is already in place.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PINNED_VERSION = "0.5.23"
PATCH_DIR = Path(__file__).resolve().parent / "patches" / f"sglang-{PINNED_VERSION}"


class PatchError(RuntimeError):
    """A patch cannot be applied; the installed SGLang was left unmodified."""


@dataclass(frozen=True)
class PatchOutcome:
    patch: Path
    status: str  # "already applied" | "applied" | "reverted" | "not applied"


def installed_sglang() -> tuple[str, Path]:
    """Version and site-packages folder of the installed sglang, without importing it (slow)."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise PatchError("sglang is not installed in this environment (run scripts/setup.sh)") from None
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("sglang is installed but its package folder was not found")
    return version, Path(list(spec.submodule_search_locations)[0]).parent


def touched_files(patch: Path) -> list[str]:
    """Paths (relative to site-packages) named by the patch's +++ lines."""
    names = re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), flags=re.MULTILINE)
    if not names:
        raise PatchError(f"{patch.name}: no '+++ b/<path>' lines; not a unified diff")
    return names


def _git_apply(tree: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess:
    # The ceiling keeps git from treating an enclosing repository as the target.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
    return subprocess.run(
        ["git", "apply", "--whitespace=nowarn", *flags, str(patch)],
        cwd=tree, env=env, capture_output=True, text=True,
    )


def _first_failure(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("error:"):
            return line[len("error:"):].strip()
    return stderr.strip() or "git apply failed"


def run(patches: list[Path], site_packages: Path, mode: str) -> list[PatchOutcome]:
    """mode: 'apply', 'check' (apply in scratch only) or 'revert' (undo in reverse order)."""
    files = sorted({name for p in patches for name in touched_files(p)})
    outcomes: list[PatchOutcome] = []
    with tempfile.TemporaryDirectory(prefix="saria-patch-") as scratch_dir:
        scratch = Path(scratch_dir) / "site-packages"
        for name in files:
            source = site_packages / name
            if not source.exists():
                raise PatchError(f"{name}: file named by a patch is missing from the installed sglang")
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, scratch / name)
        ordered = list(reversed(patches)) if mode == "revert" else patches
        for patch in ordered:
            applied = _git_apply(scratch, patch, "--reverse", "--check").returncode == 0
            if mode == "revert":
                if not applied:
                    outcomes.append(PatchOutcome(patch, "not applied"))
                    continue
                result = _git_apply(scratch, patch, "--reverse")
                status = "reverted"
            else:
                if applied:
                    outcomes.append(PatchOutcome(patch, "already applied"))
                    continue
                result = _git_apply(scratch, patch)
                status = "applied"
            if result.returncode != 0:
                raise PatchError(f"{patch.name} does not apply: {_first_failure(result.stderr)}")
            outcomes.append(PatchOutcome(patch, status))
        if mode != "check":
            for name in files:
                target = site_packages / name
                staged = target.with_name(target.name + ".saria-new")
                shutil.copy2(scratch / name, staged)
                os.replace(staged, target)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="verify every patch applies or is applied; change nothing")
    group.add_argument("--revert", action="store_true", help="undo the applied patches")
    parser.add_argument("--patch-dir", type=Path, default=PATCH_DIR, help=f"default: {PATCH_DIR}")
    args = parser.parse_args(argv)
    mode = "check" if args.check else "revert" if args.revert else "apply"
    try:
        version, site_packages = installed_sglang()
        if version != PINNED_VERSION:
            raise PatchError(
                f"installed sglang is {version}, but the patches in {args.patch_dir} target {PINNED_VERSION}; "
                f"install sglang=={PINNED_VERSION} (scripts/setup.sh does)"
            )
        patches = sorted(args.patch_dir.glob("*.patch"))
        if not patches:
            raise PatchError(f"no *.patch files in {args.patch_dir}")
        outcomes = run(patches, site_packages, mode)
    except PatchError as err:
        print(f"error: {err}; the installed sglang was not modified", file=sys.stderr)
        return 1
    for outcome in outcomes:
        verb = {"applied": "would apply" if mode == "check" else "applied"}.get(outcome.status, outcome.status)
        print(f"{outcome.patch.name}: {verb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
