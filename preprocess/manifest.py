"""manifest.json: what a candidates directory was built from. A restart must match it, so
shards built from other prompts or settings are never mixed into one dataset."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from pofe.files import write_atomic

from .config import GenerateConfig, JudgeConfig, PipelineConfig

MANIFEST_VERSION = 1


class ManifestMismatch(RuntimeError):
    """out_dir holds shards built from different inputs or settings."""


def build_manifest(
    rows: Sequence[dict],
    *,
    policy_path: str,
    method: str,
    generate: GenerateConfig,
    judge: JudgeConfig,
    candidates: PipelineConfig,
    prompt_column: str,
) -> dict:
    """The inputs' hash and every setting the shards depend on."""
    digest = hashlib.sha256()
    for r in rows:
        digest.update(json.dumps(r, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return {
        "version": MANIFEST_VERSION,
        "method": method,
        "policy_path": str(policy_path),
        "prompts_sha256": digest.hexdigest(),
        "num_prompts": len(rows),
        "prompt_column": prompt_column,
        "generate": generate.model_dump(),
        "judge": judge.model_dump(),
        "shard_size": candidates.shard_size,
    }


def check_manifest(out: Path, manifest: dict) -> None:
    """Write out/manifest.json, or check that the one there is the same; raise naming the keys
    that differ."""
    path = out / "manifest.json"
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
    if path.exists():
        old = json.loads(path.read_text())
        norm = json.loads(text)
        if old != norm:
            diff = sorted(k for k in set(old) | set(norm) if old.get(k) != norm.get(k))
            raise ManifestMismatch(
                f"{path} was written for different inputs or settings (differs in: {', '.join(diff)}). "
                "Use a new out_dir, or delete this one to start over."
            )
        return
    write_atomic(path, text)
