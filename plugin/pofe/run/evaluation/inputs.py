"""What an evaluation works from, read before any model loads: the run (`EvalRun`: its
models, pi_0's tokenizer, the rounds' prompt column) and the held-out prompts, each rendered
as the pipeline's generate stage renders it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pofe.args import PofeConfig, pofe_config
from pofe.data.formats import RowFormat, prompt_row
from pofe.files import read_jsonl
from pofe.logs import Echo
from pofe.run.evaluation.answers import HeldOut, other_columns, reference_pairs
from pofe.run.evaluation.average import average_weights
from pofe.run.folder import RunFolder, RunState
from pofe_candidates.models import load_tokenizer
from pofe_candidates.render import render_prompt, text_prompt


def render_prompts(tokenizer, prompts: list, as_text: list[bool] | None = None) -> list[str]:
    """Each prompt rendered with the chat template as the pipeline's generate stage renders
    it, or as text where `as_text` says it trained as text (`text_prompt`): the text the models
    sample from, and the `rendered` prompt judges may read."""
    flags = as_text or [False] * len(prompts)
    return [text_prompt(tokenizer, p) if text else render_prompt(tokenizer, p).text for p, text in zip(prompts, flags)]


def trained_as_text(cfg, pcfg: PofeConfig, prompts: list) -> list[bool]:
    """Whether each prompt is rendered as text: every dataset entry of the recipe trains such a
    prompt as text (`pofe.data.formats.RowFormat.renders_as_text`)."""
    formats = [RowFormat.of_entry(e, i, pcfg) for i, e in enumerate(cfg.datasets or [])]
    return [bool(formats) and all(f.renders_as_text(p) for f in formats) for p in prompts]


def prompt_file_rows(path: str | Path) -> list[dict]:
    """The rows of a local JSON/JSONL, CSV or Parquet prompt file (`pofe.eval.prompts`)."""
    from datasets import load_dataset

    path = str(path)
    kind = "parquet" if path.endswith(".parquet") else "csv" if path.endswith(".csv") else "json"
    return load_dataset(kind, data_files=path, split="train").to_list()


def dataset_prompts(rows: list[dict], column: str, fields: dict, source: str, method: str) -> list:
    """Each row's prompt as the pipeline reads a `pofe.prompts` row of that dataset entry:
    with `prompt_format: hh`, an HH transcript becomes chat messages."""
    fmt = RowFormat(dataset=source, type="pofe.prompts", method=method, fields={**fields, "field_prompt": column})
    return [prompt_row(r, i, fmt, [])[column] for i, r in enumerate(rows)]


@dataclass(frozen=True)
class EvalRun:
    """What both parts of an evaluation work from."""

    pcfg: PofeConfig
    folder: RunFolder
    # [[name, path], ...]: pi_0, then each finished round's model (models[t] is pi_t), then pi_avg
    # when averaged (`with_average`)
    models: list[list[str]]
    tokenizer: Any  # pi_0's: renders every prompt, for every model, as the pipeline renders it
    prompt_column: str  # the rounds' prompt column (`round_prompt_column`)
    rounds: int  # finished rounds T: models[1..T] are their iterates

    @property
    def average(self) -> dict | None:
        """eval.json's `average`: pi_avg's index among the models and the iterates it averages."""
        if len(self.models) == self.rounds + 1:
            return None
        return {"index": self.rounds + 1, "of": [name for name, _ in self.models[1 : self.rounds + 1]]}


def run_folder(recipe_path: str | Path, cfg) -> RunFolder:
    """The folder of a recipe's iterated run (`cfg`: as loaded, `pofe.run.recipe.load_recipe`),
    refused unless the run has started."""
    folder = RunFolder(Path(cfg.output_dir).resolve())
    if not folder.state.exists():
        raise ValueError(f"no run state at {folder.state}: run `axolotl pofe run {recipe_path}` first")
    return folder


def open_run(recipe_path: str | Path, cfg, folder: RunFolder) -> EvalRun:
    """The iterated run in `folder`, checked: evaluation is on."""
    pcfg = checked_eval(recipe_path, cfg)
    models = RunState.read(folder.state).models()
    return EvalRun(pcfg, folder, models, load_tokenizer(models[0][1]), round_prompt_column(cfg), len(models) - 1)


def with_average(run: EvalRun, echo: Echo) -> EvalRun:
    """`run` with pi_avg (`pofe.run.evaluation.average`) after its iterates, when
    `pofe.eval.average_iterates` asks for it and two rounds or more have finished."""
    if not run.pcfg.eval.average_iterates:
        return run
    if run.rounds < 2:
        echo(f"eval: no pi_avg (pofe.eval.average_iterates): {run.rounds} round(s) finished, it averages 2 or more")
        return run
    iterates = [(name, Path(path)) for name, path in run.models[1 : run.rounds + 1]]
    path = average_weights(iterates, run.folder.eval_dir / "pi_avg", echo)
    return replace(run, models=[*run.models, ["pi_avg", str(path)]])


def checked_eval(recipe_path: str | Path, cfg) -> PofeConfig:
    """The recipe's `pofe:` block, refused when it turns evaluation off."""
    pcfg = pofe_config(cfg)
    if not pcfg.eval:
        raise ValueError(f"{recipe_path} sets `pofe.eval: false`: evaluation is off (drop the key to turn it on)")
    return pcfg


def round_prompt_column(cfg) -> str:
    """The prompt column of the run's `pofe.prompts` entry (each round's recipe keeps it)."""
    (entry,) = cfg.datasets
    return entry.get("field_prompt") or "prompt"


def held_out_set(run: EvalRun) -> HeldOut | None:
    """The held-out prompts: `pofe.eval.prompts`, or the rows the run held out of its dataset;
    None when there are none (`held_out: 0`, or a pool too small for the default slice)."""
    ecfg = run.pcfg.eval
    if not ecfg.has_held_out or not (ecfg.prompts or run.folder.held_out_prompts.exists()):
        return None
    if ecfg.prompts:
        rows = prompt_file_rows(ecfg.prompts)
        prompts = [r[ecfg.prompt_column] for r in rows]
    else:  # the dataset's own rows: read as its entry reads them (`prompt_format`)
        rows = read_jsonl(run.folder.held_out_prompts)
        fields = run.pcfg.dataset_fields[0] if run.pcfg.dataset_fields else {}
        prompts = dataset_prompts(rows, ecfg.prompt_column, fields, str(run.folder.held_out_prompts), run.pcfg.method)
    references = reference_pairs(run.tokenizer, prompts, [r.get(ecfg.reference_column) for r in rows])
    source = ecfg.prompts or str(run.folder.held_out_prompts)
    return HeldOut(
        prompts, render_prompts(run.tokenizer, prompts), references, source, other_columns(rows, ecfg.prompt_column)
    )
