"""The k-response row shapes POFE reads, checked and brought to one canonical form.

Canonical row (what tokenisation sees), with the method's label column (`Target.column`):
    {"prompt": [chat messages], "responses": [assistant messages] * k,
     <label column>: [float] * k,                   # rewards (rl: rrhf), win_rates (rl: sppo)
     "anchor_logps": [float] * k | None,            # methods with an anchor only (rl: sppo)
     "source_prompt": text or chat messages}         # the prompt as a judge reads it (evaluation)

With `prompt_format: hh` on the `datasets:` entry, the prompt and the responses are
Anthropic HH transcripts, turned into chat messages first (`transcripts.py`). TRL's
preference layouts read as TRL reads them: a prompt column or none (the responses' shared
start is the prompt, `implicit_prompt.py`), conversations or plain text, and a pair's
`score_chosen` / `score_rejected` as its labels. Messages are checked in `messages.py`.

A row trains as text, no chat template (`AS_TEXT`), when its entry's `prompt_format` is `text`, or
`auto` (TRL's rule, `pofe.pairs`' default) and its prompt is text; POFE's own rows default to
`chat` (docs/data-formats.md says why). Its canonical prompt is still one user message.

Every problem is a `PofeDataError` naming the dataset, the row, the field, what was
wrong and what to do: nothing is dropped here. Labels are checked as training will see
them, in float32: a value that overflows it, or rewards that differ but round to the
same float32, are errors; so are identical responses with different labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pofe.columns import ANCHOR_LOGPS, AS_TEXT, DEFAULT_FIELDS, SPLIT_IN_WORD
from pofe.data.implicit_prompt import implicit_prompt, splits_a_word
from pofe.data.label_checks import check_labels, check_labels_agree, label_log_probs, label_number, label_numbers
from pofe.data.messages import prompt_messages, response_message
from pofe.data.transcripts import hh_row
from pofe.errors import PofeError
from pofe.methods import Target, method_spec

PROMPT_FORMATS = ("auto", "chat", "text", "hh")


class PofeDataError(PofeError, ValueError):
    """A dataset row POFE cannot train on."""


@dataclass(frozen=True)
class RowFormat:
    """How to read one dataset entry's rows."""

    dataset: str  # the entry's path, for messages
    type: str  # pofe.rrhf | pofe.pairs | pofe.sppo | pofe.sppo_ucla
    method: str  # a registered method (`pofe.methods`): its target's column is what a row yields
    fields: Mapping[str, str]

    def __post_init__(self):
        check_prompt_format(self.prompt_format, self.dataset, self.type)

    @classmethod
    def of_entry(cls, entry, index: int, pofe) -> RowFormat:
        """The format of the recipe's `datasets[index]` entry, with its `field_*` keys (which
        `pofe.dataset_fields` holds: axolotl's dataset schema drops them)."""
        fields = pofe.dataset_fields[index] if index < len(pofe.dataset_fields) else {}
        return cls(dataset=entry.path, type=entry.type, method=pofe.method, fields=fields)

    def column(self, key: str) -> str:
        return self.fields.get(key, DEFAULT_FIELDS[key])

    @property
    def prompt_format(self) -> str:
        """The entry's `prompt_format`; unset, TRL's rule (`auto`) on TRL's layout (`pofe.pairs`),
        `chat` on POFE's own (see the module)."""
        return self.fields.get("prompt_format") or ("auto" if self.type == "pofe.pairs" else "chat")

    def renders_as_text(self, prompt: Any) -> bool:
        """Whether a row with this prompt (given, or its responses' shared start) trains as text."""
        return self.prompt_format == "text" or (self.prompt_format == "auto" and isinstance(prompt, str))

    def response_columns(self) -> list[str]:
        """The columns holding responses: the k-response list, or chosen and rejected."""
        if self.type in ("pofe.rrhf", "pofe.sppo"):
            return [self.column("field_responses")]
        return [self.column("field_chosen"), self.column("field_rejected")]

    def required_columns(self) -> list[str]:
        """The columns every row needs. The prompt is not among them: a row without one takes
        its responses' shared start (`implicit_prompt`, TRL's implicit-prompt layout)."""
        if self.type == "pofe.rrhf":
            return [self.column("field_responses")]
        if self.type == "pofe.sppo":
            return [self.column("field_responses"), self.column("field_win_rates")]
        pair = [self.column("field_chosen"), self.column("field_rejected")]
        if self.type == "pofe.sppo_ucla":
            # the SPPO scripts (compute_prob.py) write no prompt column: it is the conversations'
            # shared user turn (a prompt column, when there is one, is read instead)
            return pair + ["chosen_probs_win", "chosen_probs_lose"]
        return pair

    def score_columns(self) -> list[str]:
        """A pair's scores (TRL's `score_chosen` / `score_rejected`), read when present."""
        return [self.column("field_score_chosen"), self.column("field_score_rejected")]


