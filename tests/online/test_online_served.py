"""Online RRHF with LoRA sampled by a real vLLM (CPU) server POFE starts (`generate.serve`), through
the real `axolotl train`: one server for the run, each refresh's adapter loaded into it and sampled
with, the trainer scoring the ids it sampled, the server stopped when training ends."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pofe.online.refresh import LOGP, TOKENS, read_refresh
from pofe.online.sampling import ADAPTER, LORA_PREFIX
from tests.helpers import ROOT, assert_float_close, load_llama, naive_logps, run_axolotl
from tests.online.test_online_e2e import _scored, _toy
from tests.vllm_server import VLLM_CPU_ENV, vllm_cpu_command

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

RECIPE = yaml.safe_load((ROOT / "recipes" / "tiny-rrhf-online-cpu.yml").read_text())
LORA = {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "lora_target_linear": True}
NO_KERNELS = dict.fromkeys(("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel"), False)


def _events(log: str) -> list[tuple[str, str]]:
    """The server log's adapter loads and unloads and the adapter each completion request named,
    in order: ("load", name), ("unload", name), ("request", name or "None")."""
    pattern = re.compile(
        r"Loaded new LoRA adapter: name '([^']+)', path '([^']+)'"
        r"|Removed LoRA adapter: name '([^']+)'"
        r"|Received request cmpl-\S+: params: .*?, lora_request: (?:LoRARequest\(lora_name='([^']+)'|(None))"
    )
    events = []
    for m in pattern.finditer(log):
        load, path, unload, named, base = m.groups()
        if load:
            events.append(("load", f"{load} {path}"))
        elif unload:
            events.append(("unload", unload))
        else:
            events.append(("request", named or base))
    return events


def _with_adapter(base_model: str, adapter: Path):
    from peft import PeftModel

    return PeftModel.from_pretrained(load_llama(Path(base_model)), adapter).eval()


def test_a_served_vllm_samples_each_refresh_with_that_refreshs_adapter(tmp_path, vllm_python):
    """60 prompts in steps of 20, 2 epochs, refresh_every 3: refreshes at steps 0 and 3, each of
    60 completion requests (one a prompt, 4 samples each). The server loads refresh 0's adapter
    before its requests, refresh 3's (unloading 0's) before its own; every request names its
    refresh's adapter, and the written log-probs of the sampled ids are a plain forward of base +
    that refresh's saved adapter."""
    serve = {
        # --enable-log-requests: the server logs the adapter each request names
        "command": vllm_cpu_command(vllm_python) + " --enable-log-requests",
        "env": VLLM_CPU_ENV,
        "ready_timeout": 300,
        "stop_timeout": 20,
    }
    changes = dict(
        num_epochs=2,
        learning_rate=1.0e-2,
        **LORA,
        **NO_KERNELS,
        pofe={
            "generate": {**RECIPE["pofe"]["generate"], "backend": "openai", "serve": serve},
            # the policy's log-probs of the sampled ids are written for the KL penalty
            "online": {**RECIPE["pofe"]["online"], "kl_coef": 0.01},
        },
    )
    path, cfg, _ = _toy(tmp_path, "tiny-rrhf-online-cpu.yml", **changes)
    proc = run_axolotl("train", str(path), cwd=tmp_path)
    out = Path(cfg["output_dir"])
    output = proc.stdout + proc.stderr

    refreshes = {start: read_refresh(out / "online" / f"refresh-{start:07d}") for start in (0, 3)}
    assert sorted(p.name for p in (out / "online").glob("refresh-*")) == ["refresh-0000000", "refresh-0000003"]
    names = {start: f"{LORA_PREFIX}-refresh-{start:07d}" for start in refreshes}
    folders = {start: (out / "online" / f"refresh-{start:07d}" / ADAPTER).resolve() for start in refreshes}
    events = _events((out / "online" / "server.log").read_text())
    assert events == [
        ("load", f"{names[0]} {folders[0]}"),
        *[("request", names[0])] * 60,
        ("load", f"{names[3]} {folders[3]}"),
        ("unload", names[0]),
        *[("request", names[3])] * 60,
    ]
    for start, (_, rows, _) in refreshes.items():
        tokens = [{"row_id": j, **r[TOKENS]} for j, r in enumerate(rows)]
        plain = naive_logps(_with_adapter(cfg["base_model"], folders[start]), tokens)
        assert_float_close(_scored(rows, LOGP), plain, n_terms=64 * 16)
    # the adapter moved between the refreshes: refresh 3's rows score otherwise under refresh 0's
    _, later, _ = refreshes[3]
    tokens = [{"row_id": j, **r[TOKENS]} for j, r in enumerate(later)]
    earlier = naive_logps(_with_adapter(cfg["base_model"], folders[0]), tokens)
    assert (earlier - _scored(later, LOGP)).abs().nan_to_num().max() > 1e-2

    assert "POFE: online: stopped the server" in output
    assert (out / "adapter_model.safetensors").exists()  # trained to the end and saved
    leftover = [p for p in Path("/proc").glob("[0-9]*") if str(tmp_path) in _cmdline(p)]
    assert leftover == [], leftover


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
