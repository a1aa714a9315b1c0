"""TRL-style batched reward functions as a scalar judge (`judge.reward_funcs`, `reward_weights`).

Each function is called as TRL's GRPOTrainer calls one (trl 1.9, `_calculate_rewards`):

    fn(prompts=[...], completions=[...], **columns) -> list[float | None]

once per judge call (a shard), with one entry per candidate, grouped by prompt (prompt p's K_p
candidates consecutive, as TRL's generations are). `prompts[n]`: candidate n's prompt as the
dataset stores it; `completions[n]`: its text, or [{"role": "assistant", "content": text}]
when the prompt is chat messages (TRL's conversational format). Every dataset column other
than the prompt is a keyword argument, a list with the row's value repeated per candidate
(None where a row lacks the column). TRL's other keywords are not passed: `completion_ids`
(the judge has texts, not the policy's token ids), `trainer_state`, `log_extra`, `log_metric`
and `environments` (no trainer runs here); so a function must take **kwargs, as TRL's
contract says, and that is checked when it loads. Coroutine functions are awaited.

Combination, as TRL's `sum_then_normalize` before its normalisation (RRHF and SPPO do not
normalise rewards): reward = sum_i w_i r_i over the functions that gave a number; None or NaN
is no value from that function (TRL's nansum), and a candidate with no value from any function
abstains (TRL marks it unscorable). A value of +-inf, or a sum beyond float32, is an abstention. An exception abstains
every candidate of that call: a weighted sum silently missing a term is not what was
configured. A result of the wrong length, or an entry that is not a number (a str or a bool included), is an error
naming the function (a bug to fix, not a verdict).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from functools import partial
from typing import Any

from pofe_candidates.judges.interface import JudgeStats, Score, as_number, unusable_score
from pofe_candidates.judges.timed import JudgeTimeout, RemoteError, TimedCalls, timed
from pofe_candidates.judges.user_functions import load_dotted
from pofe_candidates.render import Prompt

RESERVED = ("prompts", "completions")  # TRL's own arguments; a dataset column cannot reuse them


class RewardFuncsJudge:
    """Weighted sum of batched reward functions, each called once per `score` call."""

    reads_rendered_prompt = False  # TRL passes reward functions the dataset's prompts
    reads_columns = True  # and the dataset's other columns as kwargs (apply.apply_judge passes them)

    def __init__(
        self,
        funcs: list[tuple[str, Callable[..., Any]]],
        weights: list[float] | None = None,
        *,
        allow_abstain: bool = True,
        timeout: float | None = None,
        stage_timeout: float | None = None,
    ):
        if weights is not None and len(weights) != len(funcs):
            raise ValueError(f"{len(weights)} reward weights for {len(funcs)} reward functions")
        for name, fn in funcs:
            check_signature(name, fn)
        self.funcs = funcs
        # judge.timeout / stage_timeout: each function's calls in a worker process (timed.py)
        self.calls = [timed(partial(_run, fn), name, timeout, stage_timeout) for name, fn in funcs]
        self.weights = list(weights) if weights is not None else [1.0] * len(funcs)
        self.allow_abstain = allow_abstain
        self.name = ", ".join(name for name, _ in funcs)
        self.stats = JudgeStats()

    @classmethod
    def from_paths(
        cls,
        paths: list[str],
        weights: list[float] | None,
        *,
        allow_abstain: bool,
        timeout: float | None = None,
        stage_timeout: float | None = None,
    ) -> RewardFuncsJudge:
        return cls(
            [(p, load_dotted(p, "judge.reward_funcs")) for p in paths],
            weights,
            allow_abstain=allow_abstain,
            timeout=timeout,
            stage_timeout=stage_timeout,
        )

    def score(
        self, prompts: list[Prompt], responses: list[list[str]], columns: list[dict] | None = None
    ) -> list[list[Score]]:
        """P prompts, P lists of K_p responses (and, from the pipeline, each prompt row's other
        columns) -> P lists of K_p rewards or Abstain."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} response lists")
        where = [(p, k) for p, cands in enumerate(responses) for k in range(len(cands))]  # (N,) candidates
        n = len(where)
        call = dict(
            prompts=[prompts[p] for p, _ in where],
            completions=[as_completion(prompts[p], responses[p][k]) for p, k in where],
            **column_kwargs(columns, where, len(prompts)),
        )
        values = [[math.nan] * len(self.funcs) for _ in range(n)]  # (N, F); NaN: no value
        failed: str | None = None
        for i, ((name, fn), run) in enumerate(zip(self.funcs, self.calls)):
            check_arguments(name, fn, call)
            try:
                out = run((call,), where=name, prompt=None) if isinstance(run, TimedCalls) else run(call)
            except JudgeTimeout:
                raise
            except RemoteError as e:  # raised in the worker: str(e) is "Type: message"
                failed = failed or f"{name} raised {e}"
                continue
            except Exception as e:  # a user function: its failure is every candidate's abstention
                failed = failed or f"{name} raised {type(e).__name__}: {e}"
                continue
            for j, v in enumerate(as_rewards(name, out, where)):
                values[j][i] = v
        self.stats.count_call(n)
        out_rows: list[list[Score]] = [[] for _ in responses]
        for (p, k), row in zip(where, values):
            at = dict(allow=self.allow_abstain, where=f"candidate {k} ({self.name})", prompt=p)
            given = [(w, v) for w, v in zip(self.weights, row) if not math.isnan(v)]
            if failed:
                out_rows[p].append(self.stats.abstain(failed, **at))
            elif not given:
                out_rows[p].append(self.stats.abstain("every reward function returned None", **at))
            elif unusable := unusable_score(sum(w * v for w, v in given), "reward"):
                out_rows[p].append(self.stats.abstain(unusable, **at))
            else:
                out_rows[p].append(sum(w * v for w, v in given))
        return out_rows


