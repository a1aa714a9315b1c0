"""GPM (arXiv 2410.02197): the paper's formulas worked by hand, and the judge on tiny random
checkpoints in the authors' layout (tests/candidates/gpm_checkpoint.py) against the same
formulas computed apart from it."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
import torch

from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges import JudgeError, make_judge
from pofe_candidates.judges.gpm import PROMPT_TOO_LONG, GPMJudge, gpm_preferences, gpm_scores
from pofe_candidates.render import as_messages
from pofe_candidates.win_rates import win_rates
from tests.candidates.gpm_checkpoint import write_gpm_checkpoint
from tests.helpers import float_tolerance

HIDDEN = 32
PROMPTS = ["12+7=", [{"role": "user", "content": "3+4="}]]
RESPONSES = [["19", "18", "nineteen", "1", "a longer wrong answer"], ["7", "8", "seven"]]
# float32 sums behind one hidden state: the width x the longest input (< 48 tokens here)
TERMS = HIDDEN * 48


def p_tolerance(tau: float, scale: float = 1.0) -> float:
    """What float32 rounding can move a P by between two computations of one forward (batched and
    padded vs alone): the hidden states, and so the embeddings and scales, carry a relative error
    up to rtol (`float_tolerance`); s sums products of two unit vectors' coordinates weighted by
    scales summing to at most k, |s| <= max lambda <= 1 (Cauchy-Schwarz per block), so
    |ds| <= 3 rtol (each embedding and lambda once); P = sigmoid(scale s / tau) moves by at most
    a quarter of its argument's change."""
    rtol = float_tolerance(torch.float32, TERMS)["rtol"]
    return 0.25 * scale / tau * 3 * rtol


# ---- the formulas, by hand -----------------------------------------------------------------


def test_bradley_terry_is_the_one_block_special_case():
    """v_y = (r_y, 1), unnormalised, one block, no prompt scale: s_ij = r_i * 1 - 1 * r_j = r_i - r_j.
    r = (1, 0, -0.5) at tau = 1: P01 = sigmoid(1) = 0.7310586, P02 = sigmoid(1.5) = 0.8175745,
    P12 = sigmoid(0.5) = 0.6224593; the authors' formation doubles the argument:
    P01 = sigmoid(2) = 0.8807971, P02 = sigmoid(3) = 0.9525741, P12 = sigmoid(1) = 0.7310586."""
    r = torch.tensor([1.0, 0.0, -0.5])
    s = gpm_scores(torch.stack([r, torch.ones(3)], dim=1))
    assert torch.equal(s, (r[:, None] - r[None, :]).double())
    p = gpm_preferences(s, tau=1.0)
    upper = p[[0, 0, 1], [1, 2, 2]]
    assert torch.allclose(upper, torch.tensor([0.7310586, 0.8175745, 0.6224593], dtype=torch.float64), atol=1e-7)
    assert torch.allclose(p, torch.sigmoid((r[:, None] - r[None, :]).double()), rtol=0, atol=1e-15)
    authors = gpm_preferences(s, tau=1.0, mode="authors")[[0, 0, 1], [1, 2, 2]]
    assert torch.allclose(authors, torch.tensor([0.8807971, 0.9525741, 0.7310586], dtype=torch.float64), atol=1e-7)
    assert torch.equal(p.diagonal(), torch.full((3,), 0.5, dtype=torch.float64))


def test_unit_embeddings_in_one_block_express_a_cycle():
    """Unit vectors at 0, 120 and 240 degrees: s_ij = cos a_i sin a_j - sin a_i cos a_j = sin(a_j - a_i),
    so s01 = s12 = s20 = sin(120 deg) = sqrt(3)/2: y0 beats y1, y1 beats y2 and y2 beats y0, each
    with P = sigmoid(sqrt(3)/2) = 0.7039180 at tau = 1, and every win rate is (1/2 + P + 1 - P)/3 =
    1/2. No scalar reward orders three responses so."""
    a = torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3], dtype=torch.float64)
    p = gpm_preferences(gpm_scores(torch.stack([a.cos(), a.sin()], dim=1)), tau=1.0)
    for i, j in ((0, 1), (1, 2), (2, 0)):
        assert p[i, j].item() == pytest.approx(0.7039180, abs=1e-7)
    assert torch.allclose(win_rates(p), torch.full((3,), 0.5, dtype=torch.float64), atol=1e-15)


