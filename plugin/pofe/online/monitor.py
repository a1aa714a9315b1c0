"""What an online run shows besides `online/*`, every `pofe.online.monitor_every` refreshes: the
policy's perplexity of held-out reference responses, and a few of the refresh's sampled
completions with their judgements.

The RRHF paper's warning about online sampling: its proxy reward rose while the perplexity of
reference responses went from 14 to 63.78 ("very friendly but meaningless" responses) until a KL
penalty held it. A judge's rising reward alone does not tell learning from hacking; the
perplexity of responses the judge never saw, and the completions themselves, do.

- **Perplexity.** The held-out prompts are `axolotl pofe eval`'s: `pofe.eval.prompts` (a file) or
  the last `pofe.eval.held_out` rows of the recipe's dataset, never trained on; each one's
  `pofe.eval.reference_column` is its reference response. The refresh's policy (before the
  window trains) scores them as it scores candidates (the chat template, eos_token, the length
  policy), and exp(-sum log pi / tokens) over all of them is `online/reference_perplexity`.
- **A second judge.** With `pofe.eval.judge2` (an independent judge, `axolotl pofe eval`'s guard
  against judge exploitation), every policy sample of the refresh is judged again, and its mean
  reward is `online/judge2_reward_mean`: the recipe's judge rising while this one falls is a
  hack.
- **Completions.** The policy's own samples of the window's first `monitor_samples` prompts,
  each with the judges' rewards or win rates (and the log-ratio to pi_0 where it is scored): in
  the console, in `<output_dir>/online/monitor.jsonl` (one record per monitored refresh), and in
  the tracker as the table `online/completions` (wandb, trackio), as TRL's GRPO logs its
  completions table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pofe.columns import PI_0_LOGPS
from pofe.data.formats import RowFormat, prompt_row, row_error
from pofe.data.held_out import held_out_count, hold_out
from pofe.data.messages import prompt_messages
from pofe.data.sources import load_entry, read_json_rows
from pofe.files import read_jsonl, write_jsonl_atomic
from pofe.logs import get_logger
from pofe.methods import method_spec
from pofe.online.refresh import LOGP
from pofe.records.refresh import FOLDER, refresh_starts
from pofe_candidates.abstentions import AbstentionTally, check_abstentions
from pofe_candidates.judges import make_judge
from pofe_candidates.shard_work import judge_shard

LOG = get_logger(__name__)

FILE = "monitor.jsonl"  # under <output_dir>/online/


class Monitor:
    """An online trainer's monitor: due at every `monitor_every`-th refresh, where it measures the
    policy (`measure`) and keeps the refresh's completions until the refresh is logged (`show`).

    `tokenize(canonical row) -> tokenised row` and `score(model, rows, what) -> summed log-probs
    per response` are the trainer's, so a reference is read and scored as a candidate is."""

    def __init__(self, cfg, pofe, output_dir: str, *, tokenize, score, main: bool, report_to: list[str] | None):
        self.cfg, self.pofe, self.folder = cfg, pofe, Path(output_dir) / FOLDER
        self.tokenize, self.score, self.main, self.report_to = tokenize, score, main, report_to
        self.every, self.count = pofe.online.monitor_every, pofe.online.monitor_samples
        self._references: list[dict] | None = None  # token ids, read at the first measure
        self._completions: list[dict] | None = None  # the last measured refresh's, until shown
        self._judge2 = None  # pofe.eval.judge2, made at its first use

    def due(self, step: int) -> bool:
        """Whether the refresh starting at `step` is monitored: the 1st, the 1 + monitor_every-th, ..."""
        earlier = sum(start < step for start in refresh_starts(self.folder.parent))
        return self.every > 0 and earlier % self.every == 0

    def measure(self, model) -> dict[str, float]:
        """{"reference_perplexity": the policy's perplexity of the held-out references}, or {}
        when the recipe holds none out."""
        if self._references is None:
            self._references = self._read_references()
        if not self._references:
            return {}
        logps = self.score(model, self._references, "the policy's reference")
        lengths = [len(r["response_ids"][0]) for r in self._references]
        return {"reference_perplexity": perplexity([row[0] for row in logps], lengths)}

    def _read_references(self) -> list[dict]:
        rows, source = reference_rows(self.cfg, self.pofe)
        tokenized = [self.tokenize(row) for row in rows]
        kept = [{"prompt_ids": t["prompt_ids"], "response_ids": t["response_ids"]} for t in tokenized if t["keep"]]
        if not source:
            LOG.info(
                "POFE: online monitor: no held-out prompts (pofe.eval.prompts or pofe.eval.held_out): the policy's "
                "perplexity of reference responses is not measured"
            )
        elif rows and not kept:
            LOG.warning(
                f"POFE: online monitor: all {len(rows)} reference responses of the held-out prompts ({source}) are "
                "dropped by the length policy (sequence_len, pofe.truncation): the perplexity is not measured"
            )
        elif kept:
            dropped = f" ({len(rows) - len(kept)} dropped by the length policy)" if len(kept) < len(rows) else ""
            LOG.info(
                f"POFE: online monitor: the policy's perplexity of {len(kept)} reference responses{dropped} of the "
                f"held-out prompts, {source}, {'every refresh' if self.every == 1 else f'every {self.every} refreshes'} "
                "(online/reference_perplexity)"
            )
        return kept

    def observe(self, generated: list[dict], judged: list[dict], data_rows: list[dict], columns: dict) -> dict:
        """Keep the refresh's completions to show (`completions`), with the log-ratio to pi_0 where
        scored and, with `pofe.eval.judge2`, the second judge's verdicts; returns the second judge's
        mean reward of all the policy's samples ({"judge2_reward_mean": ...}, or {}).
        `columns`: prompt index -> the prompt row's other columns (for judges that read them)."""
        logratios = {
            row["prompt_index"]: dict(zip(row["responses"], (a - b for a, b in zip(row[LOGP], row[PI_0_LOGPS]))))
            for row in data_rows
            if PI_0_LOGPS in row
        }
        second = self._second_opinion(generated, columns)
        self._completions = completions(generated, judged, self.count, logratios, second)
        rewards = [x for row in second for x in (row.get("rewards") or [])]
        return {"judge2_reward_mean": sum(rewards) / len(rewards)} if rewards else {}

    def _second_opinion(self, generated: list[dict], columns: dict) -> list[dict]:
        """pofe.eval.judge2's verdicts on the policy's samples (a judge shard's rows), [] without one."""
        cfg = self.pofe.eval.judge2 if self.pofe.eval else None
        if cfg is None:
            return []
        if self._judge2 is None:
            self._judge2 = make_judge(cfg)
        sampled = [_policy_only(g) for g in generated]
        target = method_spec(self.pofe.method).target
        judged = judge_shard(sampled, self._judge2, target, cfg, [columns[g["index"]] for g in sampled])
        # a judge2 that raises abstains: held to its limit as the recipe's judge is, not left out of the line
        check_abstentions(
            AbstentionTally().plus(judged),
            limit=cfg.max_abstention_rate,
            judge=cfg.function or cfg.type,
            unit="pairs" if cfg.is_pairwise else "candidates",
            final=True,
            setting="pofe.eval.judge2",
            redo="this refresh is not written: a resumed run samples and judges it again",
        )
        return judged

    def show(self, step: int, number: int, stats: dict[str, float]) -> None:
        """The kept completions in the console, monitor.jsonl and the tracker (the main process;
        nothing for a refresh read back on resume, which was shown when it was sampled)."""
        records, self._completions = self._completions, None
        if records is None or not self.main:
            return
        if records:
            LOG.info(
                f"POFE: online refresh {number}'s samples (prompt -> completion xN: judgement; every one in "
                f"{FOLDER}/{FILE}):\n" + "\n".join(console_lines(records))
            )
        write_record(self.folder, step, number, stats, records)
        log_table(self.report_to, step, records)


