"""The demo's stages, run and shown as `axolotl pofe run` runs and shows its own.

Each recipe of the demo is a few named stages (`pofe.run.rounds.runner.StageRunner`): the
tiny model and prompts with the model's greedy answers before training (`prepare`, once for
all the recipes that share them), `axolotl preprocess` (offline recipes), `axolotl train`, and
the trained model's greedy answers (`evaluate`). The console gets a line as a stage starts and
one as it ends, with how long it took, what it made and its log; each stage's whole output
(axolotl's banner and config, library warnings, a traceback) goes to its log in
`<demo folder>/logs/`. The numbers of the result table are written to `demo-results.json`
beside them (`pofe.demo.tables` prints them; `benchmarks/demo_figures.py` writes the README's
copy from them).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import yaml

from pofe.demo.evaluate import greedy_reward
from pofe.demo.task import answer, make_prompt_rows, make_prompts, sft_rows, write_jsonl
from pofe.demo.tiny import build_tiny_model, is_tiny_model
from pofe.files import read_jsonl, write_atomic
from pofe.logs import Echo
from pofe.online.refresh import read_refresh
from pofe.records.refresh import FOLDER
from pofe.run.folder import RunState
from pofe.run.rounds.processes import axolotl_command
from pofe.run.rounds.runner import StageRunner

PROMPTS = "prompts.jsonl"
NUM_TRAIN_PROMPTS = 60
NUM_HELD_OUT = 40
NEAR_MISSES = 3
RESULTS = "demo-results.json"
STATE = "pofe-demo.json"
# the demo's stages run offline, on the CPU's cores one thread each (two would contend on 2 cores)
ENV = {
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "WANDB_MODE": "disabled",
}


@dataclass(frozen=True)
class DemoRecipe:
    """A recipe the demo runs: its file and its settings."""

    path: Path
    cfg: dict

    @classmethod
    def read(cls, path: Path) -> DemoRecipe:
        return cls(path, yaml.safe_load(Path(path).read_text()))

    @property
    def method(self) -> str | None:
        """Its `rl:`; None for a supervised fine-tune (the pi_0 a Nash-MD recipe starts from)."""
        return self.cfg.get("rl")

    @property
    def online(self) -> bool:
        return "online" in (self.cfg.get("pofe") or {})

    @property
    def title(self) -> str:
        """Its column in the result table: `RRHF`, `SPPO online`, `NASH-MD online`, `SFT`."""
        return (self.method or "sft").upper().replace("_", "-") + (" online" if self.online else "")

    @property
    def name(self) -> str:
        """Its stages' prefix and logs' names: `rrhf`, `sppo-online`."""
        return self.title.lower().replace(" ", "-")

    @property
    def prompts_path(self) -> Path:
        return prompts_path(self.cfg)


def is_sft(recipe: dict) -> bool:
    """A supervised fine-tune (tiny-sft-cpu.yml): its dataset is chats, axolotl's `chat_template` type."""
    return recipe["datasets"][0].get("type") == "chat_template"


def prompts_path(recipe: dict) -> Path:
    """Where the demo writes a recipe's prompt rows: its dataset's path; beside it, as `PROMPTS`,
    for a supervised fine-tune, whose dataset is their chats (`sft_rows`)."""
    path = Path(recipe["datasets"][0]["path"])
    return path.with_name(PROMPTS) if is_sft(recipe) else path


def data_paths(recipe: dict) -> list[Path]:
    """The data files the demo writes for a recipe: its prompt rows (and, for a supervised
    fine-tune, its dataset: each prompt and its answer as a chat, `sft_rows`)."""
    paths = [prompts_path(recipe)]
    if is_sft(recipe):
        paths.append(Path(recipe["datasets"][0]["path"]))
    return paths


def holds_toy_rows(path: Path) -> bool:
    """Whether a data file holds the toy's rows only, as the demo writes them (`make_prompt_rows`,
    or their `sft_rows`): each an addition prompt and its sum. A file of other rows is a user's."""
    try:
        rows = read_jsonl(path)
        pairs = [
            (r["prompt"], r["answer"]) if "prompt" in r else (r["messages"][0]["content"], r["messages"][1]["content"])
            for r in rows
        ]
        return bool(pairs) and all(str(answer(prompt)) == said for prompt, said in pairs)
    except (OSError, KeyError, IndexError, TypeError, ValueError):  # UnreadableFile is a ValueError
        return False


