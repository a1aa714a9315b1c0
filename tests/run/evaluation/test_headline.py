"""The report's default headline (each round's trained model on its own prompts beside its
candidates' best-of-k) and its sampled-completions table.

The run is built from real parts without training: two rounds whose "trained" models are the
two tiny models, each round's candidates from the real generate/judge pipeline, then the real
`evaluate_run` (a recipe without a `pofe.eval` block) and `write_report`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import yaml

from pofe.demo.task import make_prompt_rows, reward
from pofe.run.folder import RoundRecord, RunFolder, RunState
from tests.helpers import CPU_SETTINGS

NUM_PROMPTS, HEADLINE_PROMPTS = 20, 16  # more prompts than the default headline takes


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def headline_run(tmp_path_factory, tiny_model, tiny64_model):
    from pofe.run.evaluation.evaluate import evaluate_run
    from pofe.run.report import write_report
    from pofe_candidates import CandidatesConfig, GenerateConfig, JudgeConfig, run_pipeline

    root = tmp_path_factory.mktemp("headline")
    folder = RunFolder(root / "run")
    rows = make_prompt_rows(NUM_PROMPTS, k_wrong=2, seed=3)
    pofe = {
        "generate": {
            "backend": "transformers",
            "num_candidates": 2,
            "temperature": 1.0,
            "max_new_tokens": 4,
            "seed": 0,
            "include_dataset_responses": ["answer", "near_misses"],
        },
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    }
    models = {1: str(tiny_model), 2: str(tiny64_model)}  # round t's "trained" model
    for t, policy_in in ((1, str(tiny_model)), (2, models[1])):
        folder.round_prompts(t).parent.mkdir(parents=True, exist_ok=True)
        folder.round_prompts(t).write_text("".join(json.dumps(r) + "\n" for r in rows))
        run_pipeline(
            rows,
            policy_path=policy_in,
            method="rrhf",
            generate=GenerateConfig(**pofe["generate"]),
            judge=JudgeConfig(**pofe["judge"]),
            candidates=CandidatesConfig(out_dir=str(folder.candidates(t)), progress=False),
        )
    RunState(
        folder.state,
        "recipe.yml",
        "f",
        "rrhf",
        base_model=str(tiny_model),
        starts=[time.time()],
        rounds_planned=2,
        final_policy=models[2],
        rounds={str(t): RoundRecord(policy_in=str(tiny_model), policy_out=path) for t, path in models.items()},
    ).save()
    recipe = root / "recipe.yml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "base_model": str(tiny_model),
                "plugins": ["pofe.PofePlugin"],
                "rl": "rrhf",
                "datasets": [{"path": str(root / "prompts.jsonl"), "type": "pofe.prompts"}],
                "output_dir": str(folder.root),
                "sequence_len": 64,
                "micro_batch_size": 1,
                "num_epochs": 1,
                "learning_rate": 1e-3,
                **CPU_SETTINGS,
                "pofe": pofe,
            }
        )
    )
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evaluate_run(recipe, echo=lambda _: None)
    report = write_report(folder)
    return {"folder": folder, "rows": rows, "models": models, "report": report, "recipe": recipe}


def test_default_headline_rescored_by_hand(headline_run):
    """Without a `pofe.eval` block each round's model answers the first 16 judged prompts
    once, greedily; re-scoring the recorded answers with the judge function gives the
    report's trained-model reward, and re-judging each prompt's generated candidates gives
    the same prompts' best-of-k."""
    folder, rows = headline_run["folder"], headline_run["rows"]
    recorded = json.loads((folder.eval_dir / "headline.json").read_text())
    # greedy, with the candidates' token budget (pofe.generate.max_new_tokens), not pofe.eval's 64
    assert recorded["skipped"] is None and recorded["decoding"]["temperature"] == 0.0
    assert recorded["decoding"]["max_new_tokens"] == 4
    assert not (folder.eval_dir / "eval.json").exists()  # no held-out prompts by default
    rep = headline_run["report"].data
    for t in (1, 2):
        samples = recorded["rounds"][str(t)]["samples"]
        assert recorded["rounds"][str(t)]["model"] == headline_run["models"][t]
        assert [s["prompt"] for s in samples] == [r["prompt"] for r in rows[:HEADLINE_PROMPTS]]
        assert [s["sample"] for s in samples] == [0] * HEADLINE_PROMPTS
        rescored = [reward(s["prompt"], s["completion"]) for s in samples]
        assert [s["reward"] for s in samples] == rescored
        head = rep["rounds"][t - 1]["trained_on_train_prompts"]
        assert head["num_prompts"] == HEADLINE_PROMPTS
        assert head["model_mean_reward"] == pytest.approx(sum(rescored) / len(rescored))

        generated = {
            g["index"]: g for p in sorted((folder.candidates(t) / "generate").glob("shard-*.jsonl")) for g in _jsonl(p)
        }
        best = [max(reward(rows[i]["prompt"], c) for c in generated[i]["candidates"]) for i in range(HEADLINE_PROMPTS)]
        assert head["candidates_best_of_k_reward"] == pytest.approx(sum(best) / len(best))
        assert head["candidates_best_of_k_reward"] == 1.0  # the dataset's answer is a candidate
        policy = [
            reward(rows[i]["prompt"], c)
            for i in range(HEADLINE_PROMPTS)
            for c, source in zip(generated[i]["candidates"], generated[i]["sources"], strict=True)
            if source == "policy"
        ]
        assert head["policy_sample_mean_reward"] == pytest.approx(sum(policy) / len(policy))
        for row, s in zip(head["samples"], samples):
            assert row["best_candidate_reward"] == reward(s["prompt"], row["best_candidate"]) == 1.0

        md = headline_run["report"].markdown_path.read_text()
        gap = head["model_mean_reward"] - 1.0
        assert (
            f"| {t} | {HEADLINE_PROMPTS} | {head['policy_sample_mean_reward']:.3f} | "
            f"{head['candidates_mean_reward']:.3f} | 1.000 | {head['model_mean_reward']:.3f} | {gap:.3f} |"
        ) in md


