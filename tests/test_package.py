"""Every module of the package imports, and no two modules import each other.

Walks the source folders the way pyproject maps them (plugin/ -> pofe,
preprocess/ -> pofe.preprocess), so a module missing from the package list, an import of
a moved module, or an import cycle (imports inside functions included) fails here.
"""

from __future__ import annotations

import ast
import re
import graphlib
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"pofe": ROOT / "plugin", "pofe.preprocess": ROOT / "preprocess"}


def _modules() -> dict[str, Path]:
    mods = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            if parts and parts[-1] == "__main__":
                continue
            mods[".".join([package, *parts])] = path
    return mods


MODULES = _modules()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_imports(name):
    importlib.import_module(name)


def _imports(name: str, path: Path) -> set[str]:
    """The pofe modules `name` imports (at module level or inside functions), each resolved
    to the most specific module; packages' `__init__` modules and `name`'s own ancestors
    are left out (a package re-exporting its children is not a cycle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            targets = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + ".") \
                    and MODULES[target].name != "__init__.py":
                found.add(target)
    return found


def test_no_import_cycles():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_short(name):
    """One job per module: none grows past about 400 lines."""
    assert len(MODULES[name].read_text().splitlines()) <= 400, f"{MODULES[name]} is over 400 lines"


# A method's name or label column compared outside `pofe.methods`: a branch that a new
# method would have to edit. Reading a column by name (`row["rewards"]`) is not a branch.
METHOD_BRANCHES = re.compile(
    r"""(==|!=)\s*["'](rrhf|sppo|rewards|win_rates)["']"""  # x == "sppo"
    r"""|["'](rrhf|sppo|rewards|win_rates)["']\s*(==|!=)"""  # "sppo" == x
    r"""|\bin\s*[(\[{][^)\]}]*["'](rrhf|sppo)["']"""  # x in (None, "sppo")
    r"""|["'](rrhf|sppo)["']\s+(not\s+)?in\b"""  # "sppo" in methods
    r"""|["'](rewards|win_rates)["']\s+(not\s+)?in\s+\w+\.column_names"""  # a dataset's label column
    r"""|\.target\s*(==|!=)"""  # spec.target == ...
    r"""|pofe\.\{[^}]*method"""  # f"pofe.{method}": a dataset type made from a method name
)


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"pofe.methods"}))
def test_no_branch_on_method_names(name):
    """Only the registry (`pofe.methods`) knows the methods: elsewhere code asks the spec."""
    hits = [f"{MODULES[name].name}:{i}: {line.strip()}"
            for i, line in enumerate(MODULES[name].read_text().splitlines(), start=1)
            if METHOD_BRANCHES.search(line)]
    assert not hits, "\n".join(hits)


def test_method_branch_pattern_finds_the_old_branches():
    """The pattern catches each form the code used before the method registry said it all."""
    for line in ('if method_spec(method).target == "win_rates":', 'if self.method not in (None, "sppo"):',
                 'if "rewards" in part.column_names:', 'type=f"pofe.{fmt.method}"', 'spread = spec.target == x',
                 'if method == "rrhf":'):
        assert METHOD_BRANCHES.search(line), line
    for line in ('logp = inputs["rewards"]', 'if "rewards" in plots:', 'raise ValueError(f"pofe.{key}: x")'):
        assert not METHOD_BRANCHES.search(line), line
