"""Nash-MD's opponent: responses sampled token by token from the geometric mixture of the policy and pi_0.

At every generated token the policy's next-token logits and pi_0's are combined by
`pofe.losses.nash_md_mixture_logits`, log_softmax((1 - beta) log_softmax(policy) + beta
log_softmax(pi_0)), and the token is drawn from that (after the recipe's temperature, top-k and
top-p, as the policy's own samples are). The policy decodes through transformers' `generate`
(the candidate pipeline's `sample_responses`: same prompts as ids, seeding, stop tokens and
cuts as the policy's samples); pi_0 runs beside it in a logits processor, one token at a time
over a KV cache of its own (`Pi0Policy.forward`: the adapter-disabled policy under LoRA/QLoRA,
the frozen copy under full fine-tuning).

Always the training model, whatever `generate.backend` samples the policy's own candidates:
vLLM samples from one model's logits and has no way to mix a second model's in at each token.

While sampling, the processor measures how far the mixture is from the policy: the mean over
the sampled positions of KL(pi_mix || pi_theta) per token (at temperature 1, as the mixture
is defined), logged as `online/mixture_kl`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from pofe.losses import nash_md_mixture_logits
from pofe_candidates.config import Sampling
from pofe_candidates.generators.hf import sample_responses, stop_token_ids
from pofe_candidates.generators.interface import Completion
from pofe_candidates.models import with_pad_token
from pofe_candidates.render import Rendered


@dataclass
class MixtureDistance:
    """The summed per-token KL(pi_mix || pi_theta) of the sampled positions, and their count."""

    total: float = 0.0
    tokens: int = 0

    def add(self, kl: torch.Tensor) -> None:
        self.total += float(kl.sum())
        self.tokens += kl.numel()

    @property
    def mean(self) -> float | None:
        return self.total / self.tokens if self.tokens else None


class MixtureLogitsProcessor(LogitsProcessor):
    """A transformers logits processor that turns the policy's next-token logits into the mixture's.

    Made for one `generate` call (one batch): pi_0 is run on the tokens the call has added since
    its last step (the whole prompt at the first), over its own KV cache, with the positions the
    left-padded prompt mask gives, and only its last position's logits are computed.
    """

    def __init__(
        self,
        pi_0_forward: Callable[..., object],
        mixture_coef: float,
        prompt_mask: torch.Tensor,
        stops: list[int],
        distance: MixtureDistance,
    ):
        self.pi_0_forward, self.mixture_coef = pi_0_forward, mixture_coef
        self.prompt_mask = prompt_mask  # (R, P): one row per sequence
        self.stops = torch.tensor(stops, device=prompt_mask.device)
        self.distance = distance
        self.cache = None  # pi_0's KV cache for this batch
        self.seen = 0  # tokens of input_ids pi_0 has read
        self.finished = torch.zeros(len(prompt_mask), dtype=torch.bool, device=prompt_mask.device)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids (R, L): each sequence so far; scores (R, V): the policy's next-token logits ->
        the mixture's (R, V) log-probabilities, in `scores`' dtype."""
        rows, length = input_ids.shape
        prompt_len = self.prompt_mask.shape[1]
        if length > prompt_len:  # a sequence that has sampled a stop token is padding from then on
            self.finished |= torch.isin(input_ids[:, -1], self.stops)
        mask = torch.cat([self.prompt_mask, self.prompt_mask.new_ones(rows, length - prompt_len)], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # (R, L): left padding does not count
        out = self.pi_0_forward(
            input_ids=input_ids[:, self.seen :],
            attention_mask=mask,
            position_ids=positions[:, self.seen :],
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache, self.seen = out.past_key_values, length
        mixed = nash_md_mixture_logits(scores, out.logits[:, -1], self.mixture_coef)  # (R, V)
        policy = torch.log_softmax(scores.to(mixed.dtype), dim=-1)
        kl = (mixed.exp() * (mixed - policy)).sum(dim=-1)  # (R,) KL(pi_mix || pi_theta) at this token
        self.distance.add(kl[~self.finished])
        return mixed.to(scores.dtype)


class MixtureGenerator:
    """A candidate-pipeline generator (`Generator`) whose samples are the mixture's: the unwrapped
    policy `model` decodes; `pi_0()` is a context in which pi_0's forward can be called
    (`Pi0Policy.forward`), entered for each `generate` call only (under ZeRO-3 it holds a
    gathered copy)."""

    name = "transformers (Nash-MD mixture)"

    def __init__(
        self,
        model,
        pi_0: Callable[[], AbstractContextManager[Callable[..., object]]],
        tokenizer,
        *,
        mixture_coef: float,
        batch_size: int,
    ):
        self.model, self.pi_0 = model, pi_0
        self.tokenizer, self.batch_size = with_pad_token(tokenizer), batch_size
        self.mixture_coef = mixture_coef
        self.distance = MixtureDistance()

    def generate(self, prompts: list[Rendered], n: int, sampling: Sampling) -> list[list[Completion]]:
        """P rendered prompts -> P lists of n samples of the mixture."""
        stops = stop_token_ids(self.model, self.tokenizer)
        with self.pi_0() as pi_0_forward:

            def processors(prompt_mask: torch.Tensor) -> LogitsProcessorList:
                mixture = MixtureLogitsProcessor(pi_0_forward, self.mixture_coef, prompt_mask, stops, self.distance)
                return LogitsProcessorList([mixture])

            samples = sample_responses(
                self.model,
                self.tokenizer,
                [list(p.ids) for p in prompts],
                n,
                sampling,
                batch_size=self.batch_size,
                logits_processor_for=processors,
            )
        return [[Completion(s.text, s.finish_reason, s.response_ids) for s in row] for row in samples]