def users_files(recipe: dict) -> dict[Path, str]:
    """The files the demo would write a recipe's toy over that hold a user's work, each with what it
    holds: its base_model folder, a model other than the tiny one (`is_tiny_model`); a data file,
    rows other than the toy's (`holds_toy_rows`). The demo never writes over these; the toy's model
    and rows of an earlier run it writes again."""
    found = {}
    model = Path(recipe["base_model"])
    if model.is_dir() and any(model.iterdir()) and not is_tiny_model(model):
        found[model] = "a model other than the toy's"
    for path in data_paths(recipe):
        if path.exists() and not holds_toy_rows(path):
            found[path] = "rows other than the toy's"
    return found


def prepare(recipe: dict, seed: int, prompts: int = NUM_TRAIN_PROMPTS, *, keep: Collection[Path] = ()) -> list[dict]:
    """Write the tiny model and `prompts` prompt rows where the recipe expects them (`data_paths`),
    but for the files in `keep` (a user's own, `users_files`: left as they are)."""
    if Path(recipe["base_model"]) not in keep:
        build_tiny_model(Path(recipe["base_model"]), seed=seed)
    rows = make_prompt_rows(prompts, k_wrong=NEAR_MISSES, seed=seed)
    for path, file_rows in zip(data_paths(recipe), (rows, sft_rows(rows)), strict=False):
        if path not in keep:
            write_jsonl(file_rows, path)
    return rows


def held_out_prompts(train: list[str], seed: int) -> list[str]:
    """Prompts none of the training rows hold: operands are drawn without replacement, so the
    tail of a longer list of the same seed is unseen."""
    tail = make_prompts(NUM_TRAIN_PROMPTS + NUM_HELD_OUT, seed=seed)[NUM_TRAIN_PROMPTS:]
    return [p for p in tail if p not in set(train)]


def greedy(model: str | Path, prompts: dict[str, list[str]]) -> dict:
    """The model's greedy reward on each prompt set (`greedy_reward`), samples as lists; on one
    thread, as the stages train (`ENV`): a float32 sum's order, and so a close call between two
    answers, then depends on the CPU's instructions only, not on its number of cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scores = {name: greedy_reward(model, p) for name, p in prompts.items()}
    finally:
        torch.set_num_threads(threads)
    return {name: {**s, "samples": [list(sample) for sample in s["samples"]]} for name, s in scores.items()}


def candidates_summary(recipe: DemoRecipe) -> dict:
    """The summary.json of the candidates this run built: the newest of the method's under the
    recipe's dataset_prepared_path (the two tiny recipes share one; each method has its folders)."""
    found = [
        (path.stat().st_mtime, summary)
        for path in Path(recipe.cfg["dataset_prepared_path"]).glob("pofe-candidates-*/summary.json")
        if (summary := json.loads(path.read_text()))["method"] == recipe.cfg["rl"]
    ]
    return max(found, key=lambda pair: pair[0])[1]


def online_refreshes(recipe: DemoRecipe) -> list[dict]:
    """Each refresh's stats, in step order, from the run's output_dir (`pofe.online.refresh`)."""
    folders = sorted((Path(recipe.cfg["output_dir"]) / FOLDER).glob("refresh-*"))
    return [read_refresh(folder)[2] for folder in folders]


