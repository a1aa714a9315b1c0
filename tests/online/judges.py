"""Python judges the online tests train with, imported by `axolotl train` from the repository
(`PYTHONPATH`): the demo's reward, or another judge, or one that misbehaves where a test needs it."""

from __future__ import annotations

import os

from pofe.demo.task import reward


def halved(prompt: str, response: str) -> float:
    """Another judge than the demo's: half its reward."""
    return reward(prompt, response) / 2


def abstains_on_a_quarter(prompt: str, response: str) -> float:
    """The demo's reward, but raising (an abstention) on about a quarter of the responses: those
    whose characters' code points sum to a multiple of 4."""
    if sum(map(ord, response)) % 4 == 0:
        raise ValueError(f"no verdict on {response!r}")
    return reward(prompt, response)


def same_for_all(prompt: str, response: str) -> float:
    """One reward for every response: every Nash-MD pair ties."""
    return 1.0


def raises(prompt: str, response: str) -> float:
    """A judge that fails on every response."""
    raise ZeroDivisionError(f"no verdict on {response!r}")


def none_on_one_prompt(prompt: str, response: str) -> float | None:
    """The demo's reward, but None (not a number: a broken judge, not an abstention) on the prompt
    the test names in POFE_TEST_BROKEN_PROMPT."""
    return None if prompt == os.environ["POFE_TEST_BROKEN_PROMPT"] else reward(prompt, response)
