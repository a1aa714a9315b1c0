"""`axolotl pofe eval recipe.yml`: the report's headline and every iterate on held-out prompts.

The headline (on by default, `pofe.eval.train_prompts`): each round's trained model pi_t
answers the first prompts its round judged (greedy by default) and the recipe's scalar judge
scores them, into eval/headline.json; the report sets them beside the same prompts'
candidates (`pofe.run.evaluation.headline`). A pairwise judge gives no scalar reward: the file says so.

With held-out prompts (`pofe.eval.prompts`, or `held_out`: by default a slice of the
prompt pool, `pofe.run.prompts`), models: pi_0 (the policy round 1 started from) and pi_t
(round t's trained model), read from the run's state file. Every
model answers the same held-out prompts with the same seeds (`pofe.eval`: `num_samples`
per prompt at `temperature`; temperature 0 = greedy), sampled on the rounds' vLLM engine
when the recipe generates with one, else by `model.generate` (`pofe.run.evaluation.sampler`).
Then, per model:

- mean reward under the recipe's judge (scalar judges), and under `pofe.eval.judge2`;
- trained model vs best-of-k: each round's K candidates on the held-out prompts, sampled
  from the policy the round started from, for evaluation only (`pofe.run.evaluation.best_of_k`);
- the win-rate matrix W[a, b] = P(a's response beats b's) (`pofe.run.evaluation.statistics`),
  averaged over prompts and over all sample pairs: scalar judges through Bradley-Terry,
  P = sigmoid(r_a - r_b); pairwise judges directly, from the judge's (both-orders)
  preference matrix over all models' responses to the prompt. The diagonal is 1/2. Each
  entry with a bootstrap 95 % interval over prompts; each model's raw and length-controlled
  win rate against pi_0 and against the iterate before it (`pofe.run.evaluation.statistics`);
- mean and median response length (tokens, including the end-of-turn token when the model
  stopped; characters of the decoded text);
- KL to pi_0 estimated on the model's own samples: mean over samples of
  log pi_t(y|x) - log pi_0(y|x) (summed over response tokens, by `pofe.scoring`). An
  unbiased estimate of KL(pi_t || pi_0) only when sampling at temperature 1, top_p 1;
  otherwise the same mean log-ratio on the decoded responses;
- perplexity of the held-out reference responses (when the prompts have a reference
  column): exp(total NLL / total tokens) over the rendered assistant turns.

Two stages, so that each fits the machine the policy fits: first every model's answers
(`pofe.run.evaluation.answers`: headline and held-out samples, their log-probs, then pi_0's pass for
the KL), one model in memory at a time, each loaded once, used and freed before the next;
then the judges, each built once after the last policy is freed, judge everything. They are
called as the judge stage calls them (`pofe.run.evaluation.judging`, through
`pofe_candidates.judges.apply_judge`): a judge that reads the rendered prompt (PairRM) gets
the chat-templated text the models sampled from. A model's answers are stored in
eval/answers/ and read back, not sampled again, while its weights, the prompts and the
decoding are unchanged (`pofe.run.evaluation.answers`).

Outputs under <output_dir>/eval/: headline.json, and with held-out prompts samples.jsonl
(every response with its reward(s) and log-probs), candidates.jsonl (each round's held-out
candidates with their rewards) and eval.json (the numbers the report shows).
Both JSON files end with `peak_memory`, each stage's peak in GiB (`pofe.run.evaluation.peak_memory`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from pofe.args import PofeConfig
from pofe.files import weights_fingerprint, write_jsonl_atomic
from pofe.logs import Echo
from pofe.records.evaluation import EvalRecord
from pofe.run.evaluation.answers import (
    AnswerStore,
    HeldOut,
    ModelAnswers,
    answer,
    answers_from_json,
    answers_to_json,
    held_out_sampling,
    samples_from_json,
    samples_to_json,
    score_under_pi_0,
)
from pofe.run.evaluation.best_of_k import best_of_k, held_out_candidates, round_sampling
from pofe.run.evaluation.headline import (
    HeadlineAnswers,
    headline_answers,
    headline_plan,
    headline_round,
    headline_sampling,
    write_headline,
)
from pofe.run.evaluation.inputs import EvalRun, held_out_set, open_run, render_prompts, run_folder, with_average
from pofe.run.evaluation.judging import judge_models, mean_reward_per_model
from pofe.run.evaluation.peak_memory import PeakMemory
from pofe.run.evaluation.records import sample_records, summarise, with_readings
from pofe.run.evaluation.sampler import eval_sampler
from pofe.run.folder import RunFolder
from pofe.run.guards import EVAL, holding_run, pofe_wrote
from pofe.run.recipe import load_recipe
from pofe_candidates.config import Sampling
from pofe_candidates.generators.hf import Sample
from pofe_candidates.judges import PairwiseJudge, ScalarJudge, make_judge
from pofe_candidates.models import load_policy
from pofe_candidates.shard_work import free_memory
from pofe_candidates.shards import progress_bar

# ---- held-out prompts: every iterate on the same prompts ----------------------------------------


def judge_held_out(
    held_out: HeldOut,
    answers: list[ModelAnswers],
    judge: ScalarJudge | PairwiseJudge,
    judge2: ScalarJudge | PairwiseJudge | None,
    pcfg: PofeConfig,
) -> tuple[dict, dict | None]:
    """Every model's held-out answers judged together, per prompt (and by judge2); each judge's
    abstentions checked against its max_abstention_rate (`pofe.run.evaluation.judging`)."""
    M, P, S = len(answers), len(held_out.prompts), pcfg.eval.num_samples
    texts = [[[answers[m].samples[p][s].text for s in range(S)] for m in range(M)] for p in range(P)]
    main = judge_models(judge, held_out.prompts, held_out.rendered, texts, columns=held_out.columns, cfg=pcfg.judge)
    second = (
        judge_models(
            judge2,
            held_out.prompts,
            held_out.rendered,
            texts,
            "judge2 on the held-out answers",
            held_out.columns,
            cfg=pcfg.eval.judge2,
            setting="pofe.eval.judge2",
        )
        if judge2
        else None
    )
    return main, second


def write_held_out(
    run: EvalRun,
    held_out: HeldOut,
    answers: list[ModelAnswers],
    main: dict,
    second: dict | None,
    extra: dict,
    echo: Echo,
) -> None:
    """The judged held-out answers into eval/samples.jsonl and eval/eval.json (with `extra`:
    the rounds' best-of-k, the evaluation's peak memory)."""
    # the decoding as it ran: the held-out cap resolved (unset: the candidates' budget)
    ecfg = run.pcfg.eval.model_copy(update={"max_new_tokens": run.pcfg.eval.held_out_tokens(run.pcfg.generate)})
    result = summarise(
        answers, held_out.prompts, held_out.source, ecfg, run.pcfg.judge, main, second, len(held_out.references)
    )
    record = EvalRecord.model_validate(with_readings({**result, **extra}))
    # NaN rewards (abstentions) are written as NaN
    records = sample_records(answers, held_out.prompts, main, second)
    write_jsonl_atomic(run.folder.eval_dir / "samples.jsonl", records, allow_nan=True)
    out = run.folder.evaluation
    record.write(out)
    echo(f"eval: {len(answers)} models x {len(held_out.prompts)} prompts x {ecfg.num_samples} samples -> {out}")


def decision_inputs(run: EvalRun) -> dict:
    """What `pofe.run.evaluation.decision` reads besides the comparisons: which model is pi_avg,
    and the KL ceiling of `pofe.stop_when` (the choice keeps to the models under it)."""
    rule = run.pcfg.stop_when
    return {"average": run.average, "kl_ceiling": rule.kl_to_pi_0_above if rule else None}


# ---- every model's answers, one model in memory at a time -------------------------------------


@dataclass
class Answers:
    """What the judges will read: every model's held-out answers (scored under pi_0 too) and
    each round's headline answers, all produced before any judge is built."""

    held_out: list[ModelAnswers] = field(default_factory=list)  # pi_0 first, as run.models
    # round t: its K candidates on the held-out prompts, from pi_{t-1} (`pofe.run.evaluation.best_of_k`)
    candidates: dict[int, list[list[Sample]]] = field(default_factory=dict)
    headline: dict[int, HeadlineAnswers] = field(default_factory=dict)  # round m: its model's


