"""`axolotl pofe eval` and `report` of an online run (issue 31): the recipe's one `axolotl train`
sampled its candidates as it trained (`pofe.online`); the trained model is evaluated against
its base on the held-out prompts, and the report adds each refresh's stats (from
output_dir/online/refresh-*/refresh.json) and the training's reproducibility record."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from pofe.demo.task import make_prompt_rows, write_jsonl
from pofe.records.refresh import RefreshRecord, merged_stats, written_refreshes
from pofe.run.folder import RunFolder
from tests.helpers import checked_eval_samples, run_axolotl

REPO = Path(__file__).resolve().parents[3]
# the demo's 60 prompts, 20 held out: 40 train, 2 micro-batches of 20 an epoch
PROMPTS, HELD_OUT, EPOCHS = 60, 20, 6


@pytest.fixture(scope="module")
def online_run(tmp_path_factory, tiny_model):
    """recipes/tiny-rrhf-online-cpu.yml on the demo's prompts, trained for 6 epochs, then
    `pofe eval --no-report` and `pofe report`: (recipe's folder, evaluation folder, eval's and
    report's console output)."""
    root = tmp_path_factory.mktemp("online")
    rows = make_prompt_rows(PROMPTS, k_wrong=3, seed=0)
    raw = yaml.safe_load((REPO / "recipes" / "tiny-rrhf-online-cpu.yml").read_text())
    raw |= {
        "base_model": str(tiny_model),
        "datasets": [{"path": str(write_jsonl(rows, root / "prompts.jsonl")), "type": "pofe.prompts"}],
        "dataset_prepared_path": str(root / "prepared"),
        "output_dir": str(root / "out"),
        "num_epochs": EPOCHS,
    }
    raw["pofe"]["eval"] = {"held_out": HELD_OUT}
    raw["pofe"]["online"]["kl_coef"] = 0.01  # the report's KL column
    raw["pofe"]["generate"]["seed"] = 7
    path = root / "recipe.yml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    run_axolotl("train", str(path))
    evaluated = run_axolotl("pofe", "eval", str(path), "--no-report")
    reported = run_axolotl("pofe", "report", str(path))
    return root, RunFolder(root / "out" / "pofe-eval"), rows, evaluated.stdout, reported.stdout


def _refresh_files(out: Path) -> list[dict]:
    """Every refresh.json under out/online, read here, in step order."""
    records = [json.loads(p.read_text()) for p in (out / "online").glob("refresh-*/refresh.json")]
    return sorted(records, key=lambda r: r["start_step"])


def _table(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the first table after `heading`."""
    lines = markdown.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    body = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        body.append([cell.strip() for cell in line.strip("|").split("|")])
    return body


@pytest.mark.e2e
def test_the_report_tables_every_refresh_as_its_refresh_json_holds_it(online_run):
    """An epoch is 2 steps (40 prompts / 20), fewer than refresh_every 3, and a window ends at
    an epoch's end: one refresh per epoch, at steps 0, 2, ..., 10. report.json's refreshes are
    the refresh.json files' stats, and report.md's table shows them (counts whole, the rest to
    3 decimals), with its plot; the console line gives the first and the last."""
    root, folder, _, _, reported = online_run
    records = _refresh_files(root / "out")
    assert [r["start_step"] for r in records] == list(range(0, 2 * EPOCHS, 2))
    rep = json.loads((folder.root / "report.json").read_text())
    # merged over the ranks (one here): a mean weighted by prompts, x * n / n, may differ in the last bit
    assert len(rep["online"]["refreshes"]) == len(records)
    for got, r in zip(rep["online"]["refreshes"], records):
        assert got == pytest.approx({"step": r["start_step"], **r["stats"]}, rel=1e-12)
    assert (rep["online"]["refresh_every"], rep["online"]["kl_coef"]) == (3, 0.01)
    md = (folder.root / "report.md").read_text()
    expected = [
        [
            str(n),
            str(r["start_step"]),
            f"{r['stats']['prompts']:.0f}",
            f"{r['stats']['candidates']:.0f}",
            *(f"{r['stats'][k]:.3f}" for k in ("candidate_reward_mean", "candidate_reward_best", "kl_to_pi_0")),
        ]
        for n, r in enumerate(records, 1)
    ]
    assert _table(md, "## Online training") == expected
    assert all(r[2] == str(PROMPTS - HELD_OUT) for r in expected)
    assert "![candidate reward and KL to pi_0 per refresh](report-online.png)" in md
    first, last = expected[0], expected[-1]
    assert (
        f"online: {EPOCHS} refreshes, steps 0 -> {2 * EPOCHS - 2}: candidate reward {first[4]} -> {last[4]} "
        f"(best-of-k {first[5]} -> {last[5]}), KL to pi_0 {first[6]} -> {last[6]}"
    ) in reported
    assert (folder.root / "report-online.png").stat().st_size > 10_000


@pytest.mark.e2e
def test_the_training_record_digests_its_refreshes_files_in_step_order(online_run):
    """The one training's record: its candidates are the refreshes' generate.jsonl and its
    trained-on rows their rows.jsonl, hashed here in step order; its generate seed the recipe's
    pofe.generate.seed (7), its train seed the recipe's seed (0)."""
    root, folder, _, _, _ = online_run
    steps = [r["start_step"] for r in _refresh_files(root / "out")]

    def digest(name: str) -> str:
        h = hashlib.sha256()
        for step in steps:
            h.update((root / "out" / "online" / f"refresh-{step:07d}" / name).read_bytes())
        return h.hexdigest()

    record = json.loads((folder.root / "report.json").read_text())["rounds"][0]["reproduce"]
    assert record["sha256"]["candidates"] == digest("generate.jsonl")
    assert record["sha256"]["trained_on"] == digest("rows.jsonl")
    assert record["seeds"] == {"generate": 7, "train": 0}
    assert record["recipe"]["pofe"]["online"] == {"refresh_every": 3, "kl_coef": 0.01, "monitor_every": 10}
    row = _table((folder.root / "report.md").read_text(), "## Reproducing each round")[0]
    assert row[:6] == [
        "1",
        "generate 7, train 0",
        f"`{record['recipe_sha256'][:12]}`",
        "-",
        f"`{digest('generate.jsonl')[:12]}`",
        f"`{digest('rows.jsonl')[:12]}`",
    ]


@pytest.mark.e2e
def test_eval_compares_the_trained_model_with_its_base_on_the_held_out_prompts(online_run):
    """pi_1 (output_dir) and pi_0 (base_model) answer the dataset's last 20 prompts, which the
    training never saw; every reward is the demo's reward of its answer recomputed here, each
    model's mean reward their mean, and the report and the console show eval.json's figures."""
    root, folder, rows, evaluated, reported = online_run
    ev = json.loads((folder.eval_dir / "eval.json").read_text())
    assert ev["models"] == [
        {"name": "pi_0", "path": json.loads(folder.state.read_text())["pi_0"]},
        {"name": "pi_1", "path": str(root / "out")},
    ]
    held = [json.loads(line)["prompt"] for line in folder.held_out_prompts.read_text().splitlines()]
    assert held == [r["prompt"] for r in rows[-HELD_OUT:]]
    trained_on = {row["prompt"] for r in written_refreshes(root / "out") for row in _rows(r.folders[0])}
    assert trained_on == {r["prompt"] for r in rows[:-HELD_OUT]}
    _, samples = checked_eval_samples(folder, held)
    assert len(samples) == 2 * HELD_OUT * ev["decoding"]["num_samples"]
    vs = ev["vs_pi_0"][1]
    assert 0.0 <= vs["raw"] <= 1.0
    md = (folder.root / "report.md").read_text()
    pi_1 = next(r for r in _table(md, "## Held-out evaluation") if r[0] == "pi_1")
    assert pi_1[1:4] == [f"{ev['mean_reward'][1]:.3f}", "-", f"{vs['raw']:.3f}"]
    # the tiny model's vocabulary has <|user|> as one token: an answer that begins a user turn is cut there
    cut = [sum(s["cut_at_user_turn"] for s in samples if s["model"] == name) for name in ("pi_0", "pi_1")]
    assert ev["samples_cut_at_user_turn"] == cut
    answers = HELD_OUT * ev["decoding"]["num_samples"]
    said = [f" ({n} of {answers} answers cut where they began a user turn)" if n else "" for n in cut]
    held_out_line = (
        f"held-out prompts, sampled answers ({ev['decoding']['num_samples']} a prompt at temperature "
        f"{ev['decoding']['temperature']:g}): pi_0 reward {ev['mean_reward'][0]:.3f} KL {ev['kl_to_pi_0'][0]:.3f}"
        f"{said[0]}, pi_1 reward {ev['mean_reward'][1]:.3f} KL {ev['kl_to_pi_0'][1]:.3f}{said[1]}"
    )
    assert held_out_line in reported
    assert f"on {HELD_OUT} held-out prompts" in evaluated


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]


def test_refreshes_merge_their_ranks_stats_as_the_log_does(tmp_path):
    """Two ranks: counts add up (30 + 10 prompts); the rest are means weighted by each rank's
    prompts: reward (30 * 0.2 + 10 * 0.6) / 40 = 0.3; kl_to_pi_0 only rank 0 measured: 1.5.
    A refresh one rank has not finished is left out, and refreshes come in step order (10 after 2)."""
    stats = [
        {"prompts": 30.0, "candidates": 120.0, "candidate_reward_mean": 0.2, "kl_to_pi_0": 1.5},
        {"prompts": 10.0, "candidates": 40.0, "candidate_reward_mean": 0.6},
    ]
    assert merged_stats(stats) == pytest.approx(
        {"prompts": 40.0, "candidates": 160.0, "candidate_reward_mean": 0.3, "kl_to_pi_0": 1.5}
    )
    for step, ranks in ((10, (0, 1)), (2, (0, 1)), (12, (0,))):
        for rank in range(2):
            folder = tmp_path / "online" / f"refresh-{step:07d}" / f"rank-{rank}"
            folder.mkdir(parents=True)
            if rank in ranks:
                record = RefreshRecord(
                    start_step=step, micro_batches=[[0]], stats=stats[rank], refresh_every=1, made_with={}
                )
                record.write(folder / "refresh.json")
    found = written_refreshes(tmp_path)
    assert [r.start_step for r in found] == [2, 10]
    assert found[0].stats == merged_stats(stats)
    assert [f.name for f in found[1].folders] == ["rank-0", "rank-1"]
