"""`axolotl pofe eval recipe.yml`: the report's headline and every iterate on held-out prompts.

The headline (on by default, `pofe.eval.train_prompts`): each round's trained model pi_t
answers the first prompts its round judged (greedy by default) and the recipe's scalar judge
scores them, into eval/headline.json; the report sets them beside the same prompts'
candidates (`pofe.run.headline`). A pairwise judge gives no scalar reward: the file says so.

With held-out prompts (`pofe.eval.prompts` or `held_out`), models: pi_0 (the policy round 1
started from) and pi_t (round t's trained model), read from the run's state file. Every
model answers the same held-out prompts with the same seeds (`pofe.eval`: `num_samples`
per prompt at `temperature`; temperature 0 = greedy), through the one generation loop
(`pofe.preprocess.generators.hf.sample_responses`).
Then, per model:

- mean reward under the recipe's judge (scalar judges), and under `pofe.eval.judge2`;
- the win-rate matrix W[a, b] = P(a's response beats b's) (`pofe.run.tournament`),
  averaged over prompts and over all sample pairs: scalar judges through Bradley-Terry,
  P = sigmoid(r_a - r_b); pairwise judges directly, from the judge's (both-orders)
  preference matrix over all models' responses to the prompt. The diagonal is 1/2;
- mean response length (tokens, including the end-of-turn token when the model stopped;
  characters of the decoded text);
- KL to pi_0 estimated on the model's own samples: mean over samples of
  log pi_t(y|x) - log pi_0(y|x) (summed over response tokens, by `pofe.scoring`). An
  unbiased estimate of KL(pi_t || pi_0) only when sampling at temperature 1, top_p 1;
  otherwise the same mean log-ratio on the decoded responses;
- perplexity of the held-out reference responses (when the prompts have a reference
  column): exp(total NLL / total tokens) over the rendered assistant turns.

Outputs under <output_dir>/eval/: headline.json, and with held-out prompts samples.jsonl
(every response with its reward(s) and log-probs) and eval.json (the numbers the report shows).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pofe.args import pofe_config
from pofe.data.formats import RowFormat, prompt_row
from pofe.files import read_jsonl, write_atomic
from pofe.layout import IGNORE_INDEX
from pofe.preprocess.config import JudgeConfig, Sampling
from pofe.preprocess.generators.hf import Sample, load_policy, load_tokenizer, sample_responses
from pofe.scoring import response_logps

from .config import EvalConfig
from .headline import HEADLINE_JSON, headline_prompts
from .layout import RunLayout, RunState
from .recipe import load_recipe
from .rounds import eval_models
from .stages import Echo
from .tournament import block_win_matrix, nan_mean, win_matrix_from_rewards

TokenPair = tuple[list[int], list[int]]  # (prompt ids, response ids)


# ---- log-probs -------------------------------------------------------------------------------


@torch.no_grad()
def sequence_logps(
    model, prompt_ids: list[list[int]], response_ids: list[list[int]], batch_size: int = 16
) -> list[float]:
    """Summed log pi(response | prompt) for each pair, by `pofe.scoring.response_logps`.

    Rows `prompt + response` are right-padded (positions start at 0 for every row); only
    response tokens are labelled, so only they count. An empty response scores 0.
    """
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts, responses = prompt_ids[start : start + batch_size], response_ids[start : start + batch_size]
        rows = [p + r for p, r in zip(prompts, responses, strict=True)]
        T = max(len(row) for row in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long)  # (B, T)
        mask = torch.zeros(len(rows), T, dtype=torch.long)  # (B, T)
        labels = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)  # (B, T)
        for i, (prompt, row) in enumerate(zip(prompts, rows)):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            labels[i, len(prompt) : len(row)] = ids[i, len(prompt) : len(row)]
        logp_sum, _ = response_logps(model, ids.to(device), mask.to(device), labels.to(device))  # (B,)
        out += logp_sum.tolist()
    return out


# ---- one model's answers ---------------------------------------------------------------------


@dataclass
class ModelAnswers:
    """One model's held-out samples, with log-probs flat in prompt-major order (P * S)."""

    name: str
    path: str
    samples: list[list[Sample]]  # [prompt][sample]
    logps: list[float]  # log pi_m(y|x)
    base_logps: list[float] = field(default_factory=list)  # log pi_0(y|x)
    perplexity: float | None = None

    @property
    def flat(self) -> list[Sample]:
        return [s for row in self.samples for s in row]


def held_out_sampling(ecfg: EvalConfig) -> Sampling:
    return Sampling(temperature=ecfg.temperature, top_p=ecfg.top_p, max_new_tokens=ecfg.max_new_tokens, seed=ecfg.seed)


