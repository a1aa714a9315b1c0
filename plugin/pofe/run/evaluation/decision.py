"""Decisions read off eval.json: which iterate to use, which rounds regressed, and whether
`pofe.stop_when` ends the run.

Which iterate to use (`choose_model`), by what carries signal for the judge the run has:

- a scalar judge (a reward model, a verifier, reward functions: one score per answer): the
  highest mean held-out reward (the first of equals); "clearly" better than pi_0 when the 95 %
  interval of its paired difference to pi_0's is above 0. A round regresses when its mean
  reward is below the previous iterate's: "clearly" when the whole interval of the difference
  is below 0. Win rates between models would be Bradley-Terry on those rewards: near 1/2 by
  construction for rewards in [0, 1], they keep a gap's sign, not its size
  (`pofe.run.evaluation.statistics.reward_comparisons`);
- a pairwise judge (PairRM, an LLM comparing two answers: no score of its own): the highest
  length-controlled win rate against pi_0 (pi_0 itself counts 1/2; the first of equals), so
  that a round that only made answers longer does not win; "clearly" better when its whole
  95 % interval is above 1/2. A round regresses when its length-controlled win rate against the
  iterate before it is below 1/2: "clearly" when the whole interval is.

An interval needs `MIN_INTERVAL_PROMPTS` held-out prompts (`pofe.run.evaluation.statistics`):
from fewer, nothing is "clearly" better or worse, and the choice and each regression say so
(`no_interval`: "too few prompts (N) for an interval ..."). The choice says which it read
(`basis`). The report warns about each regression; only `pofe.stop_when` ends a run on one.
An eval.json written before the reward comparisons existed is read by win rates. pi_avg
(`pofe.eval.average_iterates`, eval.json's `average`) is a candidate like any iterate; it
regresses against nothing (its "previous" is pi_T). With a KL ceiling (`pofe.stop_when`'s
`kl_to_pi_0_above`, eval.json's `kl_ceiling`) only models whose KL to pi_0 is under it count.

Whether a run ends after its latest round (`stop_decision`, `pofe.stop_when`). With the rule set, the runner evaluates every finished iterate on the held-out prompts after
each round (`axolotl pofe eval`, as after the last round) and asks `stop_decision` of the
newest one, pi_t, against pi_{t-1}:

- `lc_vs_previous_below: x`: pi_t's length-controlled win rate against pi_{t-1}
  (eval.json's `vs_previous`, `pofe.run.evaluation.statistics`) is below x;
- `held_out_reward_falls: true`: pi_t's mean held-out reward is below pi_{t-1}'s;
- `kl_to_pi_0_above: x`: pi_t's KL to pi_0 (eval.json's `kl_to_pi_0`) is above x.

A rule that fires ends the run after that round (its model stays, and the report says which
model to use, `choose_model`); a rule that cannot be read (no held-out file, a NaN reward)
does not fire, and says why.
"""

from __future__ import annotations

import math

from pofe.args.rounds import StopWhen
from pofe.run.evaluation.statistics import too_few_prompts


def last_iterate(ev: dict) -> int:
    """The index of the newest round's model pi_T in eval.json's models (pi_avg comes after it)."""
    average = ev.get("average")
    return average["index"] - 1 if average else len(ev["models"]) - 1


def over_ceiling(ev: dict) -> list[int]:
    """The models whose KL to pi_0 is above eval.json's `kl_ceiling` (none without one)."""
    ceiling = ev.get("kl_ceiling")
    kl = ev.get("kl_to_pi_0") or []
    return [m for m, x in enumerate(kl) if ceiling is not None and _number(x) is not None and x > ceiling]


def choose_model(ev: dict | None) -> dict | None:
    """{"basis": "reward" | "win_rate", "best": model index, "name", "clear" (better than pi_0
    beyond noise), "no_interval" (why there is no interval to read: too few prompts; else None),
    "regressions": [...], "over_kl_ceiling": [names], "kl_ceiling"}, with the basis's
    figures: reward: "mean_reward", "reward_ci95", "diff_vs_pi_0", "diff_ci95"; win rate:
    "lc_vs_pi_0", "lc_ci95", "raw_vs_pi_0". None without comparisons. Models over the KL ceiling
    are not chosen."""
    if not ev or not ev.get("vs_pi_0"):
        return None
    by_reward = bool(ev.get("reward_vs_pi_0"))
    names = [m["name"] for m in ev["models"]]
    excluded = over_ceiling(ev)
    scores = _reward_scores(ev) if by_reward else _win_rate_scores(ev)
    best = max((m for m in range(len(scores)) if m not in excluded), key=lambda m: (scores[m], -m))
    basis = "reward" if by_reward else "win_rate"
    chosen, verdict, regressions = _compare(ev, best, names, basis)
    if by_reward:
        figures = {
            "mean_reward": _number(ev["mean_reward"][best]),
            "reward_ci95": ev["reward_ci95"][best],
            "diff_vs_pi_0": chosen.get("diff"),
            "diff_ci95": chosen.get("diff_ci95"),
        }
    else:
        figures = {"lc_vs_pi_0": chosen.get("lc"), "lc_ci95": chosen.get("lc_ci95"), "raw_vs_pi_0": chosen.get("raw")}
    return {
        "basis": basis,
        "best": best,
        "name": names[best],
        **figures,
        **verdict,
        "regressions": regressions,
        "over_kl_ceiling": [names[m] for m in excluded],
        "kl_ceiling": ev.get("kl_ceiling"),
    }


