"""The online trainer: RRHF's or SPPO's trainer, its batches refreshed from the moving policy.

transformers' training loop asks `get_batch_samples` for each optimizer step's micro-batches.
Here, when the current window is used up, it takes the prompt batches of the next
`refresh_every` steps from the data loader at once (fewer at an epoch's end), samples and
judges their candidates with the policy as it is (`refresh.py`), and hands the k-response
batches out a step at a time; the loss, the optimizer and the schedule are the offline
trainer's and run on across refreshes. As TRL's GRPO buffers a generation over
`steps_per_generation` steps, with the window's own candidates instead of a group's.
"""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from contextlib import contextmanager
from functools import cache, cached_property, partial
from pathlib import Path

from accelerate.utils import gather_object
from datasets import Dataset

from pofe.anchor.table import RowScorer, score_rows
from pofe.args import PofeConfig, pofe_config
from pofe.data.tokenize import tokenize_row
from pofe.distributed import rank_and_world
from pofe.errors import PofeError
from pofe.logs import get_logger
from pofe.methods import method_spec
from pofe.online.models import BasePolicy, policy_for_refresh
from pofe.online.monitor import Monitor
from pofe.online.prompts import PROMPT_COLUMNS, PROMPT_INDEX, PROMPT_ROW
from pofe.online.refresh import (
    FOLDER,
    LOGP,
    LOGP_BASE,
    TOKENS,
    Refreshed,
    Window,
    judged_columns,
    merged_stats,
    read_refresh,
    refresh_dir,
    refresh_starts,
    sample_and_judge,
    trainable_rows,
    window_stats,
    with_scores,
    write_refresh,
)
from pofe.online.sampling import sampler_for
from pofe_candidates.judges import make_judge

LOG = get_logger(__name__)


class OnlineRefreshError(PofeError, RuntimeError):
    """A refresh cannot feed the steps it is for."""


