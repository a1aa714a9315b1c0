"""What one training logged, and the lines `axolotl train` of a POFE recipe ends its console with.

The Trainer's log history (`trainer_state.json`'s `log_history`) holds the loss and the method's
diagnostic (`MethodSpec.diagnostic_metric`) every `logging_steps`; the run report reads a
round's curves from it (`pofe.run.report.collect`), and `pofe.PofePlugin` says first -> last
after axolotl's "Model successfully saved", so the console ends with POFE's verdict: what was
trained, how its loss and reward metric went, and the command that evaluates it.
"""

from __future__ import annotations

import os

from pofe.methods import method_spec

# Set by `axolotl pofe run` in every stage process it starts: the descriptor of the run's lock,
# which the stage inherits (`pofe.run.guards`); a training with it is one of a run's rounds
LOCK_FD_ENV = "POFE_RUN_LOCK_FD"

# an online training's candidate reward (scalar judges), logged at each refresh
ONLINE_REWARD = "online/candidate_reward_mean"


def logged_curves(log_history: list[dict], names) -> dict[str, list[list]]:
    """{name: [[step, value], ...]} of each of `names` the log history holds (none: left out)."""
    curves = {}
    for name in names:
        points = [[h["step"], h[name]] for h in log_history if name in h and "step" in h]
        if points:
            curves[name] = points
    return curves


def training_summary(cfg, pofe, log_history: list[dict], steps: int) -> list[str]:
    """The lines a POFE training ends with: what it trained and where, its loss, diagnostic and
    (online) candidate reward first -> last logged; outside `axolotl pofe run` and unless
    `pofe.eval: false`, the command that evaluates it, and, when the recipe holds no prompts out,
    that it must before training.
    `cfg`: axolotl's validated config; `pofe`: its `pofe:` block."""
    kind = f"a {cfg.adapter.upper()} adapter" if cfg.adapter else "full fine-tune"
    online = ", online" if pofe.online is not None else ""
    names = ("loss", method_spec(pofe.method).diagnostic_metric, ONLINE_REWARD)
    changes = [
        f"{name} {points[0][1]:.3f} -> {points[-1][1]:.3f}"
        for name, points in logged_curves(log_history, names).items()
    ]
    said = ", ".join(changes) if changes else f"nothing logged (fewer steps than logging_steps, {cfg.logging_steps})"
    lines = [f"POFE: trained rl: {pofe.method} ({kind}{online}) into {cfg.output_dir}, {steps} steps: {said}"]
    ecfg = pofe.eval
    # a round of `axolotl pofe run` is evaluated by the run; `pofe.eval: false` asks for no evaluation
    if os.environ.get(LOCK_FD_ENV) or not ecfg:
        return lines
    lines.append(
        f"POFE: next, evaluate it against its base on held-out prompts: axolotl pofe eval {cfg.axolotl_config_path}"
    )
    if not (ecfg.prompts or ecfg.held_out or cfg.val_set_size):
        lines.append(
            "POFE: pofe.eval.held_out is not set, so every row of the dataset was trained on: set it before "
            "training (held_out: n keeps the last n rows out) to hold prompts out for `axolotl pofe eval`, or "
            "give it prompts of its own (pofe.eval.prompts)"
        )
    return lines
