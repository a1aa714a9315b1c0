"""`axolotl train` with two processes on the CPU (torchrun, gloo) matches one process.

axolotl 0.19 maps every rank's model to an accelerator when world_size > 1; the plugin's
`pre_model_load` places it on the CPU where none exists (`pofe.distributed.place_ranks_on_cpu`).
Two ranks at micro-batch 2 see the same global batches as one process at micro-batch 4,
so the logged losses and gradient norms of the first steps (after updates: the gradients
were averaged over the ranks) must equal the one-process run's. Small logit chunks, and
prefix sharing in its `auto` layout, so the ranks score unequal numbers of chunks and
decide the layout together.

The same two ranks under DeepSpeed ZeRO-3 (the shipped `recipes/deepspeed/zero3_bf16.json`,
as a user passes it) must match the same one-process run, plain: the model is built under
`zero.Init` (its parameters partitioned, so scoring lets the forward run the head), the
trainers step through the DeepSpeed engine, and the model saved with
`stage3_gather_16bit_weights_on_model_save` is the one-process model, loadable by the next
round's generation. SPPO's anchor pass runs there at an eval batch of 3: 11 batches over
2 ranks, so the second rank scores one batch twice to keep the gathers paired.

Those ZeRO-3 runs save at every step, and one killed after its first save resumes: a fresh
folder holding only what the kill would have left (checkpoint-1 and the prepared data)
trains steps 2 and 3 again with `resume_from_checkpoint` and must log what the
uninterrupted run logged and save its weights.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import AXOLOTL_ENV, ROOT, assert_float_close, log_history, recipe, whole_candidates

STEPS = 3
LR = 3e-3  # tests.helpers.recipe's learning_rate
ROWS = 32  # rows of the conftest datasets
ZERO3 = ROOT / "recipes" / "deepspeed" / "zero3_bf16.json"
RESUME_AT = 1  # the killed ZeRO-3 run's last checkpoint: steps 2 and 3 test the restored state
# float32 sums behind a logged loss or gradient: width 64 x the global batch's tokens
# (4 prompts x 4 responses, up to 64 tokens each); Adam's few steps carry them along
N_TERMS = 64 * 4 * 4 * 64
pytestmark = pytest.mark.e2e


def train(
    tmp_path: Path,
    model: Path,
    method: str,
    data: Path,
    processes: int,
    zero3: bool = False,
    resume: Path | None = None,
):
    """Run `axolotl train` on `processes` CPU processes at a global batch of 4: its step logs,
    stdout and output_dir. ZeRO-3 runs save at every step; `resume`: the checkpoint (in
    tmp_path/out) to resume from."""
    tmp_path.mkdir(exist_ok=resume is not None)
    pofe = {"logit_chunk_size": 16, "eta": 10.0} if method == "sppo" else {"logit_chunk_size": 16}
    extra = {"deepspeed": str(ZERO3), "eval_batch_size": 3} if zero3 else {}
    if resume is not None:
        extra["resume_from_checkpoint"] = str(resume)
    cfg = recipe(
        tmp_path,
        model,
        method,
        data,
        f"pofe.{method}",
        micro_batch_size=4 // processes,
        max_steps=STEPS,
        save_strategy="steps",
        save_steps=1 if zero3 else STEPS,
        learning_rate=LR,
        pofe=pofe,
        **extra,
    )
    bin_dir = Path(sys.executable).parent
    launcher = (
        ["--launcher", "python"]
        if processes == 1
        else [
            "--launcher",
            "torchrun",
            "--",
            "--standalone",
            "--nproc_per_node",
            str(processes),  # --standalone: a free port
        ]
    )
    env = {**os.environ, **AXOLOTL_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [str(bin_dir / "axolotl"), "train", str(cfg), *launcher], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    steps = [h for h in log_history(tmp_path / "out") if "loss" in h]
    assert [h["step"] for h in steps] == list(range(1, STEPS + 1))
    # POFE's summary ends the console once, from rank 0, after the process group is gone
    assert (proc.stdout + proc.stderr).count(f"POFE: trained rl: {method}") == 1
    return steps, proc.stdout + proc.stderr, tmp_path / "out"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny64_model, rrhf_jsonl, sppo_jsonl):
    """`runs(method, kind)`: one run per method and kind ("one", "gloo", "zero3", and
    "zero3-resumed": the zero3 run killed after checkpoint-RESUME_AT and resumed), made once
    for the module; the one-process runs serve both comparisons."""
    done = {}

    def run(method: str, kind: str):
        if (method, kind) not in done:
            data = {"rrhf": rrhf_jsonl, "sppo": sppo_jsonl}[method]
            killed = run(method, "zero3")[2].parent if kind == "zero3-resumed" else None
            root = tmp_path_factory.mktemp(method) / kind
            resume = killed_after_save(killed, root) if killed else None
            done[method, kind] = train(
                root,
                tiny64_model,
                method,
                data,
                processes=1 if kind == "one" else 2,
                zero3=kind.startswith("zero3"),
                resume=resume,
            )
        return done[method, kind]

    return run


def killed_after_save(run_dir: Path, dest: Path) -> Path:
    """Lay out in `dest` what `run_dir`'s run, killed right after saving checkpoint-RESUME_AT,
    would have left: that checkpoint and the prepared data (with SPPO's anchor table, cached
    in step 1, before the save); not the later checkpoints nor the final model. Returns the
    checkpoint's copy."""
    checkpoint = dest / "out" / f"checkpoint-{RESUME_AT}"
    shutil.copytree(run_dir / "out" / checkpoint.name, checkpoint)
    shutil.copytree(run_dir / "prepared", dest / "prepared")
    return checkpoint