def reference_rows(cfg, pofe) -> tuple[list[dict[str, Any]], str]:
    """The held-out prompts that have a reference response, as canonical rows (prompt as chat
    messages, the reference as the one assistant response), and where they came from ("" when
    the recipe holds none out)."""
    ecfg = pofe.eval
    if not ecfg or not (ecfg.prompts or ecfg.held_out):
        return [], ""
    if ecfg.prompts:
        path = ecfg.prompts
        raw = read_json_rows(path) if path.endswith((".json", ".jsonl")) else _table_rows(path)
        fmt = RowFormat(
            dataset=path, type="pofe.prompts", method=pofe.method, fields={"field_prompt": ecfg.prompt_column}
        )
        start, source = 0, f"{path} (pofe.eval.prompts)"
    else:
        n = held_out_count(pofe, cfg.datasets)
        entry = cfg.datasets[0]
        fmt = RowFormat.of_entry(entry, 0, pofe)
        everything = load_entry(entry, cfg.hf_use_auth_token)
        _, raw, _ = hold_out(everything, fmt, n)
        start, source = len(everything) - n, f"the last {n} rows of {entry.path} (pofe.eval.held_out)"
    column, prompt_column = ecfg.reference_column, fmt.column("field_prompt")
    rows = []
    for i, row in enumerate(raw):
        read = prompt_row(row, start + i, fmt, [column])
        reference = read.get(column)
        if isinstance(reference, str) and reference.strip():
            prompt = prompt_messages(read[prompt_column], prompt_column, row_error(fmt.dataset, start + i))
            rows.append({"prompt": prompt, "responses": [{"role": "assistant", "content": reference}]})
    if not rows:
        LOG.warning(
            f"POFE: online monitor: none of the {len(raw)} held-out prompts ({source}) has a reference response in "
            f"column {column!r} (pofe.eval.reference_column): the policy's perplexity of reference responses is not "
            "measured. Name the column that holds one to measure it"
        )
    return rows, source


