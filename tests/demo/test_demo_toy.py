"""The embedded toy world: tiny model and tokenizer, addition task, rows, greedy evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pofe.demo.evaluate import greedy_reward
from pofe.demo.task import (
    answer,
    bradley_terry_win_rates,
    exact_reward,
    make_prompts,
    make_rrhf_rows,
    make_sppo_rows,
    reward,
    write_jsonl,
)
from pofe.demo.tiny import build_tiny_model


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    return build_tiny_model(tmp_path / "tiny")


# --- tokenizer and model ---------------------------------------------------------------


@pytest.mark.parametrize("text", ["12+7=", "Hello,  world .\n", "  leading and trailing  ", "a<b>c {x} ~`|\\"])
def test_tokenizer_round_trips_ascii(tiny_dir: Path, text: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text


def test_chat_template_renders_turns_exactly(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": "1+2="},
        {"role": "assistant", "content": "3"},
    ]
    assert (
        tok.apply_chat_template(messages, tokenize=False)
        == "<|system|>Add.<|end|><|user|>1+2=<|end|><|assistant|>3<|end|>"
    )
    assert (
        tok.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
        == "<|user|>1+2=<|end|><|assistant|>"
    )
    # Role markers are single special tokens, not spelled out character by character.
    assert tok.encode("<|user|>1<|end|>", add_special_tokens=False) == [
        tok.convert_tokens_to_ids("<|user|>"),
        tok.convert_tokens_to_ids("1"),
        tok.eos_token_id,
    ]


def test_model_loads_by_path_like_a_hub_model(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    cfg = model.config
    assert cfg.model_type == "llama"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (128, 2, 2)
    assert cfg.head_dim == 64  # vLLM's CPU attention rejects head_dim 16
    assert cfg.vocab_size == len(tok)
    assert model.dtype == torch.float32
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<s>", "<|end|>")
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    gen = model.generation_config
    assert (gen.eos_token_id, gen.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)


def test_same_seed_same_weights(tmp_path: Path) -> None:
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=4))
    w = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a.state_dict()[w], b.state_dict()[w])
    assert not torch.equal(a.state_dict()[w], c.state_dict()[w])


# --- reward and rows ---------------------------------------------------------------------


def test_reward_hand_cases() -> None:
    """12+7 = 19. Wrong integers score 0.5 / (1 + |diff|):
    18 -> 0.5/2 = 0.25, 21 -> 0.5/3 = 1/6, 8 -> 0.5/12 = 1/24, -19 -> 0.5/39."""
    p = "12+7="
    assert reward(p, "19") == 1.0
    assert reward(p, " 19\n") == 1.0  # compared after strip
    assert reward(p, "18") == pytest.approx(0.25)
    assert reward(p, "21") == pytest.approx(1 / 6)
    assert reward(p, "8") == pytest.approx(1 / 24)
    assert reward(p, "-19") == pytest.approx(0.5 / 39)
    assert 1.0 > reward(p, "18") > reward(p, "21") > reward(p, "8") > reward(p, "-19") > 0.0
    for junk in ["", "nineteen", "19 apples", "1 9", "<|end|>", "19.0"]:
        assert reward(p, junk) == 0.0


def test_exact_reward_is_one_for_the_sum_only() -> None:
    """Nash-MD's verifier on the toy: the sum (after strip) 1.0; a near miss, junk, 0.0."""
    p = "12+7="
    assert [exact_reward(p, r) for r in ("19", " 19\n", "18", "20", "-19", "", "19 apples")] == [1, 1, 0, 0, 0, 0, 0]


