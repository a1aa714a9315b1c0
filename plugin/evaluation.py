"""`axolotl pofe eval recipe.yml`: every iterate of a run on held-out prompts.

Models: pi_0 (the policy round 1 started from) and pi_t (round t's trained model), read
from the run's state file. Every model answers the same held-out prompts with the same
seeds (`pofe.eval`: `num_samples` per prompt at `temperature`; temperature 0 = greedy).
Then, per model:

- mean reward under the recipe's judge (scalar judges), and under `pofe.eval.judge2`;
- the win-rate matrix W[a, b] = P(a's response beats b's), averaged over prompts and over
  all sample pairs: scalar judges through Bradley-Terry, P = sigmoid(r_a - r_b)
  (`bradley_terry_preferences`); pairwise judges directly, from the judge's (both-orders)
  preference matrix over all models' responses to the prompt. The diagonal is 1/2;
- mean response length (tokens, including the end-of-turn token when the model stopped;
  characters of the decoded text);
- KL to pi_0 estimated on the model's own samples: mean over samples of
  log pi_t(y|x) - log pi_0(y|x) (summed over response tokens). An unbiased estimate of
  KL(pi_t || pi_0) only when sampling at temperature 1, top_p 1; otherwise the same mean
  log-ratio on the decoded responses;
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
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from pofe.preprocess.win_rates import bradley_terry_preferences


# ---- pure maths ------------------------------------------------------------------------------


def block_win_matrix(pref: Tensor, num_models: int, num_samples: int) -> Tensor:
    """Average a preference matrix over all responses into a model-vs-model matrix.

    Args:
        pref: (P, M*S, M*S), pref[p, i, j] = P(response i beats response j) for prompt p;
            responses are ordered model-major (model m's samples are m*S .. m*S+S-1).
            NaN entries (abstentions) are left out of the averages.
    Returns:
        (M, M): W[a, b] = mean over prompts and sample pairs of P(a's beats b's);
        the diagonal is exactly 1/2.
    """
    P, N, _ = pref.shape
    M, S = num_models, num_samples
    if N != M * S:
        raise ValueError(f"pref is {tuple(pref.shape)}, expected (P, {M * S}, {M * S})")
    blocks = pref.reshape(P, M, S, M, S)  # (P, M, S, M, S)
    per_prompt = torch.nanmean(blocks, dim=(2, 4))  # (P, M, M)
    w = torch.nanmean(per_prompt, dim=0)  # (M, M)
    w.fill_diagonal_(0.5)
    return w


def win_matrix_from_rewards(rewards: Tensor) -> Tensor:
    """Bradley-Terry win rates between models from scalar rewards.

    Args:
        rewards: (P, M, S) reward of model m's sample s on prompt p (NaN = abstained).
    Returns:
        (M, M), W[a, b] = mean_{p, s, s'} sigmoid(r[p, a, s] - r[p, b, s']), diagonal 1/2.
    """
    P, M, S = rewards.shape
    pref = bradley_terry_preferences(rewards.reshape(P, M * S).double())  # (P, M*S, M*S)
    return block_win_matrix(pref, M, S)


def nan_mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(vals) / len(vals) if vals else None


# ---- models ----------------------------------------------------------------------------------


def load_policy(path: str, device: str):
    """A full model folder, or a peft adapter folder on its base; eval mode."""
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if (Path(path) / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    p = Path(path)
    if (p / "adapter_config.json").exists() and not (p / "tokenizer_config.json").exists():
        path = json.loads((p / "adapter_config.json").read_text())["base_model_name_or_path"]
    return AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def generate(
    model, tokenizer, prompts: list, *, num_samples: int, temperature: float, top_p: float,
    max_new_tokens: int, batch_size: int, seed: int,
) -> list[list[dict]]:
    """P prompts -> P lists of `num_samples` {"prompt_ids", "response_ids", "text"}.

    Prompts are rendered with the chat template (as the pipeline renders them). Response
    ids stop at and include the first EOS; the text is decoded without special tokens.
    Batch b is seeded with `seed + b`, so every model sees the same random stream.
    """
    from pofe.preprocess.render import render_prompt

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    out: list[list[dict]] = []
    device = next(model.parameters()).device
    for b, start in enumerate(range(0, len(prompts), batch_size)):
        chunk = prompts[start : start + batch_size]
        texts = [render_prompt(tokenizer, p).text for p in chunk]
        add_special = not bool(getattr(tokenizer, "chat_template", None))
        enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left",
                        add_special_tokens=add_special).to(device)
        torch.manual_seed(seed + b)
        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        if temperature == 0.0:
            kwargs.update(do_sample=False)
        else:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                          num_return_sequences=num_samples)
        seqs = model.generate(**enc, **kwargs)  # (B * S, L + T)
        L = enc["input_ids"].shape[1]
        for i in range(len(chunk)):
            row_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            samples = []
            for s in range(num_samples):
                new = seqs[i * num_samples + s, L:].tolist()
                if eos in new:
                    new = new[: new.index(eos) + 1]
                else:
                    while new and new[-1] == pad:  # only padding after EOS is expected
                        new.pop()
                text_ids = [t for t in new if t != eos]
                samples.append({
                    "prompt_ids": row_ids,
                    "response_ids": new,
                    "text": tokenizer.decode(text_ids, skip_special_tokens=True),
                })
            out.append(samples)
    return out


@torch.no_grad()
def sequence_logps(model, prompt_ids: list[list[int]], response_ids: list[list[int]], batch_size: int = 16) -> list[float]:
    """Summed log pi(response | prompt) for each pair, by one teacher-forced forward.

    Sequences are right-padded (positions start at 0 for every row); only response tokens
    count. An empty response scores 0.
    """
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(prompt_ids), batch_size):
        ps, rs = prompt_ids[start : start + batch_size], response_ids[start : start + batch_size]
        seqs = [p + r for p, r in zip(ps, rs, strict=True)]
        T = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), T, dtype=torch.long)
        mask = torch.zeros(len(seqs), T, dtype=torch.long)
        tgt = torch.zeros(len(seqs), T, dtype=torch.bool)  # (B, T): token t is a response token
        for i, (p, s) in enumerate(zip(ps, seqs)):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
            tgt[i, len(p) : len(s)] = True
        ids, mask, tgt = ids.to(device), mask.to(device), tgt.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()  # (B, T, V)
        logp = torch.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V): predicts token t+1
        tok = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
        out += (tok * tgt[:, 1:]).sum(-1).tolist()
    return out


# ---- the eval command --------------------------------------------------------------------------


def _load_rows(path: str | Path) -> list[dict]:
    from datasets import load_dataset

    path = str(path)
    kind = "parquet" if path.endswith(".parquet") else "csv" if path.endswith(".csv") else "json"
    return load_dataset(kind, data_files=path, split="train").to_list()


def _score(judge_cfg, prompts: list, responses: list[list[str]]) -> list[list[float]]:
    """Scalar judge scores, NaN for abstentions."""
    from pofe.preprocess.judges import Abstain, make_judge

    judge = make_judge(judge_cfg)
    scores = judge.score(prompts, responses)
    return [[math.nan if isinstance(v, Abstain) else float(v) for v in row] for row in scores]


def _pairwise_pref(judge_cfg, prompts: list, responses: list[list[str]]) -> Tensor:
    from pofe.preprocess.judges import make_judge

    judge = make_judge(judge_cfg)
    verdicts = judge.preferences(prompts, responses)
    return torch.stack([v.matrix.to(torch.float64) for v in verdicts])  # (P, N, N)


def judge_models(judge_cfg, prompts: list, texts: list[list[list[str]]]) -> dict:
    """texts[p][m][s] -> {"rewards": (P, M, S) list or None, "win_matrix": (M, M), "method"}."""
    P, M, S = len(texts), len(texts[0]), len(texts[0][0])
    flat = [[t for m in range(M) for t in texts[p][m]] for p in range(P)]  # (P, M*S), model-major
    if judge_cfg.is_pairwise:
        w = block_win_matrix(_pairwise_pref(judge_cfg, prompts, flat), M, S)
        return {"rewards": None, "win_matrix": w.tolist(), "method": "pairwise"}
    scores = torch.tensor(_score(judge_cfg, prompts, flat), dtype=torch.float64).reshape(P, M, S)
    return {
        "rewards": scores.tolist(),
        "win_matrix": win_matrix_from_rewards(scores).tolist(),
        "method": "bradley_terry",
    }


def evaluate_run(recipe_path: str | Path, echo=print) -> Path:
    """Evaluate every finished iterate of the run of `recipe_path`; returns eval.json's path."""
    from pofe.preprocess.config import JudgeConfig

    from .data.tokenize import render_row
    from .rounds import RunLayout, RunState, eval_models, load_recipe, read_jsonl

    raw, cfg = load_recipe(recipe_path)
    ecfg = cfg.pofe.eval
    if ecfg is None:
        raise ValueError(f"{recipe_path} has no pofe.eval block")
    from .iterate_config import EvalConfig

    ecfg = EvalConfig(**dict(ecfg))
    layout = RunLayout(Path(cfg.output_dir).resolve())
    if not layout.state.exists():
        raise ValueError(f"no run state at {layout.state}: run `axolotl pofe run {recipe_path}` first")
    state = RunState(layout.state, json.loads(layout.state.read_text()))
    models = eval_models(state)
    judge_cfg = JudgeConfig(**dict(cfg.pofe.judge))
    judge2_cfg = ecfg.judge2

    rows = _load_rows(ecfg.prompts) if ecfg.prompts else read_jsonl(layout.held_out_prompts)
    prompts = [r[ecfg.prompt_column] for r in rows]
    refs = [r.get(ecfg.reference_column) for r in rows]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tokenizer(models[0][1])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dec = dict(num_samples=ecfg.num_samples, temperature=ecfg.temperature, top_p=ecfg.top_p,
               max_new_tokens=ecfg.max_new_tokens, batch_size=ecfg.batch_size, seed=ecfg.seed)

    # references, tokenised once: (prompt ids, response ids) of the rendered assistant turn
    ref_pairs = []
    for p, ref in zip(prompts, refs):
        if isinstance(ref, str) and ref:
            msgs = [{"role": "user", "content": p}] if isinstance(p, str) else p
            pt, (rt,) = render_row({"prompt": msgs, "responses": [{"role": "assistant", "content": ref}]}, tokenizer)
            ref_pairs.append((tokenizer(pt, add_special_tokens=False)["input_ids"],
                              tokenizer(rt, add_special_tokens=False)["input_ids"]))

    gens: list[list[list[dict]]] = []  # [model][prompt][sample]
    train_gens: dict[int, tuple[list, list[list[dict]]]] = {}
    perplexity: list[float | None] = []
    for m, (name, path) in enumerate(models):
        echo(f"eval: {name} ({path})")
        model = load_policy(path, device)
        g = generate(model, tokenizer, prompts, **dec)
        flat = [s for row in g for s in row]
        for s, lp in zip(flat, sequence_logps(model, [s["prompt_ids"] for s in flat],
                                              [s["response_ids"] for s in flat], ecfg.batch_size)):
            s["logp"] = lp
        gens.append(g)
        if ref_pairs:
            nll = -sum(sequence_logps(model, [a for a, _ in ref_pairs], [b for _, b in ref_pairs], ecfg.batch_size))
            perplexity.append(math.exp(nll / sum(len(b) for _, b in ref_pairs)))
        else:
            perplexity.append(None)
        if m >= 1 and ecfg.train_prompts and not judge_cfg.is_pairwise:
            t = m
            trows = read_jsonl(layout.round_prompts(t))[: ecfg.train_prompts]
            field = (cfg.pofe.dataset_fields or [{}])[0].get("field_prompt", "prompt")
            tprompts = [r[field] for r in trows]
            train_gens[t] = (tprompts, generate(model, tokenizer, tprompts, **dec))
        del model

    # log pi_0 on every model's samples (pi_0's own: its logp)
    base = load_policy(models[0][1], device)
    for m, g in enumerate(gens):
        flat = [s for row in g for s in row]
        if m == 0:
            for s in flat:
                s["logp_base"] = s["logp"]
            continue
        for s, lp in zip(flat, sequence_logps(base, [s["prompt_ids"] for s in flat],
                                              [s["response_ids"] for s in flat], ecfg.batch_size)):
            s["logp_base"] = lp
    del base

    M, P, S = len(models), len(prompts), ecfg.num_samples
    texts = [[[gens[m][p][s]["text"] for s in range(S)] for m in range(M)] for p in range(P)]
    j1 = judge_models(judge_cfg, prompts, texts)
    j2 = judge_models(judge2_cfg, prompts, texts) if judge2_cfg else None

    def per_model_mean(rewards):
        if rewards is None:
            return None
        return [nan_mean([rewards[p][m][s] for p in range(P) for s in range(S)]) for m in range(M)]

    result: dict[str, Any] = {
        "models": [{"name": n, "path": p} for n, p in models],
        "num_prompts": P,
        "prompts_source": ecfg.prompts or str(layout.held_out_prompts),
        "decoding": {k: v for k, v in dec.items() if k != "batch_size"},
        "judge": judge_cfg.model_dump(),
        "judge2": judge2_cfg.model_dump() if judge2_cfg else None,
        "win_matrix_method": j1["method"],
        "win_matrix": j1["win_matrix"],
        "mean_reward": per_model_mean(j1["rewards"]),
        "win_matrix_judge2": j2["win_matrix"] if j2 else None,
        "mean_reward_judge2": per_model_mean(j2["rewards"]) if j2 else None,
        "mean_response_tokens": [nan_mean([len(s["response_ids"]) for row in g for s in row]) for g in gens],
        "mean_response_chars": [nan_mean([len(s["text"]) for row in g for s in row]) for g in gens],
        "kl_to_base": [nan_mean([s["logp"] - s["logp_base"] for row in g for s in row]) for g in gens],
        "kl_is_unbiased": ecfg.temperature == 1.0 and ecfg.top_p == 1.0,
        "perplexity": perplexity if ref_pairs else None,
        "reference_count": len(ref_pairs),
        "cycle_threshold": ecfg.cycle_threshold,
        "train_prompts": {},
    }
    for t, (tprompts, tg) in train_gens.items():
        scores = _score(judge_cfg, tprompts, [[s["text"] for s in row] for row in tg])
        result["train_prompts"][str(t)] = {
            "num_prompts": len(tprompts),
            "prompts": tprompts,
            "mean_reward": nan_mean([x for row in scores for x in row]),
        }

    layout.eval_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for m, g in enumerate(gens):
        for p, row in enumerate(g):
            for s, smp in enumerate(row):
                lines.append({
                    "model": models[m][0], "prompt_index": p, "sample": s, "prompt": prompts[p],
                    "response": smp["text"], "tokens": len(smp["response_ids"]),
                    "reward": j1["rewards"][p][m][s] if j1["rewards"] else None,
                    "reward2": j2["rewards"][p][m][s] if j2 and j2["rewards"] else None,
                    "logp": smp["logp"], "logp_base": smp["logp_base"],
                })
    from .rounds import write_atomic

    write_atomic(layout.eval_dir / "samples.jsonl", "".join(json.dumps(r, allow_nan=True) + "\n" for r in lines))
    out = layout.eval_dir / "eval.json"
    write_atomic(out, json.dumps(result, indent=2) + "\n")
    echo(f"eval: {M} models x {P} prompts x {S} samples -> {out}")
    return out
