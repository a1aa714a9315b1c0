"""The report's headline: each round's trained model beside the best of its own candidates.

RRHF's defining comparison. For round t, the prompts are the first `pofe.eval.train_prompts`
the round judged (by index, each with at least one rewarded candidate); evaluation
(`pofe.run.evaluation.evaluate`) has pi_t answer them (`train_samples` each at `train_temperature`,
greedy by default), the recipe's scalar judge scores the answers, and they are set beside the
same prompts' candidates: their mean, their best-of-k (the mean over prompts of the best reward)
and the starting policy's own samples, into eval/headline.json (`pofe.records.headline`), which
the report renders. A pairwise judge gives no scalar reward: headline.json then says so instead.

Here: which prompts and columns a round's headline has, its model's answers, their judging
beside the round's candidates, and the record evaluation writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pofe.files import read_jsonl
from pofe.logs import Echo
from pofe.records.headline import Headline, HeadlineAnswer, HeadlineDecoding, RoundHeadline
from pofe.run.evaluation.inputs import EvalRun, render_prompts
from pofe.run.evaluation.judging import scalar_scores
from pofe.run.evaluation.sampler import Progress
from pofe_candidates.build import policy_sample_rewards
from pofe_candidates.config import Sampling
from pofe_candidates.generators.hf import Sample
from pofe_candidates.judges import ScalarJudge
from pofe_candidates.render import prompt_text
from pofe_candidates.win_rates import nan_mean

if TYPE_CHECKING:
    from pofe.args.rounds import EvalConfig
    from pofe_candidates.config import JudgeConfig


def shard_rows(folder: Path) -> list[dict]:
    """Every row of the pipeline's shard-*.jsonl files in `folder`, in shard order."""
    return [row for path in sorted(folder.glob("shard-*.jsonl")) for row in read_jsonl(path)]


def judged_rows(cand_dir: Path) -> list[dict]:
    """The round's judge rows with at least one scalar reward, by prompt index."""
    return sorted((r for r in shard_rows(cand_dir / "judge") if r.get("rewards")), key=lambda r: r["index"])


def headline_prompts(cand_dir: Path, n: int) -> list[dict]:
    """The headline's prompts of a round: its first `n` judged rows ({"index", "prompt"})."""
    return [{"index": r["index"], "prompt": r["prompt"]} for r in judged_rows(cand_dir)[:n]]


def round_columns(prompts_file: Path, headline: list[dict], prompt_column: str) -> list[dict]:
    """The other dataset columns of each headline prompt's row in the round's prompt file,
    as the judge stage passed them when it judged that round's candidates."""
    rows = read_jsonl(prompts_file)
    return [{c: v for c, v in rows[q["index"]].items() if c != prompt_column} for q in headline]


def headline_skipped(ecfg: EvalConfig, judge_cfg: JudgeConfig) -> str | None:
    """Why the run has no headline, or None."""
    if not ecfg.train_prompts:
        return "`pofe.eval.train_prompts: 0`"
    if judge_cfg.is_pairwise:
        return (
            f"the judge (`{judge_cfg.type}`) is pairwise: it gives no scalar reward to set beside the "
            "candidates' best-of-k (the held-out prompts, `pofe.eval.held_out`, give each round's win rates "
            "against pi_0 and pi_{t-1} instead)"
        )
    return None


def best_candidate(row: dict) -> tuple[str, float]:
    """A judged row's highest-reward candidate (the first of equals) and its reward."""
    k = max(range(len(row["rewards"])), key=lambda i: row["rewards"][i])
    return row["responses"][k], row["rewards"][k]


