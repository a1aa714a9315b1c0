"""`axolotl pofe plan RECIPE`: each stage of each round, what it loads where, its memory and disk.

Pure: `plan_run` takes the recipe's YAML dict, the sizes of its models (`pofe.run.plan.model_size`;
None where a model could not be sized offline) and the prompt count, and returns the stages
as `axolotl pofe run` runs them (`pofe.run.rounds.loop`): per round generate, judge, train (SPPO's
anchor pass included: one table, no reference model) and, with an adapter, merge; then the
evaluation's answers and judging, once after the last round. An online recipe (`pofe.online`) is
one `axolotl train` per GPU that samples and judges as it trains: one train stage holding the
generator, the judge and pi_0 beside the training state (`pofe.run.plan.online`). The arithmetic is
`pofe.run.plan.estimate`'s; `pofe.run.plan.sources` finds the sizes, `pofe.run.plan.render` prints.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from pofe.args import PofeConfig
from pofe.args.lengths import generation_fit
from pofe.args.translate import LORA_KERNELS
from pofe.run.plan.candidates import device_warnings, generate_stage, judge_stage
from pofe.run.plan.common import PlanOptions, recipe_device, round_candidates
from pofe.run.plan.estimate import GB, ModelSize
from pofe.run.plan.evaluation import eval_stages
from pofe.run.plan.online import online_stage
from pofe.run.plan.sources import disk_warning, double_bos, free_disk, model_sizes, prompt_rows
from pofe.run.plan.training import merge_stage, pi_0_stage, train_stage
from pofe.run.recipe import check_plugin_listed, translated_recipe


def lora_kernels_on(recipe: dict) -> list[str]:
    """The LoRA kernel keys a translated recipe turns on (`translate_raw_config` turns all four
    off for a LoRA / QLoRA recipe that sets none, so only keys the recipe sets are on)."""
    return [k for k in LORA_KERNELS if recipe.get(k)]


def round_stages(
    raw: dict, pcfg: PofeConfig, sizes: dict, per_round: list[list[int] | None], options: PlanOptions
) -> tuple[list[dict], list[str]]:
    """(stages, warnings) of the rounds `axolotl pofe run` runs: per round generate, judge, pi_0
    (`pofe.anchor_mix`, rounds 2..T), train and, with an adapter, merge; `per_round`: each
    round's candidates per prompt (`round_candidates`)."""
    base, adapter = str(raw["base_model"]), bool(raw.get("adapter"))
    size, judge_size = sizes.get(base), sizes.get(pcfg.judge.model) if pcfg.judge.model else None
    stages, warnings = [], []
    for t, per_prompt in enumerate(per_round, start=1):
        model = base if t == 1 else f"round-{t - 1}/{'merged' if adapter else 'train'}"
        entry, said = generate_stage(raw, pcfg, size, t, model, per_prompt, options)
        stages.append(entry)
        warnings += said
        stages.append(judge_stage(pcfg, judge_size, t, per_prompt, options))
        if t > 1 and pcfg.anchor_mix:  # round 1's pi_t is pi_0: its anchor pass serves
            stages.append(pi_0_stage(raw, pcfg, size, t, base, per_prompt, options))
        stages.append(train_stage(raw, pcfg, size, t, model, per_prompt, options))
        if adapter:
            stages.append(merge_stage(raw, size, t, model, options))
    return stages, warnings


def trained_stages(
    raw: dict, pcfg: PofeConfig, sizes: dict, per_prompt: list[int] | None, options: PlanOptions
) -> tuple[list[dict], list[str]]:
    """(stages, warnings) of `axolotl preprocess` and `axolotl train` on the recipe: generate and
    judge (the preprocess), then one training of base_model; no merge (`axolotl train` keeps its adapter)."""
    base = str(raw["base_model"])
    size, judge_size = sizes.get(base), sizes.get(pcfg.judge.model) if pcfg.judge.model else None
    generate, said = generate_stage(raw, pcfg, size, None, base, per_prompt, options)
    judge = judge_stage(pcfg, judge_size, None, per_prompt, options)
    return [generate, judge, train_stage(raw, pcfg, size, None, base, per_prompt, options)], said