def test_the_sft_recipe_reads_each_prompt_and_answer_as_the_policy_samples_them(tmp_path: Path) -> None:
    """`prepare` on recipes/tiny-sft-cpu.yml: the prompt rows beside its dataset, and the dataset
    one chat a prompt whose rendering (the chat template axolotl's chat_template type applies) is
    the generation prompt the policy samples from, then the answer and the end of turn."""
    import yaml

    from pofe.demo.stages import prepare
    from tests.helpers import ROOT

    recipe = yaml.safe_load((ROOT / "recipes" / "tiny-sft-cpu.yml").read_text())
    recipe["base_model"] = str(tmp_path / recipe["base_model"])
    recipe["datasets"][0]["path"] = str(tmp_path / recipe["datasets"][0]["path"])
    rows = prepare(recipe, seed=0, prompts=5)
    prompts = [json.loads(line) for line in (tmp_path / "outputs/demo/prompts.jsonl").read_text().splitlines()]
    chats = [json.loads(line) for line in Path(recipe["datasets"][0]["path"]).read_text().splitlines()]
    assert prompts == rows and len(chats) == 5
    tok = AutoTokenizer.from_pretrained(recipe["base_model"])
    for row, chat in zip(rows, chats, strict=True):
        assert chat["messages"] == [
            {"role": "user", "content": row["prompt"]},
            {"role": "assistant", "content": row["answer"]},
        ]
        asked = tok.apply_chat_template(chat["messages"][:1], tokenize=False, add_generation_prompt=True)
        assert tok.apply_chat_template(chat["messages"], tokenize=False) == f"{asked}{row['answer']}<|end|>"
    # a recipe of prompts (any other dataset type, or none given: benchmarks.online's) gets them at its path
    plain = {"base_model": str(tmp_path / "other"), "datasets": [{"path": str(tmp_path / "p.jsonl")}]}
    assert prepare(plain, seed=0, prompts=3) == [json.loads(line) for line in (tmp_path / "p.jsonl").open()]
    with pytest.raises(ValueError, match="a\\+b="):
        reward("12*7=", "84")


def test_rrhf_rows_well_formed_and_seeded() -> None:
    rows = make_rrhf_rows(30, k=4, seed=5)
    assert len(rows) == 30
    assert len({r["prompt"] for r in rows}) == 30  # distinct prompts
    for row in rows:
        assert set(row) == {"prompt", "responses", "rewards"}
        assert len(row["responses"]) == len(set(row["responses"])) == 4
        assert all(r.isdigit() for r in row["responses"])  # non-negative integers
        assert row["rewards"] == [reward(row["prompt"], r) for r in row["responses"]]
        assert row["rewards"].count(1.0) == 1
        assert all(0.0 < s < 0.5 for s in row["rewards"] if s != 1.0)
    best_positions = {row["rewards"].index(1.0) for row in rows}
    assert len(best_positions) > 1  # shuffled: the correct answer is not always first
    assert make_rrhf_rows(30, k=4, seed=5) == rows
    assert make_rrhf_rows(30, k=4, seed=6) != rows


def test_make_prompts_distinct_and_bounded() -> None:
    prompts = make_prompts(441)  # every pair of operands in 0..20
    assert len(set(prompts)) == 441
    assert make_prompts(10, seed=1) == make_prompts(10, seed=1)
    with pytest.raises(ValueError):
        make_prompts(442)


def test_sppo_win_rates_by_hand() -> None:
    """Row 0 of seed 0, k=3: "20+12=" (sum 32) with candidates 36, 35, 32, so rewards
    0.5/5 = 0.1, 0.5/4 = 0.125, 1.0. With scale 5 the reward gaps give
    sigmoid(5 * 0.025) = sigmoid(0.125) = 0.53121, sigmoid(5 * 0.9) = sigmoid(4.5) = 0.98901,
    sigmoid(5 * 0.875) = sigmoid(4.375) = 0.98757, and the diagonal counts 0.5:
      w(36) = (0.5 + 0.46879 + 0.01099) / 3 = 0.32659
      w(35) = (0.53121 + 0.5 + 0.01243) / 3 = 0.34788
      w(32) = (0.98901 + 0.98757 + 0.5) / 3 = 0.82553"""
    (row,) = make_sppo_rows(1, k=3, seed=0, scale=5.0)
    assert set(row) == {"prompt", "responses", "win_rates"}
    assert row["prompt"] == "20+12="
    assert row["responses"] == ["36", "35", "32"]
    assert row["win_rates"] == pytest.approx([0.32659, 0.34788, 0.82553], abs=1e-5)
    # Pairwise probabilities sum to one per pair, so the K win rates average to 0.5.
    assert sum(row["win_rates"]) == pytest.approx(1.5)


