"""Issue 22's judge and anchor-pass figures on this machine: the reward-model judge (prompts
shared, and whole texts) against a plain length-sorted forward (`benchmarks.judges`), and SPPO's
anchor pass against one epoch's training forwards (`benchmarks.anchor_pass`). Speed rows are
`measured`, the reward model's >= 1.0x target met or MISSED; its scores against the plain
forward's are a `pass` within float32 rounding (both run the same float32 model)."""

from __future__ import annotations

import json
from pathlib import Path


def run(work: Path, cuda: bool) -> dict:
    from benchmarks import anchor_pass
    from benchmarks.judges import reward_model

    device = "cuda" if cuda else "cpu"
    work.mkdir(parents=True, exist_ok=True)
    judge = reward_model(work, 48 if cuda else 8, 5, 5 if cuda else 1, device)
    anchor = work / "anchor-pass.json"
    anchor_pass.main(
        ["--device", device, "--rows", "128" if cuda else "8", "--reps", "3" if cuda else "1", "--out", str(anchor)]
    )
    return {"reward_model": judge, "anchor_pass": json.loads(anchor.read_text())}


def checks(report: dict) -> list[dict]:
    import torch

    from benchmarks.gpu_check.report import row
    from tests.helpers import float_tolerance

    rm, anchor = report["reward_model"], report["anchor_pass"]
    speed = rm["speed_pofe_over"]
    # float32 sums over the width at each matmul and over the longest input's tokens in attention
    bound = float_tolerance(
        torch.float32, rm["hidden_size"] * rm["longest_input_tokens"], magnitude=rm["max_abs_score"]
    )["atol"]
    difference = rm["max_abs_score_difference_vs_plain"]
    return [
        row(
            "judge reward model vs plain forward",
            "measured",
            f"pofe {rm['per_second']['pofe']:,.0f} candidates/s, {speed['plain']:.2f}x the plain forward "
            f"(>= 1.0 {'met' if speed['plain'] >= 1.0 else 'MISSED'}), {speed['pofe_whole_texts']:.2f}x whole texts",
            speed_pofe_over=speed,
        ),
        row(
            "judge reward model scores == plain forward's",
            "pass" if difference <= bound else "FAIL",
            f"max |difference| {difference:.2e}, float32 bound {bound:.2e}",
            difference=difference,
            bound=bound,
        ),
        row(
            "anchor pass vs one epoch's forwards",
            "measured",
            f"{anchor['anchor_sorted_over_epoch_forward']:.2f}x the epoch's forwards; sorting saves "
            f"{anchor['anchor_unsorted_over_sorted']:.2f}x",
            anchor_over_epoch=anchor["anchor_sorted_over_epoch_forward"],
        ),
    ]