def _win_rate_scores(ev: dict) -> list[float]:
    return [0.5] + [v["lc"] if v and v["lc"] is not None else float("-inf") for v in ev["vs_pi_0"][1:]]


def _reward_scores(ev: dict) -> list[float]:
    rewards = [_number(x) for x in ev["mean_reward"]]
    return [float("-inf") if x is None else x for x in rewards]


# each basis's comparisons in eval.json (against the previous model, against pi_0), the statistic
# they hold (its interval under `<statistic>_ci95`), and its value where the two models are level
COMPARISONS = {
    "win_rate": ("vs_previous", "vs_pi_0", "lc", 0.5),
    "reward": ("reward_vs_previous", "reward_vs_pi_0", "diff", 0.0),
}


def _compare(ev: dict, best: int, names: list[str], basis: str) -> tuple[dict, dict, list[dict]]:
    """The chosen model's comparison with pi_0, whether it is clearly better ("clear",
    "no_interval"), and every iterate worse than the one before it (a regression, clear where its
    whole interval lies below level)."""
    previous, vs_pi_0, stat, level = COMPARISONS[basis]
    ci = f"{stat}_ci95"
    regressions = []
    for m, v in enumerate(ev[previous][: last_iterate(ev) + 1]):
        if v and v[stat] is not None and v[stat] < level:
            upper, no_interval = v[ci][1], _no_interval(ev, v)
            regressions.append(
                {
                    "model": names[m],
                    "previous": names[m - 1],
                    stat: v[stat],
                    ci: v[ci],
                    "clear": not no_interval and upper is not None and upper < level,
                    "no_interval": no_interval,
                }
            )
    chosen = ev[vs_pi_0][best] or {}
    lower, no_interval = (chosen.get(ci) or [None])[0], _no_interval(ev, chosen) if best else None
    verdict = {"clear": not no_interval and lower is not None and lower > level, "no_interval": no_interval}
    return chosen, verdict, regressions


def _no_interval(ev: dict, comparison: dict) -> str | None:
    """Why a comparison has no interval to read: too few prompts (its own count, or, in an
    eval.json written before comparisons counted theirs, the evaluation's); None when enough."""
    n = comparison.get("prompts", ev.get("num_prompts"))
    return None if n is None else too_few_prompts(n)


def _number(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def stop_decision(ev: dict | None, rule: StopWhen) -> dict:
    """{"stop": bool, "round": t, "fired": [{"rule", "value", "threshold"|"previous", "why"}],
    "unread": [why a rule could not be read]} for the newest model of eval.json's `ev`."""
    if not ev or len(ev.get("models", [])) < 2:
        return {"stop": False, "round": None, "fired": [], "unread": ["no held-out evaluation of a trained model"]}
    t = last_iterate(ev)
    fired, unread = [], []
    if rule.lc_vs_previous_below is not None:
        lc = _number((ev["vs_previous"][t] or {}).get("lc"))
        if lc is None:
            unread.append(f"pi_{t}'s length-controlled win rate against pi_{t - 1} is missing")
        elif lc < rule.lc_vs_previous_below:
            fired.append(
                {
                    "rule": "lc_vs_previous_below",
                    "value": lc,
                    "threshold": rule.lc_vs_previous_below,
                    "why": f"pi_{t}'s length-controlled win rate against pi_{t - 1} is {lc:.3f}, "
                    f"below {rule.lc_vs_previous_below}",
                }
            )
    if rule.held_out_reward_falls:
        rewards = ev.get("mean_reward") or []
        now, before = (_number(rewards[t]), _number(rewards[t - 1])) if len(rewards) > t else (None, None)
        if now is None or before is None:
            unread.append(f"no mean held-out reward of pi_{t} and pi_{t - 1}")
        elif now < before:
            fired.append(
                {
                    "rule": "held_out_reward_falls",
                    "value": now,
                    "previous": before,
                    "why": f"pi_{t}'s mean held-out reward {now:.3f} is below pi_{t - 1}'s {before:.3f}",
                }
            )
    if rule.kl_to_pi_0_above is not None:
        kl = _number((ev.get("kl_to_pi_0") or [None] * (t + 1))[t])
        if kl is None:
            unread.append(f"no KL to pi_0 of pi_{t}")
        elif kl > rule.kl_to_pi_0_above:
            fired.append(
                {
                    "rule": "kl_to_pi_0_above",
                    "value": kl,
                    "threshold": rule.kl_to_pi_0_above,
                    "why": f"pi_{t}'s KL to pi_0 is {kl:.3f}, above the ceiling {rule.kl_to_pi_0_above}",
                }
            )
    return {"stop": bool(fired), "round": t, "fired": fired, "unread": unread}