def stat_keys(method: str) -> tuple[str, ...]:
    return "loss", "grad_norm", f"{method}/{'rank' if method == 'rrhf' else 'logratio'}"


@pytest.mark.parametrize("method", ["rrhf", "sppo"])
def test_zero3_two_processes_match_one(runs, method):
    import torch
    from safetensors.torch import load_file

    from pofe_candidates.models import load_policy, load_tokenizer

    zero3, log, out = runs(method, "zero3")
    one, _, one_out = runs(method, "one")
    assert "rank 0 of 2 trains on the CPU (DEEPSPEED, gloo)" in log
    # the parameters were partitioned (they carry ds_id) when the trainer scored
    assert "POFE: DeepSpeed ZeRO-3 gathers the output embedding's weights at each call" in log
    # each rank took its half of every global batch: a quarter of an epoch in 3 steps
    assert zero3[-1]["epoch"] == pytest.approx(STEPS * 4 / ROWS)
    for a, b in zip(zero3, one):
        for key in stat_keys(method):
            assert_float_close(
                torch.tensor(a[key]),
                torch.tensor(b[key]),
                N_TERMS,
                msg=lambda m, s=a["step"], k=key: f"step {s} {k}: {m}",
            )
    if method == "sppo":  # 11 batches of 3 over 2 ranks: the pass finished, the table whole
        assert "computed SPPO anchor log-probs for 32 rows" in log and "on 2 process(es)" in log
    # the final save gathered the partitions: whole weights, the one-process run's
    policy = load_policy(str(out))
    load_tokenizer(str(out))
    expected = load_file(one_out / "model.safetensors")
    saved = {n: p.detach() for n, p in policy.state_dict().items()}
    assert saved.keys() >= expected.keys()
    for name, weight in expected.items():
        assert_adam_weights_close(saved[name], weight, name)


