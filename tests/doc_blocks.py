"""The fenced code blocks of the README and the docs, and what each says about how it is tested.

A shell block runs as written unless the line before its fence marks it:

    <!-- shell: parse only: <why> -->      never run here (a GPU, the hub, placeholders, the suite
                                           itself); `bash -n` and each command's options checked
    <!-- shell: run by <test file>: ... -->  run as written by that test (a long run the suite makes
                                           anyway), checked here as a parse-only block is

`tests/test_doc_blocks.py` runs, parses or checks every block; a block run by another test is
read there with `shell_block(doc, first_line)`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT

DOCS = [ROOT / "README.md", ROOT / "preprocess" / "README.md", ROOT / "benchmarks" / "README.md"]
DOCS += sorted((ROOT / "docs").glob("*.md"))
SHELL = ("bash", "sh", "shell")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!-- shell: (parse only|run by ([^:]+)): (.+?) -->\s*$", re.S)


@dataclass(frozen=True)
class Block:
    """One fenced block: its doc, the line of its fence, its language and text, and for a shell
    block its mode (`run`, `parse only`, `run by`), why, and the test that runs it."""

    doc: Path
    line: int
    language: str
    text: str
    mode: str = "run"
    why: str = ""
    runner: str | None = None

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[list[str]]:
        """Each command of the block as words, comments dropped, `&&` chains split."""
        found = []
        for line in self.text.splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                found.append(words[:cut])
                words = words[cut + 1 :]
        return [c for c in found if c]


def blocks(docs: list[Path] = DOCS) -> list[Block]:
    found = []
    for doc in docs:
        text = doc.read_text()
        for match in _FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before) if match.group(1) in SHELL else None
            mode = "run" if mark is None else ("parse only" if mark.group(1) == "parse only" else "run by")
            found.append(
                Block(
                    doc=doc,
                    line=text[: match.start()].count("\n") + 1,
                    language=match.group(1),
                    text=match.group(2),
                    mode=mode,
                    why=mark.group(3) if mark else "",
                    runner=mark.group(2).strip() if mark and mark.group(2) else None,
                )
            )
    return found


def shell_block(doc: str, first_line: str) -> Block:
    """The shell block of `doc` (relative to the repository) whose first line starts with
    `first_line`: what a test that runs a block as written runs."""
    (found,) = [
        b for b in blocks([ROOT / doc]) if b.language in SHELL and b.text.splitlines()[0].startswith(first_line)
    ]
    return found
