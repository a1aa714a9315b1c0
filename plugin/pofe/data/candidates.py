"""Candidates for a `pofe.prompts` dataset entry, from inside axolotl: the policy to sample
from, where the shards go, and the generate -> judge -> build pipeline (`pofe_candidates`)
run (or resumed) with the recipe's tokenizer.

`axolotl preprocess` / `train` reach it through the loader (`loader.py`), and
`axolotl pofe candidates` directly.
"""

from __future__ import annotations

from pathlib import Path

from axolotl.loaders import load_tokenizer
from axolotl.utils.dict import DictDefault
from datasets import Dataset

from pofe.args import PofeConfig
from pofe.data.formats import RowFormat, prompt_row, template_refused
from pofe.data.sources import local_files_digest, read_json_rows
from pofe.errors import PofeError
from pofe.files import stable_hash
from pofe.logs import get_logger
from pofe_candidates.render import ChatTemplateError

LOG = get_logger(__name__)


def candidates_from_prompts(
    cfg: DictDefault, pofe: PofeConfig, entry, prompts: Dataset, fmt: RowFormat
) -> tuple[Dataset, str]:
    """Generate and judge candidates for a prompt dataset: the pipeline's rows (prompt,
    responses, the method's label column), and the file they were read from."""
    result = build_candidates(cfg, pofe, entry, prompts, fmt.column("field_prompt"), prompt_format=fmt.prompt_format)
    return read_json_rows(result.data_path), str(result.data_path)


def build_candidates(
    cfg: DictDefault,
    pofe: PofeConfig,
    entry,
    prompts: Dataset,
    prompt_column: str,
    stop_after=None,
    prompt_format: str = "chat",
):
    """Run (or resume) the generate -> judge -> build pipeline for one prompt dataset.

    `pofe` is `cfg`'s validated `pofe:` block. `prompt_format` is the entry's (`hh`: the
    prompts and the dataset responses are HH transcripts, read as chat turns by
    `formats.prompt_row`).
    """
    from pofe_candidates.pipeline import run_pipeline

    generate, judge, candidates = pofe.generate, pofe.judge, pofe.candidates.for_method(pofe.method)
    fmt = RowFormat(
        dataset=entry.path,
        type="pofe.prompts",
        method=pofe.method,
        fields={"field_prompt": prompt_column, "prompt_format": prompt_format},
    )
    # iterating decodes mixed-type (Json) columns; to_list() would give their JSON text
    rows = [prompt_row(row, i, fmt, generate.include_dataset_responses) for i, row in enumerate(prompts)]
    policy = sampling_policy(cfg, generate)
    tokenizer = prompt_tokenizer(cfg, generate)
    out_dir = candidates_folder(cfg, pofe, entry, prompt_column, prompt_format, tokenizer)
    candidates = candidates.model_copy(update={"out_dir": str(out_dir)})
    try:
        result = run_pipeline(
            rows,
            policy_path=policy,
            method=pofe.method,
            generate=generate,
            judge=judge,
            candidates=candidates,
            prompt_column=prompt_column,
            stop_after=stop_after,
            tokenizer=tokenizer,
            saturation_band=pofe.saturation_band,
        )
    except ChatTemplateError as e:
        if e.row is None:
            raise
        name = tokenizer.name_or_path if tokenizer is not None else policy
        raise template_refused(entry.path, e.row, prompt_column, name, e.message) from e
    if result is None:
        LOG.info(f"POFE: stopped after the {stop_after} stage; shards in {candidates.out_dir}")
        return None
    s = result.summary
    LOG.info(
        f"POFE: {s['rows']} of {s['rows_in']} prompts of {entry.path} have candidates "
        f"(dropped: {s['rows_dropped'] or 0}), {s['candidates_per_prompt']['mean']:.2f} per "
        f"prompt, duplicates removed {s['duplicates_removed']}, empty candidates removed "
        f"{s['empty_candidates_removed']}, samples cut where they began a user turn "
        f"{s['candidates_cut_at_user_turn']}, mean candidate reward {_three(s['mean_candidate_reward'])}, "
        f"best-of-k {_three(s['mean_best_of_k_reward'])}, judge abstentions {s['judge_abstentions']}; "
        f"summary in {result.summary_path}"
    )
    return result