class Demo:
    """The stages of the demo's recipes, their logs in `logs`, their state and results in the
    folder above it; every run starts over (the tiny model is written again, so nothing earlier
    is reused)."""

    def __init__(
        self, recipes: list[DemoRecipe], seed: int, logs: Path, *, echo: Echo, stream: bool, progress: Echo | None
    ):
        self.recipes, self.seed = recipes, seed
        self.logs, self.folder = logs, logs.parent
        (self.folder / STATE).unlink(missing_ok=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        state = RunState.open(self.folder / STATE, fingerprint="demo", recipe=str(recipes[0].path), method="demo")
        self.runner = StageRunner(state, echo=echo, stream=stream, progress=progress)

    def in_process(self, name: str):
        """A stage's work in this process, its output and traceback in `logs/<name>.log`."""
        return self.runner.in_process(self.logs / f"{name}.log")

    def run(self) -> dict:
        """Every stage, then the results (also written to `demo-results.json`). A recipe whose
        base_model is an earlier recipe's output_dir (Nash-MD's pi_0, fine-tuned by the SFT
        recipe) starts from that model: its prompts, and that model's answers as its `before`."""
        prepared, trained, runs = {}, {}, []
        for recipe in self.recipes:
            start = trained.get(Path(recipe.cfg["base_model"]))
            if start is None:
                key = (recipe.cfg["base_model"], str(recipe.prompts_path))
                if key not in prepared:
                    prepared[key] = self.prepare(recipe, f"prepare-{len(prepared) + 1}" if prepared else "prepare")
                start = prepared[key]
            runs.append(self.run_recipe(recipe, start))
            trained[Path(recipe.cfg["output_dir"])] = {**start, "before": runs[-1]["after"]}
        results = {"seed": self.seed, "runs": runs}
        write_atomic(self.folder / RESULTS, json.dumps(results, indent=1) + "\n")
        return results

    def prepare(self, recipe: DemoRecipe, stage: str) -> dict:
        """The tiny model and prompts, and the model's greedy answers before training."""
        found = {}

        def work():
            with self.in_process(stage):
                found["rows"] = prepare(recipe.cfg, self.seed)
                train = [r["prompt"] for r in found["rows"]]
                found.update(prompts={"train": train, "held_out": held_out_prompts(train, self.seed)})
                found.update(before=greedy(recipe.cfg["base_model"], found["prompts"]))

        self.runner.run(
            stage,
            work,
            says=f"prepare: a random 2-layer Llama and {NUM_TRAIN_PROMPTS} addition prompts (seed {self.seed}), "
            "the model's greedy answers",
            made=lambda _: (
                f"{recipe.cfg['base_model']}, {recipe.prompts_path}, "
                f"greedy reward {found['before']['train']['mean_reward']:.3f}"
            ),
        )
        return found

    def run_recipe(self, recipe: DemoRecipe, prepared: dict) -> dict:
        """`axolotl preprocess` (offline) and `axolotl train` on the recipe, then its greedy answers."""
        seconds = {}
        if recipe.method and not recipe.online:  # online, the candidates are sampled inside `axolotl train`
            seconds["preprocess"] = self.axolotl(recipe, "preprocess", self.candidates_made)
        if is_sft(recipe.cfg):  # its dataset is the prompts' chats (another recipe prepared them)
            write_jsonl(sft_rows(prepared["rows"]), Path(recipe.cfg["datasets"][0]["path"]))
        seconds["train"] = self.axolotl(recipe, "train", self.training_made)
        after = {}

        def work():
            with self.in_process(f"{recipe.name}-evaluate"):
                after.update(greedy(recipe.cfg["output_dir"], prepared["prompts"]))

        self.runner.run(
            f"{recipe.name}/evaluate",
            work,
            says=f"{recipe.title}: the trained model's greedy answers",
            made=lambda _: (
                f"greedy reward {after['train']['mean_reward']:.3f} on the training prompts, "
                f"{after['held_out']['mean_reward']:.3f} held out"
            ),
        )
        run = {"title": recipe.title, "recipe": str(recipe.path), "method": recipe.method, "online": recipe.online}
        run.update(before=prepared["before"], after=after, seconds=seconds)
        if recipe.online:
            run["refreshes"] = online_refreshes(recipe)
        elif recipe.method:
            run["candidates"] = candidates_summary(recipe)
        return run

    def axolotl(self, recipe: DemoRecipe, command: str, made) -> float:
        """`axolotl <command> recipe` as a stage process; its seconds."""
        stage = f"{recipe.name}/{command}"
        cmd = axolotl_command(command, str(recipe.path), *(["--launcher", "python"] if command == "train" else []))
        self.runner.run(
            stage,
            lambda: self.runner.command(cmd, self.logs / f"{recipe.name}-{command}.log", ENV),
            says=f"{recipe.title}: axolotl {command} {recipe.path}",
            made=lambda _: made(recipe),
        )
        return self.runner.state.stages[stage]["seconds"]

    def candidates_made(self, recipe: DemoRecipe) -> str:
        summary = candidates_summary(recipe)
        kept = summary["candidates_per_prompt"]["mean"]
        judged = sum(summary["candidates_by_source"].values()) / summary["rows"]
        trained = f" ({kept:.1f} kept)" if f"{kept:.1f}" != f"{judged:.1f}" else ""
        return (
            f"{summary['rows']} prompts x {judged:.1f} candidates{trained}, mean reward "
            f"{summary['mean_candidate_reward']:.3f}, best-of-k {summary['mean_best_of_k_reward']:.3f}"
        )

    def training_made(self, recipe: DemoRecipe) -> str:
        model = f"model {recipe.cfg['output_dir']}"
        return f"{len(online_refreshes(recipe))} refreshes of the candidates, {model}" if recipe.online else model
