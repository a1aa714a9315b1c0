"""The online trainer: a method's trainer (RRHF's, SPPO's, Nash-MD's), its batches refreshed from the moving policy.

transformers' training loop asks for each optimizer step's micro-batches (`step_batches`, through
`pofe.compat.StepBatches`).
Here, when the current window is used up, it takes the prompt batches of the next
`refresh_every` steps from the data loader at once (fewer at an epoch's end), samples and
judges their candidates with the policy as it is (`refresh.py`), and hands the k-response
batches out a step at a time; the loss, the optimizer and the schedule are the offline
trainer's and run on across refreshes. As TRL's GRPO buffers a generation over
`steps_per_generation` steps, with the window's own candidates instead of a group's.
"""

from __future__ import annotations

import math
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
from pofe.args.nash_md import NashMDConfig
from pofe.columns import PI_0_LOGPS
from pofe.compat.trainer import StepBatches
from pofe.data.tokenize import tokenize_row
from pofe.distributed import rank_and_world
from pofe.logs import get_logger
from pofe.methods import method_spec
from pofe.online.made_with import made_with
from pofe.online.mixture import MixtureGenerator
from pofe.online.models import Pi0Policy, policy_for_refresh
from pofe.online.monitor import Monitor
from pofe.online.opponents import opponent_stats, play_window, preference_rows
from pofe.online.prompts import PROMPT_COLUMNS, PROMPT_INDEX, PROMPT_ROW, PROMPT_SOURCE
from pofe.online.refresh import (
    LOGP,
    TOKENS,
    RefreshContext,
    Refreshed,
    Window,
    judged_columns,
    sample_and_judge,
    trainable_rows,
    with_scores,
    write_refresh,
)
from pofe.online.resume import OnlineRefreshError, ResumedRefreshes
from pofe.online.sampling import sampler_for
from pofe.online.stats import dropped_candidates, window_stats
from pofe.online.summary import ConsoleCadence, all_pairs_tied, refresh_summary
from pofe.records.refresh import FOLDER, merged_stats, refresh_record, refresh_starts
from pofe_candidates.build import empty_samples_warning
from pofe_candidates.judges import make_judge

LOG = get_logger(__name__)


