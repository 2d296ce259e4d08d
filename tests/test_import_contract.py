"""The package's layering (README "Layering"), checked on every import in the source.

Every ``import``/``from ... import`` counts, including those inside functions: a cycle hidden
behind a deferred import is still a cycle. The contract has three parts:

- each top-level part of ``sglang_saria`` imports only the parts its row of ``ALLOWED`` names;
- no cycle between modules;
- nothing in the package imports ``scripts`` or ``tests``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = "sglang_saria"
SOURCE = Path(__file__).resolve().parents[1] / PACKAGE

# part -> the parts it may import (itself always). A part is a subpackage or a top-level module.
LEAVES = {"units", "model_specs", "policy_names", "launcher", "hybrid", "digest", "session_affinity", "fingerprint"}
ALLOWED: dict[str, set[str]] = {
    **{leaf: set() for leaf in LEAVES},
    "config": {"units", "policy_names"},
    "kernels": {"digest"},
    "storage": {"units", "digest"},
    "mem_cache": {"config", "units", "policy_names"},
    "replay": {"mem_cache", "config", "units", "policy_names", "model_specs", "session_affinity"},
    "reload": {"mem_cache", "storage", "kernels", "config", "units", "digest"},
    "hicache": {"reload", "mem_cache", "storage", "kernels", "config", "units", "policy_names", "digest",
                "fingerprint"},
    "gpukit": {"reload", "storage", "kernels", "mem_cache", "config", "units", "digest"},
    "agents": {"replay", "units"},
    "demo": {"agents", "launcher", "replay", "units"},
    "tiny_models": {"agents", "hybrid"},
    "fidelity": {"replay", "mem_cache", "config", "model_specs"},
    "bench": {"agents", "launcher", "replay", "config", "model_specs", "policy_names", "units", "tiny_models",
              "storage", "reload", "gpukit", "mem_cache"},
    "cluster": {"launcher", "session_affinity"},
    "plugin": {"hicache"},
}
FORBIDDEN_ROOTS = ("scripts", "tests")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path, modules: set[str]) -> set[str]:
    """Every module ``path`` imports, resolved to a module of ``modules`` where it is one
    (``from pkg import mod`` names the submodule ``pkg.mod``), else the imported name as written."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
            found.update(subs or [target])
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules (and forbidden roots) it imports."""
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        wanted = set()
        for target in imports_of(path, root, modules):
            if target.split(".")[0] in FORBIDDEN_ROOTS:
                wanted.add(target)
            elif target.split(".")[0] == root.name:
                while target not in modules and "." in target:  # `from pkg.mod import name`
                    target = target.rpartition(".")[0]
                wanted.add(target)
        graph[module_name(path, root)] = wanted - {module_name(path, root)}
    return graph


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        source = part_of(module)
        for target in sorted(targets):
            if target.split(".")[0] in FORBIDDEN_ROOTS:
                bad.append(f"{module} imports {target}: the package never imports scripts/ or tests/")
                continue
            dest = part_of(target)
            if not dest or dest == source:
                continue
            if source not in allowed:
                bad.append(f"{module}: part '{source}' has no row in the layering table")
            elif dest not in allowed[source]:
                bad.append(f"{module} imports {target}: '{source}' may import only {sorted(allowed[source])}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in graph), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_part_imports_only_its_layers() -> None:
    assert layer_violations(import_graph(SOURCE), ALLOWED) == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph(SOURCE)) == []


def test_the_layering_table_has_no_cycle() -> None:
    """The table itself is a DAG: no two parts may import each other, directly or not."""
    assert cycles({part: set(allowed) for part, allowed in ALLOWED.items()}) == []


def readme_layering() -> dict[str, set[str]]:
    """The README's "Layering" table as part -> parts it may import."""
    text = (SOURCE.parent / "README.md").read_text().split("### Layering", 1)[1]
    table: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            if table:
                break
            continue
        allowed = set(re.findall(r"`(\w+)`", cells[1]))
        table.update({part: allowed for part in re.findall(r"`(\w+)`", cells[0])})
    return table


def test_the_readme_states_this_contract() -> None:
    assert readme_layering() == ALLOWED


def test_every_part_has_a_row() -> None:
    parts = {part_of(m) for m in import_graph(SOURCE)} - {""}
    assert parts <= set(ALLOWED), f"parts without a layering row: {sorted(parts - set(ALLOWED))}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package ``sglang_saria`` under ``tmp_path`` with these modules (and their ``__init__``s)."""
    root = tmp_path / PACKAGE
    for rel, text in files.items():
        path = root / rel
        for folder in [path.parent, *path.parent.parents][: len(Path(rel).parts)]:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
        path.write_text(text)
    return root


def test_contract_catches_a_back_import(tmp_path: Path) -> None:
    """The checker itself: storage importing a policy module is named, with the rule it breaks."""
    root = _tree(tmp_path, {
        "storage/store.py": "def victims():\n    from sglang_saria.mem_cache.ssd_order import order\n",
        "mem_cache/ssd_order.py": "order = 1\n",
    })
    assert layer_violations(import_graph(root), ALLOWED) == [
        "sglang_saria.storage.store imports sglang_saria.mem_cache.ssd_order: "
        "'storage' may import only ['digest', 'units']"
    ]


def test_contract_catches_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    """A cycle through an import inside a function is found like any other."""
    root = _tree(tmp_path, {
        "mem_cache/admission.py": "from sglang_saria.mem_cache import budget\n",
        "mem_cache/budget.py": "def make():\n    from .admission import x\n",
    })
    assert cycles(import_graph(root)) == [["sglang_saria.mem_cache.admission", "sglang_saria.mem_cache.budget"]]


@pytest.mark.parametrize("line", ["import tests.faults", "from scripts import bench_tree"])
def test_contract_catches_imports_of_scripts_and_tests(tmp_path: Path, line: str) -> None:
    root = _tree(tmp_path, {"units.py": f"def f():\n    {line}\n"})
    [violation] = layer_violations(import_graph(root), ALLOWED)
    assert "never imports scripts/ or tests/" in violation


def test_the_backend_imports_without_prometheus_client():
    """SGLang validates the saria extra-config at launch (the plugin's check), importing the backend in its
    main process before it sets PROMETHEUS_MULTIPROC_DIR; prometheus_client fixes its value class
    when first imported, so an import here would hide the main process's (and, under fork, every
    subprocess's) metrics from /metrics."""
    import subprocess
    import sys

    probe = "import sys, sglang_saria.hicache.backend; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"