@pytest.mark.parametrize("method", ["rrhf", "sppo"])
def test_zero3_resumes_from_checkpoint(runs, method):
    """The killed ZeRO-3 run, started again with `resume_from_checkpoint`, logs steps 2 and 3
    as the uninterrupted run did and ends with its weights. Step 2 is scored on the restored
    weight partitions and the data set's second global batch; step 3 on weights updated with
    the restored Adam moments. SPPO's anchor table is the cached step-0 one, not one
    recomputed from the partly trained policy."""
    import torch
    from safetensors.torch import load_file

    resumed, log, out = runs(method, "zero3-resumed")
    whole, _, whole_out = runs(method, "zero3")
    checkpoint = out / f"checkpoint-{RESUME_AT}"
    # what the checkpoint holds: one rank's partitions each, the state the kill left
    assert sorted(p.name for p in (checkpoint / f"global_step{RESUME_AT}").glob("*_states.pt")) == [
        f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in (0, 1) for kind in ("model", "optim")
    ]
    killed_log = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in killed_log if "loss" in h] == [RESUME_AT]  # the later steps are the restart's
    for a, b in zip(resumed[RESUME_AT:], whole[RESUME_AT:], strict=True):
        for key in stat_keys(method):
            assert_float_close(
                torch.tensor(a[key]),
                torch.tensor(b[key]),
                N_TERMS,
                msg=lambda m, s=a["step"], k=key: f"step {s} {k}: {m}",
            )
    if method == "sppo":
        assert "loading SPPO anchor log-probs from" in log and "computed SPPO anchor" not in log
    expected = load_file(whole_out / "model.safetensors")
    saved = load_file(out / "model.safetensors")
    assert saved.keys() == expected.keys()
    for name, weight in expected.items():
        assert_adam_weights_close(saved[name], weight, name)


@pytest.mark.parametrize("method", ["rrhf", "sppo"])
def test_two_processes_match_one(runs, method):
    import torch

    two, log, _ = runs(method, "gloo")
    one, _, _ = runs(method, "one")
    assert "rank 0 of 2 trains on the CPU (MULTI_CPU, gloo)" in log  # axolotl prints rank 0 only
    # 3 steps of 4 rows out of 32: a quarter of an epoch unless each rank trained alone
    assert two[-1]["epoch"] == pytest.approx(STEPS * 4 / ROWS)
    for a, b in zip(two, one):
        for key in stat_keys(method):
            assert_float_close(
                torch.tensor(a[key]),
                torch.tensor(b[key]),
                N_TERMS,
                msg=lambda m, s=a["step"], k=key: f"step {s} {k}: {m}",
            )
    if method == "sppo":  # the anchor pass was sharded: both ranks scored, the table is whole
        assert "computed SPPO anchor log-probs for 32 rows" in log and "on 2 process(es)" in log