def _table_rows(path: str) -> list[dict]:
    from datasets import load_dataset

    return load_dataset("parquet" if path.endswith(".parquet") else "csv", data_files=path, split="train").to_list()


def perplexity(logps: list[float], lengths: list[int]) -> float:
    """exp(-sum_i logp_i / sum_i |y_i|): the per-token perplexity of responses whose summed
    log-probs are `logps` and whose token counts are `lengths`."""
    return math.exp(-sum(logps) / sum(lengths))


def _policy_only(row: dict) -> dict:
    """A generate shard row with the policy's own samples only (the dataset's responses left out)."""
    keep = [s == "policy" for s in row["sources"]]
    per_candidate = ("candidates", "sources", "finish_reasons", "candidate_ids", "candidate_tokens")
    return {
        **row,
        **{k: [v for v, kept in zip(row[k], keep) if kept] for k in per_candidate if row.get(k) is not None},
    }


def completions(
    generated: list[dict],
    judged: list[dict],
    count: int,
    logratios: dict[int, dict[str, float]],
    second: list[dict] = (),
) -> list[dict[str, Any]]:
    """The policy's own samples of the window's first `count` prompts, in window order, with the
    judge's labels: {prompt, completion, finish_reason, reward and/or win_rate, logratio_to_pi_0,
    judge2_reward or judge2_win_rate}. `logratios`: prompt index -> {response: log pi - log pi_0},
    where pi_0 scored the response; `second`: the second judge's shard rows (`Monitor.observe`)."""
    seconds = {row["index"]: row for row in second}
    out = []
    for g, r in list(zip(generated, judged, strict=True))[:count]:
        # the judge keeps the candidates' order, less abstentions: the k-th copy of a text judged
        # is the k-th copy generated (the dataset's answer and a sample may be the same text)
        unclaimed = list(zip(g["candidates"], g["sources"], g["finish_reasons"]))
        ratios = logratios.get(r["index"], {})
        other = seconds.get(r["index"], {})
        for j, response in enumerate(r["responses"]):
            _, source, finish = unclaimed.pop(next(i for i, (c, _, _) in enumerate(unclaimed) if c == response))
            if source != "policy":
                continue
            record = {"prompt": r["prompt"], "completion": response, "finish_reason": finish}
            record |= _labels(r, j)
            if response in ratios:
                record["logratio_to_pi_0"] = ratios[response]
            if response in other.get("responses", []):
                record |= {f"judge2_{k}": v for k, v in _labels(other, other["responses"].index(response)).items()}
            out.append(record)
    return out


