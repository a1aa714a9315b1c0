"""report.md's sections on the held-out evaluation (eval.json): which model to use, every
iterate against pi_0 and its predecessor (raw and length-controlled, with intervals), the
win-rate matrix and its cycles, best-of-k against the trained model, lengths."""

from __future__ import annotations

from pofe.run.report.cells import CLUSTERED, abstained, fmt, table


def stopped_line(rep: dict) -> list[str]:
    """Why the run ended early (`pofe.stop_when`), or nothing."""
    stopped = rep.get("stopped")
    if not stopped:
        return []
    return [
        f"**Stopped after round {stopped['after_round']} of {stopped['rounds_planned']}** (`pofe.stop_when`): "
        + "; ".join(f["why"] for f in stopped["fired"])
        + ".",
        "",
    ]


def not_evaluated(missing: list[str]) -> str:
    """Why no model is named: the held-out evaluation predates these finished models."""
    return (
        f"Not decided: eval/eval.json has no held-out answers of {', '.join(missing)}, which finished after it "
        "was written. Run `axolotl pofe eval <recipe>`, then `axolotl pofe report <recipe>`."
    )


def choice_basis(ev: dict, choice: dict) -> str:
    """Why the choice reads what it reads: the judge's kind."""
    kind = ((ev or {}).get("judge") or {}).get("type")
    judge = f"the judge `{kind}`" if kind else "the judge"
    if choice["basis"] == "reward":
        return (
            f"Chosen by mean held-out reward: {judge} scores each answer on its own (pointwise), so a "
            "reward says how much better one model's answers are. Win rates between models would be "
            "Bradley-Terry on those rewards, near 1/2 by construction (rewards in [0, 1] never pass 0.73): "
            "they give a gap's sign, not its size."
        )
    return (
        f"Chosen by win rate: {judge} compares two answers and gives no score of its own, so the "
        "length-controlled win rate against pi_0 (at equal length: a round that only made answers longer "
        "does not win) is what carries its signal."
    )


def choice_line(choice: dict) -> str:
    """The chosen model and its figure against pi_0, with how sure."""
    if choice["best"] == 0:
        beaten = "a higher mean reward" if choice["basis"] == "reward" else "a win at equal length"
        return f"**{choice['name']}**, the base: no iterate has {beaten} on the held-out prompts."
    if choice["basis"] == "reward":
        return (
            f"**{choice['name']}**: the highest mean reward on the held-out prompts "
            f"({with_ci(choice['mean_reward'], choice['reward_ci95'])}), "
            f"{signed_ci(choice['diff_vs_pi_0'], choice['diff_ci95'])} over pi_0's"
            + unclear(choice, ", though the interval of the difference holds 0: not clearly better.", ".")
        )
    return (
        f"**{choice['name']}**: the highest length-controlled win rate against pi_0 on the held-out "
        f"prompts ({with_ci(choice['lc_vs_pi_0'], choice['lc_ci95'])}; raw {fmt(choice['raw_vs_pi_0'])})"
        + unclear(choice, ", though its interval holds 1/2: not clearly better than pi_0.", ".")
    )


def unclear(comparison: dict, within_noise: str, end: str = "") -> str:
    """How sure a comparison (a choice or a regression) is: nothing when clear, else why not:
    too few prompts for an interval (`no_interval`), or `within_noise`."""
    if comparison["clear"]:
        return end
    if comparison.get("no_interval"):
        return f", not clearly: {comparison['no_interval']}{end}"
    return within_noise


def regression_line(choice: dict, r: dict) -> str:
    how = "REGRESSED" if r["clear"] else f"did not improve ({r.get('no_interval') or 'within noise'})"
    if choice["basis"] == "reward":
        return f"- {r['model']} {how} against {r['previous']}: mean reward {signed_ci(r['diff'], r['diff_ci95'])}."
    return (
        f"- {r['model']} {how} against {r['previous']}: length-controlled win rate {fmt(r['lc'])} "
        f"[{fmt(r['lc_ci95'][0])}, {fmt(r['lc_ci95'][1])}]."
    )