def headline_sampling(ecfg: EvalConfig, max_new_tokens: int) -> Sampling:
    """The headline's decoding: `train_temperature`, and the token budget the round's
    candidates had (`max_new_tokens`), so that their rewards compare."""
    return Sampling(temperature=ecfg.train_temperature, top_p=ecfg.top_p, max_new_tokens=max_new_tokens,
                    seed=ecfg.seed)


def draw_samples(model, tokenizer, prompts: list, n: int, sampling: Sampling, batch_size: int) -> list[list[Sample]]:
    """`n` responses to each prompt, rendered with the chat template as the pipeline renders
    them; the same seeds for every model."""
    from pofe.preprocess.render import render_prompt

    rendered = [render_prompt(tokenizer, p).text for p in prompts]
    return sample_responses(model, tokenizer, rendered, n, sampling, batch_size=batch_size)


def reference_pairs(tokenizer, prompts: list, references: list) -> list[TokenPair]:
    """(prompt ids, response ids) of each non-empty reference, as the rendered assistant turn."""
    from pofe.data.tokenize import render_row

    pairs = []
    for prompt, reference in zip(prompts, references):
        if isinstance(reference, str) and reference:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            row = {"prompt": messages, "responses": [{"role": "assistant", "content": reference}]}
            prompt_text, (response_text,) = render_row(row, tokenizer)
            pairs.append((tokenizer(prompt_text, add_special_tokens=False)["input_ids"],
                          tokenizer(response_text, add_special_tokens=False)["input_ids"]))
    return pairs


def perplexity(model, pairs: list[TokenPair], batch_size: int) -> float | None:
    """exp(total NLL / total tokens) of the reference responses; None without references."""
    if not pairs:
        return None
    nll = -sum(sequence_logps(model, [p for p, _ in pairs], [r for _, r in pairs], batch_size))
    return math.exp(nll / sum(len(r) for _, r in pairs))


def answer(model, name: str, path: str, tokenizer, prompts: list, references: list[TokenPair],
           ecfg: EvalConfig) -> ModelAnswers:
    """One model's held-out samples with their log-probs, and its reference perplexity."""
    samples = draw_samples(model, tokenizer, prompts, ecfg.num_samples, held_out_sampling(ecfg), ecfg.batch_size)
    flat = [s for row in samples for s in row]
    logps = sequence_logps(model, [s.prompt_ids for s in flat], [s.response_ids for s in flat], ecfg.batch_size)
    return ModelAnswers(name, path, samples, logps, perplexity=perplexity(model, references, ecfg.batch_size))


def score_under_base(base_path: str, answers: list[ModelAnswers], batch_size: int) -> None:
    """Fill `base_logps`: log pi_0 of every model's samples (pi_0's own: its `logps`)."""
    answers[0].base_logps = list(answers[0].logps)
    base = load_policy(base_path)
    for a in answers[1:]:
        flat = a.flat
        a.base_logps = sequence_logps(base, [s.prompt_ids for s in flat], [s.response_ids for s in flat], batch_size)


# ---- judging ---------------------------------------------------------------------------------


def scalar_scores(judge_cfg: JudgeConfig, prompts: list, responses: list[list[str]],
                  columns: list[dict] | None = None) -> list[list[float]]:
    """Scalar judge scores, NaN for abstentions. `columns`: each prompt's other dataset
    columns, for judges that read them (TRL-style reward functions take them as kwargs)."""
    from pofe.preprocess.judges import Abstain, make_judge

    judge = make_judge(judge_cfg)
    extra = {"columns": columns} if columns is not None and getattr(judge, "reads_columns", False) else {}
    scores = judge.score(prompts, responses, **extra)
    return [[math.nan if isinstance(v, Abstain) else float(v) for v in row] for row in scores]


def pairwise_preferences(judge_cfg: JudgeConfig, prompts: list, responses: list[list[str]]) -> Tensor:
    """(P, N, N) preference matrices of a pairwise judge."""
    from pofe.preprocess.judges import make_judge

    verdicts = make_judge(judge_cfg).preferences(prompts, responses)
    return torch.stack([v.matrix.to(torch.float64) for v in verdicts])  # (P, N, N)


def judge_models(judge_cfg: JudgeConfig, prompts: list, texts: list[list[list[str]]]) -> dict:
    """texts[p][m][s] -> {"rewards": (P, M, S) list or None, "win_matrix": (M, M), "method"}."""
    P, M, S = len(texts), len(texts[0]), len(texts[0][0])
    flat = [[t for m in range(M) for t in texts[p][m]] for p in range(P)]  # (P, M*S), model-major
    if judge_cfg.is_pairwise:
        w = block_win_matrix(pairwise_preferences(judge_cfg, prompts, flat), M, S)
        return {"rewards": None, "win_matrix": w.tolist(), "method": "pairwise"}
    scores = torch.tensor(scalar_scores(judge_cfg, prompts, flat), dtype=torch.float64).reshape(P, M, S)
    return {
        "rewards": scores.tolist(),
        "win_matrix": win_matrix_from_rewards(scores).tolist(),
        "method": "bradley_terry",
    }


