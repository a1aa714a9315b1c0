"""The docs name only what exists: every `pofe.<...>` a doc puts in backticks is a module (or
an attribute of one), a key of the `pofe:` block, or a dataset type. A module moved or a key
renamed fails here until the docs follow."""

from __future__ import annotations

import importlib
import re

import yaml

from pofe.args import PofeConfig
from pofe.methods import DATASET_TYPES
from pofe_candidates.config import JUDGES, JudgeConfig
from pofe_candidates.judges.llm import DEFAULT_RUBRIC
from pofe_candidates.judges.pairwise import DEFAULT_PAIRWISE
from tests.helpers import ROOT

DOCS = [ROOT / "README.md", ROOT / "preprocess" / "README.md", ROOT / "benchmarks" / "README.md"]
DOCS += sorted((ROOT / "docs").glob("*.md"))
NAME = re.compile(r"`(pofe(?:\.\w+)+)")


def _model_of(annotation):
    """The pydantic block a field holds (through Optional and unions), or None."""
    found = [a for a in getattr(annotation, "__args__", (annotation,)) if hasattr(a, "model_fields")]
    return found[0] if found else None


def _is_key(parts: list[str]) -> bool:
    """`pofe.a.b`: a key of the `pofe:` block, block by block."""
    model = PofeConfig
    for part in parts:
        if model is dict:  # a mapping key (`generate.vllm_kwargs.max_model_len`): the engine's own
            return True
        if model is None or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        model = dict if "dict" in str(annotation) else _model_of(annotation)
    return True


def _is_code(parts: list[str]) -> bool:
    """`pofe.a.b.c`: the longest prefix that imports as a module, the rest attributes of it."""
    for cut in range(len(parts), -1, -1):
        try:
            obj = importlib.import_module(".".join(["pofe", *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_docs_name_only_modules_and_keys_that_exist():
    stale = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), start=1):
            for name in NAME.findall(line):
                parts = name.split(".")[1:]
                if not (name in DATASET_TYPES or _is_key(parts) or _is_code(parts)):
                    stale.append(f"{doc.relative_to(ROOT)}:{n}: {name}")
    assert not stale, "\n".join(stale)


def test_every_judge_type_has_an_example_that_validates():
    """docs/candidates.md shows each `judge.type` in a `pofe:` block that validates as written,
    and the rubrics it calls built in are the built-in ones, character for character."""
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "candidates.md").read_text(), re.S)
    judges = [b["pofe"]["judge"] for b in map(yaml.safe_load, blocks) if "judge" in ((b or {}).get("pofe") or {})]
    assert {j["type"] for j in judges} == set(JUDGES)
    for judge in judges:
        JudgeConfig.model_validate(judge)
    rubrics = {j["type"]: j["rubric"].rstrip("\n") for j in judges if "rubric" in j}
    assert rubrics == {"llm": DEFAULT_RUBRIC, "pairwise_llm": DEFAULT_PAIRWISE}


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_docs_resolve():
    """Every relative link of the README and docs/ names a file that exists and, with a #, one
    of its headings (the README's parts moved to docs/: a link left behind fails here)."""
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no file)")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{doc.relative_to(ROOT)}: {target} (no heading)")
    assert not broken, "\n".join(broken)
