"""An online training's refreshes: `<output_dir>/online/refresh-<step>/refresh.json` (under several
processes, one per rank: `refresh-<step>/rank-<r>/refresh.json`).

`pofe.online` writes a window's refresh.json after its rows, so a folder without one is a killed
run's, redone on resume: the window (its first step, the prompts of each micro-batch), its stats
(`online/*`), the refresh_every it was sampled for and what made its rows (`made_with`). A resumed
run reads it back; the run report reads every finished one (`written_refreshes`), its stats merged
over the ranks as the training logged them (`merged_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pofe.records import Record

FOLDER = "online"

# window stats that add up over ranks; the others are means weighted by each rank's prompts
COUNTS = (
    "prompts",
    "prompts_dropped",
    "candidates",
    "candidates_empty",
    "candidates_duplicate",
    "candidates_truncated",
    "candidates_cut_at_user_turn",
    "opponents_cut_at_user_turn",
    "judge_verdicts",
    "judge_abstentions",
    "pairs",
    "pairs_tied",
)


class RefreshRecord(Record):
    """refresh.json: one rank's window of one refresh."""

    # 2: the stats name KL to pi_0 `kl_to_pi_0`, and this field is recorded
    FORMAT: ClassVar[int] = 2
    format: Literal[2] = 2
    start_step: int
    micro_batches: list[list[int]]
    stats: dict[str, float]
    refresh_every: int
    made_with: dict[str, Any]


def merged_stats(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One refresh's stats over its ranks, as `online/*` logs them: counts summed, the others
    means weighted by each rank's prompts (over the ranks that measured them)."""
    merged = {}
    for key in dict.fromkeys(k for stats in per_rank for k in stats):
        having = [s for s in per_rank if key in s]
        if key in COUNTS:
            merged[key] = sum(s[key] for s in having)
        elif sum(s["prompts"] for s in having):
            merged[key] = sum(s[key] * s["prompts"] for s in having) / sum(s["prompts"] for s in having)
    return merged


def refresh_starts(output_dir: str | Path) -> list[int]:
    """The first steps of the refreshes in `output_dir`, in order (finished or not)."""
    return sorted(int(p.name.split("-")[1]) for p in (Path(output_dir) / FOLDER).glob("refresh-*"))


def refresh_dir(output_dir: str | Path, start_step: int, rank: int = 0, world: int = 1) -> Path:
    """Where the refresh starting at `start_step` is written (each rank its own, under several)."""
    folder = Path(output_dir) / FOLDER / f"refresh-{start_step:07d}"
    return folder / f"rank-{rank}" if world > 1 else folder


def refresh_record(folder: Path) -> RefreshRecord | None:
    """A rank's finished refresh (its refresh.json); None when not finished."""
    return RefreshRecord.read_if_written(
        folder / "refresh.json", f"Delete {folder}: a resumed run samples the window again"
    )


@dataclass(frozen=True)
class WrittenRefresh:
    """A finished refresh as its files hold it: the step it fed first, its folders (one per
    rank), its stats merged over the ranks (`merged_stats`)."""

    start_step: int
    folders: list[Path]
    stats: dict[str, float]


def written_refreshes(output_dir: str | Path) -> list[WrittenRefresh]:
    """Every finished refresh of the online training in `output_dir`, in step order. A refresh
    whose refresh.json some rank has not written yet (a killed run's last) is left out, as a
    resumed run redoes it."""
    out = []
    for start in refresh_starts(output_dir):
        folder = refresh_dir(output_dir, start)
        folders = sorted(folder.glob("rank-*")) or [folder]
        if not all((f / "refresh.json").is_file() for f in folders):
            continue
        records = [refresh_record(f) for f in folders]
        out.append(WrittenRefresh(records[0].start_step, folders, merged_stats([r.stats for r in records])))
    return out
