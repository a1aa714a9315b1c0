"""Trained model vs best-of-k on the held-out prompts: eval.json's `best_of_k`.

Round t samples its K candidates (`pofe.generate.num_candidates`) from pi_{t-1} and trains
pi_t towards the best of them. The headline measures that on the round's own (trained-on)
prompts; here it is measured on prompts no round trained on: in evaluation, each policy a
round started from (pi_0 .. pi_{T-1}) samples K candidates for every held-out prompt, with the
round's decoding (`pofe.generate`'s temperature, top_p, max_new_tokens; the round's seed,
`generate.seed + t - 1`), for evaluation only (never trained on). The recipe's scalar judge
scores them (with each prompt's other columns, as the judge stage gave them); per round: their mean, their best-of-k (mean over prompts of the best reward),
beside pi_t's mean held-out reward (at `pofe.eval`'s decoding). Only the policy's own samples
count (not `include_dataset_responses`); they come from the rounds' vLLM engine when
evaluation samples there (`pofe.eval.backend`), else from the transformers backend. A
pairwise judge gives no scalar reward: no entry.
"""

from __future__ import annotations

from dataclasses import replace

from pofe.run.evaluation.answers import HeldOut
from pofe.run.evaluation.judging import scalar_scores
from pofe.run.evaluation.sampler import Progress
from pofe_candidates.config import GenerateConfig, JudgeConfig, Sampling
from pofe_candidates.generators.hf import Sample
from pofe_candidates.win_rates import nan_mean


def round_sampling(generate: GenerateConfig, t: int) -> Sampling:
    """Round t's candidate decoding, with the seed the runner gave round t."""
    sampling = generate.sampling()
    return replace(sampling, seed=sampling.seed + (t - 1))


def held_out_candidates(
    sampler, rendered: list[str], generate: GenerateConfig, t: int, progress: Progress = None
) -> list[list[Sample]]:
    """Round t's K candidates on the held-out prompts from `sampler` (pi_{t-1}'s,
    `pofe.run.evaluation.sampler`): [prompt][k]."""
    return sampler.sample(rendered, generate.num_candidates, round_sampling(generate, t), progress)


def best_of_k(
    judge,
    held_out: HeldOut,
    candidates: dict[int, list[list[Sample]]],
    trained_reward: list[float | None],
    judge_cfg: JudgeConfig | None = None,
) -> tuple[list[dict], list[dict]]:
    """(entries, records). One entry per round t in `candidates` ({t: [prompt][k] samples from
    pi_{t-1} on the `held_out` prompts}): {"round", "k", "mean_candidate_reward", "best_of_k_reward", "trained_mean_reward"
    (pi_t's, from `trained_reward`, eval.json's mean_reward), "trained_minus_best_of_k"}; one
    record per candidate (eval/candidates.jsonl): round, prompt_index, k, response, tokens, reward.
    `judge_cfg`: the judge's config, each round's abstentions checked against it (`scalar_scores`)."""
    out, records = [], []
    for t, cands in sorted(candidates.items()):
        responses = [[s.text for s in row] for row in cands]
        rewards = scalar_scores(
            judge,
            held_out.prompts,
            held_out.rendered,
            responses,
            held_out.columns,
            desc=f"judge round {t}'s held-out candidates",
            cfg=judge_cfg,
        )
        records += [
            {
                "round": t,
                "prompt_index": p,
                "k": k,
                "response": smp.text,
                "tokens": len(smp.response_ids),
                "reward": rewards[p][k],
            }
            for p, row in enumerate(cands)
            for k, smp in enumerate(row)
        ]
        best = nan_mean([max((x for x in row if x == x), default=float("nan")) for row in rewards])
        trained = trained_reward[t] if t < len(trained_reward) else None
        out.append(
            {
                "round": t,
                "k": len(cands[0]) if cands else 0,
                "mean_candidate_reward": nan_mean([x for row in rewards for x in row]),
                "best_of_k_reward": best,
                "trained_mean_reward": trained,
                "trained_minus_best_of_k": None if trained is None or best is None else trained - best,
            }
        )
    return out, records