def check_prompt_format(value: str, dataset: str, type_: str | None = None) -> None:
    if value not in PROMPT_FORMATS:
        raise PofeDataError(
            f"dataset {dataset}: prompt_format {value!r} is not one of {list(PROMPT_FORMATS)}; use hh "
            "for Anthropic HH transcripts ('\\n\\nHuman: ...\\n\\nAssistant:'), text for text trained without "
            "the chat template, or leave it out"
        )
    if type_ == "pofe.prompts" and value in ("text", "auto"):  # candidates are sampled after the template
        raise PofeDataError(
            f"dataset {dataset}: prompt_format {value} on a pofe.prompts entry: the candidate pipeline samples "
            "after the chat-templated prompt, where training scores them; leave prompt_format out (or chat, hh)"
        )


def check_columns(fmt: RowFormat, columns: list[str]) -> None:
    """Fail before row 0 when a whole column is missing."""
    missing = [c for c in fmt.required_columns() if c not in columns]
    if fmt.type == "pofe.rrhf" and not missing:
        if fmt.column("field_rewards") not in columns and fmt.column("field_ranks") not in columns:
            missing = [f"{fmt.column('field_rewards')} (or {fmt.column('field_ranks')})"]
    scores = [c for c in fmt.score_columns() if c in columns] if fmt.type == "pofe.pairs" else []
    if len(scores) == 1:
        missing = [c for c in fmt.score_columns() if c not in columns]
    if missing:
        unpaired = {"completion", "label"} <= set(columns)
        unpaired = (
            " It has TRL's unpaired layout (completion, label: KTO's), which holds no pairs." if unpaired else ""
        )
        raise PofeDataError(
            f"dataset {fmt.dataset}: missing column(s) {missing} for type {fmt.type}; "
            f"it has {columns}. Rename the columns or map them with "
            f"`field_*` keys on the dataset entry (e.g. field_chosen: preferred).{unpaired}"
        )


def ordered_label_columns(fmt: RowFormat, columns: list[str]) -> list[str] | None:
    """The two columns a pair's labels come from when they rank chosen above rejected (the
    SPPO authors' win rates, TRL's scores): a row where they do not is suspicious. None: the
    labels are the pair's order itself, or k responses'."""
    if fmt.type == "pofe.sppo_ucla":
        return ["chosen_probs_win", "chosen_probs_lose"]
    if fmt.type == "pofe.pairs" and all(c in columns for c in fmt.score_columns()):
        return fmt.score_columns()
    return None


def implicit_prompt_note(fmt: RowFormat, columns: list[str]) -> str | None:
    """What the log says when an entry has no prompt column: where its prompts come from."""
    if fmt.column("field_prompt") in columns or fmt.prompt_format == "hh":
        return None
    return (
        f"POFE: dataset {fmt.dataset} has no {fmt.column('field_prompt')!r} column: each row's prompt is the "
        f"shared start of its {' and '.join(fmt.response_columns())} (TRL's implicit-prompt layout); name a "
        "prompt column with field_prompt if it has one"
    )


def row_error(dataset: str, index: int):
    """`fail(field, what, fix)`: the error for one field of row `index` of `dataset`."""

    def fail(field: str, what: str, fix: str) -> PofeDataError:
        return PofeDataError(f"dataset {dataset}, row {index} (0-based), field '{field}': {what}. {fix}")

    return fail


def template_refused(dataset: str, index: int, column: str, tokenizer_name: str, message: str) -> PofeDataError:
    """The error for row `index` of `dataset` whose `column` the chat template would not render
    (`pofe_candidates.render.ChatTemplateError`'s `message`)."""
    return row_error(dataset, index)(
        column,
        f"the chat template of {tokenizer_name} raised: {message}",
        "Give this row's messages in the roles and order the template accepts (e.g. user and assistant "
        "turns alternating, a system message only first), or set `chat_template:` to one that accepts them "
        "(e.g. chatml).",
    )


def prompt_row(row: Mapping[str, Any], index: int, fmt: RowFormat, response_columns: list[str]) -> dict[str, Any]:
    """A `pofe.prompts` row as the pipeline reads it: with `prompt_format: hh`, its prompt
    as chat messages and each of `response_columns` (`generate.include_dataset_responses`)
    as the response text; otherwise as it is, its prompt checked as training checks it (an
    unknown role, an empty message) before any candidate is generated for it."""
    fail = row_error(fmt.dataset, index)
    if fmt.prompt_format == "hh":
        return hh_row(row, fmt.column("field_prompt"), response_columns, fail)
    prompt_messages(row.get(fmt.column("field_prompt")), fmt.column("field_prompt"), fail)
    return dict(row)


