"""What an evaluation writes of the judged held-out answers: eval.json's numbers
(`summarise`) and samples.jsonl's rows (`sample_records`), from every model's answers
(`pofe.run.evaluation.answers`) and the judges' verdicts (`pofe.run.evaluation.judging.judge_models`)."""

from __future__ import annotations

from typing import Any

import torch

from pofe.args.rounds import EvalConfig
from pofe.records.evaluation import EvalRecord
from pofe.run.evaluation.answers import ModelAnswers
from pofe.run.evaluation.decision import choose_model
from pofe.run.evaluation.judging import mean_reward_per_model, reward_counts
from pofe.run.evaluation.statistics import compare_iterates, distance_from_half, find_cycles, reward_comparisons
from pofe_candidates.config import JudgeConfig
from pofe_candidates.win_rates import nan_mean


def summarise(
    answers: list[ModelAnswers],
    prompts: list,
    prompts_source: str,
    ecfg: EvalConfig,
    judge_cfg: JudgeConfig,
    main: dict,
    second: dict | None,
    references: int,
) -> dict[str, Any]:
    """eval.json's numbers."""
    M = len(answers)
    tokens = torch.tensor(
        [[[len(s.response_ids) for s in a.samples[p]] for a in answers] for p in range(len(prompts))],
        dtype=torch.float64,
    )  # (P, M, S)
    return {
        "models": [{"name": a.name, "path": a.path} for a in answers],
        "num_prompts": len(prompts),
        "prompts_source": prompts_source,
        "decoding": ecfg.model_dump(include={"num_samples", "temperature", "top_p", "max_new_tokens", "seed"}),
        "judge": judge_cfg.model_dump(),
        "judge2": ecfg.judge2.model_dump() if ecfg.judge2 else None,
        "win_matrix_method": main["method"],
        "win_matrix": main["win_matrix"],
        "mean_reward": mean_reward_per_model(main["rewards"], M),
        # each mean is over the answers with a reward; the others abstained (NaN)
        **reward_counts(main["rewards"], M),
        "win_matrix_judge2": second["win_matrix"] if second else None,
        "mean_reward_judge2": mean_reward_per_model(second["rewards"], M) if second else None,
        **{f"{k}_judge2": v for k, v in reward_counts(second["rewards"] if second else None, M).items()},
        "mean_response_tokens": [nan_mean([len(s.response_ids) for s in a.flat]) for a in answers],
        "mean_response_chars": [nan_mean([len(s.text) for s in a.flat]) for a in answers],
        # cut where they began a user turn of their own (`pofe.run.evaluation.sampler.cut_user_turns`)
        "samples_cut_at_user_turn": [sum(s.cut_at_user_turn for s in a.flat) for a in answers],
        "kl_to_pi_0": [nan_mean([lp - base for lp, base in zip(a.logps, a.pi_0_logps)]) for a in answers],
        "kl_is_unbiased": ecfg.temperature == 1.0 and ecfg.top_p == 1.0,
        "perplexity": [a.perplexity for a in answers] if references else None,
        "reference_count": references,
        "cycle_threshold": ecfg.cycle_threshold,
        **compare_iterates(main["pref"], tokens, ecfg.seed),
        # a scalar judge's rewards, what the choice of a model reads (`pofe.run.evaluation.decision`)
        **(
            reward_comparisons(torch.tensor(main["rewards"], dtype=torch.float64), seed=ecfg.seed)
            if main["rewards"] is not None
            else {}
        ),
    }


def with_readings(numbers: dict[str, Any]) -> dict[str, Any]:
    """eval.json whole (`pofe.records.evaluation.EvalRecord`'s fields): `numbers` (`summarise`'s,
    with the run's best-of-k and decision inputs) and what is read off them, so that readers render
    it rather than derive it again: each judge's 3-cycles (`find_cycles` at `cycle_threshold`) and
    largest distance of a win rate from 1/2 (`distance_from_half`), the model to use
    (`choose_model`), and the file's format."""
    readings: dict[str, Any] = {"format": EvalRecord.FORMAT}
    for suffix in ("", "_judge2"):
        matrix = numbers.get(f"win_matrix{suffix}")
        readings[f"cycles{suffix}"] = find_cycles(matrix, numbers["cycle_threshold"]) if matrix else None
        readings[f"win_matrix_spread{suffix}"] = distance_from_half(matrix) if matrix else None
    readings["choice"] = choose_model(numbers)
    return {**numbers, **readings}


def sample_records(answers: list[ModelAnswers], prompts: list, main: dict, second: dict | None) -> list[dict]:
    """samples.jsonl: every response with its reward(s) and log-probs."""
    records = []
    for m, a in enumerate(answers):
        flat_index = 0
        for p, row in enumerate(a.samples):
            for s, smp in enumerate(row):
                records.append(
                    {
                        "model": a.name,
                        "prompt_index": p,
                        "sample": s,
                        "prompt": prompts[p],
                        "response": smp.text,
                        "tokens": len(smp.response_ids),
                        "cut_at_user_turn": smp.cut_at_user_turn,
                        "reward": main["rewards"][p][m][s] if main["rewards"] else None,
                        "reward2": second["rewards"][p][m][s] if second and second["rewards"] else None,
                        "logp": a.logps[flat_index],
                        "pi_0_logps": a.pi_0_logps[flat_index],
                    }
                )
                flat_index += 1
    return records