def choice_section(rep: dict) -> list[str]:
    """## Which model to use: the best iterate by what carries the judge's signal (rewards or win
    rates, `pofe.run.evaluation.decision`), regressions, and why the run stopped early."""
    choice = rep.get("choice")
    if rep.get("eval_missing"):
        return ["## Which model to use", "", *stopped_line(rep), not_evaluated(rep["eval_missing"]), ""]
    if not choice:
        return ["## Which model to use", "", *stopped_line(rep)] if rep.get("stopped") else []
    md = ["## Which model to use", "", *stopped_line(rep)]
    average = ((rep.get("eval") or {}).get("average") or {}).get("of")
    md.append(
        choice_line(choice)
        + (f" pi_avg is the average of {', '.join(average)}'s weights." if choice["name"] == "pi_avg" else "")
    )
    md += ["", choice_basis(rep.get("eval"), choice), ""]
    if choice.get("over_kl_ceiling"):
        md.append(
            f"- Not chosen, over the KL ceiling {choice['kl_ceiling']} (`pofe.stop_when.kl_to_pi_0_above`): "
            + ", ".join(choice["over_kl_ceiling"])
            + "."
        )
    md += [regression_line(choice, r) for r in choice["regressions"]]
    return md + [""]


def models_table(ev: dict, names: list[str]) -> str:
    """One row per model: rewards, win rates against earlier iterates, drift."""
    w = ev["win_matrix"]
    header = [
        "model",
        "mean reward",
        "2nd judge reward",
        "win vs pi_0",
        "win vs previous",
        "win vs 2 back",
        "mean tokens",
        "mean chars",
        "KL to pi_0",
        "ref. perplexity",
    ]
    missing = [None] * len(names)
    rows = []
    for i, name in enumerate(names):
        rows.append(
            [
                name,
                fmt((ev["mean_reward"] or missing)[i]) + abstained(ev, i),
                fmt((ev["mean_reward_judge2"] or missing)[i]) + abstained(ev, i, "_judge2"),
                fmt(w[i][0]) if i >= 1 else "-",
                fmt(w[i][i - 1]) if i >= 1 else "-",
                fmt(w[i][i - 2]) if i >= 2 else "-",
                fmt(ev["mean_response_tokens"][i], 2),
                fmt(ev["mean_response_chars"][i], 2),
                fmt(ev["kl_to_pi_0"][i]),
                fmt((ev["perplexity"] or missing)[i]),
            ]
        )
    return table(header, rows)


def with_ci(x, ci) -> str:
    """A rate with its interval: `0.620 [0.510, 0.730]`."""
    return fmt(x) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci and None not in ci else "")


def signed(x) -> str:
    """A difference with its sign: `+0.125`, `-0.040`; two significant digits under 0.01 (`+0.00045`),
    where three decimals would print a real difference as +0.000."""
    if x is None:
        return "-"
    return f"{x:+.2g}" if 0 < abs(x) < 0.01 else f"{x:+.3f}"


def signed_ci(x, interval) -> str:
    """A difference with its interval, `+0.125 [+0.050, +0.200]`; alone without one."""
    return f"{signed(x)} {ci(interval)}" if ci(interval) else signed(x)


def ci(interval) -> str:
    """An interval of differences: `[+0.050, +0.200]`."""
    return f"[{signed(interval[0])}, {signed(interval[1])}]" if interval and None not in interval else ""


def clustered_note(matrix: list[list[float]], spread: float, bradley_terry: bool) -> list[str]:
    """Why every win rate of `matrix` sits near 1/2 (`spread`: the largest distance of one from 1/2,
    as eval.json records it), and what to do; nothing when they spread."""
    if len(matrix) < 2 or spread >= CLUSTERED:
        return []
    if bradley_terry:
        why = (
            "Bradley-Terry turns a reward gap into a win probability sigmoid(r_a - r_b), so models whose "
            "rewards differ little win about half the time by construction (a gap of 0.1 is 0.525, and rewards "
            "in [0, 1] never pass 0.731). Read the mean rewards for the size of a difference and these rates "
            "for its direction; a judge whose rewards spread over several units (a reward model's logits), or "
            "a pairwise judge as `pofe.eval.judge2`, separates the models more"
        )
    else:
        why = (
            "The pairwise judge rarely prefers one model's answer to another's: the models answer alike, or "
            "the judge is saturated (it calls most pairs even). More held-out prompts or samples "
            "(`pofe.eval.held_out`, `pofe.eval.num_samples`) narrow the intervals; a stronger judge, as "
            "`pofe.eval.judge2`, may tell the models apart"
        )
    return [f"Every win rate {'is 1/2' if round(spread, 3) == 0 else f'lies within 0.5 ± {spread:.3f}'}. {why}.", ""]


