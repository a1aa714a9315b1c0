"""The demo's result table, from its results (`pofe.demo.stages.Demo.run`, `demo-results.json`).

One column per trained recipe beside the model before training: the reward and exact match of
its greedy answers (one a prompt) on the training prompts, their reward on held-out ones (not
`axolotl pofe eval`'s figure, the reward of answers sampled at `pofe.eval.temperature`, whose
console and README table say "sampled"), what each trained on (the
candidates' mean and best-of-k reward; online, the policy's own samples at the first and the
last refresh, and Nash-MD's preference over the mixture's samples) and how long it took. The console prints it; `benchmarks/demo_figures.py` writes
the README's copy with the same function.
"""

from __future__ import annotations

LABEL, BEFORE, COLUMN = 42, 8, 15
SECONDS = "seconds: preprocess + train"  # the only row that depends on the machine's speed
SAMPLES_SHOWN = 4


def _row(label: str, before: str, cells: list[str]) -> str:
    return (f"{label:<{LABEL}}{before:>{BEFORE}}" + "".join(f"{c:>{COLUMN}}" for c in cells)).rstrip()


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _candidates(run: dict, key: str) -> float | None:
    return run["candidates"][key] if "candidates" in run else None


def _refresh(run: dict, which: int, key: str) -> float | None:
    return run["refreshes"][which].get(key) if run.get("refreshes") else None


def _per_prompt(run: dict, trained: bool) -> str:
    """Candidates judged per prompt, or trained on (SPPO's best-and-worst keeps 2 of them)."""
    if "candidates" not in run:
        return ""
    summary = run["candidates"]
    if trained:
        return f"{summary['candidates_per_prompt']['mean']:.1f}"
    return f"{sum(summary['candidates_by_source'].values()) / summary['rows']:.1f}"


def table_rows(results: dict) -> list[tuple[str, str, list[str]]]:
    """The table's rows, each (label, the model before training, one cell per run), cells as
    printed; each run's `before` is the first run's model (the demo's recipes share it)."""
    runs = results["runs"]
    before = runs[0]["before"]
    rows = [
        (label, _score(before[prompts][key]), [_score(r["after"][prompts][key]) for r in runs])
        for label, prompts, key in (
            ("greedy reward, training prompts", "train", "mean_reward"),
            ("greedy exact match, training prompts", "train", "exact_match"),
            ("greedy reward, held-out prompts", "held_out", "mean_reward"),
        )
    ]
    if any("candidates" in r for r in runs):
        rows += [
            ("candidates per prompt: judged", "", [_per_prompt(r, False) for r in runs]),
            ("candidates per prompt: trained on", "", [_per_prompt(r, True) for r in runs]),
            ("candidates: mean reward", "", [_score(_candidates(r, "mean_candidate_reward")) for r in runs]),
            ("candidates: best-of-k", "", [_score(_candidates(r, "mean_best_of_k_reward")) for r in runs]),
        ]
    online = [r for r in runs if r.get("refreshes")]
    if online:  # each run's own first and last refresh (the recipes train for different epochs)
        rows.append(("online refreshes", "", [str(len(r["refreshes"])) if r.get("refreshes") else "" for r in runs]))
        rows += [
            (label, "", [_score(_refresh(r, which, key)) for r in runs])
            for label, which, key in (
                ("policy samples: mean reward, first refresh", 0, "candidate_reward_mean"),
                ("policy samples: mean reward, last refresh", -1, "candidate_reward_mean"),
                ("policy samples: best-of-k, last refresh", -1, "candidate_reward_best"),
                # a method that plays the mixture of the policy and the base model (Nash-MD)
                ("preference over the mixture, last refresh", -1, "preference"),
            )
            if any(_refresh(r, which, key) is not None for r in online)
        ]
    rows.append((SECONDS, "", [f"{sum(r['seconds'].values()):.0f}" for r in runs]))
    return rows


def result_table(results: dict) -> list[str]:
    """The table's lines: a header of the runs' titles, then `table_rows`."""
    header = _row("", "before", [r["title"] for r in results["runs"]])
    return [header] + [_row(label, before, cells) for label, before, cells in table_rows(results)]


def figures(results: dict) -> dict[str, str]:
    """Every figure of the table but its times, as printed: `{"<row> | <column>": "0.237"}`."""
    titles = ["before"] + [r["title"] for r in results["runs"]]
    return {
        f"{label} | {title}": cell
        for label, before, cells in table_rows(results)
        if label != SECONDS
        for title, cell in zip(titles, [before, *cells], strict=True)
        if cell
    }


def sample_lines(results: dict) -> list[str]:
    """A few training prompts' greedy answers, before and after each training."""
    runs = results["runs"]
    shown = [("before", runs[0]["before"])] + [(r["title"], r["after"]) for r in runs]
    lines = ["greedy answers (prompt -> answer, reward):"]
    width = max(len(title) for title, _ in shown) + 2
    for title, answers in shown:
        cells = [f"{p} {a!r} {s:.2f}" for p, a, s in answers["train"]["samples"][:SAMPLES_SHOWN]]
        lines.append(f"  {title:<{width}}" + " | ".join(cells))
    return lines
