"""Pipeline output format, counts and summary (in process; a scripted generator keeps it fast)."""

from __future__ import annotations

import json

import pytest

from pofe.preprocess.config import GenerateConfig, JudgeConfig, PipelineConfig
from pofe.preprocess.judges import JudgeStats
from pofe.preprocess.judges.pairwise import preferences_both_orders
from pofe.preprocess.manifest import ManifestMismatch
from pofe.preprocess.pipeline import run_pipeline


class ScriptedGenerator:
    """Candidates "<answer>", with deliberate duplicates: exact and near (case/punctuation)."""

    name = "scripted"

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, n, sampling):
        self.calls += 1
        base = ["4", "4", "Four.", "four", "5", "3"]
        return [[base[k % len(base)] for k in range(n)] for _ in prompts]


class LengthPairJudge:
    """Pairwise: longer wins (no position bias)."""

    def __init__(self):
        self.stats = JudgeStats()

    def preferences(self, prompts, responses):
        fn = lambda items: [1.0 if len(a) > len(b) else 0.0 if len(a) < len(b) else 0.5 for _, a, b in items]  # noqa: E731
        return preferences_both_orders(fn, prompts, responses, self.stats)


ROWS = [
    {"prompt": "2+2=", "human": "4 (human)"},
    {"prompt": [{"role": "user", "content": "1+3="}], "human": ["4!", "four"]},
    {"prompt": "1+1=", "human": None},
]
GEN = GenerateConfig(num_candidates=5, include_dataset_responses=["human"], max_new_tokens=4)


def _reward(prompt, response):
    return float(len(response))


def test_rrhf_rows_format_and_summary(tiny_policy, tmp_path):
    judge = JudgeConfig(type="python", function=f"{__name__}:_reward")
    res = run_pipeline(
        ROWS, policy_path=str(tiny_policy), method="rrhf", generate=GEN, judge=judge,
        candidates=PipelineConfig(out_dir=str(tmp_path), shard_size=2, progress=False), generator=ScriptedGenerator(),
    )
    rows = [json.loads(l) for l in res.data_path.read_text().splitlines()]
    assert res.rows == 3 and len(rows) == 3
    assert all(list(r) == ["prompt", "responses", "rewards"] for r in rows)
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in ROWS]  # as input: str or messages
    # Model candidates (n=5): 4, 4, Four., four, 5. Dataset responses come first.
    # Row 0: [4 (human), 4, 4*, Four., four~, 5]          exact 1 (*), near 1 (~)
    # Row 1: [4!, four, 4, 4*, Four.~, four*, 5]          exact 2, near 1 ("4!" is not "4":
    #        a factorial, say; "Four." ~ "four": case and the final full stop)
    # Row 2: [4, 4*, Four., four~, 5]                      exact 1, near 1  -> totals 4 and 3
    assert rows[0]["responses"] == ["4 (human)", "4", "Four.", "5"]
    assert rows[0]["rewards"] == [9.0, 1.0, 5.0, 1.0]
    assert rows[1]["responses"] == ["4!", "four", "4", "5"]
    s = json.loads(res.summary_path.read_text())
    assert s["rows"] == 3 and s["rows_in"] == 3
    assert s["duplicates_removed"] == {"exact": 4, "near": 3}
    assert s["candidates_by_source"] == {"human": 3, "policy": 8}
    assert s["mean_best_of_k_reward"] == pytest.approx((9 + 4 + 5) / 3)
    assert s["generate"]["backend"] == "transformers" and s["judge"]["type"] == "python"


def test_sppo_scalar_judge_gives_bradley_terry_win_rates(tiny_policy, tmp_path):
    judge = JudgeConfig(type="python", function=f"{__name__}:_reward")
    res = run_pipeline(
        ROWS, policy_path=str(tiny_policy), method="sppo", generate=GEN, judge=judge,
        candidates=PipelineConfig(out_dir=str(tmp_path), progress=False), generator=ScriptedGenerator(),
    )
    rows = [json.loads(l) for l in res.data_path.read_text().splitlines()]
    assert all(list(r) == ["prompt", "responses", "win_rates"] for r in rows)
    for r in rows:
        assert all(0.0 <= w <= 1.0 for w in r["win_rates"])
        assert sum(r["win_rates"]) == pytest.approx(len(r["win_rates"]) / 2)  # P + P.T = 1
    w = rows[0]["win_rates"]
    assert w[0] == max(w)  # the longest (highest reward) wins most


def test_sppo_pairwise_best_worst(tiny_policy, tmp_path):
    judge = JudgeConfig(type="pairwise_llm", base_url="http://127.0.0.1:9/v1")  # never called: judge_impl given
    res = run_pipeline(
        ROWS, policy_path=str(tiny_policy), method="sppo", generate=GEN, judge=judge,
        candidates=PipelineConfig(out_dir=str(tmp_path), keep="best_worst", progress=False),
        generator=ScriptedGenerator(), judge_impl=LengthPairJudge(),
    )
    rows = [json.loads(l) for l in res.data_path.read_text().splitlines()]
    assert all(len(r["responses"]) == 2 for r in rows)
    assert rows[0]["responses"][0] == "4 (human)"  # longest = best
    assert rows[0]["win_rates"][0] > rows[0]["win_rates"][1]