def answer_with(
    run: EvalRun,
    m: int,
    held_out: HeldOut | None,
    on_train: dict[int, list[dict]],
    sampling: Sampling,
    answers: Answers,
    store: AnswerStore,
) -> bool:
    """Model m's answers added to `answers`, each part from `store` when stored under its key,
    else from the model's sampler (started only then, and stopped on return); True if it was.
    The held-out part comes last: its log-probs need the transformers model, which loads only
    once the engine has stopped (`pofe.run.evaluation.sampler`). A progress bar counts the
    prompts answered, part after part (a stored part at once)."""
    name, path = run.models[m]
    ecfg, gen = run.pcfg.eval, run.pcfg.generate
    sampler = eval_sampler(
        gen, ecfg.backend, path, run.tokenizer, ecfg.batch_size, run.folder.eval_dir / "engine" / name
    )
    base = {
        "model": weights_fingerprint(path),
        "tokenizer": weights_fingerprint(run.models[0][1]),
        "batch_size": ecfg.batch_size,
        "sampler": sampler.identity,
    }
    headline = on_train.get(m) or []
    # the next round's candidates: none after the last round (nor for pi_avg)
    candidates = bool(held_out and m < run.rounds and gen and not run.pcfg.judge.is_pairwise)
    parts = [len(headline), len(held_out.rendered) if candidates else 0, len(held_out.rendered) if held_out else 0]
    bar = progress_bar(True, sum(parts), f"eval {name} answers")
    try:
        if headline:
            key = {**base, "prompts": headline, "sampling": asdict(sampling), "num_samples": ecfg.train_samples}
            samples = store.part(
                name,
                "headline",
                key,
                lambda: samples_to_json(headline_answers(run, sampler, headline, sampling, bar.update).samples),
            )
            rendered = render_prompts(run.tokenizer, [q["prompt"] for q in headline])
            answers.headline[m] = HeadlineAnswers(headline, rendered, samples_from_json(samples))
            bar.update(parts[0] - bar.n)
        if candidates:
            key = {
                **base,
                "prompts": held_out.rendered,
                "k": gen.num_candidates,
                "sampling": asdict(round_sampling(gen, m + 1)),
            }
            answers.candidates[m + 1] = samples_from_json(
                store.part(
                    name,
                    "candidates",
                    key,
                    lambda: samples_to_json(held_out_candidates(sampler, held_out.rendered, gen, m + 1, bar.update)),
                )
            )
            bar.update(sum(parts[:2]) - bar.n)
        if held_out:
            key = {
                **base,
                "prompts": held_out.rendered,
                "references": held_out.references,
                "sampling": asdict(held_out_sampling(ecfg, gen)),
                "num_samples": ecfg.num_samples,
            }

            def held_out_answers() -> dict:
                samples = sampler.sample(held_out.rendered, ecfg.num_samples, held_out_sampling(ecfg, gen), bar.update)
                return answers_to_json(answer(sampler.scorer(), name, path, samples, held_out, ecfg))

            answers.held_out.append(answers_from_json(name, path, store.part(name, "held_out", key, held_out_answers)))
            bar.update(sum(parts) - bar.n)
    finally:
        bar.close()
        sampler.release()
    return sampler.loaded


