"""The generator interface every backend implements (a leaf: backends and the factory import it)."""

from __future__ import annotations

from typing import Protocol

from pofe_candidates.config import Sampling
from pofe_candidates.render import Rendered


class Completion(str):
    """A candidate's text, why decoding ended, and the token ids sampled. `finish_reason`:
    "stop" (a stop token) or "length" (cut at max_new_tokens); `token_ids`: the sampled ids as
    the engine returned them (the stop token included when one ended the candidate), None
    when the backend gave none. A str, so everything that reads candidates reads it as text;
    a backend that cannot tell returns plain strings (finish reason and ids unknown)."""

    finish_reason: str
    token_ids: list[int] | None

    def __new__(cls, text: str, finish_reason: str, token_ids: list[int] | None = None) -> Completion:
        out = super().__new__(cls, text)
        out.finish_reason = finish_reason
        out.token_ids = None if token_ids is None else [int(t) for t in token_ids]
        return out


def finish_reason(candidate: str) -> str | None:
    """ "stop", "length", or None when the backend did not say."""
    return getattr(candidate, "finish_reason", None)


def sampled_ids(candidate: str) -> list[int] | None:
    """The ids the backend sampled for `candidate`, or None when it gave none."""
    return getattr(candidate, "token_ids", None)


def check_prompt_seen(sent: list[int], seen: list[int] | None, where: str, index: int) -> None:
    """Raise if the engine conditioned prompt `index` on other ids than those POFE sent (a
    server that tokenised text again, adding a second BOS): training would then score samples
    drawn after another prompt. `seen` None: the engine did not say (nothing to check)."""
    if seen is None or list(seen) == list(sent):
        return
    raise ValueError(
        f"{where} conditioned prompt {index} of the batch on {len(seen)} token ids {list(seen)[:8]}..., not the "
        f"{len(sent)} POFE sent {list(sent)[:8]}... (the trainer's): it tokenised the prompt again and added special "
        "tokens (two BOS when the chat template writes one). Send token ids (generate.openai_prompt: token_ids, "
        "which vLLM and SGLang accept), or use a server that honours add_special_tokens: false."
    )


class Generator(Protocol):
    name: str

    def generate(self, prompts: list[Rendered], n: int, sampling: Sampling) -> list[list[str]]:
        """prompts: P rendered prompts (their `ids` are what the policy conditions on) -> P lists
        of exactly n candidates each (`Completion`s where the backend knows why each stopped)."""
        ...