def test_headline_answers_are_the_round_models_greedy_answers(headline_run):
    """The recorded answers are each round's own model's greedy decoding (transformers'
    generate, called here directly): round 2's differ from what round 1's model says."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = headline_run["folder"]
    recorded = json.loads((folder.eval_dir / "headline.json").read_text())
    max_new = recorded["decoding"]["max_new_tokens"]
    answers = {}
    for t, path in headline_run["models"].items():
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for s in recorded["rounds"][str(t)]["samples"][:3]:
            text = tok.apply_chat_template(
                [{"role": "user", "content": s["prompt"]}], tokenize=False, add_generation_prompt=True
            )
            ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out = model.generate(
                ids,
                do_sample=False,
                max_new_tokens=max_new,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
            answers[t, s["index"]] = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            assert s["completion"] == answers[t, s["index"]]
    assert any(answers[1, i] != answers[2, i] for (t, i) in answers if t == 1)


def test_samples_table_and_rows(headline_run):
    """`sample_rows` gives every headline answer as a plain JSON-able row; report.md shows
    the first four of each round, escaped."""
    from pofe.run.report.collect import sample_rows
    from pofe.run.report.markdown import text_cell

    rep = headline_run["report"].data
    rows = sample_rows(rep)
    assert len(rows) == 2 * HEADLINE_PROMPTS and json.loads(json.dumps(rows)) == rows
    assert set(rows[0]) == {
        "round",
        "index",
        "sample",
        "prompt",
        "prompt_text",
        "completion",
        "tokens",
        "reward",
        "best_candidate",
        "best_candidate_reward",
    }
    assert all(r["prompt_text"] == r["prompt"] for r in rows)  # plain prompts: their text as it is
    md = headline_run["report"].markdown_path.read_text()
    for t in (1, 2):
        mine = [r for r in rows if r["round"] == t]
        for r in mine[:4]:
            assert (
                f"| {text_cell(r['prompt'])} | {text_cell(r['completion'])} | {r['reward']:.3f} | "
                f"{text_cell(r['best_candidate'])} | {r['best_candidate_reward']:.3f} |"
            ) in md
        assert f"| {text_cell(mine[4]['prompt'])} |" not in md.split(f"Round {t} (pi_{t}):")[1].split("Round")[0]


def test_text_cell_shows_the_text_literally():
    """A completion with table pipes, HTML, emphasis, code, a link, an image, an entity, a
    heading and list markers on its lines is one cell whose text, as CommonMark with GFM tables
    and strikethrough (markdown-it) parse it, is the completion."""
    from markdown_it import MarkdownIt

    from pofe.run.report.markdown import table, text_cell

    nasty = "# a | b\n<script>x</script> *em* _u_ `code` [l](http://x) ![i](y) &amp; \\ ~~s~~\r\n+ item\n1. end"
    md = table(["prompt", "completion"], [["p", text_cell(nasty)]])
    tokens = MarkdownIt("commonmark").enable(["table", "strikethrough"]).parse(md)
    cells = [tokens[i + 1] for i, tok in enumerate(tokens) if tok.type == "td_open"]
    assert len(cells) == 2  # the pipe did not split the row
    parsed = "".join("\n" if c.type == "html_inline" and c.content == "<br>" else c.content for c in cells[1].children)
    assert all(c.type in ("text", "html_inline") for c in cells[1].children)  # no emphasis, link, code
    assert parsed == nasty.replace("\r\n", "\n")
    assert text_cell("x" * 300).endswith("…") and len(text_cell("x" * 300)) == 200
    assert text_cell("") == "*(empty)*"


def test_eval_switch_and_headline_keys():
    """`pofe.eval` is on by default (headline only), `false` turns it off; held-out keys
    without held-out prompts and greedy with several samples are refused."""
    from pofe.args import PofeConfig
    from pofe.args.rounds import EvalConfig

    default = PofeConfig().eval
    assert (default.train_prompts, default.train_samples, default.train_temperature) == (16, 1, 0.0)
    assert default.has_held_out and default.held_out is None  # the default slice of the pool
    assert not EvalConfig(held_out=0).has_held_out
    assert PofeConfig(eval=False).eval is False is PofeConfig(eval=None).eval
    assert PofeConfig.model_validate(PofeConfig().model_dump()).eval == default  # dumped and read again
    with pytest.raises(ValueError, match=r"pofe.eval.num_samples shapes the held-out evaluation"):
        EvalConfig(held_out=0, num_samples=2)
    with pytest.raises(ValueError, match="set train_samples: 1"):
        EvalConfig(train_samples=2)
    assert EvalConfig(train_samples=2, train_temperature=0.7).train_samples == 2


def test_pairwise_judge_or_no_eval_says_why(headline_run, tmp_path):
    """A pairwise judge records why there is no headline, and the report says it; a recipe
    with `pofe.eval: false` cannot be evaluated."""
    from pofe.args.rounds import EvalConfig
    from pofe.run.evaluation.evaluate import evaluate_run
    from pofe.run.evaluation.headline import headline_skipped
    from pofe.run.report.markdown import headline_section
    from pofe_candidates import JudgeConfig

    why = headline_skipped(EvalConfig(), JudgeConfig(type="python_pairwise", function="m:f"))
    assert "pairwise" in why
    assert headline_skipped(EvalConfig(train_prompts=0), JudgeConfig(type="python", function="m:f"))
    rep = {"headline": {"skipped": why}, "rounds": []}
    assert f"No reward headline: {why}." in "\n".join(headline_section(rep))
    assert "No headline: `axolotl pofe eval` has not run" in "\n".join(headline_section({"headline": None}))

    off = yaml.safe_load(headline_run["recipe"].read_text())
    off["pofe"]["eval"] = False
    (tmp_path / "off.yml").write_text(yaml.safe_dump(off))
    with pytest.raises(ValueError, match="pofe.eval: false"):
        evaluate_run(tmp_path / "off.yml")


def test_an_evaluation_waits_for_no_run_and_reads_none_half_done(headline_run, monkeypatch):
    """While a runner holds the run's lock (a round training), `axolotl pofe eval` is refused,
    naming the runner, and writes nothing (it evaluated the rounds finished so far and exited
    0); the runner's own eval stage, which inherits the lock, evaluates under it."""
    import os
    import socket

    from pofe.run.evaluation.evaluate import evaluate_run
    from pofe.run.guards import LOCK_FD_ENV, RunLock, RunLocked

    folder = headline_run["folder"]
    headline = folder.eval_dir / "headline.json"
    before = headline.read_text()
    with RunLock.acquire(folder.lock, print) as runner:
        with pytest.raises(RunLocked) as refused:
            evaluate_run(headline_run["recipe"], echo=lambda _: None)
        assert str(refused.value) == (
            f"{folder.root} is in use by `axolotl pofe run` (PID {os.getpid()} on host {socket.gethostname()}, "
            f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(runner.holder['started']))}); an "
            "evaluation read now would take a round that is still training as finished. Wait for it to finish, "
            f"or stop it (kill {os.getpid()}), then run `axolotl pofe eval` again."
        )
        assert headline.read_text() == before
        monkeypatch.setenv(LOCK_FD_ENV, str(runner.fileno()))  # as the runner starts its eval stage
        headline.unlink()
        evaluate_run(headline_run["recipe"], echo=lambda _: None)
    assert json.loads(headline.read_text())["rounds"] == json.loads(before)["rounds"]


