"""The tools are package modules with console scripts (setup.py): each script's module has a
``main(argv)`` whose ``--help`` names the script, and every ``scripts/`` file the docs, the Makefile
or the package name exists (a tool that moved into the package leaves no stale path behind)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def console_scripts() -> dict[str, str]:
    """setup.py's ``console_scripts`` as script name -> ``module:function``."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "console_scripts":
                    entries = [ast.literal_eval(v) for v in value.elts]
                    return dict(entry.split("=", 1) for entry in entries)
    raise AssertionError("setup.py declares no console_scripts")


@pytest.mark.parametrize("script,target", sorted(console_scripts().items()))
def test_each_console_script_runs_main_and_names_itself(script: str, target: str, capsys) -> None:
    module, _, function = target.partition(":")
    main = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {script} ")


def test_every_scripts_path_named_in_docs_and_code_exists() -> None:
    texts = [REPO / "README.md", REPO / "Makefile", *REPO.glob("docs/*.md"), *REPO.glob("sglang_saria/**/*.md"),
             *REPO.glob("sglang_saria/**/*.py"), *REPO.glob("scripts/*")]
    missing = sorted({f"{path.relative_to(REPO)}: {name}" for path in texts
                      for name in re.findall(r"\bscripts/[\w.-]+\.(?:py|sh)\b", path.read_text())
                      if not (REPO / name).exists()})
    assert missing == []