def plan_run(
    raw: dict,
    pcfg: PofeConfig,
    sizes: dict[str, ModelSize | None],
    prompts: int | None,
    options: PlanOptions,
    responses: list[int] | None = None,
    command: str = "run",
) -> dict:
    """The plan: {"stages": [...], "warnings": [...], ...} (entries: `pofe.run.plan.common.stage`).

    `raw` is the recipe as POFE translates it (`pofe.run.recipe.translated_recipe`), so the plan is
    of the run `axolotl train` makes of it; `pcfg` is its validated `pofe:` block. `responses`:
    each prompt row's dataset responses (`pofe.run.plan.sources.prompt_rows`); None: one per
    include_dataset_responses column, an estimate the warnings say. `command`: "run", the rounds of
    `axolotl pofe run`; "train", `axolotl preprocess` and `axolotl train` once on the recipe (its
    prompts less `pofe.eval.held_out`'s, no merge), then `axolotl pofe eval` of the trained model.
    """
    if not pcfg.method or pcfg.generate is None:
        raise ValueError(
            "plan: the recipe sets no `rl: rrhf|sppo` with pofe.generate and pofe.judge (a run from prompts)"
        )
    warnings = []
    per_round, estimated = round_candidates(pcfg, prompts, responses, command)
    if estimated:
        warnings.append(
            f"pofe.generate.include_dataset_responses ({', '.join(pcfg.generate.include_dataset_responses)}): "
            "counted as one response per column and prompt, as the plan does not read the rounds' rows (a hub "
            "dataset, pofe.round_prompts as a list, or --prompts other than the file's rows); a column that holds "
            "a list has more: the candidates, judge calls and training rows' responses are an estimate"
        )
    if pcfg.online is not None:  # one axolotl train: rounds is 1 (`PofeConfig._check_online`)
        size, judge_size = sizes.get(str(raw["base_model"])), sizes.get(pcfg.judge.model)
        stages = [online_stage(raw, pcfg, size, judge_size, per_round[0], options)]
    elif command == "train":
        stages, said = trained_stages(raw, pcfg, sizes, per_round[0], options)
        warnings += said
    else:
        stages, said = round_stages(raw, pcfg, sizes, per_round, options)
        warnings += said
    if pcfg.eval:
        stages += eval_stages(raw, pcfg, sizes, options, headline=command == "run")
        if command == "train" and not (pcfg.eval.prompts or pcfg.eval.held_out or raw.get("val_set_size")):
            warnings.append(
                "pofe.eval.held_out is not set: `axolotl train` trains on every row, and `axolotl pofe eval` then "
                "has no held-out prompts; set it before training (held_out: n keeps the last n rows out), or give "
                "pofe.eval.prompts"
            )
    warnings += device_warnings(pcfg, options)
    if fit := generation_fit(raw, pcfg):
        warnings.append(fit)
    warnings += memory_warnings(stages, options, online=pcfg.online is not None) + kernel_warnings(raw)
    disk = [s["disk_gb"] for s in stages]
    return {
        "recipe": raw.get("output_dir"),
        "command": command,
        "method": pcfg.method,
        "rounds": pcfg.rounds,
        "online": None if pcfg.online is None else pcfg.online.model_dump(),
        "gpus": options.gpus,
        "gpu_memory_gb": options.gpu_memory_gb,
        "gpus_from": options.gpus_from,
        "device": options.device,
        "prompts": prompts,
        "stages": stages,
        "disk_gb": None if None in disk else round(sum(disk), 2),
        "warnings": warnings,
    }


# the keys that shrink each stage's memory, named in its warning
STAGE_KEYS = {
    "generate": "pofe.candidates.worker_devices / num_workers (workers sharing a GPU), pofe.generate.vllm_kwargs "
    "(max_model_len, tensor_parallel_size) or pofe.generate.batch_size",
    "judge": "pofe.candidates.worker_devices / num_workers (workers sharing a GPU), pofe.judge.batch_size or "
    "pofe.judge.max_length",
    "train": "micro_batch_size, gradient_checkpointing, adapter: qlora or deepspeed",
    "merge": "merge_method: memory_efficient",
    "pi_0": "eval_batch_size (or micro_batch_size), sequence_len, or pofe.logit_chunk_size",
    "eval-answers": "pofe.eval.batch_size (model.generate) or pofe.generate.vllm_kwargs (the rounds' vLLM engine)",
    "eval-logprobs": "pofe.eval.batch_size",
    "eval-judging": "pofe.judge.batch_size or pofe.judge.max_length",
}
# what else shrinks an online run's train stage, which holds the generator and the judge too
ONLINE_TRAIN_KEYS = "pofe.generate.batch_size or max_new_tokens, pofe.judge.batch_size or max_length"


