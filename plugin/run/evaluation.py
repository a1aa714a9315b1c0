"""`axolotl pofe eval recipe.yml`: every iterate of a run on held-out prompts.

Models: pi_0 (the policy round 1 started from) and pi_t (round t's trained model), read
from the run's state file. Every model answers the same held-out prompts with the same
seeds (`pofe.eval`: `num_samples` per prompt at `temperature`; temperature 0 = greedy),
through the one generation loop (`pofe.preprocess.generators.hf.sample_responses`).
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
  column): exp(total NLL / total tokens) over the rendered assistant turns;
- on up to `train_prompts` of the prompts round t trained on: pi_t's mean reward, next to
  the candidates' mean and best-of-k on the same prompts (RRHF's ceiling).

Outputs under <output_dir>/eval/: samples.jsonl (every response with its reward(s) and
log-probs) and eval.json (the numbers the report shows).
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
from pofe.files import read_jsonl, write_atomic
from pofe.layout import IGNORE_INDEX, PROMPT
from pofe.preprocess.config import JudgeConfig, Sampling
from pofe.preprocess.generators.hf import Sample, load_policy, load_tokenizer, sample_responses
from pofe.scoring import response_logps

from .config import EvalConfig
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


def draw_samples(model, tokenizer, prompts: list, ecfg: EvalConfig) -> list[list[Sample]]:
    """`num_samples` responses per prompt, rendered with the chat template as the pipeline
    renders them; the same seeds for every model."""
    from pofe.preprocess.render import render_prompt

    sampling = Sampling(temperature=ecfg.temperature, top_p=ecfg.top_p, max_new_tokens=ecfg.max_new_tokens,
                        seed=ecfg.seed)
    rendered = [render_prompt(tokenizer, p).text for p in prompts]
    return sample_responses(model, tokenizer, rendered, ecfg.num_samples, sampling, batch_size=ecfg.batch_size)


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


def answer(name: str, path: str, tokenizer, prompts: list, references: list[TokenPair],
           train_prompts: list | None, ecfg: EvalConfig) -> tuple[ModelAnswers, list[list[Sample]] | None]:
    """Load one model: its held-out samples with their log-probs, its reference perplexity,
    and (when `train_prompts` is given) its samples on those training prompts."""
    model = load_policy(path)
    samples = draw_samples(model, tokenizer, prompts, ecfg)
    flat = [s for row in samples for s in row]
    logps = sequence_logps(model, [s.prompt_ids for s in flat], [s.response_ids for s in flat], ecfg.batch_size)
    answers = ModelAnswers(name, path, samples, logps, perplexity=perplexity(model, references, ecfg.batch_size))
    on_train = draw_samples(model, tokenizer, train_prompts, ecfg) if train_prompts is not None else None
    return answers, on_train


def score_under_base(base_path: str, answers: list[ModelAnswers], batch_size: int) -> None:
    """Fill `base_logps`: log pi_0 of every model's samples (pi_0's own: its `logps`)."""
    answers[0].base_logps = list(answers[0].logps)
    base = load_policy(base_path)
    for a in answers[1:]:
        flat = a.flat
        a.base_logps = sequence_logps(base, [s.prompt_ids for s in flat], [s.response_ids for s in flat], batch_size)


# ---- judging ---------------------------------------------------------------------------------


def scalar_scores(judge_cfg: JudgeConfig, prompts: list, responses: list[list[str]]) -> list[list[float]]:
    """Scalar judge scores, NaN for abstentions."""
    from pofe.preprocess.judges import Abstain, make_judge

    scores = make_judge(judge_cfg).score(prompts, responses)
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


def summarise(answers: list[ModelAnswers], prompts: list, prompts_source: str, ecfg: EvalConfig,
              judge_cfg: JudgeConfig, main: dict, second: dict | None, references: int) -> dict[str, Any]:
    """eval.json's numbers (without `train_prompts`)."""
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
        "train_prompts": {},
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


def evaluate_run(recipe_path: str | Path, echo: Echo = print) -> RunLayout:
    """Evaluate every finished iterate of the run of `recipe_path` into its eval/ folder;
    returns the run's layout (for the report)."""
    _, cfg = load_recipe(recipe_path)
    pcfg = pofe_config(cfg)
    ecfg = pcfg.eval
    if ecfg is None:
        raise ValueError(f"{recipe_path} has no pofe.eval block")
    layout = RunLayout(Path(cfg.output_dir).resolve())
    if not layout.state.exists():
        raise ValueError(f"no run state at {layout.state}: run `axolotl pofe run {recipe_path}` first")
    models = eval_models(RunState.read(layout.state))
    judge_cfg = pcfg.judge

    rows = _load_rows(ecfg.prompts) if ecfg.prompts else read_jsonl(layout.held_out_prompts)
    prompts = [r[ecfg.prompt_column] for r in rows]
    tokenizer = load_tokenizer(models[0][1])
    references = reference_pairs(tokenizer, prompts, [r.get(ecfg.reference_column) for r in rows])
    prompt_field = (pcfg.dataset_fields or [{}])[0].get("field_prompt", PROMPT)

    answers: list[ModelAnswers] = []
    on_train: dict[int, tuple[list, list[list[Sample]]]] = {}  # round t -> (prompts, pi_t's samples)
    for m, (name, path) in enumerate(models):
        echo(f"eval: {name} ({path})")
        train_prompts = None
        if m >= 1 and ecfg.train_prompts and not judge_cfg.is_pairwise:  # model m is round m's
            train_prompts = [r[prompt_field] for r in read_jsonl(layout.round_prompts(m))[: ecfg.train_prompts]]
        model_answers, train_samples = answer(name, path, tokenizer, prompts, references, train_prompts, ecfg)
        answers.append(model_answers)
        if train_samples is not None:
            on_train[m] = (train_prompts, train_samples)
    score_under_base(models[0][1], answers, ecfg.batch_size)

    M, P, S = len(models), len(prompts), ecfg.num_samples
    texts = [[[answers[m].samples[p][s].text for s in range(S)] for m in range(M)] for p in range(P)]
    main = judge_models(judge_cfg, prompts, texts)
    second = judge_models(ecfg.judge2, prompts, texts) if ecfg.judge2 else None

    result = summarise(answers, prompts, ecfg.prompts or str(layout.held_out_prompts), ecfg, judge_cfg,
                       main, second, len(references))
    for t, (train_prompts, train_samples) in on_train.items():
        scores = scalar_scores(judge_cfg, train_prompts, [[s.text for s in row] for row in train_samples])
        result["train_prompts"][str(t)] = {
            "num_prompts": len(train_prompts),
            "prompts": train_prompts,
            "mean_reward": nan_mean([x for row in scores for x in row]),
        }

    # NaN rewards (abstentions) are written as NaN, as json.dumps does by default
    records = sample_records(answers, prompts, main, second)
    write_atomic(layout.eval_dir / "samples.jsonl", "".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
    out = layout.eval_dir / "eval.json"
    write_atomic(out, json.dumps(result, indent=2) + "\n")
    echo(f"eval: {M} models x {P} prompts x {S} samples -> {out}")
    return layout