def iterate_wins_table(ev: dict) -> str:
    """Per round t: pi_t's raw and length-controlled win rates against pi_0 and pi_{t-1}."""
    names = [m["name"] for m in ev["models"]]
    average = (ev.get("average") or {}).get("index")
    rows = []
    for m in range(1, len(names)):
        base, prev = ev["vs_pi_0"][m], ev["vs_previous"][m]
        rows.append(
            [
                "avg" if m == average else str(m),
                names[m],
                with_ci(base["raw"], base["raw_ci95"]),
                with_ci(base["lc"], base["lc_ci95"]),
                with_ci(prev["raw"], prev["raw_ci95"]),
                with_ci(prev["lc"], prev["lc_ci95"]),
            ]
        )
    return table(
        [
            "round",
            "model",
            "win vs pi_0",
            "length-controlled vs pi_0",
            "win vs pi_{t-1}",
            "length-controlled vs pi_{t-1}",
        ],
        rows,
    )


def length_section(ev: dict) -> list[str]:
    """### Better, or only longer? Held-out lengths and length-controlled win rates."""
    names = [m["name"] for m in ev["models"]]
    if not ev.get("vs_pi_0"):
        return []
    md = [
        "### Better, or only longer?",
        "",
        "Length-controlled win rate (AlpacaEval 2's method, simplified): a logistic regression of the "
        "judge's preference for the model's answer on the length difference, P(win) = "
        "sigmoid(a + b tanh(d / sd(d))), d in tokens; reported: sigmoid(a), the win rate at equal length. "
        "A model that only got longer has a high raw and a ~0.5 length-controlled rate. Brackets: "
        "bootstrap 95 % intervals over prompts.",
        "",
        iterate_wins_table(ev),
        "",
    ]
    average = ev.get("average")
    if average:
        md += [
            f"Row avg: pi_avg, the average of {', '.join(average['of'])}'s weights (`pofe.eval.average_iterates`); "
            f"its pi_{{t-1}} columns compare it with the last iterate, {average['of'][-1]}.",
            "",
        ]
    tokens = ev["response_tokens"]
    rows = [
        [
            n,
            fmt(tokens["mean"][i], 2),
            fmt(tokens["median"][i], 1),
            fmt((ev["vs_pi_0"][i] or {}).get("length_slope"), 2),
        ]
        for i, n in enumerate(names)
    ]
    md += [
        table(["model", "held-out mean tokens", "median tokens", "length slope b vs pi_0"], rows),
        "",
        "Held-out tokens count the end-of-turn token when the model stopped; candidate lengths do not.",
        "",
    ]
    return md


def best_of_k_section(ev: dict) -> list[str]:
    """### Trained model vs best-of-k, on the held-out prompts."""
    if not ev.get("best_of_k"):
        return []
    rows = [
        [
            str(b["round"]),
            f"pi_{b['round'] - 1}",
            str(b["k"]),
            fmt(b["mean_candidate_reward"]),
            fmt(b["best_of_k_reward"]),
            f"pi_{b['round']}",
            fmt(b["trained_mean_reward"]),
            fmt(b["trained_minus_best_of_k"]),
        ]
        for b in ev["best_of_k"]
    ]
    return [
        "### Trained model vs best-of-k, on the held-out prompts",
        "",
        "Round t's K candidates for each held-out prompt, sampled from the policy the round started from "
        "with the round's decoding and seed, for evaluation only (no round trains on these prompts); "
        "best-of-k: the mean over prompts of the best candidate's reward. The trained model's reward is at "
        "the held-out decoding above.",
        "",
        table(
            [
                "round",
                "candidates from",
                "k",
                "candidates' mean reward",
                "best-of-k",
                "trained model",
                "its mean reward",
                "trained - best-of-k",
            ],
            rows,
        ),
        "",
    ]


