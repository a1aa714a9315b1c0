"""Reward-model judge options: dtype, device_map, trust_remote_code and which output is the score
(a tiny multi-objective model whose own modeling file is loaded as custom code)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges import make_judge
from pofe_candidates.judges.reward_model import RewardModelJudge
from tests.helpers import approx_float

MODELING = Path(__file__).parent / "fixtures" / "multi_rm" / "modeling_multi_rm.py"
PROMPTS = ["What is 2+2?", [{"role": "user", "content": "Hi there"}]]
RESPONSES = [["4", "four, I think", "5"], ["hello", "a much longer greeting with words"]]


def _fixture_module():
    spec = importlib.util.spec_from_file_location("modeling_multi_rm", MODELING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def multi_rm(tmp_path_factory) -> Path:
    """A folder as a hub model with its own code: config.json's auto_map names the modeling file
    copied beside the weights; its model_type is unknown to transformers."""
    from pofe.demo.tiny import build_tokenizer

    module = _fixture_module()
    tok = build_tokenizer()
    cfg = module.MultiRMConfig(vocab_size=len(tok))
    cfg.auto_map = {
        "AutoConfig": "modeling_multi_rm.MultiRMConfig",
        "AutoModelForSequenceClassification": "modeling_multi_rm.MultiRM",
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = module.MultiRM(cfg)
        torch.nn.init.normal_(model.heads.weight, std=1.0)  # scores of order 1, not 1e-3
    path = tmp_path_factory.mktemp("multi-rm") / "multi-rm"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    shutil.copy(MODELING, path)
    return path


@pytest.fixture(scope="session")
def bf16_reward_model(tiny_reward_model, tmp_path_factory) -> Path:
    """The tiny reward model saved in bfloat16 (its config's dtype says so)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tmp_path_factory.mktemp("rm-bf16") / "rm"
    AutoModelForSequenceClassification.from_pretrained(tiny_reward_model, dtype=torch.bfloat16).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_reward_model).save_pretrained(path)
    return path


def _dtypes(judge: RewardModelJudge) -> set[torch.dtype]:
    return {p.dtype for p in judge.model.parameters()}


def test_dtype_is_applied_and_auto_reads_the_checkpoint(tiny_reward_model, bf16_reward_model):
    """bfloat16 scores differ from float32 ones (the forward ran in bf16) by bf16's rounding only."""
    fp32 = RewardModelJudge(str(tiny_reward_model), dtype="float32")
    bf16 = RewardModelJudge(str(tiny_reward_model), dtype="bfloat16")
    assert _dtypes(fp32) == {torch.float32} and _dtypes(bf16) == {torch.bfloat16}
    a, b = fp32.score(PROMPTS, RESPONSES), bf16.score(PROMPTS, RESPONSES)
    flat_a, flat_b = [x for r in a for x in r], [x for r in b for x in r]
    assert flat_a != flat_b and flat_b == pytest.approx(flat_a, abs=0.05)
    assert _dtypes(RewardModelJudge(str(tiny_reward_model), dtype="float16")) == {torch.float16}
    assert _dtypes(RewardModelJudge(str(tiny_reward_model))) == {torch.float32}  # auto: saved in float32
    assert _dtypes(RewardModelJudge(str(bf16_reward_model))) == {torch.bfloat16}  # auto: saved in bfloat16
    assert _dtypes(RewardModelJudge(str(bf16_reward_model), dtype="float32")) == {torch.float32}


def test_device_map_places_the_model(tiny_reward_model):
    """device_map reaches transformers: {"model": 0, "score": "cpu"} puts the body on GPU 0 and
    the score head on the CPU; on a machine without a GPU transformers refuses it, rather than
    the judge loading everything on the CPU. "cpu" scores as the default placement does here."""
    split = {"model": 0, "score": "cpu"}
    if torch.cuda.is_available():
        model = RewardModelJudge(str(tiny_reward_model), device_map=split).model
        assert model.model.embed_tokens.weight.device == torch.device("cuda", 0)
        assert model.score.weight.device == torch.device("cpu")
    else:
        with pytest.raises(RuntimeError, match="Cannot access accelerator device"):
            RewardModelJudge(str(tiny_reward_model), device_map=split)
    on_cpu = RewardModelJudge(str(tiny_reward_model), device_map="cpu")
    assert {p.device for p in on_cpu.model.parameters()} == {torch.device("cpu")}
    assert on_cpu.score(PROMPTS, RESPONSES) == RewardModelJudge(str(tiny_reward_model), device_map={"": "cpu"}).score(
        PROMPTS, RESPONSES
    )


