"""A judging stage without signal stops the run: the abstention tally and its limit.

A judge that raises on every call (a NameError in a python judge, an unreadable LLM reply)
abstains everywhere; the data built from what is left would be empty, or one-sided. The
pipeline tallies abstentions over the judge shards, stage so far, and stops when the rate
passes `judge.max_abstention_rate` (checked before each shard is written, so a fixed judge
redoes the shard that crossed it) or when every verdict abstained.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from pofe.errors import PofeError
from pofe_candidates.counts import reason_kind


class NoJudgeSignal(PofeError, RuntimeError):
    """The judge abstained on every verdict, or on more than the allowed share."""


@dataclass(frozen=True)
class AbstentionTally:
    """Verdicts asked (candidates for a scalar judge, unordered pairs for a pairwise one) and
    abstentions, by reason kind, with the first row seen for each kind (a judged row's `where`,
    else its dataset row `index`)."""

    verdicts: int = 0
    abstained: int = 0
    reasons: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def plus(self, judged_rows: list[dict]) -> AbstentionTally:
        reasons, examples = Counter(self.reasons), dict(self.examples)
        for r in judged_rows:
            for reason in r.get("abstain_reasons", []):
                kind = reason_kind(reason)
                reasons[kind] += 1
                where = r.get("where") or f"dataset row {r['index']}"
                examples.setdefault(kind, f"{where}: {reason}")
        return replace(
            self,
            verdicts=self.verdicts + sum(r.get("judged", 0) for r in judged_rows),
            abstained=self.abstained + sum(r["abstained"] for r in judged_rows),
            reasons=reasons,
            examples=examples,
        )

    @property
    def rate(self) -> float:
        return self.abstained / self.verdicts if self.verdicts else 0.0


def check_abstentions(
    tally: AbstentionTally,
    *,
    limit: float,
    judge: str,
    unit: str,
    final: bool,
    setting: str = "pofe.judge",
    redo: str = "judge shards over the limit are not written",
) -> None:
    """Raise NoJudgeSignal when the rate passes `limit`, or (final: the whole stage) when every
    verdict abstained. `unit` names a verdict: "candidates" or "pairs"; `setting`, the judge's
    config block (its max_abstention_rate is the limit); `redo`, what a rerun does again."""
    everything = final and tally.verdicts > 0 and tally.abstained == tally.verdicts
    if not everything and tally.rate <= limit:
        return
    if tally.reasons:
        kind, n = tally.reasons.most_common(1)[0]
        why = f"top reason {kind!r} ({n} times), e.g. {tally.examples[kind]}"
    else:
        why = "no reasons recorded"
    raise NoJudgeSignal(
        f"judge {judge} abstained on {tally.abstained} of {tally.verdicts} {unit} ({tally.rate:.0%}, "
        f"limit {setting}.max_abstention_rate={limit:g}): {why}. Fix the judge and run again ({redo}); "
        f"raise {setting}.max_abstention_rate to accept more."
    )