def _run(fn: Callable[..., Any], call: dict[str, list]) -> Any:
    """TRL's call of a reward function (a coroutine function runs to its end)."""
    return asyncio.run(fn(**call)) if inspect.iscoroutinefunction(fn) else fn(**call)


def check_signature(name: str, fn: Callable[..., Any]) -> None:
    """Refuse, when loaded, a function TRL's call `fn(prompts=, completions=, **columns)` cannot
    reach. Its other required arguments must be dataset columns (`check_arguments`, per call)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): the call will tell
        return
    try:
        sig.bind_partial(prompts=[], completions=[])
    except TypeError as e:
        raise TypeError(
            f"judge.reward_funcs: {name}{sig} cannot be called as fn(prompts=..., completions=..., **kwargs), "
            f"TRL's reward function signature: {e}"
        ) from e
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        raise TypeError(
            f"judge.reward_funcs: {name}{sig} must take **kwargs: the dataset's other columns are passed as "
            "keyword arguments, as TRL does. Add **kwargs to its parameters."
        )


def check_arguments(name: str, fn: Callable[..., Any], call: dict[str, list]) -> None:
    """A required argument that no dataset column fills is a configuration error, not a verdict."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(**call)
    except TypeError as e:
        columns = [c for c in call if c not in RESERVED]
        raise TypeError(
            f"judge.reward_funcs: {name}{sig} cannot take this call ({e}); its arguments besides prompts and "
            f"completions are filled from the dataset's columns, which here are {columns}."
        ) from None


def as_completion(prompt: Prompt, text: str) -> str | list[dict]:
    """TRL's completion format: the text, or one assistant message for a conversational prompt."""
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text


def column_kwargs(columns: list[dict] | None, where: list[tuple[int, int]], n_prompts: int) -> dict[str, list]:
    """{column: one value per candidate}: each prompt row's value repeated over its candidates."""
    if columns is None:
        return {}
    if len(columns) != n_prompts:
        raise ValueError(f"{len(columns)} column rows for {n_prompts} prompts")
    names = list(dict.fromkeys(c for row in columns for c in row))
    clash = [c for c in names if c in RESERVED]
    if clash:
        raise ValueError(
            f"dataset column(s) {clash} would be passed to the reward functions as keyword arguments, "
            f"clashing with TRL's own {' and '.join(RESERVED)} arguments; rename the column(s)."
        )
    return {c: [columns[p].get(c) for p, _ in where] for c in names}


def as_rewards(name: str, out: Any, where: list[tuple[int, int]]) -> list[float]:
    """A function's result -> N floats (NaN for None), or an error naming the function."""
    try:
        out = list(out)
    except TypeError:
        raise TypeError(
            f"reward function {name} returned {type(out).__name__}; expected a list of {len(where)} rewards "
            "(float or None), one per completion"
        ) from None
    if len(out) != len(where):
        raise ValueError(
            f"reward function {name} returned {len(out)} rewards for {len(where)} completions; it must return "
            "one per completion, in the order given"
        )
    rewards = []
    for (p, k), v in zip(where, out):
        if v is None:
            rewards.append(math.nan)
            continue
        rewards.append(as_number(v, f"reward function {name}", f"candidate {k}", "a number or None", prompt=p))
    return rewards
