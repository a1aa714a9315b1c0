"""The round loop: `axolotl pofe run recipe.yml`.

For t = 1..T (`pofe.rounds`): generate candidates from the current policy, judge them,
build rows (`axolotl preprocess`), train (`axolotl train`), and make the trained model the
next round's policy. Every stage goes through the run's `StageRunner` (`pofe.run.rounds.runner`);
most are a process of their own (`pofe.run.rounds.processes`). Each round gets a derived recipe
(`pofe.run.rounds.round_recipe`), written into the run's output dir (`pofe.run.folder`), that differs
from the user's recipe only in where things are.

Prompts per round: `pofe.run.prompts`. SPPO re-anchors on each round's starting policy for
free: the anchor pass uses the policy as loaded, and round t loads round t-1's (merged)
model. LoRA / QLoRA: between rounds the adapter is merged into the round's base (below),
the next round's `base_model`, which trains a fresh adapter.
Each round publishes as the SPPO authors' iterations do (`pofe.run.rounds.publish`): hub repos
`<hub_model_id>-iter<t>` (the model) and `...-iter<t>-data` (its candidates), tracker runs
`<name>-iter<t>`, and the round-level numbers in one W&B run after the report.

A run killed at any point and started again skips every stage recorded as finished and
redoes the first unfinished one (an interrupted preprocess resumes from its shards, an
interrupted training from its last checkpoint). One runner per output_dir
(`pofe.run.guards`); its stages end with it (`pofe.run.rounds.processes`).
After the rounds: the held-out evaluation (`axolotl pofe eval`, its own process) and the
report, written once. With `pofe.stop_when`, the evaluation also runs after each round but
the last, and a round whose model fails the rule ends the run (`check_stop`, `pofe.run.evaluation.decision`).

The LoRA merge (`merge_command`): axolotl's `merge-lora` merges the adapter into the round's
base. The merged model becomes the next round's `base_model` (which trains a fresh adapter). The
runner's merge stage is

    axolotl merge-lora round-<t>/recipe.yml --lora-model-dir round-<t>/train --output-dir round-<t>

whose default (`merge_method: memory_efficient`) adds the adapter's delta shard by shard,
never holding the whole model in memory, and writes `round-<t>/merged` (axolotl always
writes `<output_dir>/merged`), with the base's non-weight files (config, tokenizer). The
base's dtype is kept; on a float32 LoRA the weights equal peft's `merge_and_unload` exactly.
QLoRA: axolotl adds the delta to the NF4 round trip of every 2-D base weight, the embeddings
and lm_head included, which QLoRA training keeps in float (on the tiny model: max abs diff
1.0e-2 to the float merge); `merge_method: legacy` in the recipe takes axolotl's whole-model
float merge instead (equal to `merge_and_unload`). The next round quantises the merged model again.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from pofe.args import PofeConfig, pofe_config
from pofe.files import write_atomic, write_jsonl_atomic
from pofe.logs import Echo
from pofe.records.evaluation import EvalRecord
from pofe.run.folder import REWRITE_EVAL, RunFolder, RunState, RunStateMismatch, checkpoints
from pofe.run.guards import RunLock, check_prompt_sources, claim_recipe_output_dir, prompt_sources, redo_damaged_stages
from pofe.run.prompts import held_out_count, load_round_prompts, resolve_round_prompts, split_prompts, without_held_out
from pofe.run.provenance import stage_environment
from pofe.run.recipe import load_recipe, recipe_fingerprint
from pofe.run.report import write_report
from pofe.run.rounds.checkpoints import check_resume, record_training, resumable, training_identity
from pofe.run.rounds.made import candidates_made, evaluation_made, training_made
from pofe.run.rounds.processes import axolotl_command, output_to
from pofe.run.rounds.publish import log_rounds, push_round, tracker_env, uses_wandb
from pofe.run.rounds.round_recipe import RoundRecipe, round_recipe
from pofe.run.rounds.runner import StageRunner, shown_path
from pofe_candidates.generators.available import check_backend_runs


def check_iterable(cfg, pcfg: PofeConfig) -> None:
    """An iterated run needs a POFE method, one pofe.prompts dataset and a backend that runs here."""
    if not pcfg.method:
        raise ValueError("the recipe sets no `rl: rrhf` / `rl: sppo`")
    check_backend_runs(pcfg.generate, online=pcfg.online is not None)  # before the first stage, not in it
    entries = cfg.datasets or []
    if len(entries) != 1 or entries[0].type != "pofe.prompts":
        raise ValueError(
            "an iterated run needs exactly one dataset, of type pofe.prompts (each round "
            f"generates its candidates from it); got {[e.type for e in entries]}. A model trained on "
            "rows of your own (`axolotl train`) is evaluated against its base by `axolotl pofe eval` instead"
        )


@dataclass(frozen=True)
class RoundPlan:
    """What round `t` of `rounds` starts from: its policy (a local path or hub id), whether
    it trains an adapter (then merged before the next round), its generation seed, the
    `axolotl train --launcher` (None: axolotl's default), the run's first policy pi_0."""

    t: int
    rounds: int
    policy: str
    adapter: bool
    seed: int
    launcher: str | None = None
    pi_0: str | None = None


def policy_dir(folder: RunFolder, t: int, adapter: bool) -> Path:
    """The model round t produced (round t+1's policy)."""
    return folder.merged(t) if adapter else folder.train(t)


def prepare_prompts(cfg, pcfg: PofeConfig, folder: RunFolder, runner: StageRunner) -> None:
    """The `prompts` stage: write the per-round prompt files (and held-out prompts) once.

    `pofe.round_prompts` as a list: round t's prompts are the t-th file or dataset spec, read
    with the `datasets:` entry's settings; that entry then only supplies the held-out rows,
    and a round's set loses any of them it holds (`without_held_out`, counted).
    """

    def work() -> dict:
        from pofe.data.sources import load_entry

        entry = cfg.datasets[0]
        rows = list(load_entry(entry, cfg.hf_use_auth_token))  # values as written
        held = held_out_count(len(rows), pcfg.eval.held_out, pcfg.eval.prompts is not None) if pcfg.eval else 0
        train_rows, held_rows = rows[: len(rows) - held], rows[len(rows) - held :]
        if held:
            write_jsonl_atomic(folder.held_out_prompts, held_rows)
        if isinstance(pcfg.round_prompts, list):
            mode = "files"
            per_round = load_round_prompts(entry, pcfg.round_prompts, cfg.hf_use_auth_token)
        else:
            mode = resolve_round_prompts(pcfg.method, pcfg.round_prompts)
            splits = split_prompts(len(train_rows), pcfg.rounds, mode)
            per_round = [[train_rows[i] for i in indices] for indices in splits]
            sizes = [[r.start, r.stop] for r in splits]
        per_round, removed = without_held_out(per_round, held_rows, entry.get("field_prompt") or "prompt")
        if mode == "files":
            sizes = [[0, len(r)] for r in per_round]
        for t, round_rows in enumerate(per_round, start=1):
            write_jsonl_atomic(folder.round_prompts(t), round_rows)
        runner.state.prompt_mode = mode
        runner.state.rounds_planned = pcfg.rounds
        trained = len(per_round[0]) if mode == "all" else sum(len(r) for r in per_round)
        runner.echo(f"prompts: {trained} for training ({mode} over {pcfg.rounds} round(s)), {held} held out")
        if any(removed):
            runner.echo(f"prompts: removed held-out prompts from the rounds' sets (per round: {removed})")
        return {"total": len(rows), "held_out": held, "mode": mode, "per_round": sizes, "held_out_removed": removed}

    runner.run("prompts", work)


def check_rounds(rounds: int, state: RunState, folder: RunFolder) -> None:
    """`pofe.rounds` more than planned: fine with `all` (write the new rounds' prompts); a
    split depends on the number of rounds, so it cannot change once prompts are written."""
    planned = state.rounds_planned
    if planned is None or planned == rounds:
        return
    if state.prompt_mode in ("split", "files"):
        raise RunStateMismatch(
            f"this run split its prompts into {planned} rounds; pofe.rounds: {rounds} "
            "would need another split. Use a new output_dir (or round_prompts: all)."
        )
    for t in range(planned + 1, rounds + 1):
        if not folder.round_prompts(t).exists():
            shutil.copyfile(folder.round_prompts(1), folder.round_prompts(t))
    state.rounds_planned = max(planned, rounds)
    state.save()


def collect_trainer_state(folder: RunFolder, t: int, forced_save: bool) -> Path | None:
    """Copy the last checkpoint's trainer_state.json to round-t/; drop the forced checkpoint."""
    train = folder.train(t)
    saved = checkpoints(train)
    if not saved:
        return None
    dest = folder.trainer_state(t)
    write_atomic(dest, (saved[-1] / "trainer_state.json").read_text())
    if forced_save:
        for checkpoint in train.glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
    return dest


def _local_or_hub(path: str) -> str:
    """An existing local path made absolute (derived recipes live elsewhere); else a hub id."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def resume_point(
    folder: RunFolder, state: RunState, t: int, echo: Echo = print, deepspeed: bool = False
) -> Path | None:
    """The checkpoint round t's training resumes from: an unfinished stage's last whole one
    (`checkpoints.resumable`, with its DeepSpeed state for a `deepspeed` recipe; a finished
    stage's forced checkpoint is gone), or the one a finished stage resumed from."""
    stage = f"round-{t}/train"
    if state.done(stage):
        resumed = state.stages[stage].get("resumed_from")
        return Path(resumed) if resumed else None
    return resumable(folder.train(t), echo, deepspeed)


def claim_training(folder: RunFolder, t: int, recipe: dict, resume: Path | None) -> None:
    """Before round t trains: resume only from a checkpoint its own recipe and candidates
    wrote (`RunStateMismatch` otherwise); a fresh start records them for the checkpoints
    it will save (`pofe.run.rounds.checkpoints`)."""
    identity = training_identity(recipe, folder.candidates(t) / "data.jsonl")
    if resume is not None:
        check_resume(folder.train(t), resume, identity, t)
    else:
        record_training(folder.train(t), identity)


def write_round_recipe(raw: dict, folder: RunFolder, plan: RoundPlan, resume: Path | None) -> tuple[Path, RoundRecipe]:
    """Write round t's derived recipe (only when its text changed: a restart leaves a finished
    round's file as it ran); its path and the derived recipe."""
    derived = round_recipe(raw, folder, plan.t, plan.policy, plan.seed, resume, pi_0=plan.pi_0)
    text = yaml.safe_dump(derived.recipe, sort_keys=False)
    recipe = folder.recipe(plan.t)
    if not recipe.exists() or recipe.read_text() != text:
        write_atomic(recipe, text, private=True)  # the recipe may carry a served policy's key
    return recipe, derived


def run_round(raw: dict, folder: RunFolder, plan: RoundPlan, runner: StageRunner) -> str:
    """Round t's preprocess, train, (LoRA) merge and (hub) push stages, each skipped when
    done; returns the round's model (the next round's policy)."""
    t, state = plan.t, runner.state
    redo_damaged_stages(folder, state, t, runner.echo)
    record = state.round(t)
    record.policy_in, record.generate_seed = plan.policy, plan.seed
    resume = resume_point(folder, state, t, runner.echo, deepspeed=bool(raw.get("deepspeed")))
    recipe, derived = write_round_recipe(raw, folder, plan, resume)
    round_dir = folder.round_dir(t)
    step = f"round {t}/{plan.rounds}"

    def preprocess() -> dict:
        runner.command(axolotl_command("preprocess", str(recipe)), round_dir / "preprocess.log")
        return {"summary": str(folder.summary(t))}

    def train() -> dict:
        launcher = ["--launcher", plan.launcher] if plan.launcher else []
        runner.command(axolotl_command("train", str(recipe), *launcher), round_dir / "train.log", env=tracker_env(raw))
        trainer_state = collect_trainer_state(folder, t, derived.forced_save)
        return {"output_dir": str(folder.train(t)), "trainer_state": str(trainer_state) if trainer_state else None}

    def merge() -> dict:
        shutil.rmtree(folder.merged(t), ignore_errors=True)  # what a killed merge left
        runner.command(merge_command(recipe, folder.train(t), round_dir), round_dir / "merge.log")
        return {"merged": str(folder.merged(t))}

    environment = stage_environment(raw)  # what each stage's process runs with (`pofe.run.provenance`)
    runner.run(
        f"round-{t}/preprocess",
        preprocess,
        says=f"{step}: generate + judge + tokenise from {plan.policy}",
        started={"environment": environment},
        made=lambda _: candidates_made(folder, t),
    )
    if not state.done(f"round-{t}/train"):
        claim_training(folder, t, derived.recipe, resume)
    runner.run(
        f"round-{t}/train",
        train,
        says=f"{step}: train" + (f", resuming from {resume}" if resume else ""),
        started={"resumed_from": str(resume) if resume else None, "environment": environment},
        made=lambda facts: training_made(
            folder, facts["trainer_state"] and Path(facts["trainer_state"]), folder.train(t)
        ),
    )
    if plan.adapter:
        runner.run(
            f"round-{t}/merge",
            merge,
            says=f"{step}: merge the adapter into {plan.policy}",
            made=lambda _: f"model {shown_path(folder.merged(t), folder.root)}",
        )
    push_round(raw, folder, t, plan.adapter, runner)

    policy = str(policy_dir(folder, t, plan.adapter))
    record.policy_out = policy
    state.save()
    return policy


def run_rounds(
    recipe_path: str | Path,
    *,
    launcher: str | None = None,
    stream: bool = True,
    echo: Echo = print,
    evaluate: bool = True,
    overrides: dict | None = None,
    progress: Echo | None = None,
) -> RunFolder:
    """Run (or resume) every round of `recipe_path`, then evaluate and report; `RunLocked`
    while another runner (or a stage it started) holds the output_dir. `echo` says what each
    stage does and made, `stream` adds the stages' whole output, `progress` shows their
    progress bars (`StageRunner`). `overrides`: axolotl's command-line options (`--num-epochs
    3`), applied to the recipe every stage derives from (recorded in the state; a restart with
    others is another recipe)."""
    folder = claim_recipe_output_dir(recipe_path, echo, overrides)
    with output_to(folder.runner_log, echo):  # axolotl's config dump and its libraries' warnings: not for the console
        raw, cfg = load_recipe(recipe_path, overrides)
    pcfg = pofe_config(cfg)
    check_iterable(cfg, pcfg)
    with RunLock.acquire(folder.lock, echo) as lock:
        state = RunState.open(
            folder.state,
            fingerprint=recipe_fingerprint(raw),
            recipe=str(Path(recipe_path).resolve()),
            method=pcfg.method,
        )
        state.overrides = overrides or None
        # the eval stage reads the recipe as run: the user's, or with the overrides applied
        if overrides:
            write_atomic(folder.recipe_as_run, yaml.safe_dump(raw, sort_keys=False), private=True)
            recipe_path = folder.recipe_as_run
        runner = StageRunner(state, echo=echo, stream=stream, keep_fds=(lock.fileno(),), progress=progress)
        echo(f"{pcfg.method.upper()}, {pcfg.rounds} round(s), in {folder.root} (each stage's log there)")
        prepare_prompts(cfg, pcfg, folder, runner)
        check_prompt_sources(prompt_sources(cfg, pcfg), state)
        check_rounds(pcfg.rounds, state, folder)
        policy = _local_or_hub(str(raw["base_model"]))
        state.base_model = policy
        # pi_0 of the evaluation: the policy round 1 starts from (with its adapter, if any)
        state.pi_0 = _local_or_hub(str(raw["lora_model_dir"])) if raw.get("lora_model_dir") else policy
        base_seed = int(pcfg.generate.seed if pcfg.generate else 0)
        state.stopped = None
        for t in range(1, pcfg.rounds + 1):
            plan = RoundPlan(
                t=t,
                rounds=pcfg.rounds,
                policy=policy,
                adapter=bool(cfg.adapter),
                seed=base_seed + (t - 1),
                launcher=launcher,
                pi_0=state.pi_0,
            )
            policy = run_round(raw, folder, plan, runner)
            if evaluate and pcfg.stop_when and t < pcfg.rounds and check_stop(recipe_path, folder, pcfg, runner, t):
                break
        state.final_policy = policy
        state.save()

        if evaluate and pcfg.eval:  # on unless `pofe.eval: false`: the headline at least
            evaluate_rounds(recipe_path, folder, pcfg, runner)
        report = write_report(folder)
        if uses_wandb(raw):
            log_rounds(raw, report.data, folder, runner)
        echo(report.terminal_summary())
    return folder


def evaluate_rounds(recipe_path: str | Path, folder: RunFolder, pcfg, runner: StageRunner) -> None:
    """The eval stage, `axolotl pofe eval` in its own process; run again when the run has
    more finished rounds (other models) than the recorded evaluation."""
    says = "evaluate: each round's headline" + (
        ", every iterate on held-out prompts" if pcfg.eval.has_held_out else ""
    )
    command = axolotl_command("pofe", "eval", "--no-report", str(recipe_path))
    runner.run(
        "eval",
        lambda: runner.command(command, folder.root / "eval.log"),
        says=says,
        inputs={"models": runner.state.models(pcfg.rounds)},
        made=lambda _: evaluation_made(folder),
    )


def check_stop(recipe_path: str | Path, folder: RunFolder, pcfg, runner: StageRunner, t: int) -> bool:
    """After round t (not the last): every finished iterate evaluated (the eval stage), and
    `pofe.stop_when` asked of pi_t (`pofe.run.evaluation.decision`); recorded as the stage
    `round-<t>/stop-check`, so a restart decides as the first start did (a changed rule
    decides again). True (and the state's `stopped` set) when the run ends here."""
    from pofe.run.evaluation.decision import stop_decision

    rule = pcfg.stop_when

    def work() -> dict:
        evaluate_rounds(recipe_path, folder, pcfg, runner)
        evaluation = EvalRecord.read_if_written(folder.evaluation, REWRITE_EVAL)
        return stop_decision(evaluation and evaluation.model_dump(mode="json"), rule)

    name = f"round-{t}/stop-check"
    runner.run(
        name, work, says=f"round {t}: check pofe.stop_when on the held-out prompts", inputs={"rule": rule.model_dump()}
    )
    decision = {k: runner.state.stages[name][k] for k in ("stop", "round", "fired", "unread")}
    for why in decision["unread"]:
        runner.echo(f"round {t}: pofe.stop_when not checked: {why}")
    if decision["stop"]:
        runner.state.stopped = {"after_round": t, "rounds_planned": pcfg.rounds, **decision}
        runner.echo(f"round {t}: STOP (pofe.stop_when): " + "; ".join(f["why"] for f in decision["fired"]))
    return decision["stop"]


def merge_command(recipe: Path, adapter: Path, round_dir: Path) -> list[str]:
    """The merge stage's command: `adapter` into the `recipe`'s base_model, to `round_dir/merged`."""
    return axolotl_command(
        "merge-lora",
        str(recipe),
        f"--lora-model-dir={adapter}",
        f"--output-dir={round_dir}",
    )