def all_answers(
    run: EvalRun, held_out: HeldOut | None, on_train: dict[int, list[dict]], sampling: Sampling, echo: Echo
) -> Answers:
    """Each model's answers, each model loaded (unless every part is stored,
    `pofe.run.evaluation.answers`), used and freed before the next loads; then (with held-out
    prompts) pi_0 loaded again to score every model's samples (the KL)."""
    answers, store = Answers(), AnswerStore(run.folder.eval_dir / "answers")
    for m, (name, path) in enumerate(run.models):
        if held_out or on_train.get(m):
            echo(f"eval: {name} ({path})")
            if not answer_with(run, m, held_out, on_train, sampling, answers, store):
                echo(f"eval: {name}: every answer read from {store.folder}: weights, prompts and decoding unchanged")
            free_memory()
    if held_out:
        score_under_pi_0(load_policy(run.models[0][1]), answers.held_out, run.pcfg.eval.batch_size)
        free_memory()
    return answers


# ---- the eval command ------------------------------------------------------------------------------


def evaluate_run(
    recipe_path: str | Path,
    echo: Echo = print,
    model: str | None = None,
    output: str | Path | None = None,
    overrides: dict | None = None,
) -> RunFolder:
    """Evaluate the recipe's iterated run (`axolotl pofe run`: its output_dir holds one), or,
    without one or with `model` / `output`, one trained model against its base
    (`pofe.run.evaluation.trained`); returns the folder the report is written into.
    `overrides`: axolotl's command-line options, applied to the recipe."""
    from pofe.run.evaluation.trained import is_iterated, open_trained

    raw, cfg = load_recipe(recipe_path, overrides)
    if model is None and output is None and is_iterated(cfg):
        folder = run_folder(recipe_path, cfg)
        with holding_run(folder, echo, EVAL):  # the rounds read while no round trains
            run = open_run(recipe_path, cfg, folder)
            skipped, on_train = headline_plan(run)
            return evaluate(run, held_out_set(run), skipped, on_train, echo)
    run, held_out, skipped, record = open_trained(recipe_path, raw, cfg, model, output, overrides, echo)
    with holding_run(run.folder, echo, EVAL):
        folder = evaluate(run, held_out, skipped, {}, echo)
        record()
        return folder


