"""The user's recipe (`pofe.run.recipe`): what its fingerprint covers."""

from __future__ import annotations

import json

from pofe.run.recipe import recipe_fingerprint
from tests.helpers import ITERATED_RAW


def test_fingerprint_ignores_rounds_and_eval_only():
    other = json.loads(json.dumps(ITERATED_RAW))
    other["pofe"]["rounds"] = 5
    other["pofe"]["eval"] = {"held_out": 9}
    assert recipe_fingerprint(other) == recipe_fingerprint(ITERATED_RAW)
    other["learning_rate"] = 1.0
    assert recipe_fingerprint(other) != recipe_fingerprint(ITERATED_RAW)


def test_overrides_apply_as_axolotl_resolves_them():
    """axolotl's CLI passes `--num-epochs 3` as the text "3" and its `load_cfg` casts it: the
    recipe every stage derives from takes the value axolotl's validated config holds (and the
    text as given where that holds none, e.g. `rl`, which POFE moves); `trl__beta` is nested."""
    from enum import Enum

    from axolotl.utils.dict import DictDefault

    from pofe.run.recipe import with_overrides

    class Scheduler(Enum):
        COSINE = "cosine"

    cfg = DictDefault(num_epochs=3.0, lr_scheduler=Scheduler.COSINE, trl={"beta": 0.5}, rl=None)
    overrides = {"num_epochs": "3", "lr_scheduler": "cosine", "trl__beta": "0.5", "rl": "sppo"}
    got = with_overrides(ITERATED_RAW, overrides, cfg)
    assert (got["num_epochs"], got["lr_scheduler"], got["trl"], got["rl"]) == (3.0, "cosine", {"beta": 0.5}, "sppo")
    assert ITERATED_RAW.get("num_epochs") is None  # a copy
    assert recipe_fingerprint(got) != recipe_fingerprint(ITERATED_RAW)
