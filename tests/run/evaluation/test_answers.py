"""Evaluation's answers (`pofe.run.evaluation.answers`): their decoding."""

from __future__ import annotations

from pofe.args import PofeConfig
from pofe.args.rounds import EvalConfig


def test_held_out_answers_get_the_candidates_token_budget():
    """Unset, the held-out cap is the candidates' (a 64-token cap under 2048-token candidates, as
    the SPPO recipes had, cut every model's answers at one length); a set cap wins; no generate
    block: 64."""
    from pofe.run.evaluation.answers import held_out_sampling

    blocks = {
        "generate": {"backend": "transformers", "max_new_tokens": 2048},
        "judge": {"type": "python", "function": "m:f"},
    }
    cfg = PofeConfig(method="sppo", rounds=2, **blocks)
    assert held_out_sampling(cfg.eval, cfg.generate).max_new_tokens == 2048
    cfg = PofeConfig(method="sppo", rounds=2, eval={"max_new_tokens": 32}, **blocks)
    assert held_out_sampling(cfg.eval, cfg.generate).max_new_tokens == 32
    assert held_out_sampling(EvalConfig(), None).max_new_tokens == 64


def test_answers_stored_before_samples_were_cut_at_a_user_turn_are_answered_again(tmp_path):
    """A model's held-out part stored under the sampler identity of a POFE that did not cut samples
    at a user turn ({"engine": "transformers"}) is not read back by one that does: its answers may
    hold a user turn of their own, so they are sampled (and cut) again."""
    from pofe.run.evaluation.answers import AnswerStore
    from pofe.run.evaluation.sampler import eval_sampler

    store = AnswerStore(tmp_path)
    key = {"model": "m", "sampling": {"seed": 0}}
    store.put("pi_0", "held_out", {**key, "sampler": {"engine": "transformers"}}, {"samples": []})
    sampler = eval_sampler(None, "transformers", "unused", None, 1, tmp_path)
    assert store.get("pi_0", "held_out", {**key, "sampler": sampler.identity}) is None
    assert store.get("pi_0", "held_out", {**key, "sampler": {"engine": "transformers"}}) == {"samples": []}