def test_sppo_rows_share_candidates_with_rrhf_rows() -> None:
    rrhf, sppo = make_rrhf_rows(8, k=5, seed=2), make_sppo_rows(8, k=5, seed=2)
    for a, b in zip(rrhf, sppo, strict=True):
        assert (a["prompt"], a["responses"]) == (b["prompt"], b["responses"])
        assert b["win_rates"] == pytest.approx(bradley_terry_win_rates(a["rewards"]))


def test_write_jsonl_round_trips(tmp_path: Path) -> None:
    rows = make_rrhf_rows(3, seed=0)
    path = write_jsonl(rows, tmp_path / "sub" / "rrhf.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


# --- greedy evaluation -------------------------------------------------------------------


def _sft(model_dir: Path, prompts: list[str], out_dir: Path, *, steps: int, lr: float) -> Path:
    """Plain full-batch SFT on the correct answers (loss on `answer<|end|>` only)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    seqs, labels = [], []
    for p in prompts:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tok.encode(rendered, add_special_tokens=False)
        answer_ids = tok.encode(str(answer(p)), add_special_tokens=False) + [tok.eos_token_id]
        seqs.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(map(len, seqs))
    pad = [width - len(s) for s in seqs]
    input_ids = torch.tensor([s + [tok.pad_token_id] * n for s, n in zip(seqs, pad)])  # (B, T)
    mask = torch.tensor([[1] * len(s) + [0] * n for s, n in zip(seqs, pad)])
    target = torch.tensor([lab + [-100] * n for lab, n in zip(labels, pad)])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=input_ids, attention_mask=mask, labels=target).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.mark.usefixtures("one_torch_thread")
def test_greedy_reward_rises_after_sft(tiny_dir: Path, tmp_path: Path) -> None:
    prompts = make_prompts(24, seed=0)
    before = greedy_reward(tiny_dir, prompts)
    # 1e-3 full batch: 3e-3 oscillates on this model (measured on 60 prompts).
    trained = _sft(tiny_dir, prompts, tmp_path / "sft", steps=40, lr=1e-3)
    after = greedy_reward(trained, prompts, batch_size=7)  # uneven batches exercise padding
    # margin: over model and prompt seeds 0-4 (one torch thread), exact match and mean reward
    # went from 0.0 to 0.96-1.0 each
    assert after["exact_match"] > before["exact_match"]
    assert after["mean_reward"] > before["mean_reward"]
    assert len(after["samples"]) == 24
    for prompt, response, score in after["samples"]:
        assert score == reward(prompt, response)
        assert "<|end|>" not in response and "<pad>" not in response


@pytest.mark.usefixtures("one_torch_thread")
def test_greedy_reward_batching_changes_nothing(tiny_dir: Path) -> None:
    prompts = make_prompts(9, seed=1)
    one = greedy_reward(tiny_dir, prompts, batch_size=1)
    many = greedy_reward(tiny_dir, prompts, batch_size=32)
    assert one["samples"] == many["samples"]


@pytest.mark.usefixtures("one_torch_thread")
def test_greedy_reward_loads_lora_adapter(tiny_dir: Path, tmp_path: Path) -> None:
    """A freshly initialised LoRA adapter (B = 0) leaves the outputs of its base unchanged."""
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    adapted = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    adapter_dir = tmp_path / "adapter"
    adapted.save_pretrained(adapter_dir)  # no tokenizer: it must come from the base
    assert (adapter_dir / "adapter_config.json").exists()
    prompts = make_prompts(6, seed=2)
    via_adapter = greedy_reward(adapter_dir, prompts)["samples"]
    assert via_adapter == greedy_reward(tiny_dir, prompts)["samples"]