class OnlineTraining:
    """Mixed in before a `KResponseTrainer` subclass by `online_trainer`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.spec = method_spec(self.args.pofe_method)
        self._left: list[dict] = []  # the current window's collated batches not yet trained on
        self._judge = None  # made at the first refresh, kept for the run
        self.rank, self.world = rank_and_world()

    # axolotl sets `axolotl_cfg` after the trainer is built: what it holds is read at the first refresh
    @cached_property
    def pofe(self) -> PofeConfig:
        return pofe_config(self.axolotl_cfg)

    @cached_property
    def _base(self) -> BasePolicy:
        return BasePolicy(self.axolotl_cfg, self.accelerator)

    @cached_property
    def _monitor(self) -> Monitor:
        return Monitor(
            self.axolotl_cfg,
            self.pofe,
            self.args.output_dir,
            tokenize=self._tokenize,
            score=self.score_table,
            main=self.accelerator.is_main_process,
            report_to=self.args.report_to,
        )

    @cached_property
    def _sampler(self):
        """What samples each refresh: the training model, a colocated vLLM or a server kept in step
        (`pofe.online.sampling`)."""
        return sampler_for(self.pofe.generate, self, Path(self.args.output_dir) / FOLDER, self.world)

    def train(self, *args, **kwargs):
        sampler = self._sampler  # refused before the first step when it cannot run
        try:
            return super().train(*args, **kwargs)
        finally:
            sampler.close()  # a server started for the run stops with it, trained or failed

    def _set_signature_columns_if_needed(self):
        # the prompt columns reach the collator; candidates come at each refresh
        if self._signature_columns is None:
            self._signature_columns = list(PROMPT_COLUMNS)

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        if not self._left:
            self._left = self._next_window(epoch_iterator, num_batches)
        batches, self._left = self._left[:num_batches], self._left[num_batches:]
        return batches, None  # the losses are means over prompts: no token count

    def _next_window(self, epoch_iterator, per_step: int) -> list[dict]:
        """The collated batches of the next window: read back when a resumed run's step falls in a
        written refresh, else sampled now."""
        start = self.state.global_step
        stored = self._stored_window(start, per_step)
        offset = (start - stored[0].start_step) * per_step if stored else 0
        wanted = len(stored[0].micro_batches) - offset if stored else self.pofe.online.refresh_every * per_step
        pulled = []
        for _ in range(wanted):
            try:
                pulled.append(next(epoch_iterator))
            except StopIteration:
                break
        if not pulled:
            return []
        batches = [b[PROMPT_INDEX].tolist() for b in pulled]
        if stored:
            refreshed = self._resumed(stored, offset, batches)
        else:
            prompt_rows = {i: row for b in pulled for i, row in zip(b[PROMPT_INDEX].tolist(), b[PROMPT_ROW])}
            refreshed = self._refresh(Window(start, batches), prompt_rows)
        self._log_refresh(refreshed)
        return [self._collate(rows, refreshed.window, m) for m, rows in enumerate(refreshed.rows)]

    def _collate(self, rows: list[dict], window: Window, m: int) -> dict:
        if not rows:
            raise OnlineRefreshError(
                f"online refresh at step {window.start_step}: no prompt of micro-batch {m} "
                f"(prompts {window.micro_batches[m]}) kept {self.pofe.candidates.min_candidates} candidates "
                "(identical samples are deduplicated; judge abstentions and the length policy drop others). Raise "
                "pofe.generate.num_candidates or temperature, micro_batch_size, or add dataset responses "
                "(generate.include_dataset_responses)"
            )
        return self.data_collator.rows(rows)

    # -- a refresh --------------------------------------------------------------------

    def _refresh(self, window: Window, prompt_rows: dict[int, dict]) -> Refreshed:
        """Sample, judge and score the window's candidates; write them before any step trains."""
        if window.start_step == 0:
            self._clear_earlier_run()
        pofe, timings = self.pofe, defaultdict(float)
        if self._judge is None:
            self._judge = make_judge(pofe.judge)
        with policy_for_refresh(self) as model:
            generator = self._sampler.generator(model, self._folder(window.start_step))
            generated, judged = sample_and_judge(
                window,
                prompt_rows,
                generator=generator,
                judge=self._judge,
                tokenizer=self.processing_class,
                method=self.spec,
                generate=pofe.generate,
                judge_cfg=pofe.judge,
                candidates=pofe.candidates.for_method(pofe.method),
                timer=partial(_timed, timings),
            )
            kept = trainable_rows(judged, self.spec, pofe.candidates, self._tokenize)
            with _timed(timings, "score"):
                logp, logp_base = self._scores(model, [kept[i][TOKENS] for i in kept])
            monitored, measured = self._monitor.due(window.start_step), {}
            if monitored:
                with _timed(timings, "monitor"):
                    measured = self._monitor.measure(model)
        data_rows, kl = [], []
        for j, (index, row) in enumerate(kept.items()):
            record = {"prompt_index": index, **row["data"], TOKENS: row[TOKENS]}
            if logp is not None:
                record[LOGP] = logp[j]
            if logp_base is not None:
                record[LOGP_BASE] = logp_base[j]
                kl.extend(a - b for a, b in zip(logp[j], logp_base[j]))
            data_rows.append(record)
        stats = window_stats(generated, judged, kept, kl) | {f"{k}_seconds": v for k, v in timings.items()}
        if monitored:
            columns = {i: judged_columns(row) for i, row in prompt_rows.items()}
            measured |= self._monitor.observe(generated, judged, data_rows, columns)
        stats |= measured
        refreshed = Refreshed(window, self._batched(window, data_rows), stats)
        write_refresh(self._folder(window.start_step), refreshed, generated, judged, data_rows)
        return refreshed

    def _scores(self, model, rows: list[dict]) -> tuple[list[list[float]] | None, list[list[float]] | None]:
        """The policy's summed log-probs of each kept candidate when the method anchors on them or
        pi_0's are scored, and pi_0's for kl_coef or anchor_mix (None: not measured)."""
        pi_0 = self.pofe.online_scores_pi_0
        if not rows or not (self.spec.needs_anchor or pi_0):
            return None, None
        logp = self.score_table(model, rows, "the policy's")
        if not pi_0:
            return logp, None
        with self._base.scoring(model) as base:
            return logp, self.score_table(base, rows, "pi_0's")

    def score_table(self, model, rows: list[dict], what: str) -> list[list[float]]:
        """`model`'s summed log-probs of each response of `rows` (their prompt_ids and
        response_ids), as the trainer scores a batch's candidates, without gradients."""
        # the label column only passes the trainer's batch check: scoring does not read it
        label = self.spec.target.column
        dataset = Dataset.from_list(
            [{**r, label: [0.0] * len(r["response_ids"]), "row_id": j} for j, r in enumerate(rows)]
        )
        scorer = RowScorer(
            collate=self.data_collator.rows,
            score=self.score_candidates,
            batch_size=self.args.per_device_eval_batch_size,
            device=self.args.device,
            progress=False,
        )
        table = score_rows(model, [dataset], scorer, what, ranks=(0, 1))
        return [table[j, : len(r["response_ids"])].tolist() for j, r in enumerate(rows)]

    def _tokenize(self, canonical: dict) -> dict:
        cfg = self.axolotl_cfg
        return tokenize_row(
            canonical,
            self.processing_class,
            sequence_len=cfg.sequence_len,
            max_prompt_len=self.pofe.max_prompt_len or cfg.sequence_len // 2,
            truncation=self.pofe.truncation,
        )

    def _batched(self, window: Window, data_rows: list[dict]) -> list[list[dict]]:
        """Each micro-batch's trainable rows, with the scores folded in (`with_scores`)."""
        pofe = self.pofe
        by_index = {
            row["prompt_index"]: with_scores(row, self.spec, pofe.online.kl_coef, pofe.anchor_mix) for row in data_rows
        }
        return [[by_index[i] for i in batch if i in by_index] for batch in window.micro_batches]

    # -- resuming -----------------------------------------------------------------------

    def _folder(self, start_step: int) -> Path:
        return refresh_dir(self.args.output_dir, start_step, self.rank, self.world)

    def _stored_window(self, step: int, per_step: int):
        """The written refresh whose steps include `step` (a resumed run's), if any."""
        if step == 0:
            return None
        for start in reversed([s for s in refresh_starts(self.args.output_dir) if s <= step]):
            stored = read_refresh(self._folder(start))
            if stored is None:
                continue
            steps = -(-len(stored[0].micro_batches) // per_step)
            return stored if step < start + steps else None
        return None

    def _resumed(self, stored, offset: int, batches: list[list[int]]) -> Refreshed:
        window, data_rows, stats = stored
        if window.micro_batches[offset : offset + len(batches)] != batches:
            raise OnlineRefreshError(
                f"resuming at step {self.state.global_step}: the data loader's prompts differ from those the "
                f"refresh written at step {window.start_step} ({self._folder(window.start_step)}) was sampled for. "
                "Resume with the recipe the run started with (same datasets, seed, batch sizes), or start over in "
                "a new output_dir"
            )
        LOG.info(f"POFE: online: resuming in the refresh of step {window.start_step}, read from its files")
        tail = Window(window.start_step, window.micro_batches[offset:])
        return Refreshed(tail, self._batched(tail, data_rows), stats)

    def _clear_earlier_run(self) -> None:
        """A training started afresh (not resumed) in an output_dir that holds an earlier run's
        refreshes: replaced, as the run's checkpoints are."""
        folder = Path(self.args.output_dir) / FOLDER
        earlier = list(folder.glob("refresh-*")) if self.rank == 0 else []
        if earlier:
            LOG.warning(f"POFE: online: a new training in {folder.parent}: replacing {len(earlier)} earlier refreshes")
            for path in earlier:
                shutil.rmtree(path)
        # no rank writes its first refresh before rank 0 has cleared the folder
        self.accelerator.wait_for_everyone()

    # -- what a user watches ------------------------------------------------------------

    def _log_refresh(self, refreshed: Refreshed) -> None:
        """`online/*` in the training log (counts summed over the ranks, the rest means weighted by
        prompts) and a console line."""
        # each rank's stats, merged as the report merges the written ones
        means = merged_stats(gather_object([refreshed.stats]))
        number = sum(start <= refreshed.window.start_step for start in refresh_starts(self.args.output_dir))
        self.log({"online/refresh": float(number), **{f"online/{k}": v for k, v in means.items()}})
        reward = (
            f", candidate reward {means['candidate_reward_mean']:.3f} (best-of-k {means['candidate_reward_best']:.3f})"
            if "candidate_reward_mean" in means
            else ""
        )
        kl = f", KL to pi_0 {means['kl_to_base']:.3f}" if "kl_to_base" in means else ""
        monitored = "".join(
            f", {name} {means[key]:.3f}"
            for key, name in (
                ("judge2_reward_mean", "judge2 reward"),
                ("reference_perplexity", "reference perplexity"),
            )
            if key in means
        )
        LOG.info(
            f"POFE: online refresh {number} at step {refreshed.window.start_step}: {int(means['prompts'])} prompts, "
            f"{int(means['candidates'])} candidates{reward}{kl}{monitored}; generated in "
            f"{means.get('generate_seconds', 0.0):.1f} s, judged in {means.get('judge_seconds', 0.0):.1f} s"
        )
        self._monitor.show(refreshed.window.start_step, number, means)


@contextmanager
def _timed(timings: dict[str, float], name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] += time.perf_counter() - start


@cache
def online_trainer(trainer_cls: type) -> type:
    """`trainer_cls` (a method's trainer) trained online: `OnlineTraining` mixed in before it."""
    return type(f"Online{trainer_cls.__name__}", (OnlineTraining, trainer_cls), {"__module__": __name__})