def memory_warnings(stages: list[dict], options: PlanOptions, online: bool = False) -> list[str]:
    """A stage whose co-resident models and buffers exceed one GPU (`online`: the recipe's
    train stage is an online run's, `pofe.run.plan.online`)."""
    said = []
    for s in stages:
        if s["gpu_memory_gb"] is None or s["gpu_memory_gb"] <= options.gpu_memory_gb:
            continue
        if "reserved" in s["parts_gb"] and not any(k.endswith("_on_this_gpu") for k in s["parts_gb"]):
            continue  # one vLLM engine in its share: `generate_stage` said what does not fit in it
        where = "" if s["round"] is None else f" (round {s['round']})"
        keys = STAGE_KEYS[s["stage"]] + (f", {ONLINE_TRAIN_KEYS}" if online and s["stage"] == "train" else "")
        said.append(
            f"{s['stage']}{where}: {s['gpu_memory_gb']} GB per GPU exceeds a {options.gpu_memory_gb:g} GB "
            f"GPU ({s['model']}): change {keys}, or use larger or more GPUs "
            "(--gpu-memory, --gpus)"
        )
    return said


def kernel_warnings(raw: dict) -> list[str]:
    on = lora_kernels_on(raw)
    if not on:
        return []
    return [
        f"LoRA kernels {', '.join(on)} (set explicitly): no POFE test trains with them; set "
        f"{': false, '.join(LORA_KERNELS)}: false unless a GPU run showed them exact"
    ]


def planned_command(original: dict, command: str | None) -> tuple[str, str]:
    """(command, why): what the user will run on the recipe: `command` when asked (--command), else
    `axolotl pofe run` for a recipe that sets pofe.rounds and `axolotl train` for one that does not
    (an online recipe is one `axolotl train` either way)."""
    if command:
        return command, "--command"
    if "rounds" in (original.get("pofe") or {}):
        return "run", "the recipe sets pofe.rounds"
    return "train", "the recipe sets no pofe.rounds"


def plan_recipe(recipe: str | Path, options, prompts: int | None = None, command: str | None = None) -> dict:
    """The plan of the recipe file `recipe` (`plan_run`) with what only the disk
    tells: the models' sizes, the prompt count (`prompts` when given, else a local dataset's rows)
    and each row's dataset responses, a double BOS, and the free disk under output_dir; on
    `options.device`, else on the device the recipe is for (`recipe_device`; `device_from` says
    which); of `command`, else the command the recipe is for (`planned_command`; `command_from`)."""
    original = yaml.safe_load(Path(recipe).read_text())
    command, command_from = planned_command(original, command)
    check_plugin_listed(original, recipe)
    raw, pcfg = translated_recipe(original)
    if pcfg.generate is None:
        raise ValueError(f"{recipe}: plan needs a run from prompts (pofe.generate and pofe.judge)")
    check_python_judges(recipe, pcfg)
    device, why = (options.device, "--device") if options.device else recipe_device(raw)
    options = replace(options, device=device)
    sizes, warnings = model_sizes(raw, pcfg)
    rows, responses = prompt_rows(raw, pcfg.generate.include_dataset_responses)
    plan = plan_run(raw, pcfg, sizes, rows if prompts is None else prompts, options, responses, command)
    plan["device_from"], plan["command_from"], plan["recipe_path"] = why, command_from, str(recipe)
    bos = double_bos(str(raw["base_model"]))
    free = free_disk(str(raw.get("output_dir") or "."))
    plan["free_disk_gb"] = round(free / GB, 1)
    plan["warnings"] = warnings + plan["warnings"] + ([bos] if bos else []) + disk_warning(plan, free)
    return plan


def check_python_judges(recipe: str | Path, pcfg: PofeConfig) -> None:
    """Import the recipe's Python judges (`judge.function`, `judge.reward_funcs`, of each of its
    judges) as `PofePlugin.register` does when training reads the recipe, from the recipe's folder
    and the working directory: a judge that cannot import stops the plan with that message, not
    the run after its generation."""
    from pofe.recipe_modules import add_recipe_dirs
    from pofe_candidates.judges import import_judge_functions

    add_recipe_dirs(recipe)
    for _, judge in pcfg.judges:
        import_judge_functions(judge)