class OnlineTraining(ResumedRefreshes, StepBatches):
    """Mixed in before a `KResponseTrainer` subclass by `online_trainer`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.spec = method_spec(self.args.pofe_method)
        self._left: list[dict] = []  # the current window's collated batches not yet trained on
        self._judge = None  # made at the first refresh, kept for the run
        self._first_window = True  # this process's first: a new training's, or a resumed one's
        self._noted = False  # whether a console line said which refreshes' lines the console shows
        self.rank, self.world = rank_and_world()

    # axolotl sets `axolotl_cfg` after the trainer is built: what it holds is read at the first refresh
    @cached_property
    def pofe(self) -> PofeConfig:
        return pofe_config(self.axolotl_cfg)

    @cached_property
    def _pi_0(self) -> Pi0Policy:
        return Pi0Policy(self.axolotl_cfg, self.accelerator)

    @cached_property
    def _made_with(self) -> dict:
        """What this recipe makes a refresh's rows with (`refresh.made_with`), recorded in each
        and checked against one a resumed run reads back."""
        cfg = self.axolotl_cfg
        return made_with(self.pofe, cfg.sequence_len, base_model=cfg.base_model, revision=cfg.revision_of_model)

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

    def batch_columns(self) -> list[str]:
        # the prompt columns reach the collator; candidates come at each refresh
        return list(PROMPT_COLUMNS)

    def step_batches(self, epoch_iterator, num_batches: int) -> list[dict]:
        if not self._left:
            self._left = self._next_window(epoch_iterator, num_batches)
        batches, self._left = self._left[:num_batches], self._left[num_batches:]
        return batches

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
            if self._first_window:
                self._clear_refreshes_from(start)
            prompt_rows = {i: row for b in pulled for i, row in zip(b[PROMPT_INDEX].tolist(), b[PROMPT_ROW])}
            sources = {i: s for b in pulled for i, s in zip(b[PROMPT_INDEX].tolist(), b[PROMPT_SOURCE])}
            refreshed = self._refresh(Window(start, batches), prompt_rows, sources)
        self._first_window = False
        steps = math.ceil(len(pulled) / per_step)  # the window's steps: fewer than refresh_every at an epoch's end
        self._log_refresh(refreshed, last=start + steps >= self.state.max_steps)
        return [self._collate(rows, refreshed, m) for m, rows in enumerate(refreshed.rows)]

    def _collate(self, rows: list[dict], refreshed: Refreshed, m: int) -> dict:
        if not rows:
            window = refreshed.window
            raise OnlineRefreshError(
                f"online refresh at step {window.start_step}: no prompt of micro-batch {m} (prompts "
                f"{window.micro_batches[m]}) kept {self.pofe.candidates.min_candidates} candidates. "
                f"{dropped_candidates(refreshed.stats, self._folder(window.start_step))}"
            )
        return self.data_collator.rows(rows)

    # -- a refresh --------------------------------------------------------------------

    def _refresh(self, window: Window, prompt_rows: dict[int, dict], sources: dict[int, str]) -> Refreshed:
        """Sample, judge and score the window's candidates; write them before any step trains.
        `sources`: each prompt's file and row, for the judge's errors."""
        pofe, timings = self.pofe, defaultdict(float)
        folder = self._folder(window.start_step)
        if folder.exists() and refresh_record(folder) is None:  # a killed run's, cut short: its files go
            shutil.rmtree(folder)
        if self._judge is None:
            self._judge = make_judge(pofe.judge)
        with policy_for_refresh(self) as model:
            timer = partial(_timed, timings)
            generated, judged, kept, played = self._judged(model, window, prompt_rows, sources, timer)
            silent = empty_samples_warning(
                generated, f"online refresh at step {window.start_step}", folder / "generate.jsonl"
            )
            monitored, measured = self._monitor.due(window.start_step), {}
            with _timed(timings, "score"):
                logp, pi_0_logps = self._scores(model, [kept[i][TOKENS] for i in kept], monitored)
            if monitored:
                with _timed(timings, "monitor"):
                    measured = self._monitor.measure(model)
        data_rows, kl = [], []
        for j, (index, row) in enumerate(kept.items()):
            record = {"prompt_index": index, **row["data"], TOKENS: row[TOKENS]}
            if logp is not None:
                record[LOGP] = logp[j]
            if pi_0_logps is not None:
                record[PI_0_LOGPS] = pi_0_logps[j]
                kl.extend(a - b for a, b in zip(logp[j], pi_0_logps[j]))
            data_rows.append(record)
        stats = window_stats(generated, judged, kept, kl) | played | {f"{k}_seconds": v for k, v in timings.items()}
        if monitored:
            columns = {i: judged_columns(row) for i, row in prompt_rows.items()}
            measured |= self._monitor.observe(generated, judged, data_rows, columns)
        stats |= measured
        refreshed = Refreshed(window, self._batched(window, data_rows), stats, (silent,) if silent else ())
        write_refresh(
            folder,
            refreshed,
            generated,
            judged,
            data_rows,
            made=self._made_with,
            refresh_every=pofe.online.refresh_every,
        )
        return refreshed

    def _judged(
        self, model, window: Window, prompt_rows: dict[int, dict], sources, timer
    ) -> tuple[list, list, dict, dict]:
        """The window's generate and judge rows, its trainable rows (`trainable_rows`' shape) and
        the stats of its opponents: a method that plays the mixture (Nash-MD) judges each sample
        against one of the mixture's (`pofe.online.opponents`), the others judge the candidates."""
        pofe = self.pofe
        ctx = RefreshContext(
            generator=self._sampler.generator(model, self._folder(window.start_step)),
            judge=self._judge,
            tokenizer=self.processing_class,
            method=self.spec,
            generate=pofe.generate.for_method(pofe.method),  # dedupe: the method's default unless set
            judge_cfg=pofe.judge,
            candidates=pofe.candidates.for_method(pofe.method),
            timer=timer,
        )
        if self.spec.opponent != "mixture":
            generated, judged = sample_and_judge(window, prompt_rows, ctx, sources)
            return generated, judged, trainable_rows(judged, self.spec, pofe.candidates, self._tokenize), {}
        mixture = (pofe.nash_md or NashMDConfig()).mixture_coef
        opponent = MixtureGenerator(
            model,
            partial(self._pi_0.forward, model),
            self.processing_class,
            mixture_coef=mixture,
            batch_size=pofe.generate.batch_size,
        )
        generated, judged = play_window(window, prompt_rows, ctx, opponent, sources)
        kept = preference_rows(judged, self.spec, self._tokenize)
        return generated, judged, kept, opponent_stats(judged, kept, self.spec, opponent.distance.mean)

    def _scores(
        self, model, rows: list[dict], monitored: bool
    ) -> tuple[list[list[float]] | None, list[list[float]] | None]:
        """The policy's summed log-probs of each kept candidate when the method anchors on them or
        pi_0's are scored, and pi_0's for kl_coef, anchor_mix or a loss that reads them (None: not
        measured), and on a monitored refresh under LoRA/QLoRA, where pi_0 is the adapter disabled
        (no second model), so that `online/kl_to_pi_0` shows the drift without a KL penalty too."""
        scores_pi_0 = self.pofe.online_scores_pi_0 or (monitored and self._pi_0.is_adapter)
        if not rows or not (self.spec.needs_anchor or scores_pi_0):
            return None, None
        logp = self.score_table(model, rows, "the policy's")
        if not scores_pi_0:
            return logp, None
        with self._pi_0.scoring(model) as pi_0_model:
            return logp, self.score_table(pi_0_model, rows, "pi_0's")

    def score_table(self, model, rows: list[dict], what: str) -> list[list[float]]:
        """`model`'s summed log-probs of each response of `rows` (their prompt_ids and
        response_ids), as the trainer scores a batch's candidates, without gradients."""
        # the columns the loss reads only pass the trainer's batch check: scoring does not read them
        dataset = Dataset.from_list(
            [
                {**r, **dict.fromkeys(self.required_keys, [0.0] * len(r["response_ids"])), "row_id": j}
                for j, r in enumerate(rows)
            ]
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

    # -- what a user watches ------------------------------------------------------------

    def _log_refresh(self, refreshed: Refreshed, *, last: bool) -> None:
        """`online/*` in the training log for every refresh (counts summed over the ranks, the rest
        means weighted by prompts); a console line for those `ConsoleCadence` shows (`last`: the
        run's last refresh), and its warnings always."""
        # each rank's stats, merged as the report merges the written ones
        means = merged_stats(gather_object([refreshed.stats]))
        start = refreshed.window.start_step
        number = sum(s <= start for s in refresh_starts(self.args.output_dir))
        self.log({"online/refresh": float(number), **{f"online/{k}": v for k, v in means.items()}})
        tied = all_pairs_tied(number, start, means, self.pofe.judge, self._folder(start))
        warnings = [*refreshed.warnings, *([tied] if tied else [])]
        online = self.pofe.online
        cadence = ConsoleCadence(self.state.logging_steps, online.refresh_every, online.monitor_every)
        warned = bool(warnings or means.get("judge_abstentions") or means.get("prompts_dropped"))
        if cadence.shows(number, monitored=self._monitor.due(start), last=last, warned=warned):
            note = "" if self._noted else cadence.note(Path(self.args.output_dir) / FOLDER)
            self._noted = True
            LOG.info(refresh_summary(number, start, means) + note)
        for warning in warnings:
            LOG.warning(warning)
        self._monitor.show(start, number, means)


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