def mean_reward_per_model(rewards: list | None, num_models: int) -> list[float | None] | None:
    """rewards (P, M, S) -> each model's mean over prompts and samples (NaN left out)."""
    if rewards is None:
        return None
    return [nan_mean([x for per_prompt in rewards for x in per_prompt[m]]) for m in range(num_models)]


# ---- the eval command --------------------------------------------------------------------------


def _load_rows(path: str | Path) -> list[dict]:
    from datasets import load_dataset

    path = str(path)
    kind = "parquet" if path.endswith(".parquet") else "csv" if path.endswith(".csv") else "json"
    return load_dataset(kind, data_files=path, split="train").to_list()


def dataset_prompts(rows: list[dict], column: str, fields: dict, source: str, method: str) -> list:
    """Each row's prompt as the pipeline reads a `pofe.prompts` row of that dataset entry:
    with `prompt_format: hh`, an HH transcript becomes chat messages."""
    fmt = RowFormat(dataset=source, type="pofe.prompts", method=method, fields={**fields, "field_prompt": column})
    return [prompt_row(r, i, fmt, [])[column] for i, r in enumerate(rows)]


def summarise(answers: list[ModelAnswers], prompts: list, prompts_source: str, ecfg: EvalConfig,
              judge_cfg: JudgeConfig, main: dict, second: dict | None, references: int) -> dict[str, Any]:
    """eval.json's numbers."""
    M = len(answers)
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
        "win_matrix_judge2": second["win_matrix"] if second else None,
        "mean_reward_judge2": mean_reward_per_model(second["rewards"], M) if second else None,
        "mean_response_tokens": [nan_mean([len(s.response_ids) for s in a.flat]) for a in answers],
        "mean_response_chars": [nan_mean([len(s.text) for s in a.flat]) for a in answers],
        "kl_to_base": [nan_mean([lp - base for lp, base in zip(a.logps, a.base_logps)]) for a in answers],
        "kl_is_unbiased": ecfg.temperature == 1.0 and ecfg.top_p == 1.0,
        "perplexity": [a.perplexity for a in answers] if references else None,
        "reference_count": references,
        "cycle_threshold": ecfg.cycle_threshold,
    }


def sample_records(answers: list[ModelAnswers], prompts: list, main: dict, second: dict | None) -> list[dict]:
    """samples.jsonl: every response with its reward(s) and log-probs."""
    records = []
    for m, a in enumerate(answers):
        flat_index = 0
        for p, row in enumerate(a.samples):
            for s, smp in enumerate(row):
                records.append({
                    "model": a.name, "prompt_index": p, "sample": s, "prompt": prompts[p],
                    "response": smp.text, "tokens": len(smp.response_ids),
                    "reward": main["rewards"][p][m][s] if main["rewards"] else None,
                    "reward2": second["rewards"][p][m][s] if second and second["rewards"] else None,
                    "logp": a.logps[flat_index], "logp_base": a.base_logps[flat_index],
                })
                flat_index += 1
    return records


def round_prompt_column(cfg) -> str:
    """The prompt column of the run's `pofe.prompts` entry (each round's recipe keeps it)."""
    (entry,) = cfg.datasets
    return entry.get("field_prompt") or "prompt"


def round_columns(prompts_file: Path, headline: list[dict], prompt_column: str) -> list[dict]:
    """The other dataset columns of each headline prompt's row in the round's prompt file,
    as the judge stage passed them when it judged that round's candidates."""
    rows = read_jsonl(prompts_file)
    return [{c: v for c, v in rows[q["index"]].items() if c != prompt_column} for q in headline]


def headline_record(path: str, prompts: list[dict], samples: list[list[Sample]], rewards: list[list[float]]) -> dict:
    """headline.json's entry for one round: its model, and each answer with its reward."""
    return {"model": path, "samples": [
        {"index": q["index"], "prompt": q["prompt"], "sample": s, "response": smp.text,
         "tokens": len(smp.response_ids), "reward": rewards[i][s]}
        for i, (q, row) in enumerate(zip(prompts, samples, strict=True)) for s, smp in enumerate(row)
    ]}


def headline_skipped(ecfg: EvalConfig, judge_cfg: JudgeConfig) -> str | None:
    """Why the run has no headline, or None."""
    if not ecfg.train_prompts:
        return "`pofe.eval.train_prompts: 0`"
    if judge_cfg.is_pairwise:
        return (f"the judge (`{judge_cfg.type}`) is pairwise: it gives no scalar reward to set beside the "
                "candidates' best-of-k (held-out prompts, `pofe.eval.held_out`, give win rates between iterates)")
    return None


