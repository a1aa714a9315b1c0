"""The strict base models every config block builds on: unknown keys refused with the nearest
known one, numbers finite and in range, stated with the range they must lie in."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo


def check_keys(data: dict[str, Any], known: Iterable[str], renamed: Mapping[str, str] | None = None) -> None:
    """Refuse the keys of `data` not in `known`: a key POFE renamed with its new name (`renamed`:
    old name to new), any other with the nearest known key (difflib's, as Python's own "did you
    mean" picks one), else with the keys there are."""
    known, renamed = list(known), renamed or {}
    unknown = [key for key in data if key not in known]
    if not unknown:
        return
    said = []
    for key in unknown:
        near = difflib.get_close_matches(str(key), known, n=1)
        if key in renamed:
            said.append(f"{key!r} (renamed {renamed[key]!r}: rename the key, its value is read as before)")
        else:
            said.append(f"{key!r} (did you mean {near[0]!r}?)" if near else repr(key))
    hint = "" if all("(" in s for s in said) else f"; the keys here: {', '.join(sorted(known))}"
    raise ValueError(f"unknown key{'s' * (len(unknown) > 1)} {', '.join(said)}{hint}")


# pydantic's errors for a number it refuses: not finite, or past one of the field's bounds
RANGE_ERRORS = frozenset({"finite_number", "greater_than", "greater_than_equal", "less_than", "less_than_equal"})
BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def _holds_floats(annotation) -> bool:
    return annotation is float or any(map(_holds_floats, get_args(annotation)))


def allowed_range(field: FieldInfo) -> str:
    """What a numeric field takes, from its type and declared bounds: "a finite number >= 0.0 and <= 1.0",
    "a whole number >= 1"."""
    kind = "a finite number" if _holds_floats(field.annotation) else "a whole number"
    bounds = [f"{sign} {getattr(m, name)}" for m in field.metadata for name, sign in BOUNDS if hasattr(m, name)]
    return " ".join([kind, " and ".join(bounds)]).strip()


class KnownKeys(BaseModel):
    """A config block whose unknown keys are typos: refused, each named with the nearest key,
    instead of pydantic's "Extra inputs are not permitted"; and whose numbers are finite.

    pydantic's floats take `.inf` and `.nan` unless told not to, and infinity passes a `ge` bound:
    `kl_coef: .inf` validated, and the first step's loss went NaN. Every block refuses them, and a
    number out of range is named with its value and the range it must lie in (pydantic's message
    has neither the value, which `hide_input_in_errors` leaves out, nor, for infinity, the range).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # keys a block had under an older name (old: new), refused with the new name
    renamed_keys: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict):
            check_keys(data, cls.model_fields, cls.renamed_keys)
        return data

    @field_validator("*", mode="wrap")
    @classmethod
    def _number_in_range(cls, value, handler, info):
        try:
            return handler(value)
        except ValidationError as error:
            # a nested block's errors are its own (their loc is inside it), already said this way
            if not all(e["type"] in RANGE_ERRORS and len(e["loc"]) <= 1 for e in error.errors()):
                raise
            allowed = allowed_range(cls.model_fields[info.field_name])
            each = "each " if isinstance(value, list | tuple) else ""
            raise ValueError(f"{info.field_name}: {value!r} is out of range; set {each}{allowed}") from None


class StrictConfig(KnownKeys):
    # Errors never repeat the input: it may be a key pasted where it does not belong (`api_key:`).
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError(
                "api_key: keys are never read from the config (it is written to logs and "
                "outputs); put the key in an environment variable and set api_key_env to that "
                "variable's name."
            )
        if isinstance(data, dict):
            check_keys(data, cls.model_fields, cls.renamed_keys)
        return data