def answer_length_gap(prompts, completions, answer, **kwargs):
    """A GRPO-style reward function reading the dataset's `answer` column."""
    return [-abs(len(c) - len(a)) for c, a in zip(completions, answer, strict=True)]


def test_headline_passes_dataset_columns_to_reward_functions(headline_run, tmp_path):
    """A `reward_funcs` judge that reads a dataset column (as GRPO reward functions do) gets
    each headline prompt's column from the round's prompt file, as the judge stage gave it:
    the recorded rewards equal the function applied by hand to the answers and `answer`."""
    import shutil

    from pofe.run.evaluation.evaluate import evaluate_run

    folder = RunFolder(tmp_path / "run")
    shutil.copytree(headline_run["folder"].root, folder.root)
    recipe = yaml.safe_load(headline_run["recipe"].read_text())
    recipe["output_dir"] = str(folder.root)
    recipe["pofe"]["judge"] = {
        "type": "python",
        "reward_funcs": ["tests.run.evaluation.test_headline.answer_length_gap"],
        "reward_weights": [2.0],
    }
    (tmp_path / "funcs.yml").write_text(yaml.safe_dump(recipe))
    evaluate_run(tmp_path / "funcs.yml", echo=lambda _: None)

    recorded = json.loads((folder.eval_dir / "headline.json").read_text())
    answers = {r["prompt"]: r["answer"] for r in headline_run["rows"]}
    for t in (1, 2):
        samples = recorded["rounds"][str(t)]["samples"]
        assert len(samples) == HEADLINE_PROMPTS
        by_hand = [2.0 * -abs(len(s["completion"]) - len(answers[s["prompt"]])) for s in samples]
        assert [s["reward"] for s in samples] == by_hand


