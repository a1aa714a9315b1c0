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
