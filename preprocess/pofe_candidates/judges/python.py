"""Python judges: a user function, scalar `module:function(prompt, response) -> float` or
pairwise `module:function(prompt, response_a, response_b) -> P(a beats b)`."""

from __future__ import annotations

from collections.abc import Callable

from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges.interface import Abstain, JudgeStats, PairwiseVerdict, Score, as_number, unusable_score
from pofe_candidates.judges.pairwise import preferences_both_orders
from pofe_candidates.judges.reward_funcs import RewardFuncsJudge
from pofe_candidates.judges.timed import JudgeTimeout, RemoteError, TimedCalls, timed
from pofe_candidates.judges.user_functions import load_function
from pofe_candidates.render import Prompt, prompt_text


def python_judge(cfg: JudgeConfig) -> PythonJudge | RewardFuncsJudge:
    """`judge.type: python`: the per-candidate `judge.function`, or the batched `judge.reward_funcs`."""
    if cfg.reward_funcs:
        return RewardFuncsJudge.from_paths(
            cfg.reward_funcs,
            cfg.reward_weights,
            allow_abstain=cfg.allow_abstain,
            timeout=cfg.timeout,
            stage_timeout=cfg.stage_timeout,
        )
    return PythonJudge.from_config(cfg)


class UserFunctionJudge:
    """What both Python judges hold: the user's function, timed, named by its
    `module:function` path in messages."""

    reads_rendered_prompt = False  # the user's function gets the dataset's prompt as stored
    reads_columns = False
    kind = "python"  # the name in messages where no path is given

    def __init__(
        self,
        fn: Callable[..., float],
        *,
        allow_abstain: bool = True,
        name: str | None = None,
        timeout: float | None = None,
        stage_timeout: float | None = None,
    ):
        self.name = name or self.kind
        self.fn = timed(fn, self.name, timeout, stage_timeout)
        self.allow_abstain = allow_abstain
        self.stats = JudgeStats()

    @classmethod
    def from_config(cls, cfg: JudgeConfig) -> UserFunctionJudge:
        return cls(
            load_function(cfg.function),
            allow_abstain=cfg.allow_abstain,
            name=cfg.function,
            timeout=cfg.timeout,
            stage_timeout=cfg.stage_timeout,
        )


class PythonJudge(UserFunctionJudge):
    """`module:function(prompt, response) -> float`, called once per candidate.

    `prompt` is the dataset's prompt as stored (a string or chat messages). Exceptions and
    non-finite results (or beyond float32) become abstentions naming
    why; a result that is not a number ("0.7", True) is a TypeError naming the judge.
    """

    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        out: list[list[Score]] = []
        for p, (prompt, cands) in enumerate(zip(prompts, responses, strict=True)):
            row: list[Score] = []
            for k, resp in enumerate(cands):
                self.stats.count_call()
                at = dict(allow=self.allow_abstain, where=f"candidate {k} ({self.name})", prompt=p)
                row.append(
                    _call(self.fn, (prompt, resp), self.stats, at, "score", self.name, f"candidate {k}", prompt=p)
                )
            out.append(row)
        return out


class PythonPairwiseJudge(UserFunctionJudge):
    """`module:function(prompt, response_a, response_b) -> P(a beats b)`, called for every
    ordered pair (both orders, combined as for the other pairwise judges), so preferences
    need not be transitive (rock-paper-scissors).

    Exceptions, non-finite values and values outside [0, 1] become abstentions naming why.
    """

    kind = "python_pairwise"

    def judge_pairs(self, items: list[tuple[Prompt, str, str]]) -> list[float | Abstain]:
        out: list[float | Abstain] = []
        for n, (prompt, a, b) in enumerate(items):
            at = dict(allow=self.allow_abstain, where=self.name, prompt=n)
            where = f"prompt {prompt_text(prompt)!r:.60}, responses {a!r:.40} and {b!r:.40}"
            v = _call(self.fn, (prompt, a, b), self.stats, at, "P(a beats b)", self.name, where)
            if not isinstance(v, Abstain) and not 0.0 <= v <= 1.0:
                v = self.stats.abstain(f"out of range: P(a beats b) = {v}, expected [0, 1]", **at)
            out.append(v)
        return out

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[PairwiseVerdict]:
        return preferences_both_orders(self.judge_pairs, prompts, responses, self.stats)


def _call(
    fn: Callable, args: tuple, stats: JudgeStats, at: dict, what: str, name: str, where: str, prompt: int | None = None
) -> float | Abstain:
    """fn(*args) as a float; a user function's exception, a non-finite value or one beyond
    float32 is an abstention, counted in `stats` (or an error where `at` forbids abstaining).
    A result that is not a number is a `NotANumber` naming the judge (`name`), `where` (the
    candidate) and `prompt` (its prompt's position in the call, which `apply_judge` turns into
    the dataset row)."""
    try:
        out = fn(args, where=at["where"], prompt=at["prompt"]) if isinstance(fn, TimedCalls) else fn(*args)
    except JudgeTimeout:
        raise
    except RemoteError as e:  # raised in the worker: str(e) is "Type: message"
        return stats.abstain(str(e), **at)
    except Exception as e:  # a user function: any failure is an abstention, counted
        return stats.abstain(f"{type(e).__name__}: {e}", **at)
    v = as_number(out, f"judge {name}", where, prompt=prompt)
    reason = unusable_score(v, what)
    return v if reason is None else stats.abstain(reason, **at)