def source_prompt(row: Mapping[str, Any], index: int, fmt: RowFormat) -> Any:
    """The row's prompt as a judge reads it (text or chat messages): the prompt column's value,
    or, without one, the prompt its responses share; HH transcripts as chat messages."""
    if fmt.type == "pofe.prompts":
        return prompt_row(row, index, fmt, [])[fmt.column("field_prompt")]
    return _with_prompt(row, fmt, row_error(fmt.dataset, index))[fmt.column("field_prompt")]


def normalize_row(row: Mapping[str, Any], index: int, fmt: RowFormat) -> dict[str, Any]:
    """Check one raw row and return its canonical form (see module docstring), with the prompt
    as a judge reads it under `source_prompt`."""
    fail = row_error(fmt.dataset, index)
    row = _with_prompt(row, fmt, fail)
    prompt_col = fmt.column("field_prompt")
    as_text = fmt.renders_as_text(row.get(prompt_col))
    if as_text and not isinstance(row.get(prompt_col), str):
        what = f"prompt_format: text reads a text prompt; this is {row.get(prompt_col)!r:.60}"
        raise fail(prompt_col, what, "Give the prompt as text, or drop prompt_format: text (chat messages need it).")
    prompt = prompt_messages(row.get(prompt_col), prompt_col, fail)
    responses, names = _responses(row, fmt, fail)
    spec = method_spec(fmt.method)
    labels, label_names = _labels(row, fmt, len(responses), fail)
    check_labels(spec.target, labels, label_names, responses, names, fail)
    out: dict[str, Any] = {"prompt": prompt, "responses": responses, spec.target.column: labels}
    out["source_prompt"] = row[prompt_col]
    out[AS_TEXT] = as_text
    out[SPLIT_IN_WORD] = bool(row.get(SPLIT_IN_WORD))
    if spec.needs_anchor:
        anchor_col = fmt.column("field_anchor_logps")
        out[ANCHOR_LOGPS] = (
            label_log_probs(row, anchor_col, len(responses), fail) if row.get(anchor_col) is not None else None
        )
    return out


def candidate_row(row: Mapping[str, Any], index: int, *, target: Target, source: str) -> dict[str, Any]:
    """A row of POFE's own candidate pipeline (`data.jsonl`) in canonical form.

    The pipeline has checked what it wrote (non-empty candidates, labels from its judge), so
    only the shapes change: the prompt becomes chat messages, each response an assistant
    message. Identical candidate texts stay as sampled: SPPO keeps all K samples, and
    a judge's verdicts on two copies of one text may differ. `response_ids` (the sampled ids,
    None for a dataset response) pass through when the pipeline kept them.
    """
    out = {
        "prompt": prompt_messages(row["prompt"], "prompt", row_error(source, index)),
        "responses": [{"role": "assistant", "content": text} for text in row["responses"]],
        target.column: row[target.column],
        "source_prompt": row["prompt"],
    }
    if row.get("response_ids") is not None:  # the ids the policy sampled: trained as they are
        out["response_ids"] = row["response_ids"]
    return out


def _responses(row: Mapping[str, Any], fmt: RowFormat, fail) -> tuple[list[dict], list[str]]:
    """The row's responses as assistant messages, and each one's field name for errors."""
    if fmt.type in ("pofe.rrhf", "pofe.sppo"):
        resp_col = fmt.column("field_responses")
        raw = row.get(resp_col)
        if not isinstance(raw, (list, tuple)):
            raise fail(
                resp_col, f"expected a list of responses, got {type(raw).__name__}", "Give k >= 2 responses per row."
            )
        responses = [
            response_message(
                r,
                lambda what, fix, j=j: fail(f"{resp_col}[{j}]", what, fix),
                "Remove the empty candidate or regenerate it.",
            )
            for j, r in enumerate(raw)
        ]
        if len(responses) < 2:
            raise fail(resp_col, f"k = {len(responses)} response(s)", "Ranking needs k >= 2 responses per prompt.")
        return responses, [f"{resp_col}[{j}]" for j in range(len(responses))]
    chosen_col, rejected_col = fmt.column("field_chosen"), fmt.column("field_rejected")
    responses = [
        response_message(
            row.get(col),
            lambda what, fix, col=col: fail(col, what, fix),
            "Both responses of a pair must be non-empty.",
        )
        for col in (chosen_col, rejected_col)
    ]
    return responses, [chosen_col, rejected_col]