def evaluate_run(recipe_path: str | Path, echo: Echo = print) -> RunLayout:
    """The headline of every finished round, and (with held-out prompts) every iterate on
    them, into the run's eval/ folder; returns the run's layout (for the report)."""
    _, cfg = load_recipe(recipe_path)
    pcfg = pofe_config(cfg)
    ecfg = pcfg.eval
    if not ecfg:
        raise ValueError(f"{recipe_path} sets `pofe.eval: false`: evaluation is off (drop the key to turn it on)")
    layout = RunLayout(Path(cfg.output_dir).resolve())
    if not layout.state.exists():
        raise ValueError(f"no run state at {layout.state}: run `axolotl pofe run {recipe_path}` first")
    models = eval_models(RunState.read(layout.state))
    judge_cfg = pcfg.judge
    tokenizer = load_tokenizer(models[0][1])

    skipped = headline_skipped(ecfg, judge_cfg)
    # model m is round m's; its headline prompts come from round m's judged candidates
    on_train = {} if skipped else {m: headline_prompts(layout.candidates(m), ecfg.train_prompts)
                                   for m in range(1, len(models))}
    prompts, references = [], []
    if ecfg.has_held_out:
        if ecfg.prompts:
            rows = _load_rows(ecfg.prompts)
            prompts = [r[ecfg.prompt_column] for r in rows]
        else:  # the dataset's own rows: read as its entry reads them (`prompt_format`)
            rows = read_jsonl(layout.held_out_prompts)
            fields = pcfg.dataset_fields[0] if pcfg.dataset_fields else {}
            prompts = dataset_prompts(rows, ecfg.prompt_column, fields, str(layout.held_out_prompts), pcfg.method)
        references = reference_pairs(tokenizer, prompts, [r.get(ecfg.reference_column) for r in rows])

    answers: list[ModelAnswers] = []
    sampling = headline_sampling(ecfg, pcfg.generate.max_new_tokens if pcfg.generate else ecfg.max_new_tokens)
    headline: dict[str, Any] = {
        "train_prompts": ecfg.train_prompts, "skipped": skipped, "judge": judge_cfg.model_dump(),
        "decoding": {"num_samples": ecfg.train_samples, "temperature": sampling.temperature,
                     "top_p": sampling.top_p, "max_new_tokens": sampling.max_new_tokens, "seed": sampling.seed},
        "rounds": {},
    }
    for m, (name, path) in enumerate(models):
        if not (ecfg.has_held_out or on_train.get(m)):
            continue
        echo(f"eval: {name} ({path})")
        model = load_policy(path)
        if ecfg.has_held_out:
            answers.append(answer(model, name, path, tokenizer, prompts, references, ecfg))
        if on_train.get(m):
            texts = [q["prompt"] for q in on_train[m]]
            samples = draw_samples(model, tokenizer, texts, ecfg.train_samples, sampling, ecfg.batch_size)
            columns = round_columns(layout.round_prompts(m), on_train[m], round_prompt_column(cfg))
            rewards = scalar_scores(judge_cfg, texts, [[s.text for s in row] for row in samples], columns)
            headline["rounds"][str(m)] = headline_record(path, on_train[m], samples, rewards)
    out = layout.eval_dir / HEADLINE_JSON
    write_atomic(out, json.dumps(headline, indent=2, allow_nan=True) + "\n")
    echo(f"eval: headline of {len(headline['rounds'])} round(s) -> {out}" + (f" (none: {skipped})" if skipped else ""))
    if not ecfg.has_held_out:
        for stale in ("eval.json", "samples.jsonl"):  # an earlier evaluation's, with held-out prompts
            (layout.eval_dir / stale).unlink(missing_ok=True)
        return layout

    score_under_base(models[0][1], answers, ecfg.batch_size)
    M, P, S = len(models), len(prompts), ecfg.num_samples
    texts = [[[answers[m].samples[p][s].text for s in range(S)] for m in range(M)] for p in range(P)]
    main = judge_models(judge_cfg, prompts, texts)
    second = judge_models(ecfg.judge2, prompts, texts) if ecfg.judge2 else None
    result = summarise(answers, prompts, ecfg.prompts or str(layout.held_out_prompts), ecfg, judge_cfg,
                       main, second, len(references))
    # NaN rewards (abstentions) are written as NaN, as json.dumps does by default
    records = sample_records(answers, prompts, main, second)
    write_atomic(layout.eval_dir / "samples.jsonl", "".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
    out = layout.eval_dir / "eval.json"
    write_atomic(out, json.dumps(result, indent=2) + "\n")
    echo(f"eval: {M} models x {P} prompts x {S} samples -> {out}")
    return layout
