"""manifest.json: what a stage's shards were built from, one per stage directory.

`generate/manifest.json` holds the prompts' hash and the generate settings; a restart must
match it, so shards built from other prompts or settings are never mixed into one dataset.
`judge/manifest.json` holds the judge settings, its code or weights (`identity.py`) and the
method (which decides the judge shards' labels). The judge's shards depend on the generate shards but not the reverse: a
changed judge reuses every generate shard. The previous judge's shards are parked in
`judge-<key>/` (and moved back if that judge returns), never deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from pofe.errors import PofeError
from pofe.files import read_json, stable_hash, write_atomic
from pofe.logs import logger_name
from pofe_candidates.config import GenerateConfig, JudgeConfig, redact
from pofe_candidates.config.generate import SERVE_RUNTIME_KEYS
from pofe_candidates.identity import judge_identity

MANIFEST_VERSION = 2
LOG = logging.getLogger(logger_name(__name__))


class ManifestMismatch(PofeError, RuntimeError):
    """out_dir holds shards built from different inputs or settings."""


def generate_manifest(
    rows: Sequence[dict], *, policy_path: str, generate: GenerateConfig, shard_size: int, prompt_column: str
) -> dict:
    """The inputs' hash and every setting the generate shards depend on."""
    digest = hashlib.sha256()
    for r in rows:
        digest.update(json.dumps(r, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return {
        "version": MANIFEST_VERSION,
        "policy_path": str(policy_path),
        "prompts_sha256": digest.hexdigest(),
        "num_prompts": len(rows),
        "prompt_column": prompt_column,
        "generate": generate_settings(generate),
        "shard_size": shard_size,
    }


def generate_settings(generate: GenerateConfig) -> dict:
    """The generate settings the samples depend on: all but the server's runtime keys and
    in_flight (how many prompts share the engine)."""
    return generate.model_dump(exclude={"serve": set(SERVE_RUNTIME_KEYS), "in_flight": True})


def judge_manifest(*, method: str, judge: JudgeConfig) -> dict:
    """Every setting the judge shards depend on (max_abstention_rate is a check over the
    shards, not part of them: raising it reuses them), and the judge's code or weights
    (`identity.judge_identity`: an edited judge function judges again)."""
    return {
        "version": MANIFEST_VERSION,
        "method": method,
        # how long a call may take, and how many are in flight, change no verdict that is written
        "judge": judge.model_dump(exclude={"max_abstention_rate", "timeout", "stage_timeout", "in_flight"}),
        "judge_identity": judge_identity(judge),
    }


def check_manifest(stage_dir: Path, manifest: dict) -> None:
    """Write stage_dir/manifest.json, or check that the one there is the same; raise naming
    the keys that differ."""
    path = stage_dir / "manifest.json"
    old = _read(path)
    if old is None and any(stage_dir.glob("shard-*.jsonl")):
        raise ManifestMismatch(
            f"{stage_dir} holds shards but no manifest.json (an older POFE?): delete it to start over."
        )
    if old is None:
        write_atomic(path, _text(manifest), private=True)
    elif old != json.loads(_text(manifest)):
        differ = "; ".join(
            f"{key}: {a} in the folder, {b} in this recipe" for key, a, b in changed_settings(old, manifest)
        )
        raise ManifestMismatch(
            f"{path} holds shards built from other inputs or settings ({differ}): another recipe's "
            f"candidates, or this one's before an edit. Set pofe.candidates.out_dir to a folder of its own, "
            f"or delete {stage_dir.parent} to start over."
        )


def select_judge_dir(out: Path, manifest: dict) -> Path:
    """out/judge, holding this judge's shards: another judge's are parked in judge-<key>/,
    and this judge's earlier ones, if parked, are moved back."""
    judge_dir = out / "judge"
    old = _read(judge_dir / "manifest.json")
    if old is not None and old != json.loads(_text(manifest)):
        parked = out / f"judge-{stable_hash(old, 12)}"
        judge_dir.rename(parked)
        changed = ", ".join(key for key, _, _ in changed_settings(old, manifest))
        LOG.warning(f"POFE: judge settings changed ({changed}); earlier judge shards kept in {parked}")
    returning = out / f"judge-{stable_hash(json.loads(_text(manifest)), 12)}"
    if not judge_dir.exists() and returning.exists():
        returning.rename(judge_dir)
        LOG.info(f"POFE: reusing this judge's earlier shards from {returning}")
    judge_dir.mkdir(exist_ok=True)
    check_manifest(judge_dir, manifest)
    return judge_dir


def recorded(settings: dict) -> dict:
    """`settings` as a manifest records them (redacted; values JSON, others as text): equal
    settings give equal records, which `changed_settings` compares."""
    return json.loads(_text(settings))


def _text(manifest: dict) -> str:
    # redacted: serve.command may carry a server's --api-key (a changed key reuses the shards)
    return json.dumps(redact(manifest), indent=2, sort_keys=True, default=str) + "\n"


def _read(path: Path) -> dict | None:
    """The manifest, None when absent; a cut one is an error naming it (the shards beside it
    cannot be checked against it)."""
    fix = (
        f"It records the settings the shards of {path.parent} were built with, which cannot be "
        f"checked without it: delete {path.parent} to build them again."
    )
    return read_json(path, fix) if path.exists() else None


_UNSET = object()  # a key one side lacks


def changed_settings(old: dict, new: dict) -> list[tuple[str, str, str]]:
    """(dotted key, its value in `old`, in `new`) for each leaf that differs, nested blocks
    followed down (`generate.dedupe`, not `generate`); values as JSON, absent as `unset`;
    `old` as recorded, `new` as given (`recorded`)."""
    return _leaf_changes(old, recorded(new), "")


def _leaf_changes(old, new, prefix: str) -> list[tuple[str, str, str]]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [c for k in keys for c in _leaf_changes(old.get(k, _UNSET), new.get(k, _UNSET), f"{prefix}{k}.")]
    if old == new:
        return []
    return [(prefix[:-1], _shown(old), _shown(new))]


def _shown(value) -> str:
    return "unset" if value is _UNSET else json.dumps(value)[:80]
