"""`axolotl pofe eval`'s stages in a plan (`pofe.run.plan.planner`), costed on the backend that
will run them (`pofe.eval.backend`, `pofe.args.rounds.samples_on_rounds_engine`).

- eval-answers: every model answers the headline and held-out prompts, one model at a time. On
  the rounds' vLLM engine (in process, or a server POFE starts) the stage is the engine's share
  of the GPU, as the generate stage's (`pofe.run.plan.candidates.vllm_parts`); with
  `model.generate` it is the model's weights and the KV cache of a batch of `pofe.eval.batch_size`
  prompts x samples, each of up to sequence_len + the answer's tokens.
- eval-logprobs (the vLLM path only; `model.generate`'s model scores in place): once the engine
  has stopped, the transformers model scores each answer (the KL to pi_0, reference perplexity):
  its weights and one no-grad forward of a batch of prompt + answer rows, logits a chunk at a time.
- eval-judging: each judge that loads weights, built once after the last model is freed.
"""

from __future__ import annotations

from pofe.args.rounds import samples_on_rounds_engine
from pofe.columns import DEFAULT_LOGIT_CHUNK_SIZE
from pofe.run.plan import estimate as mem
from pofe.run.plan.candidates import judge_parts, vllm_parts
from pofe.run.plan.common import PlanOptions, stage


def eval_stages(raw: dict, pcfg, sizes: dict, options: PlanOptions, headline: bool = True) -> list[dict]:
    """eval-answers (and eval-logprobs after a vLLM engine), then the judges; `headline`: an
    iterated run's (a trained model's evaluation has none: `pofe.run.evaluation.trained`)."""
    ev, rounds = pcfg.eval, pcfg.rounds
    size = sizes.get(str(raw["base_model"]))
    dtype = "float32" if options.device == "cpu" else "bfloat16"
    # the default held-out slice (held_out unset) answers num_samples per prompt, as a set one does
    sequences = max(
        ev.batch_size * ev.num_samples if ev.has_held_out else 0, ev.batch_size * ev.train_samples if headline else 0
    )
    tokens = int(raw.get("sequence_len", 2048)) + max(ev.held_out_tokens(pcfg.generate), pcfg.generate.max_new_tokens)
    counts = {
        "models": rounds + 1,
        "headline_answers": rounds * ev.train_prompts * ev.train_samples if headline else None,
        "held_out_answers": (rounds + 1) * ev.held_out * ev.num_samples if ev.held_out else None,
    }
    models = f"pi_0..pi_{rounds}"
    if options.device == "cuda" and samples_on_rounds_engine(ev.backend, pcfg.generate):
        parts, vdtype, tp, _ = vllm_parts(pcfg, size, options, "eval-answers")
        note = "the rounds' vLLM engine (pofe.eval.backend: auto), one model at a time"
        answers = [
            stage(
                "eval-answers",
                None,
                models,
                dtype=vdtype,
                parts=parts,
                options=options,
                gpus=tp,
                tp=tp,
                counts=counts,
                note=note,
            ),
            stage(
                "eval-logprobs",
                None,
                models,
                dtype=dtype,
                parts=_scoring_parts(size, dtype, ev, tokens, options),
                options=options,
                note="the answers' log-probs under each model and pi_0, after the engine stopped",
            ),
        ]
    else:
        parts = (
            dict.fromkeys(("weights", "kv_cache", "runtime"))
            if size is None
            else {
                "weights": mem.weights_bytes(size, dtype),
                "kv_cache": mem.kv_bytes_per_token(size, dtype) * sequences * tokens,
                "runtime": options.runtime,
            }
        )
        note = "model.generate, one model at a time"
        answers = [
            stage("eval-answers", None, models, dtype=dtype, parts=parts, options=options, counts=counts, note=note)
        ]
    return [*answers, *_judging(pcfg, sizes, options)]


def _scoring_parts(size, dtype: str, ev, tokens: int, options: PlanOptions) -> dict:
    """The transformers model scoring a batch of `pofe.eval.batch_size` answers of up to `tokens` tokens."""
    if size is None:
        return dict.fromkeys(("weights", "forward", "runtime"))
    return {
        "weights": mem.weights_bytes(size, dtype),
        "forward": mem.forward_bytes(size, ev.batch_size * tokens, dtype)
        + mem.logit_chunk_bytes(size, DEFAULT_LOGIT_CHUNK_SIZE),
        "runtime": options.runtime,
    }


def _judging(pcfg, sizes: dict, options: PlanOptions) -> list[dict]:
    judged = []
    for judge in (pcfg.judge, pcfg.eval.judge2):
        if judge is not None and judge.spec.loads_weights:
            jdtype, jparts = judge_parts(judge, sizes.get(judge.model), options)
            judged.append(stage("eval-judging", None, judge.model, dtype=jdtype, parts=jparts, options=options))
    if judged:
        return judged
    name = pcfg.judge.function or pcfg.judge.model or ""
    return [
        stage("eval-judging", None, name, dtype="-", parts={}, options=options, device="cpu", note="no model on a GPU")
    ]