def evaluate(
    run: EvalRun, held_out: HeldOut | None, skipped: str | None, on_train: dict[int, list[dict]], echo: Echo
) -> RunFolder:
    """The headline of every finished round (`on_train`: each round's prompts; `skipped`: why
    there is none), and (with held-out prompts) every model on them, into the run's eval/
    folder; returns the run's folder (for the report).

    Models first, judges after: every model's answers are produced with one model in memory
    at a time (each loaded once for both parts, then freed), and only then is each judge
    built, once, to judge them all: a GPU never holds a policy beside a reward model, and a
    reward model or PairRM loads its weights once, not once per round."""
    ecfg, pcfg = run.pcfg.eval, run.pcfg
    run = with_average(run, echo) if held_out else run
    sampling = headline_sampling(ecfg, pcfg.generate.max_new_tokens if pcfg.generate else ecfg.held_out_tokens(None))
    memory = PeakMemory()
    answers = all_answers(run, held_out, on_train, sampling, echo)
    memory.part("answers", echo)
    judge = make_judge(pcfg.judge) if held_out or answers.headline else None
    judge2 = make_judge(ecfg.judge2) if held_out and ecfg.judge2 else None
    rounds = {str(m): headline_round(run, m, judge, a) for m, a in answers.headline.items()}
    verdicts = judge_held_out(held_out, answers.held_out, judge, judge2, pcfg) if held_out else None
    if held_out:
        trained = mean_reward_per_model(verdicts[0]["rewards"], len(run.models)) or []
        rounds_bok, records = best_of_k(judge, held_out, answers.candidates, trained, pcfg.judge)
        write_jsonl_atomic(run.folder.eval_dir / "candidates.jsonl", records, allow_nan=True)
    memory.part("judging", echo)
    write_headline(run, skipped, sampling, rounds, memory.record(), echo)
    if held_out:
        write_held_out(
            run,
            held_out,
            answers.held_out,
            *verdicts,
            {"best_of_k": rounds_bok or None, "peak_memory": memory.record(), **decision_inputs(run)},
            echo,
        )
    else:
        for stale in ("eval.json", "samples.jsonl", "candidates.jsonl"):  # an earlier held-out evaluation's
            if pofe_wrote(run.folder, run.folder.eval_dir / stale):  # not one found before the run
                (run.folder.eval_dir / stale).unlink(missing_ok=True)
    return run.folder
