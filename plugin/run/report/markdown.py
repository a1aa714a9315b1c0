"""report.md: the collected numbers (`collect.collect`) as Markdown tables and notes."""

from __future__ import annotations

import json

from pofe.methods import method_spec
from pofe.preprocess.render import prompt_text
from pofe.run.report.cells import CELL_CHARS, SAMPLES_SHOWN, fmt, table, text_cell
from pofe.run.report.collect import sample_rows
from pofe.run.report.truncation import truncation_section


def rounds_section(rep: dict, plots: dict[str, str]) -> list[str]:
    """## Rounds: candidates, training, the loss curves."""
    md = ["## Rounds", ""]
    if not rep["rounds"]:
        return md + ["No round has started.", ""]
    spec = method_spec(rep["method"])
    header = [
        "round",
        "prompts",
        "cands/prompt",
        "cand. mean reward",
        "policy samples' reward",
        "best-of-k",
        "steps",
        "loss first -> last",
        f"{spec.diagnostic_label} first -> last",
    ]
    # the candidates' mean max - min label: how much the judge separates them (SPPO's signal)
    spread = spec.target.report_column
    if spread:
        header.insert(3, spread)
    rows = []
    for r in rep["rounds"]:
        cands, train = r["candidates"] or {}, r["train"] or {}
        rows.append(
            [
                str(r["round"]),
                fmt(r["prompts"]),
                fmt(cands.get("per_prompt"), 2),
                fmt(cands.get("mean_reward")),
                fmt(cands.get("policy_sample_mean_reward")),
                fmt(cands.get("best_of_k_reward")),
                fmt(train.get("steps")),
                f"{fmt(train.get('first_loss'))} -> {fmt(train.get('last_loss'))}" if train else "-",
                f"{fmt(train.get('diagnostic_first'))} -> {fmt(train.get('diagnostic_last'))}" if train else "-",
            ]
        )
        if spread:
            rows[-1].insert(3, fmt(cands.get("win_rate_spread")))
    md += [table(header, rows), ""]
    md.append(
        "Candidate rewards come from each round's `candidates/summary.json` and judge shards "
        "('policy samples' = the round's starting policy's own samples; the rest are dataset "
        "responses), over all of the round's prompts. `-`: no data."
    )
    if spread:
        md.append(
            "'cand. win-rate spread': the mean over prompts of max - min win rate among the round's "
            "candidates (`summary.json`): how far apart the judge sets them (`pofe.judge.preferences`)."
        )
    if spec.report_note:
        md.append(spec.report_note)
    md.append("")
    if "rewards" in plots:
        md += [f"![rewards per round]({plots['rewards']})", ""]
    md += round_lengths_section(rep)
    md += truncation_section(rep)
    md += ["### Loss curves", ""]
    if "loss" in plots:
        md += [f"![loss curves]({plots['loss']})", ""]
    else:
        md += ["No loss curves: no round has a trainer_state.json.", ""]
    return md


def round_lengths_section(rep: dict) -> list[str]:
    """### Candidate lengths: per round, all candidates and the kept best and worst."""
    rows = []
    for r in rep["rounds"]:
        lengths = r.get("lengths")
        if lengths:
            rows.append(
                [
                    str(r["round"]),
                    *[
                        f"{fmt(lengths[k]['mean'], 2)} / {fmt(lengths[k]['median'], 1)}"
                        for k in ("candidates", "best", "worst")
                    ],
                ]
            )
    if not rows:
        return []
    return [
        "### Candidate lengths",
        "",
        "Tokens, mean / median, of the round's candidates and of each prompt's best and worst by the "
        "judge's label (SPPO's chosen and rejected; prompts whose candidates all tie left out). Best "
        "growing longer than worst round after round: the judge rewards length.",
        "",
        table(["round", "candidates", "best (chosen)", "worst (rejected)"], rows),
        "",
    ]


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