def prompt_tokenizer(cfg: DictDefault, generate):
    """The tokenizer that renders the prompts for sampling, or None for `generate.model`'s own.

    Training's (axolotl's `load_tokenizer`: `tokenizer_config`, else `base_model`, with the
    recipe's chat_template settings), so candidates answer the prompts training scores them
    on. A `generate.model` that POFE loads (a path or hub id) keeps its own; a served name
    (`backend: openai` without `serve`: the server's name for its model) is never loaded."""
    served_name = generate.backend == "openai" and generate.serve is None
    if generate.model and not served_name:
        return None
    try:
        return load_tokenizer(cfg)
    except OSError as e:
        if not generate.model:
            raise
        source = cfg.tokenizer_config or cfg.base_model
        raise PofeError(
            f"generate.model: {generate.model!r} is the server's name for its model (backend: openai), so "
            f"POFE renders the prompts with the recipe's tokenizer, which did not load from {source!r} "
            f"({type(e).__name__}: {str(e).splitlines()[0]}). Set tokenizer_config (or base_model) to the "
            "served model's tokenizer: a local folder or a hub id in the cache."
        ) from e


def candidates_folder(
    cfg: DictDefault, pofe: PofeConfig, entry, prompt_column: str, prompt_format: str, tokenizer=None
):
    """Where a `pofe.prompts` entry's candidates are (`pofe.candidates.out_dir`, else
    `candidates_dir`); `tokenizer`: `prompt_tokenizer`'s, loaded here when not given."""
    candidates = pofe.candidates.for_method(pofe.method)
    if candidates.out_dir is not None:
        return Path(candidates.out_dir)
    if tokenizer is None:
        tokenizer = prompt_tokenizer(cfg, pofe.generate)
    policy = sampling_policy(cfg, pofe.generate)
    return candidates_dir(cfg, pofe, entry, policy, prompt_column, prompt_format, tokenizer)


def candidates_dir(
    cfg: DictDefault, pofe: PofeConfig, entry, policy: str, prompt_column: str, prompt_format: str, tokenizer
) -> Path:
    """`dataset_prepared_path/pofe-candidates-<hash>`: the folder of one prompt dataset's
    candidates, named by what its generate shards depend on, with every default filled in
    as the pipeline fills it (`generate.dedupe` and `candidates.truncated` per method), and by
    the method: two recipes that differ in any of these, `rl: rrhf` and `rl: sppo` on the same
    prompts included, never share a folder. The judge is not in the name: a changed judge
    reuses the generated candidates, its verdicts kept apart inside (`judge/manifest.json`)."""
    method = pofe.method
    generate, candidates = pofe.generate.for_method(method), pofe.candidates.for_method(method)
    parts = {
        "method": method,
        "dataset": [entry.path, entry.split, prompt_column, prompt_format],
        # what the file holds: an edited prompt file gets a folder of its own
        "data": local_files_digest([entry]),
        "policy": policy,
        "generate": generate.model_dump(),
        "candidates": [candidates.shard_size, candidates.truncated],
        "chat_template": getattr(tokenizer, "chat_template", None),
    }
    return Path(cfg.dataset_prepared_path or "last_run_prepared") / f"pofe-candidates-{stable_hash(parts, 32)}"


def _three(x: float | None) -> str:
    """A mean reward for the log: 3 decimals (the judge's scores carry no more), `-` for none."""
    return "-" if x is None else f"{x:.3f}"


def sampling_policy(cfg: DictDefault, generate) -> str:
    """What candidates are sampled from: `generate.model` when set, else the policy that
    trains. With an adapter loaded (`lora_model_dir`) that is base + adapter: SPPO's anchor
    is that iterate, so candidates drawn from the base alone would be off-policy."""
    if generate.model:
        return generate.model
    if not cfg.lora_model_dir:
        return cfg.base_model
    if generate.backend == "openai" and generate.serve is None:
        raise ValueError(
            f"lora_model_dir is set ({cfg.lora_model_dir}) but generate.backend: openai asks the "
            f"server for base_model by name, which would sample off-policy. Set generate.serve (POFE "
            f"then serves base + adapter as a LoRA module), or serve it yourself (`vllm serve "
            f"{cfg.base_model} --enable-lora --lora-modules policy={cfg.lora_model_dir}`) and set "
            "generate.model: policy"
        )
    # the transformers and vllm backends, and a served policy, load an adapter folder on its base
    return str(cfg.lora_model_dir)