def test_each_block_is_scaled_by_its_prompt_weight():
    """Two blocks, lambda = (0.25, 0.75), e1..e4 the unit axes: s(e1, e2) = 0.25 (1 * 1 - 0 * 0) = 0.25,
    s(e3, e4) = 0.75, s(e1, e3) = 0 (blocks never mix), s(e2, e1) = -0.25. The same from R built as
    the paper writes it, diag(0.25 J, 0.75 J) with J = [[0, -1], [1, 0]]: s_ij = (R e_i) . e_j."""
    e = torch.eye(4)
    lam = torch.tensor([0.25, 0.75])
    s = gpm_scores(e, lam)
    assert (s[0, 1].item(), s[2, 3].item(), s[0, 2].item(), s[1, 0].item()) == (0.25, 0.75, 0.0, -0.25)
    j = torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    r = torch.block_diag(0.25 * j, 0.75 * j)
    assert torch.equal(s, (e @ r.T @ e.T).double())
    with pytest.raises(ValueError, match=r"scales must be \(k,\) = \(2,\)"):
        gpm_scores(e, torch.ones(3))
    with pytest.raises(ValueError, match="an even width"):
        gpm_scores(torch.ones(2, 3))


# ---- checkpoints in the authors' layout ------------------------------------------------------


@pytest.fixture(scope="module")
def gpm_dirs(tmp_path_factory) -> dict[str, Path]:
    """A 6-dim GPM with a prompt head in two shards (as GPM-Llama-3.1-8B is stored), and a 4-dim
    one without, in one file."""
    root = tmp_path_factory.mktemp("gpm")
    return {
        "prompt_head": write_gpm_checkpoint(root / "prompt_head", hidden=HIDDEN, value_dim=6, shards=True),
        "no_prompt_head": write_gpm_checkpoint(root / "plain", hidden=HIDDEN, value_dim=4, prompt_head=False, seed=1),
    }


