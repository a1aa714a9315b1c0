"""Resuming an online run: the written refresh a checkpoint's step falls in, read back once it is
found to be made as this recipe makes refreshes, and the refreshes a killed run left beyond it."""

from __future__ import annotations

import shutil
from pathlib import Path

from pofe.errors import PofeError
from pofe.logs import get_logger
from pofe.online.made_with import setting_changes
from pofe.online.refresh import Refreshed, Window, read_refresh
from pofe.records.refresh import RefreshRecord, refresh_dir, refresh_record, refresh_starts

LOG = get_logger(__name__)


class OnlineRefreshError(PofeError, RuntimeError):
    """A refresh cannot feed the steps it is for."""


class ResumedRefreshes:
    """Mixed into `OnlineTraining`: where this rank's refreshes are written, and what a resumed run
    reads back of them. Reads the trainer's args, state, ranks, `pofe`, `_made_with` and `_batched`."""

    def _folder(self, start_step: int) -> Path:
        return refresh_dir(self.args.output_dir, start_step, self.rank, self.world)

    def _stored_window(self, step: int, per_step: int):
        """The written refresh whose steps include `step` (a resumed run's), if any, once checked
        to be made as this recipe makes them (`_check_made_with`)."""
        if step == 0:
            return None
        for start in reversed([s for s in refresh_starts(self.args.output_dir) if s <= step]):
            folder = self._folder(start)
            record = refresh_record(folder)
            if record is None:
                continue
            end = start + -(-len(record.micro_batches) // per_step)
            if step >= end:
                self._say_refresh_every(record, step, f"step {step} samples a new window")
                return None
            self._check_made_with(folder, record, step, end)
            feeds = f"steps {step}-{end - 1} train" if end - 1 > step else f"step {step} trains"
            self._check_rows(folder, start, step, feeds)
            self._say_refresh_every(record, step, f"{feeds} on its rows (steps {start}-{end - 1})")
            return read_refresh(folder)
        return None

    def _say_refresh_every(self, record: RefreshRecord, step: int, feeds: str) -> None:
        """A resumed run whose refresh_every is not the one its last refresh was sampled for goes on
        (the rows are the policy's samples whatever the window's length), and says so: from the
        resumed step the windows are this recipe's length, which the killed run's were not."""
        every, then = self.pofe.online.refresh_every, record.refresh_every
        if then != every:
            LOG.warning(
                f"POFE: online: the refresh of step {record.start_step} was sampled for refresh_every {then}; "
                f"this recipe's is {every}: {feeds}, and the refreshes after it come every {every} steps. Resume "
                f"with refresh_every: {then} to keep the killed run's schedule"
            )

    def _check_rows(self, folder: Path, start: int, step: int, feeds: str) -> None:
        """A finished refresh whose rows.jsonl is gone (deleted by hand, a partial copy) cannot feed
        the steps the checkpoint left of its window: stopped, naming the file, rather than sampled
        again in its place unasked (as a folder deleted whole is)."""
        rows = folder / "rows.jsonl"
        if not rows.is_file():
            raise OnlineRefreshError(
                f"resuming at step {step}: the refresh of step {start} ({folder}), whose rows {feeds} on, has its "
                f"refresh.json but no {rows.name} ({rows} is missing). Restore the file; or delete {folder.parent if self.world > 1 else folder}: "
                f"the run then samples and judges a new window at step {step}"
            )

    def _check_made_with(self, folder: Path, record: RefreshRecord, step: int, end: int) -> None:
        """Stop when the refresh read back was made otherwise than this recipe makes refreshes
        (another judge, other generate settings...): its rows are what the checkpoint trained
        on, and the steps left of its window would train on them in this recipe's name. Stopped,
        not redone: as an iterated run's training resumed with other settings stops
        (`pofe.run.rounds.checkpoints.check_resume`), since the checkpoint is the other
        settings' work; the message says how to go on with these settings."""
        if record.made_with == self._made_with:
            return
        start = record.start_step
        raise OnlineRefreshError(
            f"resuming at step {step}: the refresh of step {start} ({folder}), whose rows steps {start}-{end - 1} "
            f"train on, was made otherwise than this recipe makes them: "
            f"{setting_changes(record.made_with, self._made_with)}. Resume with the recipe that made it; "
            f"or, to go on with this recipe's settings, delete {folder.parent if self.world > 1 else folder}: "
            f"the run then samples and judges a new window at step {step} (the checkpoint keeps what it learnt "
            "from the old one); or start afresh in a new output_dir"
        )

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

    def _clear_refreshes_from(self, step: int) -> None:
        """Before this process samples its first window, at `step`, the refreshes written from
        that step on are removed: at step 0 an earlier training's (a new training replaces them,
        as it does the checkpoints); at a resumed step that no finished refresh holds (deleted, or
        cut short by the kill), the killed run's beyond its checkpoint, on a schedule this run no
        longer follows: a later window would read their rows back as its own."""
        starts = refresh_starts(self.args.output_dir) if self.rank == 0 else []
        stale = [s for s in starts if s >= step]
        later = [s for s in stale if s > step]
        if step and self.rank == 0:
            cut = step in starts
            (LOG.info if cut else LOG.warning)(
                f"POFE: online: resuming at step {step}, which no finished refresh holds "
                f"({'its refresh was cut short' if cut else f'refreshes start at steps {starts}'}): sampling a new "
                f"window at step {step} with the checkpoint's policy, then every {self.pofe.online.refresh_every} steps"
            )
        if step == 0 and stale:
            LOG.warning(
                f"POFE: online: a new training in {self.args.output_dir}: replacing {len(stale)} earlier refreshes"
            )
        elif later:
            LOG.warning(
                f"POFE: online: removing the {len(later)} refreshes the killed run wrote after step {step} (steps "
                f"{later}): this run samples its own windows from there"
            )
        for start in stale:
            shutil.rmtree(refresh_dir(self.args.output_dir, start))
        # no rank writes its first refresh before rank 0 has cleared the folder
        self.accelerator.wait_for_everyone()