def choice_section(rep: dict) -> list[str]:
    """## Which model to use: the best iterate by the held-out comparisons, regressions, and
    why the run stopped early."""
    choice = rep.get("choice")
    if not choice:
        return ["## Which model to use", "", *stopped_line(rep)] if rep.get("stopped") else []
    md = ["## Which model to use", "", *stopped_line(rep)]
    if choice["best"] == 0:
        md.append(f"**{choice['name']}**, the base: no iterate beats it at equal length on the held-out prompts.")
    else:
        md.append(
            f"**{choice['name']}**: the highest length-controlled win rate against pi_0 on the held-out "
            f"prompts ({with_ci(choice['lc_vs_pi_0'], choice['lc_ci95'])}; raw {fmt(choice['raw_vs_pi_0'])})"
            + ("." if choice["clear"] else ", though its interval holds 1/2: not clearly better than pi_0.")
        )
    for r in choice["regressions"]:
        how = "REGRESSED" if r["clear"] else "did not improve (within noise)"
        md.append(
            f"- {r['model']} {how} against {r['previous']}: length-controlled win rate {fmt(r['lc'])} "
            f"[{fmt(r['lc_ci95'][0])}, {fmt(r['lc_ci95'][1])}]."
        )
    return md + [""]


def headline_section(rep: dict) -> list[str]:
    """## Headline: each round's trained model beside its candidates, on the same prompts."""
    md = ["## Headline: the trained model and its candidates", ""]
    info = rep.get("headline")
    if info is None:
        return md + ["No headline: `axolotl pofe eval` has not run (or the recipe sets `pofe.eval: false`).", ""]
    if info["skipped"]:
        md += [f"No reward headline: {info['skipped']}.", ""]
        ev = rep.get("eval")
        if ev and ev.get("vs_pi_0") and ev["win_matrix_method"] == "pairwise":
            md += [
                "Instead, each round's model pi_t against the base pi_0 and against pi_{t-1}, on the "
                "held-out prompts, by the pairwise judge (95 % bootstrap intervals over prompts; "
                "length-controlled: the win rate at equal length):",
                "",
                iterate_wins_table(ev),
                "",
            ]
        return md
    decoding, judge = info["decoding"], info["judge"]
    how = (
        "greedy"
        if decoding["temperature"] == 0.0
        else f"temperature {decoding['temperature']}, top_p {decoding['top_p']}, seed {decoding['seed']}"
    )
    md.append(
        f"Each round's trained model pi_t answers the first {info['train_prompts']} prompts its round "
        f"judged ({decoding['num_samples']} answer(s) each, {how}, up to {decoding['max_new_tokens']} "
        f"tokens; `pofe.eval.train_*`), scored by the judge `{judge['type']}`, beside the same prompts' "
        "candidates: the starting policy's own samples, all candidates, and the best of each prompt's "
        "candidates. RRHF's trained model tends to that best-of-k reward: when it reaches it, better "
        "candidates help more than more epochs."
    )
    rows = []
    for r in rep["rounds"]:
        h = r["trained_on_train_prompts"]
        if h:
            gap = (
                h["model_mean_reward"] - h["candidates_best_of_k_reward"]
                if None not in (h["model_mean_reward"], h["candidates_best_of_k_reward"])
                else None
            )
            rows.append(
                [
                    str(r["round"]),
                    str(h["num_prompts"]),
                    fmt(h["policy_sample_mean_reward"]),
                    fmt(h["candidates_mean_reward"]),
                    fmt(h["candidates_best_of_k_reward"]),
                    fmt(h["model_mean_reward"]),
                    fmt(gap),
                ]
            )
    if not rows:
        return md + ["", "No finished round has a headline yet.", ""]
    header = [
        "round",
        "prompts",
        "policy samples' reward",
        "cand. mean reward",
        "best-of-k",
        "trained model reward",
        "trained - best-of-k",
    ]
    return md + ["", table(header, rows), ""]


def samples_section(rep: dict) -> list[str]:
    """### Sampled completions: per round, the first few headline prompts."""
    rows = sample_rows(rep)
    if not rows:
        return []
    md = [
        "### Sampled completions",
        "",
        f"The first {SAMPLES_SHOWN} headline answers of each round (all of them are in report.json), "
        f"each cell cut to {CELL_CHARS} characters; the best candidate is the round's highest-reward one "
        "for the prompt; a chat prompt shows its last user turn.",
        "",
    ]
    for t in sorted({row["round"] for row in rows}):
        shown = [row for row in rows if row["round"] == t][:SAMPLES_SHOWN]
        md += [
            f"Round {t} (pi_{t}):",
            "",
            table(
                ["prompt", f"pi_{t}'s completion", "reward", "best candidate", "its reward"],
                [
                    [
                        text_cell(prompt_text(row["prompt"])),
                        text_cell(row["completion"]),
                        fmt(row["reward"]),
                        text_cell(row["best_candidate"]),
                        fmt(row["best_candidate_reward"]),
                    ]
                    for row in shown
                ],
            ),
            "",
        ]
    return md


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
                fmt((ev["mean_reward"] or missing)[i]),
                fmt((ev["mean_reward_judge2"] or missing)[i]),
                fmt(w[i][0]) if i >= 1 else "-",
                fmt(w[i][i - 1]) if i >= 1 else "-",
                fmt(w[i][i - 2]) if i >= 2 else "-",
                fmt(ev["mean_response_tokens"][i], 2),
                fmt(ev["mean_response_chars"][i], 2),
                fmt(ev["kl_to_base"][i]),
                fmt((ev["perplexity"] or missing)[i]),
            ]
        )
    return table(header, rows)


