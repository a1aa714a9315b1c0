"""A refresh's console line: what a user watches of an online run between the training logs, and
which refreshes' lines the console shows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


def refresh_summary(number: int, start_step: int, means: dict[str, float]) -> str:
    """One line for refresh `number` (at `start_step`) from its stats merged over the ranks
    (`pofe.records.refresh.merged_stats`): prompts and candidates, the candidates' reward, the
    KL to pi_0, the monitor's second judge and reference perplexity, a mixture's preference and distance
    (Nash-MD), the samples (and opponents) cut where they began a user turn, the judge's abstentions,
    the prompts dropped, times."""
    said = [f"{int(means['prompts'])} prompts", f"{int(means['candidates'])} candidates"]
    if "candidate_reward_mean" in means:
        said[-1] += (
            f", candidate reward {means['candidate_reward_mean']:.3f} (best-of-k {means['candidate_reward_best']:.3f})"
        )
    if "kl_to_pi_0" in means:
        said.append(f"KL to pi_0 {means['kl_to_pi_0']:.3f}")
    said += [
        f"{name} {means[key]:.3f}"  # the monitor's (pofe.online.monitor), at its refreshes
        for key, name in (("judge2_reward_mean", "judge2 reward"), ("reference_perplexity", "reference perplexity"))
        if key in means
    ]
    if "preference" in means:  # a method that plays the mixture (Nash-MD)
        said.append(f"preference over the mixture {means['preference']:.3f}")
    if "mixture_kl" in means:
        said[-1] += f" (mixture's KL from the policy {means['mixture_kl']:.3f} per token)"
    if means.get("pairs_tied"):
        said.append(f"{int(means['pairs_tied'])} of {int(means['pairs'])} pairs tied")
    cut = {"samples": means.get("candidates_cut_at_user_turn"), "opponents": means.get("opponents_cut_at_user_turn")}
    if any(cut.values()):
        said.append(
            " and ".join(f"{int(n)} {what}" for what, n in cut.items() if n) + " cut where they began a user turn"
        )
    if means.get("judge_abstentions"):
        said.append(f"judge abstained on {int(means['judge_abstentions'])} of {int(means['judge_verdicts'])} verdicts")
    if means.get("prompts_dropped"):
        said.append(f"{int(means['prompts_dropped'])} prompts dropped (too few candidates kept: not trained on)")
    return (
        f"POFE: online refresh {number} at step {start_step}: {', '.join(said)}; generated in "
        f"{means.get('generate_seconds', 0.0):.1f} s, judged in {means.get('judge_seconds', 0.0):.1f} s"
    )


def all_pairs_tied(number: int, start_step: int, means: dict[str, float], judge, folder: Path) -> str | None:
    """A warning when every pair of a refresh that plays the mixture (Nash-MD) tied: preference 1/2
    everywhere, so the steps until the next refresh have no preference to learn from (only the KL to
    pi_0 pulls); None otherwise. `judge`: the recipe's JudgeConfig, for what to check."""
    if not means.get("pairs") or means.get("pairs_tied") != means["pairs"]:
        return None
    said = (
        f"POFE: online refresh {number} at step {start_step}: the judge tied all {int(means['pairs'])} pairs of "
        f"{int(means['prompts'])} prompts (every preference 1/2), so the steps until the next refresh learn nothing "
        f"from it: only the KL to pi_0 (pofe.online.kl_coef) moves the policy. The pairs are in "
        f"{folder / 'judge.jsonl'}. "
    )
    name = judge.function or judge.type
    if judge.is_pairwise:
        return said + f"The judge ({name}) gave every pair 1/2: check that it tells two different responses apart."
    return said + (
        f"The judge ({name}) gave each sample and its opponent the same reward (their rewards and "
        "opponent_rewards there): a verifier that every sample fails, or passes, ties them all. Check its rewards on "
        "these samples; start from a pi_0 that solves some prompts (an SFT first, as recipes/tiny-sft-cpu.yml does "
        "for recipes/tiny-nash-md-online-cpu.yml), or give the judge a graded reward."
    )


@dataclass(frozen=True)
class ConsoleCadence:
    """Which refreshes' lines reach the console. A run refreshing at every step would print one a
    step (Nash-MD's tiny recipe: 300 lines), so the console shows a line about as
    often as the Trainer logs: every `every`-th refresh from the first (`every` = ceil(logging_steps
    / refresh_every)), and always a monitored one (its samples follow its line), the run's last and
    one with something to warn about. Every refresh is logged (`online/*`) and written
    (refresh.json) either way."""

    logging_steps: int  # the Trainer's state.logging_steps: axolotl's logging_steps, a fraction resolved
    refresh_every: int
    monitor_every: int

    @property
    def every(self) -> int:
        return max(1, math.ceil(self.logging_steps / self.refresh_every))

    def shows(self, number: int, *, monitored: bool, last: bool, warned: bool) -> bool:
        """Whether refresh `number` (1-based) gets its line: `monitored`, the monitor shows its
        samples; `last`, the run's last refresh; `warned`, it has something to warn about."""
        return (number - 1) % self.every == 0 or monitored or last or warned

    def note(self, folder: Path) -> str:
        """What the first line shown says of the others when some are left out ("" otherwise):
        which are shown, and where all are. `folder`: the run's online/ folder."""
        if self.every == 1:
            return ""
        # the monitor's refreshes are among every `every`-th when its cadence is a multiple
        monitored = (
            f", each monitored one (monitor_every {self.monitor_every})" if self.monitor_every % self.every else ""
        )
        return (
            f" [the console shows one refresh in {self.every} (logging_steps {self.logging_steps} / refresh_every "
            f"{self.refresh_every}){monitored}, the last and any with a warning; every refresh is in the training "
            f"log (online/*) and in {folder}/refresh-*/refresh.json]"
        )