def round_headline(
    cand_dir: Path, model: str, prompts: list[dict], samples: list[list[Sample]], rewards: list[list[float]]
) -> RoundHeadline:
    """A round's headline: its model's answers (`samples[prompt][sample]`, judged `rewards`) to
    its headline `prompts`, beside the same prompts' candidates in the round's shards: their
    mean and best-of-k reward, the policy's own samples' mean, and each prompt's best."""
    indices = {q["index"] for q in prompts}
    judged = [r for r in judged_rows(cand_dir) if r["index"] in indices]
    generated = [g for g in shard_rows(cand_dir / "generate") if g["index"] in indices]
    best = {r["index"]: best_candidate(r) for r in judged}
    answers = [
        HeadlineAnswer(
            index=q["index"],
            sample=s,
            prompt=q["prompt"],
            prompt_text=prompt_text(q["prompt"]),
            completion=smp.text,
            tokens=len(smp.response_ids),
            reward=rewards[i][s],
            best_candidate=best[q["index"]][0],
            best_candidate_reward=best[q["index"]][1],
        )
        for i, (q, row) in enumerate(zip(prompts, samples, strict=True))
        for s, smp in enumerate(row)
    ]
    return RoundHeadline(
        model=model,
        num_prompts=len(indices),
        model_mean_reward=nan_mean([a.reward for a in answers]),
        candidates_mean_reward=nan_mean([x for r in judged for x in r["rewards"]]),
        candidates_best_of_k_reward=nan_mean([max(r["rewards"]) for r in judged]),
        policy_sample_mean_reward=nan_mean(policy_sample_rewards(generated, judged)),
        samples=answers,
    )


def headline_sampling(ecfg: EvalConfig, max_new_tokens: int) -> Sampling:
    """The headline's decoding: `train_temperature`, and the token budget the round's
    candidates had (`max_new_tokens`), so that their rewards compare."""
    return Sampling(
        temperature=ecfg.train_temperature, top_p=ecfg.top_p, max_new_tokens=max_new_tokens, seed=ecfg.seed
    )


@dataclass(frozen=True)
class HeadlineAnswers:
    """A round's model's answers to its headline prompts, as rendered for it."""

    prompts: list[dict]  # {"index", "prompt"}
    rendered: list[str]
    samples: list[list[Sample]]  # [prompt][sample]


def headline_plan(run: EvalRun) -> tuple[str | None, dict[int, list[dict]]]:
    """(why there is no headline or None, {round m: its headline prompts})."""
    skipped = headline_skipped(run.pcfg.eval, run.pcfg.judge)
    # model m is round m's; its headline prompts come from round m's judged candidates
    on_train = (
        {}
        if skipped
        else {
            m: headline_prompts(run.folder.candidates(m), run.pcfg.eval.train_prompts)
            for m in range(1, run.rounds + 1)
        }
    )
    return skipped, on_train


def headline_answers(
    run: EvalRun, sampler, prompts: list[dict], sampling: Sampling, progress: Progress = None
) -> HeadlineAnswers:
    """A round's model's answers to the round's headline prompts (rendered as the pipeline
    rendered them for the round's candidates), from its `pofe.run.evaluation.sampler`."""
    rendered = render_prompts(run.tokenizer, [q["prompt"] for q in prompts])
    samples = sampler.sample(rendered, run.pcfg.eval.train_samples, sampling, progress)
    return HeadlineAnswers(prompts, rendered, samples)


def headline_round(run: EvalRun, m: int, judge: ScalarJudge, answers: HeadlineAnswers) -> RoundHeadline:
    """Round m's headline entry: its model's answers judged as the judge stage judged the
    round's candidates (same rendered prompts, same dataset columns)."""
    prompts = answers.prompts
    columns = round_columns(run.folder.round_prompts(m), prompts, run.prompt_column)
    rewards = scalar_scores(
        judge,
        [q["prompt"] for q in prompts],
        answers.rendered,
        [[s.text for s in row] for row in answers.samples],
        columns,
        rows=[q["index"] for q in prompts],
        desc=f"judge round {m}'s headline answers",
        cfg=run.pcfg.judge,
    )
    return round_headline(run.folder.candidates(m), run.models[m][1], prompts, answers.samples, rewards)


def write_headline(
    run: EvalRun,
    skipped: str | None,
    sampling: Sampling,
    rounds: dict[str, RoundHeadline],
    peak_memory: dict,
    echo: Echo,
) -> None:
    """eval/headline.json: the decoding, the judge, every round's entry (or why none) and the
    evaluation's peak memory."""
    ecfg = run.pcfg.eval
    headline = Headline(
        train_prompts=ecfg.train_prompts,
        skipped=skipped,
        judge=run.pcfg.judge.model_dump(),
        decoding=HeadlineDecoding(
            num_samples=ecfg.train_samples,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_new_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
        ),
        rounds=rounds,
        peak_memory=peak_memory,
    )
    out = run.folder.headline
    headline.write(out)
    echo(f"eval: headline of {len(rounds)} round(s) -> {out}" + (f" (none: {skipped})" if skipped else ""))