def with_ci(x, ci) -> str:
    """A rate with its interval: `0.620 [0.510, 0.730]`."""
    return fmt(x) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci and None not in ci else "")


def iterate_wins_table(ev: dict) -> str:
    """Per round t: pi_t's raw and length-controlled win rates against pi_0 and pi_{t-1}."""
    names = [m["name"] for m in ev["models"]]
    rows = []
    for m in range(1, len(names)):
        base, prev = ev["vs_pi_0"][m], ev["vs_previous"][m]
        rows.append(
            [
                str(m),
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
    for label, matrix, cycles in (
        ("", ev["win_matrix"], ev["cycles"]),
        (" (second judge)", ev.get("win_matrix_judge2"), ev.get("cycles_judge2")),
    ):
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
        threshold = ev.get("cycle_threshold", 0.5)
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


def versions_cell(env: dict | None) -> str:
    """A stage's environment in one cell: POFE (revision) and each package's version."""
    if not env:
        return "-"
    pofe = env["pofe"]
    rev = ""
    if pofe["git_revision"]:
        rev = f" @ {pofe['git_revision'][:12]}" + (" (modified)" if pofe["git_dirty"] else "")
    cell = f"pofe {pofe['version']}{rev}; " + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
    served = (env.get("served") or {}).get("packages")
    return cell + ("; served: " + ", ".join(f"{k} {v}" for k, v in served.items() if v) if served else "")


def reproduce_section(rep: dict) -> list[str]:
    """## Reproducing each round: seeds, digests, judge identity, each stage's environment."""
    rows = []
    for r in rep["rounds"]:
        rec = r.get("reproduce") or {}
        digests, seeds, env = rec.get("sha256") or {}, rec.get("seeds") or {}, rec.get("environment") or {}
        short = lambda d: f"`{d[:12]}`" if d else "-"  # noqa: E731
        rows.append(
            [
                str(r["round"]),
                f"generate {fmt(seeds.get('generate'))}, train {fmt(seeds.get('train'))}",
                short(rec.get("recipe_sha256")),
                short(digests.get("prompts")),
                short(digests.get("candidates")),
                short(digests.get("trained_on")),
                text_cell(json.dumps(rec.get("judge_identity"))),
                text_cell(versions_cell(env.get("preprocess")), 400),
                text_cell(versions_cell(env.get("train")), 400),
            ]
        )
    if not rows:
        return []
    return [
        "## Reproducing each round",
        "",
        "report.json `rounds[].reproduce` holds each round's resolved recipe (secrets masked), its seeds, the "
        "full SHA-256 digests (shown cut to 12) of its recipe, prompts, candidates (generate shards) and "
        "trained-on rows (data.jsonl), the judge's identity, and each stage's environment as it started.",
        "",
        table(
            [
                "round",
                "seeds",
                "recipe",
                "prompts",
                "candidates",
                "trained on",
                "judge",
                "preprocess env",
                "train env",
            ],
            rows,
        ),
        "",
    ]


def render_markdown(rep: dict, plots: dict[str, str]) -> str:
    """report.md's text; `plots` maps plot names to the PNG files beside it."""
    md = [
        f"# POFE run report: {rep['method'].upper()}, {rep['rounds_finished']} of {rep['rounds_planned']} rounds",
        "",
    ]
    md.append(
        f"Output dir `{rep['output_dir']}`; final policy `{rep['final_policy'] or '(no round finished)'}`; "
        f"the run was started {rep['starts']} time(s)."
    )
    md.append("")
    md += headline_section(rep)
    md += samples_section(rep)
    md += choice_section(rep)
    md += rounds_section(rep, plots)
    md += eval_section(rep["eval"], plots)
    md += reproduce_section(rep)
    return "\n".join(md)
