"""What `online/*` logs of a refresh: a window's stats (merged over the ranks by
`pofe.records.refresh.merged_stats`), and why a window's prompts kept too few candidates."""

from __future__ import annotations

from pathlib import Path


def window_stats(
    generated: list[dict], judged: list[dict], kept: dict[int, dict], kl: list[float]
) -> dict[str, float]:
    """What `online/*` logs of a window: prompts, candidates, the judge's mean and best-of-k
    reward of the policy's own samples (scalar judges; dataset responses left out: they do not
    move), and the mean sampled log-ratio to pi_0 (when measured); what removed candidates
    before training: empty, duplicate and cut ones (generation), the judge's abstentions (of its
    verdicts: candidates, or pairs for a pairwise judge); and the samples cut, and kept, where
    they began a user turn."""
    sampled = []
    for g, r in zip(generated, judged, strict=True):
        policy = {c for c, source in zip(g["candidates"], g["sources"]) if source == "policy"}
        rewards = [x for c, x in zip(r["responses"], r.get("rewards") or []) if c in policy]
        if rewards:
            sampled.append(rewards)
    stats = {
        "prompts": float(len(judged)),
        "prompts_dropped": float(len(judged) - len(kept)),
        "candidates": float(sum(len(r["responses"]) for r in judged)),
        "candidates_empty": float(sum(g.get("empty", 0) for g in generated)),
        "candidates_duplicate": float(sum(g.get("exact_dups", 0) + g.get("near_dups", 0) for g in generated)),
        "candidates_truncated": float(sum(g.get("truncated_dropped", 0) for g in generated)),
        # kept, cut where they began a user turn of their own (`pofe_candidates.user_turn`)
        "candidates_cut_at_user_turn": float(sum(g.get("user_turn_cut", 0) for g in generated)),
        "judge_verdicts": float(sum(r.get("judged", 0) for r in judged)),
        "judge_abstentions": float(sum(r.get("abstained", 0) for r in judged)),
    }
    if sampled:
        stats["candidate_reward_mean"] = sum(sum(r) for r in sampled) / sum(len(r) for r in sampled)
        stats["candidate_reward_best"] = sum(max(r) for r in sampled) / len(sampled)
    if kl:
        stats["kl_to_pi_0"] = sum(kl) / len(kl)
    return stats


def dropped_candidates(stats: dict[str, float], folder: Path) -> str:
    """Why a window's prompts kept too few candidates, from its stats (`window_stats`), and what
    to do: for a micro-batch left with none to train on."""
    counts = {
        "empty (the policy ended its turn at once)": stats.get("candidates_empty", 0),
        "duplicates (generate.dedupe)": stats.get("candidates_duplicate", 0),
        "cut at max_new_tokens (candidates.truncated: drop)": stats.get("candidates_truncated", 0),
    }
    removed = ", ".join(f"{int(n)} {what}" for what, n in counts.items())
    said = (
        f"Of this window's {int(stats['prompts'])} prompts, {int(stats['prompts_dropped'])} kept too few: its "
        f"candidates removed were {removed}, and the judge abstained on {int(stats.get('judge_abstentions', 0))} of "
        f"{int(stats.get('judge_verdicts', 0))} verdicts; the length policy drops the rest (the samples are in "
        f"{folder / 'generate.jsonl'}). "
    )
    if max(counts.values()) == counts["empty (the policy ended its turn at once)"] > 0:
        return said + (
            "The policy mostly answers with its end-of-turn token alone: check its samples and its chat template's "
            "generation prompt, raise pofe.generate.temperature, or add dataset responses "
            "(generate.include_dataset_responses)"
        )
    return said + (
        "Raise pofe.generate.num_candidates or temperature, micro_batch_size, or add dataset responses "
        "(generate.include_dataset_responses)"
    )