def reference_preferences(path: Path, prompt, responses: list[str], tau: float, mode: str) -> torch.Tensor:
    """One prompt's P as the paper defines it and the authors' pipeline reads the model, written
    out apart from the judge: the whole causal LM loaded by transformers, one sequence at a time
    (no padding); the chat template over the prompt and the response, the last token made EOS;
    the heads read from the safetensors files; v = W_v h_last / |W_v h_last|, lambda = softmax(W_p
    h at the prompt's last token); R as a (2k, 2k) matrix; P = sigmoid(<R v_i, v_j> / tau)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(path)
    lm = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    weights = {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}
    w_v, w_p = weights["value_head.weight"], weights.get("prompt_head.weight")
    conv = as_messages(prompt)
    prompt_len = len(tok(tok.apply_chat_template(conv, tokenize=False))["input_ids"])
    vs, lam = [], None
    for r in responses:
        ids = tok(tok.apply_chat_template([*conv, {"role": "assistant", "content": r}], tokenize=False))["input_ids"]
        ids[-1] = tok.eos_token_id
        with torch.no_grad():
            h = lm.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # (T, H)
        v = w_v @ h[-1]
        vs.append(v / v.norm())
        if lam is None and w_p is not None:
            lam = torch.softmax(w_p @ h[prompt_len - 1], dim=0)
    d = w_v.shape[0]
    lam = torch.ones(d // 2) if lam is None else lam
    big_r = torch.zeros(d, d)
    for b in range(d // 2):
        big_r[2 * b + 1, 2 * b], big_r[2 * b, 2 * b + 1] = lam[b], -lam[b]
    s = torch.tensor([[float((big_r @ vi) @ vj) for vj in vs] for vi in vs], dtype=torch.float64)
    return torch.sigmoid((2.0 if mode == "authors" else 1.0) * s / tau)


@pytest.mark.parametrize("mode", ["probability", "authors"])
@pytest.mark.parametrize("layout", ["prompt_head", "no_prompt_head"])
def test_matches_the_paper_computed_apart(gpm_dirs, layout, mode):
    """The judge's matrices (batches of 3 over both prompts' 8 candidates, padded) equal the
    reference's within float32 rounding (`p_tolerance`), and the reference's P spread ten times
    that from 1/2 (a state read at a wrong position, or a head misapplied, would show);
    P + P.T = 1 and the diagonal is 1/2; one judge call per candidate."""
    path = gpm_dirs[layout]
    judge = make_judge(JudgeConfig(type="gpm", model=str(path), batch_size=3, preferences=mode))
    assert isinstance(judge, GPMJudge) and (judge.model.prompt_head is None) == (layout == "no_prompt_head")
    verdicts = judge.preferences(PROMPTS, RESPONSES)
    for prompt, responses, verdict in zip(PROMPTS, RESPONSES, verdicts, strict=True):
        p, ref = verdict.matrix, reference_preferences(path, prompt, responses, 0.1, mode)
        assert p.shape == (len(responses),) * 2 and verdict.abstained_pairs == 0
        tol = p_tolerance(0.1, 2.0 if mode == "authors" else 1.0)
        assert (p - ref).abs().max().item() <= tol
        assert (ref - 0.5).abs().max().item() > 10 * tol
        assert torch.allclose(p + p.T, torch.ones_like(p), rtol=0, atol=1e-15)
        assert torch.equal(p.diagonal(), torch.full((len(responses),), 0.5, dtype=torch.float64))
    assert judge.stats.calls == 8


def test_one_forward_per_response(gpm_dirs):
    """K forwards for a K x K matrix: the backbone runs 8 sequences for 5 + 3 candidates, in
    ceil(8 / 3) = 3 batches."""
    judge = GPMJudge.from_pretrained(str(gpm_dirs["prompt_head"]), batch_size=3)
    rows = []
    judge.model.backbone.register_forward_hook(
        lambda module, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    judge.preferences(PROMPTS, RESPONSES)
    assert rows == [3, 3, 2]


def test_batches_and_order_change_no_preference(gpm_dirs):
    """One candidate a batch or eight together (padding masked) give the same matrices up to
    rounding; reversing a prompt's candidates permutes its matrix."""
    base = GPMJudge.from_pretrained(str(gpm_dirs["prompt_head"]))
    one = GPMJudge(base.model, base.tokenizer, batch_size=1)
    for a, b in zip(one.preferences(PROMPTS, RESPONSES), base.preferences(PROMPTS, RESPONSES), strict=True):
        assert (a.matrix - b.matrix).abs().max().item() <= p_tolerance(0.1)
    (fwd,), (rev,) = base.preferences(PROMPTS[:1], RESPONSES[:1]), base.preferences(PROMPTS[:1], [RESPONSES[0][::-1]])
    perm = torch.arange(len(RESPONSES[0]) - 1, -1, -1)
    assert (fwd.matrix - rev.matrix[perm][:, perm]).abs().max().item() <= p_tolerance(0.1)


