"""What samples a model's answers in evaluation (`pofe.eval.backend`), and what scores them.

Every model of a run answers the held-out prompts, and each round's starting policy samples
the round's K candidates on them: on a GPU that is as much decoding as a round's generate
stage on a few hundred prompts, so it runs on the engine the rounds generate with when that
engine can load any model of the run: in-process vLLM (`pofe.generate.backend: vllm`) or a
server POFE starts for the model (`pofe.generate.serve`). A fixed `base_url` serves one model,
not each iterate, so it is never used here. Otherwise (`backend: transformers`, or a recipe
that generates with transformers or a fixed server) `model.generate` samples, through
`pofe_candidates.generators.hf.sample_responses`.

Either way a sample that runs on into a user turn of its own is cut where that turn begins, as
the candidates are (`pofe_candidates.user_turn`), and marked (`Sample.cut_at_user_turn`: eval.json
counts them per model). The log-probs of the samples (the KL estimate, perplexity) come from the
transformers model (`pofe.run.evaluation.answers`), loaded only after the engine has stopped, so a GPU
never holds both. The engine gets the prompts' token ids as the generate stage sends them,
and per prompt i the seed `sampling.seed + i`: every model samples with the same seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pofe.args.rounds import samples_on_rounds_engine
from pofe_candidates.config import GenerateConfig, Sampling
from pofe_candidates.generators import make_generator, sampled_ids
from pofe_candidates.generators.hf import Sample, sample_responses
from pofe_candidates.generators.interface import finish_reason
from pofe_candidates.models import load_policy
from pofe_candidates.render import Rendered, prompt_token_ids
from pofe_candidates.shard_work import close_generator, free_memory
from pofe_candidates.token_ids import content_ids
from pofe_candidates.user_turn import UserTurn, cut_at_user_turn, user_turn

# told each batch's prompt count as it is answered (a progress bar's `update`)
Progress = Callable[[int], object] | None
# what both samplers do to every sample after the engine (`cut_user_turns`), in their identity: the
# stored answers' key (`AnswerStore`), so answers stored before samples were cut are answered again
AFTER_SAMPLING = {"cut": "before a user turn"}


class LazyPolicy:
    """A model loaded on its first call, by `load(path)`; `loaded` tells whether it was."""

    def __init__(self, path: str, load: Callable[[str], Any]):
        self.path, self.load, self.model = path, load, None

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def __call__(self):
        if self.model is None:
            self.model = self.load(self.path)
        return self.model


def engine_for_eval(generate: GenerateConfig | None, backend: str) -> GenerateConfig | None:
    """The recipe's generate block when evaluation samples through it (see the module), else
    None (transformers)."""
    if not samples_on_rounds_engine(backend, generate):
        return None
    # `model` names what a round's engine serves; here each model of the run is the policy
    return generate.model_copy(update={"model": None})


class TransformersSampler:
    """`model.generate` (batch b seeded with `sampling.seed + b`); the same model scores."""

    def __init__(self, path: str, tokenizer, batch_size: int):
        self.policy, self.tokenizer, self.batch_size = LazyPolicy(path, load_policy), tokenizer, batch_size
        self.identity = {"engine": "transformers", **AFTER_SAMPLING}

    @property
    def loaded(self) -> bool:
        return self.policy.loaded

    def sample(self, rendered: list[str], n: int, sampling: Sampling, progress: Progress = None) -> list[list[Sample]]:
        samples = sample_responses(
            self.policy(), self.tokenizer, rendered, n, sampling, batch_size=self.batch_size, progress=progress
        )
        return cut_user_turns(samples, self.tokenizer)

    def scorer(self):
        return self.policy()

    def release(self) -> None:
        """Nothing to stop: the model is the scorer's too, and goes with this sampler."""


class EngineSampler:
    """The rounds' engine (`engine_for_eval`) for model `path`, started on the first `sample`
    and stopped before `scorer()` loads the transformers model."""

    def __init__(self, generate: GenerateConfig, path: str, tokenizer, workdir: Path):
        self.cfg, self.path, self.tokenizer, self.workdir = generate, path, tokenizer, workdir
        self.generator, self.started = None, False
        self.policy = LazyPolicy(path, load_policy)
        # what the samples depend on besides the seeds: the engine, and how many share it
        self.identity = {
            "engine": "served" if generate.serve else generate.backend,
            "in_flight": generate.in_flight,
            **AFTER_SAMPLING,
        }

    @property
    def loaded(self) -> bool:
        return self.started or self.policy.loaded

    def sample(self, rendered: list[str], n: int, sampling: Sampling, progress: Progress = None) -> list[list[Sample]]:
        if self.generator is None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.generator = make_generator(self.cfg, self.path, self.tokenizer, workdir=self.workdir)
            self.started = True
        prompts = [
            Rendered(text, len(ids), ids=ids) for text in rendered for ids in [prompt_token_ids(self.tokenizer, text)]
        ]
        out = self.generator.generate(prompts, n, sampling)
        if progress is not None:  # the engine takes every prompt at once (and shows its own bar)
            progress(len(prompts))
        samples = [
            [self._sample(p.ids, c, i) for c in row] for i, (p, row) in enumerate(zip(prompts, out, strict=True))
        ]
        return cut_user_turns(samples, self.tokenizer)

    def _sample(self, prompt_ids: list[int], candidate: str, i: int) -> Sample:
        ids = sampled_ids(candidate)
        if ids is None:
            raise ValueError(
                f"pofe.eval: the {self.identity['engine']} engine returned no token ids for prompt {i} of {self.path}'s "
                "answers; the log-probs and lengths need the ids sampled. Use vLLM >= 0.10.2 (return_token_ids), or "
                "set `pofe.eval.backend: transformers`."
            )
        return Sample(list(prompt_ids), ids, str(candidate), finish_reason(candidate) or "length")

    def release(self) -> None:
        """Stop the engine (its GPU memory is the transformers model's next)."""
        if self.generator is not None:
            close_generator(self.generator)
            self.generator = None
            free_memory()

    def scorer(self):
        self.release()
        return self.policy()


def cut_user_turns(samples: list[list[Sample]], tokenizer) -> list[list[Sample]]:
    """Each sample cut before the first user turn it writes (finish reason "stop", marked
    `cut_at_user_turn`), as the candidate pipeline cuts its samples; the others as they are."""
    turn = user_turn(tokenizer)
    return samples if turn is None else [[_cut(s, turn, tokenizer) for s in row] for row in samples]


def _cut(sample: Sample, turn: UserTurn, tokenizer) -> Sample:
    ids = content_ids(sample.response_ids, sample.finish_reason, tokenizer)
    done = cut_at_user_turn(sample.text, ids, turn, tokenizer)
    if done is None:
        return sample
    text, kept = done
    return Sample(sample.prompt_ids, kept, text, "stop", cut_at_user_turn=True)


def eval_sampler(
    generate: GenerateConfig | None, backend: str, path: str, tokenizer, batch_size: int, workdir: Path
) -> TransformersSampler | EngineSampler:
    """Model `path`'s sampler under `pofe.eval.backend` (see the module)."""
    engine = engine_for_eval(generate, backend)
    if engine is None:
        return TransformersSampler(path, tokenizer, batch_size)
    return EngineSampler(engine, path, tokenizer, workdir)