def test_held_out_rows_read_as_their_dataset_entry_reads_them():
    """Held-out rows from the dataset follow its `prompt_format`: an HH transcript becomes
    chat turns (the final empty `Assistant:` the generation point), a plain prompt stays as
    it is, and a malformed transcript names the file, row and field."""
    from pofe.run.evaluation.inputs import dataset_prompts

    rows = [
        {"prompt": "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: What is 2+2?\n\nAssistant:"},
        {"prompt": "\n\nHuman: Name a colour.\n\nAssistant:"},
    ]
    assert dataset_prompts(rows, "prompt", {"prompt_format": "hh"}, "held_out.jsonl", "rrhf") == [
        [
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "What is 2+2?"},
        ],
        [{"role": "user", "content": "Name a colour."}],
    ]
    assert dataset_prompts(rows, "prompt", {}, "held_out.jsonl", "rrhf") == [r["prompt"] for r in rows]
    with pytest.raises(ValueError, match=r"held_out\.jsonl.*row 1.*'prompt'"):
        dataset_prompts(
            [rows[0], {"prompt": "no turns here"}], "prompt", {"prompt_format": "hh"}, "held_out.jsonl", "rrhf"
        )


def longer_wins(prompt, response_a, response_b):
    """A pairwise judge function: the longer response wins, equal lengths tie."""
    return 0.5 if len(response_a) == len(response_b) else float(len(response_a) > len(response_b))