def win_rate_sections(ev: dict, names: list[str]) -> list[str]:
    """### Win rates (and the second judge's): the matrix and its cycles."""
    md: list[str] = []
    for label, suffix in (("", ""), (" (second judge)", "_judge2")):
        matrix, cycles = ev[f"win_matrix{suffix}"], ev[f"cycles{suffix}"]
        if matrix is None:
            if label:
                md += [f"### Win rates{label}", "", "No second judge (`pofe.eval.judge2`) was set.", ""]
            continue
        md += [f"### Win rates{label}", ""]
        how = (
            "Bradley-Terry on the scalar rewards, sigmoid(r_row - r_col)"
            if ev["win_matrix_method"] == "bradley_terry" or label
            else "the pairwise judge, both orders"
        )
        md.append(f"Row beats column, averaged over prompts and sample pairs ({how}).")
        cis = ev.get("win_matrix_ci95") if not label else None
        cells = [
            [with_ci(x, cis[i][j] if cis and i != j else None) for j, x in enumerate(row)]
            for i, row in enumerate(matrix)
        ]
        if cis:
            md.append("In brackets: a bootstrap 95 % interval over prompts.")
        md += ["", table(["", *names], [[n, *row] for n, row in zip(names, cells)]), ""]
        bradley_terry = ev["win_matrix_method"] == "bradley_terry" or bool(label)
        md += clustered_note(matrix, ev[f"win_matrix_spread{suffix}"], bradley_terry)
        threshold = ev["cycle_threshold"]
        if cycles:
            listed = "; ".join(f"{names[a]} > {names[b]} > {names[c]} > {names[a]}" for a, b, c in cycles)
            md += [f"**CYCLE**: {listed} (a beats b when W[a, b] > {threshold}).", ""]
        else:
            md += [f"No cycle (3-cycles of 'W[a, b] > {threshold}'); the iterates are ordered transitively.", ""]
    return md


def eval_section(ev: dict | None, plots: dict[str, str]) -> list[str]:
    """## Held-out evaluation."""
    md = ["## Held-out evaluation", ""]
    if ev is None:
        return md + [
            "No held-out evaluation: the recipe sets no held-out prompts (`pofe.eval.held_out` or "
            "`pofe.eval.prompts`), or `axolotl pofe eval` has not run.",
            "",
        ]
    names = [m["name"] for m in ev["models"]]
    decoding, judge = ev["decoding"], ev["judge"]
    md.append(
        f"{ev['num_prompts']} prompts from `{ev['prompts_source']}`, {decoding['num_samples']} sample(s) each "
        f"at temperature {decoding['temperature']}, top_p {decoding['top_p']}, seed {decoding['seed']}; "
        f"judge `{judge['type']}`"
        + (f" ({judge.get('function') or judge.get('model')})" if judge else "")
        + (f", second judge `{ev['judge2']['type']}`" if ev.get("judge2") else ", no second judge")
        + "."
    )
    md += ["", models_table(ev, names), ""]
    if ev["mean_reward"] is None:
        md.append("Mean reward: none (the judge is pairwise and gives no scalar reward).")
    kl_note = (
        "an unbiased estimate of KL(pi_t || pi_0)"
        if ev.get("kl_is_unbiased")
        else "the mean log-ratio on the decoded samples (not an unbiased KL: temperature or top_p != 1)"
    )
    md.append(
        f"KL to pi_0: mean over the model's own samples of log pi_t(y|x) - log pi_0(y|x), {kl_note}. "
        + (
            f"Perplexity: of the held-out reference responses ({ev['reference_count']} prompts have one)."
            if ev.get("perplexity")
            else "Perplexity: no reference responses in the held-out prompts."
        )
    )
    md.append("")
    md += best_of_k_section(ev)
    md += win_rate_sections(ev, names)
    md += length_section(ev)
    for key, alt in (
        ("winrate", "win-rate matrix"),
        ("lengths", "win rates against pi_0 and lengths per round"),
        ("drift", "length, KL and perplexity per iterate"),
    ):
        if key in plots:
            md += [f"![{alt}]({plots[key]})", ""]
    return md
