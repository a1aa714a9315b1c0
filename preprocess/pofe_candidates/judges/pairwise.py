"""Pairwise judging in both orders -> one (K, K) preference matrix per prompt; the pairwise
LLM judge.

A pairwise judge reads (prompt, first, second) and returns P(first beats second). Judges
favour a position (usually the first), so every unordered pair {i, j} is judged both as
(i, j) and as (j, i), and the two are combined with `symmetrize_preferences` (SPPO paper,
step 2). Self-pairs are never judged (diagonal 1/2). PairRM (pairrm.py) also runs every
ordered pair, but forms preferences from its logits by `preferences_from_logits`.

Missing verdicts (Abstain): if one order of a pair abstained, the other order alone gives
the estimate; if both did, the pair counts as a tie (1/2) and as one abstained pair.

`PairwiseLLMJudge` asks which of two responses is better ("A" or "B"). P(A) comes from the
verdict token's logprobs when the server returns them (`top_logprobs`), else from the
reply's text (1 or 0).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import torch

from pofe_candidates.config import fill_rubric
from pofe_candidates.judges.interface import Abstain, JudgeError, JudgeStats, PairwiseVerdict
from pofe_candidates.judges.llm import ChatJudge, UnreadableReply
from pofe_candidates.render import Prompt, prompt_text
from pofe_candidates.win_rates import symmetrize_preferences

PairFn = Callable[[list[tuple[Prompt, str, str]]], list["float | Abstain"]]

DEFAULT_PAIRWISE = (
    "Which response answers the request better? Reply with one letter: A or B.\n\n"
    "[Request]\n{prompt}\n\n[Response A]\n{response_a}\n\n[Response B]\n{response_b}\n\nBetter response:"
)
_VERDICT = re.compile(r"(?<![A-Za-z])([AB])(?![A-Za-z])")


# |P(a, b) + P(b, a) - 1| beyond this is counted and warned about, never refused: position-biased
# LLM judges give sums off 1 routinely (hard A/A verdicts sum to 2), and both orders are averaged
# to cancel that bias; a judge far off 1 on many pairs is mostly reading the position, not the text.
# Values outside [0, 1] are impossible and abstain where the judge returns them.
ORDER_SUM_TOLERANCE = 0.25


def combine_orders(first_wins: torch.Tensor) -> PairwiseVerdict:
    """Both-order combination with abstentions.

    Args:
        first_wins: (K, K), first_wins[i, j] = P(first beats second) with y_i shown first;
            NaN where the judge abstained; the diagonal is ignored.
    """
    k = first_wins.shape[-1]
    fw = first_wins.to(torch.float64).clone()
    off = ~torch.eye(k, dtype=torch.bool)
    nan = torch.isnan(fw) & off
    one_missing = nan & ~nan.T
    # fw[i, j] missing, fw[j, i] present: 1 - fw[j, i] is the single-order estimate.
    fw[one_missing] = (1.0 - fw.T)[one_missing]
    both_missing = nan & nan.T
    fw[both_missing] = 0.5
    fw[~off] = 0.5
    both = torch.triu(~nan & ~nan.T & off, diagonal=1)
    sums = (first_wins.to(torch.float64) + first_wins.to(torch.float64).T)[both]  # (pairs judged both ways,)
    worst = sums[(sums - 1.0).abs().argmax()].item() if sums.numel() else None
    return PairwiseVerdict(
        symmetrize_preferences(fw),
        int(both_missing.sum()) // 2,
        orders_off=int(((sums - 1.0).abs() > ORDER_SUM_TOLERANCE).sum()),
        worst_order_sum=worst,
    )


def ordered_pairs(k: int) -> list[tuple[int, int]]:
    """All (i, j), i != j: K (K - 1) judge calls per prompt."""
    return [(i, j) for i in range(k) for j in range(k) if i != j]


def preferences_both_orders(
    pair_fn: PairFn, prompts: list[Prompt], responses: list[list[str]], stats: JudgeStats
) -> list[PairwiseVerdict]:
    """Judge every ordered pair of every prompt in ONE batched call of pair_fn, map back."""
    jobs: list[tuple[int, int, int]] = []  # (prompt index, i, j)
    items: list[tuple[Prompt, str, str]] = []
    for p, (prompt, cands) in enumerate(zip(prompts, responses, strict=True)):
        for i, j in ordered_pairs(len(cands)):
            jobs.append((p, i, j))
            items.append((prompt, cands[i], cands[j]))
    try:
        verdicts = pair_fn(items) if items else []
    except JudgeError as e:  # allow_abstain: false; pair_fn knows only the item's position
        if e.prompt is None:
            raise
        p, i, j = jobs[e.prompt]
        raise type(e)(e.reason, f"candidates {i} and {j}, {e.where}", prompt=p) from e  # a JudgeTimeout stays one
    stats.count_call(len(items))
    mats = [torch.full((len(c), len(c)), float("nan"), dtype=torch.float64) for c in responses]
    missing: dict[tuple[int, int, int], str] = {}
    for (p, i, j), v in zip(jobs, verdicts, strict=True):
        if isinstance(v, Abstain):
            missing[p, i, j] = v.reason
        else:
            mats[p][i, j] = float(v)
    out = []
    for p, m in enumerate(mats):
        # a pair abstains when both orders did; its reason is the (i, j) order's
        reasons = tuple(r for (q, i, j), r in missing.items() if q == p and i < j and (p, j, i) in missing)
        out.append(dataclasses.replace(combine_orders(m), abstain_reasons=reasons))
    return out


def parse_verdict(text: str) -> float | str:
    """1.0 if the first standalone letter A/B is A, 0.0 if B; else a reason string."""
    m = _VERDICT.search(text)
    if m is None:
        return f"unparseable: no A/B verdict in {text[:40]!r}"
    return 1.0 if m.group(1) == "A" else 0.0


def verdict_from_logprobs(top: list[dict]) -> float | None:
    """P(A) from the first generated token's top_logprobs, renormalised over {A, B}.

    Tokens are matched after stripping spaces and brackets (" A", "[[A"). If only one of A/B is
    listed, the other gets the lowest listed probability (an upper bound on it, which pulls the
    estimate towards 1/2). None if neither is listed.
    """
    pa = pb = 0.0
    for t in top:
        tok = str(t.get("token", "")).strip().strip("[]()*").strip()
        p = math.exp(float(t.get("logprob", -math.inf)))
        if tok == "A":
            pa += p
        elif tok == "B":
            pb += p
    if pa == 0.0 and pb == 0.0:
        return None
    floor = min((math.exp(float(t.get("logprob", -math.inf))) for t in top), default=0.0)
    pa, pb = pa or floor, pb or floor
    return pa / (pa + pb)


class PairwiseLLMJudge(ChatJudge):
    """Pairwise: P(A beats B) per ordered pair; both orders combined per prompt."""

    # as LLMRubricJudge: the judging prompt quotes the dataset prompt's text
    reads_rendered_prompt = False
    reads_columns = False

    TOP_LOGPROBS = 20  # vLLM's default cap on top_logprobs

    def judge_pairs(self, items: list[tuple[Prompt, str, str]]) -> list[float | Abstain]:
        template = self.cfg.rubric or DEFAULT_PAIRWISE
        extra = {"logprobs": True, "top_logprobs": self.TOP_LOGPROBS} if self.cfg.use_logprobs else {}

        def one(arg) -> float | Abstain:
            n, (prompt, a, b) = arg
            at = dict(allow=self.cfg.allow_abstain, where=f"pairwise llm judge at {self.client.base_url}", prompt=n)
            text = fill_rubric(template, {"prompt": prompt_text(prompt), "response_a": a, "response_b": b})
            try:
                choice = self.chat(text, **extra)
            except UnreadableReply as e:
                return self.stats.abstain(str(e), **at)
            if self.cfg.use_logprobs:
                content = ((choice.get("logprobs") or {}).get("content")) or []
                if content and isinstance(content[0], dict):
                    p = verdict_from_logprobs(content[0].get("top_logprobs") or [])
                    if p is not None:
                        return p
            v = parse_verdict((choice.get("message") or {}).get("content") or "")
            if isinstance(v, str):
                return self.stats.abstain(v, **at)
            return v

        return self.map(one, list(enumerate(items)))

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[PairwiseVerdict]:
        return preferences_both_orders(self.judge_pairs, prompts, responses, self.stats)


__all__ = [
    "PairwiseLLMJudge",
    "combine_orders",
    "ordered_pairs",
    "parse_verdict",
    "preferences_both_orders",
    "verdict_from_logprobs",
]