def _held_out_run(headline_run, tmp_path):
    """A copy of the headline run evaluated on 3 held-out prompts (greedy, one sample) and
    with a pairwise second judge: (its folder, its recipe at tmp_path/eval.yml, the prompts)."""
    import shutil

    folder = RunFolder(tmp_path / "run")
    shutil.copytree(headline_run["folder"].root, folder.root)
    held_out = make_prompt_rows(3, k_wrong=1, seed=5)
    (tmp_path / "held_out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    recipe = yaml.safe_load(headline_run["recipe"].read_text())
    recipe["output_dir"] = str(folder.root)
    recipe["pofe"]["eval"] = {
        "prompts": str(tmp_path / "held_out.jsonl"),
        "num_samples": 1,
        "temperature": 0.0,
        "max_new_tokens": 4,
        "judge2": {"type": "python_pairwise", "function": "tests.run.evaluation.test_headline:longer_wins"},
    }
    (tmp_path / "eval.yml").write_text(yaml.safe_dump(recipe))
    return folder, recipe, held_out


def test_each_judge_is_built_once_per_evaluation(headline_run, tmp_path, monkeypatch):
    """Three models (pi_0, pi_1, pi_2), two headline rounds, held-out prompts and a second
    judge: `make_judge` runs twice, once per judge (it used to run once per headline round and
    once more per judge for the held-out prompts: four times). The scalar judge reads the
    dataset's prompt (the rewards equal `reward` applied by hand; a rendered prompt would not
    parse); the second judge, set to read the rendered prompt as PairRM does, gets each
    held-out prompt with the policy's chat template applied, in one call for all models."""
    from transformers import AutoTokenizer

    from pofe.run.evaluation import evaluate as evaluation
    from pofe_candidates.render import render_prompt

    folder, recipe, held_out = _held_out_run(headline_run, tmp_path)

    built, received, make_judge = [], [], evaluation.make_judge

    def counting_make_judge(cfg):
        judge = make_judge(cfg)
        built.append(cfg.type)
        if cfg.type == "python_pairwise":
            judge.reads_rendered_prompt = True
            preferences = judge.preferences

            def spy(prompts, responses):
                received.append(list(prompts))
                return preferences(prompts, responses)

            judge.preferences = spy
        return judge

    monkeypatch.setattr(evaluation, "make_judge", counting_make_judge)
    evaluation.evaluate_run(tmp_path / "eval.yml", echo=lambda _: None)

    assert built == ["python", "python_pairwise"]
    assert sorted(json.loads((folder.eval_dir / "headline.json").read_text())["rounds"]) == ["1", "2"]
    result = json.loads((folder.eval_dir / "eval.json").read_text())
    assert [m["name"] for m in result["models"]] == ["pi_0", "pi_1", "pi_2"]
    samples = _jsonl(folder.eval_dir / "samples.jsonl")
    assert len(samples) == 3 * 3
    assert [s["reward"] for s in samples] == [reward(s["prompt"], s["response"]) for s in samples]
    tok = AutoTokenizer.from_pretrained(recipe["base_model"])
    rendered = [render_prompt(tok, r["prompt"]).text for r in held_out]
    assert received == [rendered] and rendered[0] != held_out[0]["prompt"]


def test_no_policy_is_alive_when_a_judge_is_built(headline_run, tmp_path, monkeypatch):
    """Every model's answers come first, each policy loaded, used and freed, and only then
    are the judges built: when `make_judge` runs, every model `load_policy` gave (pi_0, pi_1,
    pi_2, and pi_0 again for the KL pass) has been loaded and is gone (its weak reference is
    dead), so a GPU never holds a policy beside a reward model. Each of the two stages logs
    its peak memory, and both eval files record them under `peak_memory`."""
    import weakref

    from pofe.run.evaluation import evaluate as evaluation
    from pofe.run.evaluation import sampler as eval_sampler

    folder, _, _ = _held_out_run(headline_run, tmp_path)
    loaded, at_build, load_policy, make_judge = [], [], evaluation.load_policy, evaluation.make_judge

    def recording_load_policy(path, **kwargs):
        model = load_policy(path, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    def checking_make_judge(cfg):
        at_build.append((cfg.type, len(loaded), [ref() is None for ref in loaded]))
        return make_judge(cfg)

    monkeypatch.setattr(evaluation, "load_policy", recording_load_policy)  # the KL pass's pi_0
    monkeypatch.setattr(eval_sampler, "load_policy", recording_load_policy)  # each model's
    monkeypatch.setattr(evaluation, "make_judge", checking_make_judge)
    echoed = []
    evaluation.evaluate_run(tmp_path / "eval.yml", echo=echoed.append)

    assert at_build == [("python", 4, [True] * 4), ("python_pairwise", 4, [True] * 4)]
    # each stage's peak memory: one line each, and the same record in both files
    peaks = [line for line in echoed if line.startswith("eval: peak memory")]
    assert [line.split(":")[1] for line in peaks] == [" peak memory of the answers", " peak memory of the judging"]
    recorded = [json.loads((folder.eval_dir / f).read_text())["peak_memory"] for f in ("headline.json", "eval.json")]
    assert recorded[0] == recorded[1]
    expected_device = "cuda" if torch.cuda.is_available() else "cpu"
    assert recorded[0]["device"] == expected_device and sorted(recorded[0]) == ["answers_gib", "device", "judging_gib"]
    assert 0 < recorded[0]["answers_gib"] and 0 < recorded[0]["judging_gib"]
    if expected_device == "cpu":  # the process's peak so far: judging's is never below the answers'
        assert recorded[0]["answers_gib"] <= recorded[0]["judging_gib"]


def test_a_later_evaluation_reads_the_answers_it_stored(headline_run, tmp_path, monkeypatch):
    """`pofe.stop_when` evaluates every iterate after every round: the answers of a model whose
    weights, prompts and decoding are unchanged come from eval/answers/, not from the model. A
    second evaluation loads only pi_0 (its pass over every model's samples, the KL); after
    pi_2's weights are written anew (a round trained again) it loads pi_2 and pi_0, and only
    pi_2's log-probs move. The second evaluation's eval.json, samples.jsonl and headline.json
    equal the first's, made with no store. (4 headline prompts a round, to keep it quick.)"""
    import shutil

    from safetensors.torch import load_file, save_file

    from pofe.run.evaluation import evaluate as evaluation
    from pofe.run.evaluation import sampler as eval_sampler

    folder, recipe, _ = _held_out_run(headline_run, tmp_path)
    recipe["pofe"]["eval"]["train_prompts"] = 4
    (tmp_path / "eval.yml").write_text(yaml.safe_dump(recipe))
    pi_0, pi_1, pi_2 = recipe["base_model"], headline_run["models"][1], str(tmp_path / "pi_2")
    shutil.copytree(headline_run["models"][2], pi_2)
    state = json.loads(folder.state.read_text())
    state["rounds"]["2"]["policy_out"] = pi_2
    folder.state.write_text(json.dumps(state))
    store = folder.eval_dir / "answers"
    shutil.rmtree(store, ignore_errors=True)  # the copied run's stored headline answers
    loaded, echoed, load_policy = [], [], evaluation.load_policy

    def recording_load_policy(path, **kwargs):
        loaded.append(path)
        return load_policy(path, **kwargs)

    def evaluate() -> dict:
        loaded.clear()
        evaluation.evaluate_run(tmp_path / "eval.yml", echo=echoed.append)
        out = {name: json.loads((folder.eval_dir / name).read_text()) for name in ("eval.json", "headline.json")}
        for record in out.values():
            record.pop("peak_memory")
        return {**out, "samples": _jsonl(folder.eval_dir / "samples.jsonl")}

    monkeypatch.setattr(evaluation, "load_policy", recording_load_policy)
    monkeypatch.setattr(eval_sampler, "load_policy", recording_load_policy)
    first = evaluate()
    assert loaded == [pi_0, pi_1, pi_2, pi_0]
    assert evaluate() == first and loaded == [pi_0]
    assert f"eval: pi_1: every answer read from {store}: weights, prompts and decoding unchanged" in echoed

    weights = Path(pi_2) / "model.safetensors"
    torch.manual_seed(0)
    state_dict = {k: v + 0.5 * torch.randn_like(v) for k, v in load_file(weights).items()}
    save_file(state_dict, weights, metadata={"format": "pt"})
    retrained = evaluate()
    assert loaded == [pi_2, pi_0]
    # pi_2's answers are its new weights' (their log-probs moved); pi_0's and pi_1's are kept
    kl, kl_before = retrained["eval.json"]["kl_to_pi_0"], first["eval.json"]["kl_to_pi_0"]
    assert kl[:2] == kl_before[:2] and kl[2] != kl_before[2]
