"""report.md: the collected numbers (`collect.collect`) as Markdown tables and notes."""

from __future__ import annotations

import re

from pofe.methods import method_spec
from pofe.run.report.cells import CELL_CHARS, SAMPLES_SHOWN, fmt, table, text_cell
from pofe.run.report.collect import sample_rows
from pofe.run.report.held_out import choice_section, eval_section, iterate_wins_table
from pofe.run.report.online import online_section
from pofe.run.report.truncation import truncation_section

# what an online training's record holds in place of a round's (`pofe.run.provenance.online_record`)
ONLINE_RECORD = (
    " An online training's candidates are its refreshes' generate.jsonl and its trained-on rows their rows.jsonl, "
    "in step order; it ran outside `axolotl pofe run`, so nothing recorded its environment or its judge's identity."
)
# a digest (sha256: 64 hex digits, a git commit: 40) in the judge's identity
LONG_HEX = re.compile(r"\b[0-9a-f]{13,}\b")


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
    md += round_details(rep)
    md += ["### Loss curves", ""]
    if "loss" in plots:
        md += [f"![loss curves]({plots['loss']})", ""]
    else:
        md += ["No loss curves: no round has a trainer_state.json.", ""]
    return md


def round_details(rep: dict) -> list[str]:
    """What the rounds table leaves out: the anchor's mixture, saturation, lengths, cuts."""
    return anchor_mix_note(rep) + saturation_section(rep) + round_lengths_section(rep) + truncation_section(rep)


def anchor_mix_note(rep: dict) -> list[str]:
    """The anchor SPPO's rounds regressed onto, when `pofe.anchor_mix` mixed it toward pi_0."""
    recipes = [(r.get("reproduce") or {}).get("recipe") or {} for r in rep["rounds"]]
    pofe = (recipes[0].get("pofe") or {}) if recipes else {}
    if not pofe.get("anchor_mix"):
        return []
    beta = pofe["anchor_mix"]
    return [
        f"Each round's anchor was (1 - {beta}) log pi_t + {beta} log pi_0 (`pofe.anchor_mix`: {beta}), pi_0 = "
        f"`{pofe.get('pi_0')}`: every round regresses toward the same first policy, and round 1's pi_t "
        "is pi_0 itself.",
        "",
    ]


def saturation_section(rep: dict) -> list[str]:
    """### Saturation: per round, the share of prompts whose win rates all sit near 1/2."""
    rows, warnings = [], []
    for r in rep["rounds"]:
        cands = r["candidates"] or {}
        sat = cands.get("saturation")
        if not sat:
            continue
        band = sat["band"]
        share = sat["saturated_share"]
        rows.append(
            [
                str(r["round"]),
                fmt(sat["prompts"]),
                f"{sat['saturated_prompts']} ({fmt(100 * share, 1) if share is not None else '-'} %)",
                fmt(sat["mean_abs_deviation"]),
            ]
        )
        if cands.get("saturation_warning"):
            warnings.append(f"- **{cands['saturation_warning']}**")
    if not rows:
        return []
    return [
        "### Saturation",
        "",
        f"A prompt is saturated when all its candidates' win rates lie within {band} of 1/2 "
        "(`pofe.saturation_band`): the judge sees no difference, SPPO's targets eta (w - 1/2) are near 0 "
        "and so is the gradient. From each round's `summary.json`, over every judged candidate.",
        "",
        table(["round", "prompts", "saturated", "mean abs(w - 1/2)"], rows),
        "",
        *warnings,
        *([""] if warnings else []),
    ]


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
        "Tokens, mean / median, of the round's candidates and of each prompt's best and worst candidate "
        f"by their {method_spec(rep['method']).target.noun} (prompts whose candidates all tie left out). "
        "Best growing longer than worst round after round: the judge rewards length.",
        "",
        table(["round", "candidates", "best (chosen)", "worst (rejected)"], rows),
        "",
    ]


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
    decoding, judge, spec = info["decoding"], info["judge"], method_spec(rep["method"])
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
        "candidates (best-of-k)." + (f" {spec.headline_note}" if spec.headline_note else "")
    )
    rows = [_headline_row(r["round"], r["trained_on_train_prompts"]) for r in rep["rounds"]]
    rows = [row for row in rows if row]
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


def _headline_row(t: int, h: dict | None) -> list[str] | None:
    """Round t's headline row; None for a round without a headline."""
    if not h:
        return None
    model, best = h["model_mean_reward"], h["candidates_best_of_k_reward"]
    gap = model - best if None not in (model, best) else None
    return [
        str(t),
        str(h["num_prompts"]),
        fmt(h["policy_sample_mean_reward"]),
        fmt(h["candidates_mean_reward"]),
        fmt(best),
        fmt(model),
        fmt(gap),
    ]


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
                        text_cell(row["prompt_text"]),
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


def identity_cell(identity: dict[str, str] | None) -> str:
    """The judge's identity in one cell: each function or model with its digest (hex cut to 12,
    as the table's other digests), or why there is none."""
    if identity is None:
        return "-"
    if not identity:
        return "a served model, known by name only"
    return text_cell(
        "; ".join(f"{name} {LONG_HEX.sub(lambda m: m[0][:12], digest)}" for name, digest in identity.items())
    )


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
                identity_cell(rec.get("judge_identity")),
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
        "trained-on rows (data.jsonl), the judge's identity (its code's or weights' digest, cut to 12 as well), "
        "and each stage's environment as it started." + (ONLINE_RECORD if rep.get("online") else ""),
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
    if rep.get("kind") == "trained":
        round_1 = rep["rounds"][0]
        md = [
            f"# POFE report: {rep['method'].upper()}, a trained model against its base",
            "",
            f"pi_1 = `{round_1['policy_out']}` (trained), pi_0 = `{round_1['policy_in']}` (its base); "
            f"evaluation and this report in `{rep['output_dir']}`.",
        ]
        train = round_1["train"] or {}
        if train.get("max_steps") and train["steps"] < train["max_steps"]:
            md.append(
                f"**pi_1 was trained {train['steps']} of {train['max_steps']} steps**: its training had not ended "
                "(a checkpoint, or a training stopped early), as its trainer_state.json records."
            )
    else:
        md = [
            f"# POFE run report: {rep['method'].upper()}, {rep['rounds_finished']} of {rep['rounds_planned']} rounds",
            "",
            f"Output dir `{rep['output_dir']}`; final policy `{rep['final_policy'] or '(no round finished)'}`; "
            f"the run was started {rep['starts']} time(s).",
        ]
    if rep.get("overrides"):
        md.append("Command-line overrides: " + ", ".join(f"`{k}: {v}`" for k, v in rep["overrides"].items()) + ".")
    md.append("")
    md += headline_section(rep)
    md += samples_section(rep)
    md += choice_section(rep)
    md += rounds_section(rep, plots)
    md += online_section(rep.get("online"), plots)
    md += eval_section(rep["eval"], plots)
    md += reproduce_section(rep)
    return "\n".join(md)