def _labels(row: Mapping[str, Any], fmt: RowFormat, k: int, fail) -> tuple[list[float], list[str]]:
    """The row's k labels as its dataset type gives them, and each label's field for errors."""
    if fmt.type == "pofe.pairs":
        return _pair_labels(row, fmt, fail)
    if fmt.type == "pofe.sppo_ucla":
        # The SPPO authors' release: chosen/rejected plus each one's win rate.
        names = ["chosen_probs_win", "chosen_probs_lose"]
        return [label_number(row, name, fail) for name in names], names
    if fmt.type == "pofe.sppo":
        col = fmt.column("field_win_rates")
        labels = label_numbers(row, col, k, fail)
        for other, ranks in ((fmt.column("field_rewards"), False), (fmt.column("field_ranks"), True)):
            if row.get(other) is not None:
                numbers = label_numbers(row, other, k, fail)
                check_labels_agree(labels, col, numbers, other, fail, ranks=ranks, drop=f"drop {other}")
    elif row.get(fmt.column("field_rewards")) is not None:
        col = fmt.column("field_rewards")
        labels = label_numbers(row, col, k, fail)
        if row.get(fmt.column("field_ranks")) is not None:
            ranks_col = fmt.column("field_ranks")
            drop = f"keep one of the two columns (drop {ranks_col}, or drop {col} to train on the ranks)"
            ranks = label_numbers(row, ranks_col, k, fail)
            check_labels_agree(labels, col, ranks, ranks_col, fail, ranks=True, drop=drop)
    else:
        # rank 1 is the best response; a reward only needs to order them
        col = fmt.column("field_ranks")
        ranks = label_numbers(row, col, k, fail)
        for j, r in enumerate(ranks):
            if r < 0:
                raise fail(
                    f"{col}[{j}]",
                    f"rank {r:g} is negative",
                    "Ranks are positions, 1 (or 0) = best; "
                    "scores where higher is better go in the rewards column (field_rewards).",
                )
        labels = [-r for r in ranks]
    return labels, [f"{col}[{j}]" for j in range(k)]


def _pair_labels(row: Mapping[str, Any], fmt: RowFormat, fail) -> tuple[list[float], list[str]]:
    """A pair's labels: 1 and 0; with scores (TRL's `score_chosen` / `score_rejected`, the
    layout of `trl-lib/ultrafeedback_binarized`), the scores themselves as rewards, or as win
    rates P(chosen beats rejected) and its complement: 1 and 0, 1/2 each on a tie, 0 and 1
    when rejected scored higher (the loader counts such rows)."""
    names = fmt.score_columns()
    if row.get(names[0]) is None and row.get(names[1]) is None:
        return [1.0, 0.0], [fmt.column("field_chosen"), fmt.column("field_rejected")]
    chosen, rejected = (label_number(row, name, fail) for name in names)
    if not method_spec(fmt.method).target.from_win_rates:
        return [chosen, rejected], names
    p = 1.0 if chosen > rejected else 0.5 if chosen == rejected else 0.0
    return [p, 1.0 - p], names


def _with_prompt(row: Mapping[str, Any], fmt: RowFormat, fail) -> Mapping[str, Any]:
    """`row` with its prompt read: HH transcripts turned into chat messages, and a missing
    prompt taken from what its responses share (`_with_implicit_prompt`)."""
    if fmt.prompt_format == "hh":
        row = hh_row(row, fmt.column("field_prompt"), fmt.response_columns(), fail)
    if row.get(fmt.column("field_prompt")) is None:
        row = _with_implicit_prompt(row, fmt, fail)
    return row


def _with_implicit_prompt(row: Mapping[str, Any], fmt: RowFormat, fail) -> dict[str, Any]:
    """`row` with the prompt its responses share (`implicit_prompt`) in the prompt column and
    what remains of each response in place of the response."""
    row = dict(row)
    columns = fmt.response_columns()
    if len(columns) == 1:  # k responses in one list column
        values = row.get(columns[0])
        if not isinstance(values, (list, tuple)) or len(values) < 2:
            return row  # `_responses` says what is wrong with the column
        names = [f"{columns[0]}[{j}]" for j in range(len(values))]
    else:
        values, names = [row.get(c) for c in columns], columns
    prompt, rests = implicit_prompt(values, names, fail, pair=len(columns) == 2)
    row[fmt.column("field_prompt")] = prompt
    row[SPLIT_IN_WORD] = isinstance(prompt, str) and splits_a_word(prompt, rests)
    if len(columns) == 1:
        row[columns[0]] = rests
    else:
        row.update(zip(columns, rests))
    return row