def test_rrhf_rejects_pairwise_judge(tiny_policy, tmp_path):
    with pytest.raises(ValueError, match="RRHF needs a scalar reward"):
        run_pipeline(ROWS, policy_path=str(tiny_policy), method="rrhf", generate=GEN,
                     judge=JudgeConfig(type="pairwise_llm", base_url="http://127.0.0.1:9/v1"),
                     candidates=PipelineConfig(out_dir=str(tmp_path)))


def test_resume_skips_done_shards_and_manifest_guards(tiny_policy, tmp_path):
    judge = JudgeConfig(type="python", function=f"{__name__}:_reward")
    g1 = ScriptedGenerator()
    kw = dict(policy_path=str(tiny_policy), method="rrhf", judge=judge,
              candidates=PipelineConfig(out_dir=str(tmp_path), shard_size=1, progress=False))
    first = run_pipeline(ROWS, generate=GEN, generator=g1, **kw).data_path.read_bytes()
    g2 = ScriptedGenerator()
    (tmp_path / "judge" / "shard-00001.jsonl").unlink()
    assert run_pipeline(ROWS, generate=GEN, generator=g2, **kw).data_path.read_bytes() == first
    assert g2.calls == 0  # generation shards were all reused
    with pytest.raises(ManifestMismatch, match="differs in: generate"):
        run_pipeline(ROWS, generate=GEN.model_copy(update={"seed": 1}), generator=g2, **kw)


def _picky(prompt, response):
    if response == "5":
        raise RuntimeError("cannot judge fives")
    return float(len(response))


def test_abstentions_drop_candidates_and_are_counted(tiny_policy, tmp_path):
    """Every row has a "5" candidate: 3 abstentions, each removing that candidate from its row."""
    res = run_pipeline(
        ROWS, policy_path=str(tiny_policy), method="rrhf", generate=GEN,
        judge=JudgeConfig(type="python", function=f"{__name__}:_picky"),
        candidates=PipelineConfig(out_dir=str(tmp_path), progress=False),
        generator=ScriptedGenerator(),
    )
    rows = [json.loads(l) for l in res.data_path.read_text().splitlines()]
    assert all("5" not in r["responses"] and len(r["responses"]) == len(r["rewards"]) for r in rows)
    assert res.summary["judge_abstentions"] == 3
    assert res.summary["judge_abstention_reasons"] == {"RuntimeError": 3}


def test_pipeline_config_block(tiny_policy, tmp_path):
    judge = JudgeConfig(type="python", function=f"{__name__}:_reward")
    pc = PipelineConfig(out_dir=str(tmp_path / "x"), shard_size=1, keep="best_worst", progress=False)
    res = run_pipeline(ROWS, policy_path=str(tiny_policy), method="sppo", generate=GEN, judge=judge, candidates=pc,
                       generator=ScriptedGenerator())
    assert res.data_path.parent == tmp_path / "x" and len(list((tmp_path / "x" / "judge").glob("*.jsonl"))) == 3
    assert all(len(json.loads(l)["responses"]) == 2 for l in res.data_path.read_text().splitlines())


def test_missing_prompt_column_names_the_row(tiny_policy, tmp_path):
    with pytest.raises(KeyError, match="prompt row 1 has no 'prompt' column"):
        run_pipeline([{"prompt": "a"}, {"question": "b"}], policy_path=str(tiny_policy), method="rrhf",
                     generate=GEN, judge=JudgeConfig(type="python", function="a:b"),
                     candidates=PipelineConfig(out_dir=str(tmp_path)))


def test_real_backend_and_reward_model(tiny_policy, tiny_reward_model, tmp_path):
    """transformers generation + reward-model judge, end to end (small)."""
    res = run_pipeline(
        [{"prompt": "3+4="}, {"prompt": "5+1="}], policy_path=str(tiny_policy), method="rrhf",
        generate=GenerateConfig(num_candidates=3, max_new_tokens=6, temperature=1.0),
        judge=JudgeConfig(type="reward_model", model=str(tiny_reward_model)),
        candidates=PipelineConfig(out_dir=str(tmp_path), progress=False),
    )
    rows = [json.loads(l) for l in res.data_path.read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["responses"]) == len(r["rewards"]) >= 2 for r in rows)
    assert res.summary["mean_candidate_tokens"] is not None


def test_empty_candidates_are_removed_before_judging_and_counted(tiny_policy, tmp_path):
    """A policy answering with end-of-turn at once gives "", which no judge can score."""
    class Scripted:
        name = "scripted"

        def generate(self, prompts, n, sampling):
            return [["", "  ", "7", "8"][:n] for _ in prompts]

    rows = [{"prompt": "3+4="}, {"prompt": "1+1="}]
    result = run_pipeline(
        rows, policy_path=str(tiny_policy), method="rrhf",
        generate=GenerateConfig(num_candidates=4), judge=JudgeConfig(type="python", function="pofe.demo.task:reward"),
        candidates=PipelineConfig(out_dir=str(tmp_path / "c"), progress=False), generator=Scripted(),
    )
    data = [json.loads(line) for line in result.data_path.read_text().splitlines()]
    assert [d["responses"] for d in data] == [["7", "8"], ["7", "8"]]
    assert data[0]["rewards"] == [1.0, 0.25]  # 3+4: exact, off by one
    assert result.summary["empty_candidates_removed"] == 4
