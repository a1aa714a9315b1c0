"""What POFE's trainers read from the `pofe:` block, as fields of axolotl's TrainingArguments.

The trainers get their hyperparameters the way axolotl's own integrations do (kd's
`KDTrainingArgsMixin`): `PofePlugin.get_training_args_mixin` names the dataclass below,
which axolotl merges into `AxolotlTrainingArguments`, and `PofePlugin.get_training_args`
fills its fields from the `pofe:` block, validated once. Each field is the `pofe:` key
with a `pofe_` prefix, so none can clash with transformers' or axolotl's arguments.
Defaults, bounds and descriptions stay in `pofe.args.PofeConfig`; a field is None only
where the plugin did not fill it. Axolotl imports this module while it builds its
TrainingArguments class, so it imports nothing of axolotl's.
"""

from dataclasses import dataclass, field, fields
from typing import Any

from pofe.args import PofeConfig

PREFIX = "pofe_"


def _filled_from(key: str):
    return field(default=None, metadata={"help": f"`pofe.{key}`, set by PofePlugin.get_training_args"})


@dataclass
class PofeTrainingArgsMixin:
    """The `pofe:` keys the trainers, their scoring and their metrics read."""

    pofe_method: str | None = _filled_from("method")
    pofe_rank_weight: float | None = _filled_from("rank_weight")
    pofe_margin: float | None = _filled_from("margin")
    pofe_length_penalty: float | None = _filled_from("length_penalty")
    pofe_eta: float | None = _filled_from("eta")
    pofe_sppo_loss: str | None = _filled_from("sppo_loss")
    pofe_anchor_mix: float | None = _filled_from("anchor_mix")
    pofe_pi_0: str | None = _filled_from("pi_0")
    pofe_logit_chunk_size: int | None = _filled_from("logit_chunk_size")
    pofe_prefix_layout: str | None = _filled_from("prefix_layout")
    pofe_kl_coef: float | None = _filled_from("online.kl_coef")


def pofe_training_args(pofe: PofeConfig) -> dict[str, Any]:
    """`PofeTrainingArgsMixin`'s fields from a validated `PofeConfig`, as TrainingArguments kwargs."""
    return {f.name: getattr(pofe, f.name.removeprefix(PREFIX)) for f in fields(PofeTrainingArgsMixin)}
