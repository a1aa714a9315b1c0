"""A strong random LoRA adapter on the tiny policy, and greedy answers through peft: the
independent reference that vLLM's LoRA serving (in process or as a server module) must match."""

from __future__ import annotations

from pathlib import Path


def strong_adapter(policy: Path, out: Path) -> Path:
    """A random rank-8 adapter with lora_B scaled by 20, so its greedy answers differ from the base's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lora = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], init_lora_weights=False
    )
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32), lora)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.mul_(20)
    model.save_pretrained(out)
    return out


def greedy_answers(
    policy: Path, prompts: list[str], adapter: Path | None = None, max_new_tokens: int = 8
) -> list[str]:
    """transformers' greedy continuation of each prompt (text as given, no special tokens
    added), from the base, or base + adapter through peft."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    answers = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
        seq = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
        answers.append(tok.decode(seq[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    return answers