def test_a_prompt_that_fills_max_length_abstains(gpm_dirs, caplog):
    """The tiny template renders "12+7=" as <|user|>12+7=<|end|>: 7 tokens. At max_length 7 the
    prompt alone fills the input: its 10 pairs abstain, ties at 1/2, and with allow_abstain: false
    the judge stops naming the prompt. At max_length 12 an input of 7 + 1 (<|assistant|>) +
    len(text) + 1 (<|end|>) tokens is cut past 3 characters: "nineteen" (17 tokens) and the
    21-character answer (30) are read cut, with a warning, and the rest whole."""
    path = str(gpm_dirs["prompt_head"])
    judge = GPMJudge.from_pretrained(path, max_length=7)
    (v,) = judge.preferences(PROMPTS[:1], RESPONSES[:1])
    assert v.abstained_pairs == 10 and torch.equal(v.matrix, torch.full((5, 5), 0.5, dtype=torch.float64))
    assert v.abstain_reasons[0].startswith(PROMPT_TOO_LONG) and judge.stats.abstentions == 10
    strict = GPMJudge(judge.model, judge.tokenizer, max_length=7, allow_abstain=False)
    with pytest.raises(JudgeError, match=f"judge gave no verdict for prompt 0, .*: {PROMPT_TOO_LONG}"):
        strict.preferences(PROMPTS[:1], RESPONSES[:1])
    cut = GPMJudge(judge.model, judge.tokenizer, max_length=12)
    with caplog.at_level(logging.WARNING):
        (v,) = cut.preferences(PROMPTS[:1], RESPONSES[:1])
    assert v.abstained_pairs == 0 and "2 GPM input(s) longer than judge.max_length=12" in caplog.text
    whole = GPMJudge(judge.model, judge.tokenizer).preferences(PROMPTS[:1], RESPONSES[:1])[0].matrix
    assert (v.matrix[:2, :2] - whole[:2, :2]).abs().max().item() <= p_tolerance(0.1)  # "19", "18": not cut


def test_a_non_finite_embedding_abstains(gpm_dirs):
    """An overflow in the value head (here an inf weight) leaves no embedding: every pair ties
    at 1/2 and counts as abstained."""
    judge = GPMJudge.from_pretrained(str(gpm_dirs["no_prompt_head"]))
    judge.model.value_head.weight.data[0, 0] = math.inf
    (v,) = judge.preferences(PROMPTS[1:], RESPONSES[1:])
    assert v.abstained_pairs == 3 and v.abstain_reasons == ("non-finite GPM embedding",) * 3
    assert torch.equal(v.matrix, torch.full((3, 3), 0.5, dtype=torch.float64))