def assert_adam_weights_close(actual, expected, name: str) -> None:
    """Weights after STEPS Adam updates from one start: equal to float32 tolerance, but for
    the few entries whose gradient is at float-noise level. Adam normalises each entry's
    update (its first one is lr * sign(g)), so there a noise-level difference in g moves the
    weight by up to 2 lr per step; entries like that are rare (1 in 8192 seen). A batch
    missing or seen twice moves most entries by ~lr (the losses of steps 2 and 3, on the
    updated weights, are compared to float tolerance too)."""
    import torch

    from tests.helpers import float_tolerance

    tol = float_tolerance(expected.dtype, N_TERMS, expected.abs().max().item())
    off = ~torch.isclose(actual, expected, **tol)
    assert off.sum().item() <= max(1, expected.numel() // 1000), f"{name}: {off.sum().item()} entries differ"
    assert (actual - expected).abs().max().item() <= 2 * LR * STEPS, name


def test_run_resumes_the_train_stage_from_a_zero3_checkpoint(runs, tmp_path, monkeypatch):
    """`axolotl pofe run`'s train stage killed after the ZeRO-3 run's three saves resumes
    from the newest checkpoint DeepSpeed can load (`pofe.run.rounds.checkpoints`): a checkpoint's
    global_step<N>/ partitions, `latest` and zero_to_fp32.py pass the wholeness check, the
    recorded recipe (with its `deepspeed` JSON) the identity check. checkpoint-3 has rank 1's
    optimizer partition cut short and checkpoint-2 has lost its global_step2/ (partial
    copies): both are passed over, each named with what is wrong (as is a rank's missing
    partition). A checkpoint as save_only_model saves it (the runner's forced save), without DeepSpeed's state, is not
    resumed either."""
    import yaml

    from pofe.run.folder import RunFolder, RunState
    from pofe.run.rounds import loop as rounds
    from pofe.run.rounds import runner
    from pofe.run.rounds.checkpoints import deepspeed_problem, resumable
    from pofe.run.rounds.round_recipe import round_recipe

    _, _, out = runs("sppo", "zero3")
    folder = RunFolder(tmp_path / "run")
    raw = {
        "base_model": "/m/base",
        "rl": "sppo",
        "deepspeed": str(ZERO3),
        "save_strategy": "steps",
        "save_steps": 1,
        "output_dir": str(folder.root),
        "datasets": [{"path": "p.jsonl", "type": "pofe.prompts"}],
        "pofe": {"generate": {"backend": "transformers"}, "judge": {"type": "python", "function": "m:f"}},
    }
    train = folder.train(1)
    whole_candidates(folder, 1)
    rounds.claim_training(folder, 1, round_recipe(raw, folder, 1, "/m/base", seed=7).recipe, None)  # the killed start
    for step in (1, 2, 3):
        shutil.copytree(out / f"checkpoint-{step}", train / f"checkpoint-{step}")
    assert {p.name for p in (train / "checkpoint-3").iterdir()} >= {"global_step3", "latest", "zero_to_fp32.py"}
    assert resumable(train, print, deepspeed=True) == train / "checkpoint-3"  # as saved: whole
    cut = train / "checkpoint-3" / "global_step3" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    cut.write_bytes(cut.read_bytes()[:1000])
    shutil.rmtree(train / "checkpoint-2" / "global_step2")
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="sppo")
    state.start("round-1/preprocess")
    state.finish("round-1/preprocess")
    state.start("round-1/train")  # killed here
    ran = []
    monkeypatch.setattr(
        runner,
        "run_logged",
        lambda cmd, *a, **k: ran.append(yaml.safe_load(Path(cmd[2]).read_text())["resume_from_checkpoint"]),
    )
    said = []
    plan = rounds.RoundPlan(t=1, rounds=1, policy="/m/base", adapter=False, seed=7)
    rounds.run_round(raw, folder, plan, runner.StageRunner(state, echo=said.append, stream=False))
    assert ran == [str(train / "checkpoint-1")]
    assert said[0].startswith(f"not resuming from {train / 'checkpoint-3'}: {cut} is cut short or damaged")
    assert said[1] == (
        f"not resuming from {train / 'checkpoint-2'}: {train / 'checkpoint-2' / 'latest'} names "
        f"global_step2, which {train / 'checkpoint-2'} lacks; trying the checkpoint before it"
    )
    assert said[2] == f"round 1/1: train, resuming from {train / 'checkpoint-1'}"
    (train / "checkpoint-3" / "global_step3" / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    assert deepspeed_problem(train / "checkpoint-3") == (
        f"{train / 'checkpoint-3' / 'global_step3'} lacks the model partition of rank(s) [1] of 2"
    )
    shutil.rmtree(train / "checkpoint-1" / "global_step1")
    (train / "checkpoint-1" / "latest").unlink()
    assert resumable(train, said.append, deepspeed=True) is None
    assert said[-1] == (
        f"not resuming from {train / 'checkpoint-1'}: {train / 'checkpoint-1'} holds no DeepSpeed "
        "state (no `latest` file naming its global_step folder; saved with save_only_model?); "
        "trying the checkpoint before it"
    )