def test_custom_code_needs_the_opt_in(multi_rm):
    with pytest.raises(ValueError, match="needs its own Python code .* set judge.trust_remote_code: true"):
        RewardModelJudge(str(multi_rm))


def test_multi_objective_scores_by_field_and_index(multi_rm):
    """Batched, padded scores == one unpadded forward of the fixture's class per pair: one
    objective (rewards[:, 2]) or the gated aggregate (score = rewards @ gate, by hand)."""
    from transformers import AutoTokenizer

    model = _fixture_module().MultiRM.from_pretrained(multi_rm).eval()
    tok = AutoTokenizer.from_pretrained(multi_rm)
    objective = RewardModelJudge(
        str(multi_rm), trust_remote_code=True, score_output="rewards", score_index=2, batch_size=2
    ).score(PROMPTS, RESPONSES)
    aggregate = make_judge(
        JudgeConfig(
            type="reward_model", model=str(multi_rm), trust_remote_code=True, score_output="score", batch_size=4
        )
    ).score(PROMPTS, RESPONSES)
    for prompt, rs, got_obj, got_agg in zip(PROMPTS, RESPONSES, objective, aggregate):
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        for r, o, a in zip(rs, got_obj, got_agg):
            text = tok.apply_chat_template(msgs + [{"role": "assistant", "content": r}], tokenize=False)
            ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
            with torch.no_grad():
                rewards = model.heads(model.embed(ids).mean(1))[0]  # (O,): mean over the (unpadded) tokens
            # float32 sums: the mean over <= 64 tokens of 8-wide embeddings, the 8-wide heads
            assert o == approx_float(rewards[2].item(), 8 * 64)
            assert a == approx_float((rewards * model.gate).sum().item(), 8 * 64 * 3)
    assert len({round(x, 4) for r in objective for x in r}) == 5  # the five responses score apart


def test_score_output_and_index_errors_say_what_there_is(multi_rm):
    judge = RewardModelJudge(str(multi_rm), trust_remote_code=True)
    with pytest.raises(ValueError, match=r"no tensor 'logits'; it has \['rewards', 'score'\]"):
        judge.score(PROMPTS[:1], RESPONSES[:1])
    judge = RewardModelJudge(str(multi_rm), trust_remote_code=True, score_output="rewards", score_index=3)
    with pytest.raises(
        ValueError, match=r"score_index 3: .* rewards has shape \(3, 3\), expected \(batch, n\) with n > "
    ):
        judge.score(PROMPTS[:1], RESPONSES[:1])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (
            dict(type="python", function="m:f", dtype="bfloat16"),
            r"judge.dtype applies to judge.type: reward_model / gpm, not to judge.type: python; remove it",
        ),
        (
            dict(type="pairrm", model="m", trust_remote_code=True, score_index=1),
            r"judge.trust_remote_code \(reward_model\), judge.score_index \(reward_model\) apply to other judge "
            r"types, not to judge.type: pairrm; remove them",
        ),
        (dict(type="reward_model", model="m", device_map="gpu0"), "'gpu0' is neither auto | balanced"),
        (dict(type="reward_model", model="m", device_map={}), "got an empty map"),
        (
            dict(type="reward_model", model="m", device_map={"model.layers.0": "auto"}),
            r"not devices: \{'model.layers.0': 'auto'\}",
        ),
        (
            dict(type="reward_model", model="m", dtype="float64"),
            "Input should be 'auto', 'float32', 'bfloat16' or 'float16'",
        ),
    ],
)
def test_config_rules(kwargs, error):
    with pytest.raises(ValidationError, match=error):
        JudgeConfig(**kwargs)


@pytest.mark.parametrize("device_map", ["auto", "cuda:1", 0, {"model": 0, "score": "cpu"}])
def test_config_accepts_device_maps(device_map):
    cfg = JudgeConfig(type="reward_model", model="m", device_map=device_map)
    assert JudgeConfig(**cfg.model_dump()) == cfg