def _labels(row: dict, j: int) -> dict[str, float]:
    """A judge shard row's verdicts on its j-th response: reward (scalar judges), win_rate."""
    return {
        name: row[column][j] for column, name in (("rewards", "reward"), ("win_rates", "win_rate")) if row.get(column)
    }


# distinct completions of a prompt shown in the console, the most frequent first; the rest are
# counted in one line (monitor.jsonl and the tracker's table hold every sample)
CONSOLE_COMPLETIONS = 4


def console_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per distinct completion of a prompt, the most frequent first: prompt -> completion,
    how many samples said it when more than one ("x12"), and its judgement (the mean over those
    samples: a win rate against opponents differs between copies of one text). Past
    CONSOLE_COMPLETIONS distinct completions, one line counts the others."""
    groups: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        prompt = r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][-1]["content"]
        groups.setdefault(prompt, {}).setdefault(r["completion"], []).append(r)
    shown = ("reward", "win_rate", "judge2_reward", "judge2_win_rate", "logratio_to_pi_0")
    lines = []
    for prompt, by_text in groups.items():
        ranked = sorted(by_text.items(), key=lambda item: -len(item[1]))  # stable: first sampled first on a tie
        for text, copies in ranked[:CONSOLE_COMPLETIONS]:
            means = {k: [c[k] for c in copies if k in c] for k in shown}
            verdict = ", ".join(f"{k} {sum(v) / len(v):.3f}" for k, v in means.items() if v)
            times = f" x{len(copies)}" if len(copies) > 1 else ""
            lines.append(f"  {_short(prompt)!r} -> {_short(text)!r}{times}: {verdict}")
        rest = ranked[CONSOLE_COMPLETIONS:]
        if rest:
            samples = sum(len(copies) for _, copies in rest)
            lines.append(f"  {_short(prompt)!r} -> {len(rest)} other completions ({samples} samples)")
    return lines


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def write_record(folder: Path, step: int, refresh: int, stats: dict[str, float], records: list[dict]) -> None:
    """Write the refresh's record into `folder`/monitor.jsonl after the records of earlier steps:
    a later step's (a killed run's, resumed before it) or an earlier run's records are dropped."""
    path = folder / FILE
    kept = [r for r in read_jsonl(path) if r["step"] < step] if path.exists() else []
    record = {"step": step, "refresh": refresh, "reference_perplexity": stats.get("reference_perplexity")}
    write_jsonl_atomic(path, [*kept, {**record, "completions": records}])


def log_table(report_to: list[str] | None, step: int, records: list[dict[str, Any]]) -> None:
    """The completions as the tracker's table `online/completions` (a column per field), to each
    of wandb (with a run) and trackio in `report_to`, as TRL's GRPOTrainer logs its completions."""
    if not records:
        return
    backends = []
    if "wandb" in (report_to or []):
        import wandb

        if wandb.run is not None:
            backends.append(wandb)
    if "trackio" in (report_to or []):
        import trackio

        backends.append(trackio)
    if not backends:
        return
    import pandas as pd

    frame = pd.DataFrame(
        [
            {"step": step, **r, "prompt": json.dumps(r["prompt"]) if not isinstance(r["prompt"], str) else r["prompt"]}
            for r in records
        ]
    )
    for backend in backends:
        backend.log({"online/completions": backend.Table(dataframe=frame)})
