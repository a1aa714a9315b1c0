"""What the linters cannot say: every module imports, none grows past about 400 lines, no
function past about 60 code lines without saying why, and only the method registry knows the
methods' names (the judge registry the judge types'). Layers and import cycles are import-linter's contracts (pyproject.toml,
`make lint`); style is ruff's.

Walks the packages in the source folders (plugin/pofe -> pofe, preprocess/pofe_candidates ->
pofe_candidates: folder = import path), so an import of a moved module fails here.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = (ROOT / "plugin", ROOT / "preprocess")


def _modules() -> dict[str, Path]:
    """Every module under the source folders, named by its path (folder = import path)."""
    mods = {}
    for folder in SOURCE_FOLDERS:
        for path in sorted(folder.rglob("*.py")):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            if parts[-1] == "__main__":
                continue
            mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def test_every_module_imports():
    failed = {}
    for name in sorted(MODULES):
        try:
            importlib.import_module(name)
        except Exception as e:  # every failure named, not only the first
            failed[name] = f"{type(e).__name__}: {e}"
    assert not failed, failed


def test_every_module_is_short():
    """One job per module: none grows past about 400 lines."""
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}"


MAX_CODE_LINES = 60


def _code_lines(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's code lines: the lines of its body after its docstring that are neither
    blank nor comment-only (nested functions count towards the outer one too)."""
    body = node.body
    if ast.get_docstring(node, clean=False) is not None:
        start = body[0].end_lineno + 1  # the line after the docstring
    else:
        first = body[0]
        start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    lines = source.splitlines()[start - 1 : node.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def _long_reason(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The text after a docstring line starting "Long:" (why the function is long), if any."""
    for line in (ast.get_docstring(node) or "").splitlines():
        if line.strip().startswith("Long:") and line.strip()[len("Long:") :].strip():
            return line.strip()[len("Long:") :].strip()
    return None


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) for every function and method, nested ones included."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{child.name}", child
            yield from _functions(child, f"{prefix}{child.name}.<locals>.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


SAMPLE = '''
def outer(x):
    """Docstring,
    two lines."""
    # a comment-only line

    y = x + 1  # a trailing comment: still code
        # an indented comment
    @staticmethod
    def inner():
        return (
            1,
        )
    return y
'''


def test_code_line_counter_counts_a_sample():
    """outer: `y = ...`, `@staticmethod`, `def inner`, `return (`, `1,`, `)`, `return y` = 7
    (docstring, comments and the blank line left out); inner: its 3-line return = 3."""
    found = dict(_functions(ast.parse(SAMPLE)))
    assert sorted(found) == ["outer", "outer.<locals>.inner"]
    assert _code_lines(SAMPLE, found["outer"]) == 7
    assert _code_lines(SAMPLE, found["outer.<locals>.inner"]) == 3
    one_liner = "def f(): return 1\n"
    assert _code_lines(one_liner, ast.parse(one_liner).body[0]) == 1
    assert _long_reason(found["outer"]) is None
    marked = ast.parse('def f():\n    """Short.\n\n    Long: one table, read top to bottom."""\n')
    assert _long_reason(marked.body[0]) == "one table, read top to bottom."
    assert _long_reason(ast.parse('def f():\n    """Long:"""\n').body[0]) is None  # no reason given


def test_functions_are_short():
    """One job per function: none over ~60 code lines unless its docstring says why ("Long: ...")."""
    long = []
    for name, path in sorted(MODULES.items()):
        source = path.read_text()
        long += [
            f"{name}.{qualname}: {n} code lines"
            for qualname, node in _functions(ast.parse(source))
            if (n := _code_lines(source, node)) > MAX_CODE_LINES and _long_reason(node) is None
        ]
    assert not long, f"over {MAX_CODE_LINES} code lines, with no 'Long:' reason in the docstring: {long}"


# A method's name or label column compared outside `pofe.methods`: a branch that a new
# method would have to edit. Reading a column by name (`row["rewards"]`) is not a branch.
METHOD_BRANCHES = re.compile(
    r"""(==|!=)\s*["'](rrhf|sppo|nash_md|rewards|win_rates|preferences)["']"""  # x == "sppo"
    r"""|["'](rrhf|sppo|nash_md|rewards|win_rates|preferences)["']\s*(==|!=)"""  # "sppo" == x
    r"""|\bin\s*[(\[{][^)\]}]*["'](rrhf|sppo|nash_md)["']"""  # x in (None, "sppo")
    r"""|["'](rrhf|sppo|nash_md)["']\s+(not\s+)?in\b"""  # "sppo" in methods
    r"""|["'](rewards|win_rates)["']\s+(not\s+)?in\s+\w+\.column_names"""  # a dataset's label column
    r"""|\.target\s*(==|!=)"""  # spec.target == ...
    r"""|pofe\.\{[^}]*method"""  # f"pofe.{method}": a dataset type made from a method name
)


def test_no_branch_on_method_names():
    """Only the registry (`pofe.methods`) knows the methods: elsewhere code asks the spec."""
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for name, path in sorted(MODULES.items())
        if name != "pofe.methods"
        for i, line in enumerate(path.read_text().splitlines(), start=1)
        if METHOD_BRANCHES.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_method_branch_pattern_finds_the_old_branches():
    """The pattern catches each form the code used before the method registry said it all."""
    for line in (
        'if method_spec(method).target == "win_rates":',
        'if self.method not in (None, "sppo"):',
        'if "rewards" in part.column_names:',
        'type=f"pofe.{fmt.method}"',
        "spread = spec.target == x",
        'if method == "rrhf":',
    ):
        assert METHOD_BRANCHES.search(line), line
    for line in ('logp = inputs["rewards"]', 'if "rewards" in plots:', 'raise ValueError(f"pofe.{key}: x")'):
        assert not METHOD_BRANCHES.search(line), line


# A judge type compared outside the judge registry (`pofe_candidates.config.judge_kinds`): a
# branch that a new judge would have to edit. The registry's spec says what each type is.
JUDGE_TYPES = r"(python|python_pairwise|reward_model|llm|pairwise_llm|pairrm|gpm)"
JUDGE_BRANCHES = re.compile(
    rf"""(==|!=)\s*["']{JUDGE_TYPES}["']"""  # cfg.type == "pairrm"
    rf"""|["']{JUDGE_TYPES}["']\s*(==|!=)"""  # "pairrm" == cfg.type
    rf"""|\bin\s*[(\[{{][^)\]}}]*["']{JUDGE_TYPES}["']"""  # judge.type in ("reward_model", "pairrm")
    rf"""|["']{JUDGE_TYPES}["']\s+(not\s+)?in\b"""  # "pairrm" in kinds
)


def test_no_branch_on_judge_types():
    """Only the judge registry knows the judge types: elsewhere code asks the type's spec."""
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for name, path in sorted(MODULES.items())
        if name != "pofe_candidates.config.judge_kinds"
        for i, line in enumerate(path.read_text().splitlines(), start=1)
        if JUDGE_BRANCHES.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_judge_branch_pattern_finds_the_old_branches():
    """The pattern catches each form the code used before the judge registry said it all."""
    for line in (
        'if cfg.type == "python" and cfg.reward_funcs:',
        'if cfg.type in ("llm", "pairwise_llm"):',
        'shares = judge.type == "reward_model" and judge.prefix_sharing',
        'llm = self.type in ("llm", "pairwise_llm")',
        'if judge is not None and judge.type in ("reward_model", "pairrm"):',
    ):
        assert JUDGE_BRANCHES.search(line), line
    for line in ('raise ValueError(f"unknown judge.type {name!r}")', 'launcher="python"', 'row["reward"]'):
        assert not JUDGE_BRANCHES.search(line), line
