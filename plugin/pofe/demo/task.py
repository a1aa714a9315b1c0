"""A verifiable toy task: small additions such as "12+7=", answered with the decimal sum.

The reward is computed, not learned, so RRHF and SPPO rows (candidates with rewards or
win rates) can be written for any number of prompts without a judge or a download.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from pathlib import Path

from pofe.files import write_jsonl_atomic

MAX_OPERAND = 20
# Wrong candidates lie within this distance of the sum, so their rewards stay graded.
MAX_WRONG_OFFSET = 10
DEFAULT_WIN_RATE_SCALE = 5.0
# what `verbose_reward` pays for each character after the number, on top of the verifiable reward
VERBOSITY = 0.25

_PROMPT = re.compile(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*")
_INTEGER = re.compile(r"[+-]?\d+")
_LEADING_INTEGER = re.compile(r"\s*[+-]?\d+")


def answer(prompt: str) -> int:
    """The correct sum for a prompt "a+b="; ValueError if the prompt has another shape."""
    match = _PROMPT.fullmatch(prompt)
    if match is None:
        raise ValueError(f"not an addition prompt of the form 'a+b=': {prompt!r}")
    return int(match.group(1)) + int(match.group(2))


def reward(prompt: str, response: str) -> float:
    """Score a response in [0, 1].

    - 1.0 when `response.strip()` is exactly the decimal sum;
    - 0.5 / (1 + |response - sum|) for any other integer, so wrong answers are ordered
      by closeness and every wrong answer stays below 0.5 < 1.0 (off by one: 0.25);
    - 0.0 for anything that is not an integer ("", "12 apples", "<|end|>").
    """
    text = response.strip()
    if _INTEGER.fullmatch(text) is None:
        return 0.0
    diff = abs(int(text) - answer(prompt))
    return 1.0 if diff == 0 else 0.5 / (1 + diff)


def exact_reward(prompt: str, response: str) -> float:
    """1.0 when `response.strip()` is exactly the decimal sum, else 0.0: `reward` without the
    grading of wrong answers by closeness."""
    return float(reward(prompt, response) == 1.0)


def verbose_reward(prompt: str, response: str) -> float:
    """A judge with a blind spot: `reward` of the number the response starts with, plus
    VERBOSITY for every character after it (0 for a response that starts with no number).

    Judges that favour longer answers are the common case (the SPPO paper reports length
    growth); here the length says nothing about the sum: "12 is it" scores 1.0 + 6 * 0.25 =
    2.5 for 5+7=, above the bare "12", while the verifiable `reward` gives it 0 (it is not a
    number). A policy trained online against this judge can raise its reward by going on
    after the sum where it should stop. The online monitors' demonstration (docs/online.md).
    """
    match = _LEADING_INTEGER.match(response)
    if match is None:
        return 0.0
    return reward(prompt, match.group(0)) + VERBOSITY * (len(response) - match.end())


def make_prompts(n_prompts: int, *, seed: int = 0) -> list[str]:
    """`n_prompts` distinct prompts "a+b=" with operands in 0..MAX_OPERAND, in seeded order.

    Distinct, so a caller can split one list into disjoint training and held-out prompts.
    """
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    if not 0 < n_prompts <= len(pairs):
        raise ValueError(f"n_prompts must be in 1..{len(pairs)}, got {n_prompts}")
    return [f"{a}+{b}=" for a, b in random.Random(seed).sample(pairs, n_prompts)]


def _candidates(prompt: str, k: int, rng: random.Random) -> list[str]:
    """The correct answer plus k-1 distinct non-negative wrong sums near it, shuffled."""
    total = answer(prompt)
    nearby = range(max(0, total - MAX_WRONG_OFFSET), total + MAX_WRONG_OFFSET + 1)
    wrong_pool = [v for v in nearby if v != total]
    values = [total, *rng.sample(wrong_pool, k - 1)]
    rng.shuffle(values)  # so the best candidate is not always first
    return [str(v) for v in values]


def make_rrhf_rows(n_prompts: int, k: int = 4, seed: int = 0) -> list[dict]:
    """Rows `{"prompt", "responses": [str]*k, "rewards": [float]*k}`, one per prompt.

    Exactly one candidate is correct (reward 1.0); the others are distinct wrong numbers.
    The same seed gives the same rows.
    """
    if not 2 <= k <= MAX_WRONG_OFFSET + 1:
        raise ValueError(f"k must be in 2..{MAX_WRONG_OFFSET + 1}, got {k}")
    rng = random.Random(seed)
    rows = []
    for prompt in make_prompts(n_prompts, seed=seed):
        responses = _candidates(prompt, k, rng)
        rows.append(
            {
                "prompt": prompt,
                "responses": responses,
                "rewards": [reward(prompt, r) for r in responses],
            }
        )
    return rows


def make_prompt_rows(n_prompts: int, k_wrong: int = 3, seed: int = 0) -> list[dict]:
    """Rows `{"prompt", "answer", "near_misses": [str]*k_wrong}` for the generate stage.

    The answer and the near misses play the dataset's own responses that the RRHF paper
    adds to the policy's samples; the judge scores them all.
    """
    rows = []
    for row in make_rrhf_rows(n_prompts, k=k_wrong + 1, seed=seed):
        right = str(answer(row["prompt"]))
        wrong = [r for r in row["responses"] if r != right]
        rows.append({"prompt": row["prompt"], "answer": right, "near_misses": wrong})
    return rows


def sft_rows(prompt_rows: list[dict]) -> list[dict]:
    """Rows `{"messages": [user prompt, assistant answer]}` of prompt rows (`make_prompt_rows`):
    the chats a supervised fine-tune of the tiny model reads (axolotl's `chat_template` type)."""
    return [
        {"messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["answer"]}]}
        for r in prompt_rows
    ]


def bradley_terry_win_rates(rewards: list[float], scale: float = DEFAULT_WIN_RATE_SCALE) -> list[float]:
    """w_i = mean_j sigmoid(scale * (r_i - r_j)) over all j, the diagonal counting 0.5.

    SPPO's K-sample win rate (Wu et al. 2024, arXiv:2405.00675) with a Bradley-Terry
    judge on the computed reward in place of PairRM. `scale` sets how sure a reward gap
    makes the judge: rewards lie in [0, 1], and with scale 5 a gap of 0.75 (right vs
    off by one) gives p = sigmoid(3.75) = 0.977.
    """
    import torch

    from pofe_candidates.win_rates import bradley_terry_preferences, win_rates

    scaled = torch.tensor(rewards, dtype=torch.float64) * scale
    return win_rates(bradley_terry_preferences(scaled)).tolist()


def make_sppo_rows(n_prompts: int, k: int = 4, seed: int = 0, scale: float = DEFAULT_WIN_RATE_SCALE) -> list[dict]:
    """Rows `{"prompt", "responses": [str]*k, "win_rates": [float]*k}`.

    Same prompts and candidates as `make_rrhf_rows` with the same seed; the rewards are
    turned into win rates by `bradley_terry_win_rates`.
    """
    return [
        {
            "prompt": row["prompt"],
            "responses": row["responses"],
            "win_rates": bradley_terry_win_rates(row["rewards"], scale),
        }
        for row in make_rrhf_rows(n_prompts, k=k, seed=seed)
    ]


def write_jsonl(rows: Iterable[dict], path: str | Path) -> Path:
    """Write one JSON object per line (`pofe.files.write_jsonl_atomic`); return the path."""
    write_jsonl_atomic(Path(path), rows)
    return Path(path)