def test_checkpoints_not_in_the_layout_are_refused(gpm_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    src = gpm_dirs["no_prompt_head"]

    def variant(name: str, edit) -> str:
        d = tmp_path / name
        shutil.copytree(src, d)
        state = load_file(d / "model.safetensors")
        edit(state)
        save_file(state, str(d / "model.safetensors"))
        return str(d)

    with pytest.raises(ValueError, match="no value_head.weight: not a GPM checkpoint in the authors' layout"):
        GPMJudge.from_pretrained(variant("headless", lambda s: s.pop("value_head.weight")))
    with pytest.raises(ValueError, match=r"value_head.weight has shape \(3, 32\); .* an even 2k"):
        GPMJudge.from_pretrained(variant("odd", lambda s: s.update({"value_head.weight": torch.ones(3, HIDDEN)})))
    with pytest.raises(ValueError, match=r"prompt_head.weight has shape \(4, 32\); .* it is \(2, 32\)"):
        GPMJudge.from_pretrained(variant("wide", lambda s: s.update({"prompt_head.weight": torch.ones(4, HIDDEN)})))
    with pytest.raises(ValueError, match=r"backbone's weights are not all there \(missing \['layers.1"):
        GPMJudge.from_pretrained(variant("short", lambda s: [s.pop(k) for k in list(s) if ".layers.1." in k]))


def test_config():
    """judge.type: gpm needs a model; it forms preferences by probability (default) or authors,
    and reads judge.tau, which another judge refuses."""
    assert JudgeConfig(type="gpm", model="m").preferences == "probability"
    assert JudgeConfig(type="gpm", model="m", preferences="authors", tau=0.5).tau == 0.5
    with pytest.raises(ValueError, match=r"judge.type=gpm needs judge.model \(a local path or hub id\)"):
        JudgeConfig(type="gpm")
    with pytest.raises(ValueError, match="preferences: both_orders does not apply to judge.type: gpm; it takes"):
        JudgeConfig(type="gpm", model="m", preferences="both_orders")
    with pytest.raises(ValueError, match="judge.tau applies to judge.type: gpm, not to judge.type: pairrm"):
        JudgeConfig(type="pairrm", model="m", tau=0.5)
    spec = JudgeConfig(type="gpm", model="m").spec
    assert spec.pairwise and spec.loads_weights and spec.judge_calls(8) == 8


class FixedCandidates:
    """A generate backend answering every prompt with the same three candidates."""

    name = "fixed"

    def generate(self, prompts, n, sampling):
        return [["19", "nineteen", "18"][:n] for _ in prompts]


def test_candidates_and_evaluation_judge_with_gpm(gpm_dirs, tiny_policy, tmp_path):
    """SPPO's candidates judged by GPM: each row's win rates are the mean rows of the judge's
    matrix for the dataset's prompt (the GPM reads its own chat template, not the policy's
    rendering), and evaluation's `judge_models` gives the same preferences for the same texts."""
    from transformers import AutoTokenizer

    from pofe.run.evaluation.inputs import render_prompts
    from pofe.run.evaluation.judging import judge_models
    from pofe_candidates.config import CandidatesConfig, GenerateConfig
    from pofe_candidates.pipeline import run_pipeline

    cfg = JudgeConfig(type="gpm", model=str(gpm_dirs["prompt_head"]))
    judge = make_judge(cfg)
    result = run_pipeline(
        [{"prompt": p} for p in PROMPTS],
        policy_path=str(tiny_policy),
        method="sppo",
        judge=cfg,
        generate=GenerateConfig(num_candidates=3, max_new_tokens=4),
        candidates=CandidatesConfig(out_dir=str(tmp_path), progress=False),
        generator=FixedCandidates(),
        judge_impl=judge,
    )
    rows = [json.loads(line) for line in result.data_path.read_text().splitlines()]
    direct = judge.preferences(PROMPTS, [["19", "nineteen", "18"]] * 2)
    for row, verdict in zip(rows, direct, strict=True):
        assert row["responses"] == ["19", "nineteen", "18"]
        assert row["win_rates"] == pytest.approx(win_rates(verdict.matrix).tolist(), abs=1e-11)
    tok = AutoTokenizer.from_pretrained(tiny_policy)
    out = judge_models(judge, PROMPTS, render_prompts(tok, PROMPTS), [[["19"], ["nineteen"]], [["18"], ["19"]]])
    assert out["method"] == "pairwise"
    assert out["pref"][0, 0, 1].item() == pytest.approx(direct[0].matrix[0, 1].item(), abs=p_tolerance(0.1))
    assert out["pref"][1, 1, 0].item() == pytest.approx(direct[1].matrix[0, 2].item(), abs=p_tolerance(0.1))


def test_an_online_refresh_judges_with_gpm(gpm_dirs, tiny_policy):
    """An online SPPO refresh's judging (`pofe.online.refresh.sample_and_judge`): each prompt's
    win rates are the mean rows of the GPM's matrix for its candidates."""
    import contextlib

    from pofe.methods import method_spec
    from pofe.online.refresh import RefreshContext, Window, sample_and_judge
    from pofe_candidates.config import CandidatesConfig, GenerateConfig
    from pofe_candidates.models import load_tokenizer

    cfg = JudgeConfig(type="gpm", model=str(gpm_dirs["no_prompt_head"]))
    judge = make_judge(cfg)
    _, judged = sample_and_judge(
        Window(0, [[0, 1]]),
        {i: {"prompt": p} for i, p in enumerate(PROMPTS)},
        RefreshContext(
            generator=FixedCandidates(),
            judge=judge,
            tokenizer=load_tokenizer(str(tiny_policy)),
            method=method_spec("sppo"),
            generate=GenerateConfig(num_candidates=3, max_new_tokens=4),
            judge_cfg=cfg,
            candidates=CandidatesConfig(progress=False),
            timer=lambda stage: contextlib.nullcontext(),
        ),
    )
    direct = judge.preferences(PROMPTS, [["19", "nineteen", "18"]] * 2)
    for row, verdict in zip(sorted(judged, key=lambda r: r["index"]), direct, strict=True):
        assert row["win_rates"] == pytest.approx(win_rates(verdict.matrix).tolist(), abs=1e-11)
