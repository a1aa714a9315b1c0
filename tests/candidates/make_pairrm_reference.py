"""llm-blender's own PairRM outputs on a tiny random checkpoint in the published layout.

`build_checkpoint(root)` writes two directories laid out like the hub's:

    root/deberta-v3-tiny/   the backbone `model_name` points to (microsoft/deberta-v3-large's
                            layout: DeBERTa-v2 config.json, spm.model only, model.safetensors)
    root/pairrm/            llm-blender/PairRM's layout: config.json is llm-blender's RankerConfig
                            (ranker_type, model_type: deberta, model_name, source/candidate
                            lengths, ...), pytorch_model.bin is CrossCompareReranker's plain state
                            dict (pretrained_model.*, head_layer.{1,4}.*) with the word embeddings
                            resized to len(tokenizer) = backbone vocabulary + [MASK] + 4 prefixes

Weights come from a seeded generator over the encoder's (sorted) parameter names, and
spm.model is trained here on a short fixed corpus (unigram, 64 pieces, pad/cls/sep/unk =
0/1/2/3 and the NFKC normaliser `nmt_nfkc`, as DeBERTa-v3's), so any venv rebuilds the same
checkpoint; `weights_sha256` and `spm_sha256` in the fixture prove it.

`main()` needs llm-blender 0.0.2 and transformers < 5 (`.ci/pairrm-reference.sh` builds that
venv and runs this file). It loads root/pairrm with `Blender.loadranker` and records, per case,
the token ids llm-blender's collator and `cat_ids` build for every ordered pair, the logits
`_full_predict` gives (C[i, j], i as candidate 1) and `Blender.rank(..., return_scores=True)`,
once with the checkpoint's lengths and once with `source_max_length`/`candidate_max_length`
given to `rank`. Output: tests/candidates/fixtures/pairrm/reference.json.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

FIXTURES = Path(__file__).parent / "fixtures" / "pairrm"
SEED = 1234
SOURCE_MAXLENGTH, CANDIDATE_MAXLENGTH = 24, 12
# Lengths given to `rank` for the second pass; their sum 16 + 2 * 8 = 32 in the checkpoint's
# 24 : 12 : 12 proportion, so POFE's `judge.max_length: 32` maps onto exactly these.
OVERRIDE = {"source_max_length": 16, "candidate_max_length": 8}
# DeBERTa-v3's architecture (relative attention, shared keys, layer-normed relative
# embeddings, no absolute positions), shrunk. vocab_size exceeds the tokenizer's length as
# in deberta-v3-large (128,100 rows for 128,001 tokens), so the resize really changes it.
ENCODER = {
    "model_type": "deberta-v2",
    "vocab_size": 80,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "max_position_embeddings": 512,
    "relative_attention": True,
    "position_buckets": 16,
    "max_relative_positions": -1,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "type_vocab_size": 0,
    "layer_norm_eps": 1e-7,
    "pad_token_id": 0,
}
TOKENIZER_CONFIG = {"do_lower_case": False, "vocab_type": "spm"}  # what microsoft/deberta-v3-large ships
RANKER_CONFIG = {  # every RankerConfig field, as llm-blender/PairRM's config.json holds them
    "ranker_type": "pairranker",
    "model_type": "deberta",
    "model_name": None,  # set to the backbone's path
    "cache_dir": None,
    "load_checkpoint": None,
    "source_maxlength": SOURCE_MAXLENGTH,
    "candidate_maxlength": CANDIDATE_MAXLENGTH,
    "n_tasks": 1,
    "num_pos": 5,
    "num_neg": 5,
    "sub_sampling_mode": "all_pair",
    "sub_sampling_ratio": 0.4,
    "loss_type": "instructgpt",
    "reduce_type": "linear",
    "inference_mode": "bubble",
    "drop_out": 0.05,
    "fp16": True,
    "device": None,
}
N_PREFIX_TOKENS = 4  # <|source|>, <|candidate1|>, <|candidate2|>, <|candidate|>
TOKENIZER_LEN = 64 + 1  # spm pieces + [MASK]
CORPUS = (
    "the quick brown fox jumps over a lazy dog what is two plus four answer hello world how are you today "
    "[INST] [/INST] <s> </s> <|user|> <|assistant|> yes no it equals 0 1 2 3 4 5 6 7 8 9 + = ? . , ! i think so"
).split()
# Sources as the SPPO scripts pass them (the policy's chat template around the prompt, with
# its newlines); candidates short and long so both budgets truncate, one holding the [SEP]
# text, some with what the NFKC map and whitespace rules change (full width, tabs, runs).
CASES = [
    {
        "source": "<s> [INST] what is two plus two? [/INST]",
        "candidates": ["four", "it is 4.", "i think it equals five, no, four!"],
    },
    {
        "source": "<|user|>\nwhat is two plus four？\n<|assistant|>\n",
        "candidates": ["ｓｉｘ", "it  is\t6\n\nyes", " 6 "],
    },
    {
        "source": "hello",
        "candidates": ["hello world how are you today? the quick brown fox jumps over the lazy dog", "hi [SEP] yes"],
    },
    {
        "source": "<s> [INST] the quick brown fox jumps over the lazy dog. how many words? [/INST]",
        "candidates": ["nine", "9", "the answer is 9 words", "no idea"],
    },
]


def train_spm(path: Path) -> None:
    """A 64-piece unigram spm.model with DeBERTa-v3's special ids and NFKC normaliser."""
    import sentencepiece

    lines = [" ".join(CORPUS[i:] + CORPUS[:i]) for i in range(len(CORPUS))]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=(buf := _Buffer()),
        vocab_size=64,
        model_type="unigram",
        normalization_rule_name="nmt_nfkc",
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        pad_piece="[PAD]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        unk_piece="[UNK]",
        num_threads=1,
        minloglevel=2,
        character_coverage=1.0,
        hard_vocab_limit=False,
    )
    path.write_bytes(buf.data)


class _Buffer:
    data = b""

    def write(self, data: bytes) -> None:
        self.data += data


def encoder_state(config) -> dict[str, torch.Tensor]:
    """Seeded weights for every persistent float tensor of DebertaV2Model(config), by sorted name."""
    from transformers import DebertaV2Model

    shapes = {k: v.shape for k, v in DebertaV2Model(config).state_dict().items() if v.is_floating_point()}
    g = torch.Generator().manual_seed(SEED)
    state = {}
    for name in sorted(shapes):
        w = 0.2 * torch.randn(shapes[name], generator=g)
        state[name] = 1.0 + w if "LayerNorm" in name and name.endswith("weight") else w
    return state


def head_state(hidden: int, n_tasks: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED + 1)
    return {
        "head_layer.1.weight": 0.3 * torch.randn(hidden, 2 * hidden, generator=g),
        "head_layer.1.bias": 0.1 * torch.randn(hidden, generator=g),
        "head_layer.4.weight": 0.3 * torch.randn(n_tasks, hidden, generator=g),
        "head_layer.4.bias": 0.1 * torch.randn(n_tasks, generator=g),
    }


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def spm_digest(ranker_dir: Path) -> str:
    model_name = json.loads((ranker_dir / "config.json").read_text())["model_name"]
    return hashlib.sha256((Path(model_name) / "spm.model").read_bytes()).hexdigest()


def build_checkpoint(root: Path, encoder: dict | None = None, ranker_config: dict | None = None) -> Path:
    """Write root/deberta-v3-tiny and root/pairrm (see the module docstring); return root/pairrm.
    `encoder` and `ranker_config` override fields of ENCODER and RANKER_CONFIG (benchmarks/
    judges.py sizes the model up); the fixture is made with neither."""
    from safetensors.torch import save_file
    from transformers import DebertaV2Config

    encoder_cfg, ranker_cfg = {**ENCODER, **(encoder or {})}, {**RANKER_CONFIG, **(ranker_config or {})}
    base, ranker = root / "deberta-v3-tiny", root / "pairrm"
    base.mkdir(parents=True, exist_ok=True)
    ranker.mkdir(parents=True, exist_ok=True)
    config = DebertaV2Config(**{k: v for k, v in encoder_cfg.items() if k != "model_type"})
    (base / "config.json").write_text(json.dumps(encoder_cfg, indent=2))
    (base / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    train_spm(base / "spm.model")
    encoder = encoder_state(config)
    save_file(encoder, str(base / "model.safetensors"))
    # The trained ranker's encoder, embeddings cut to the resized vocabulary as llm-blender saves it.
    state = {f"pretrained_model.{k}": v for k, v in encoder.items()}
    emb = "pretrained_model.embeddings.word_embeddings.weight"
    state[emb] = state[emb][: TOKENIZER_LEN + N_PREFIX_TOKENS].clone()
    state.update(head_state(encoder_cfg["hidden_size"], ranker_cfg["n_tasks"]))
    torch.save(state, ranker / "pytorch_model.bin")
    (ranker / "config.json").write_text(json.dumps({**ranker_cfg, "model_name": str(base)}, indent=2))
    return ranker


def _reference(blender, case: dict, lengths: dict) -> dict:
    """llm-blender's token ids, logits matrix and rank scores for one case."""
    from llm_blender.blender.blender_utils import RankerDataset

    ranker, k = blender.ranker, len(case["candidates"])
    collate = blender.ranker_collator
    saved = collate.source_maxlength, collate.candidate_maxlength
    collate.source_maxlength = lengths.get("source_max_length") or saved[0]
    collate.candidate_maxlength = lengths.get("candidate_max_length") or saved[1]
    batch = collate([RankerDataset([case["source"]], [case["candidates"]])[0]])
    collate.source_maxlength, collate.candidate_maxlength = saved
    tok = blender.ranker_tokenizer
    ids = {}
    for i in range(k):
        for j in range(k):
            if i == j:
                continue
            c1, c2 = batch["candidate_ids"][:, i].clone(), batch["candidate_ids"][:, j].clone()
            c1[c1 == tok.cand_prefix_id] = tok.cand1_prefix_id
            c2[c2 == tok.cand_prefix_id] = tok.cand2_prefix_id
            cat, mask = ranker.cat_ids(
                batch["source_ids"],
                batch["source_attention_mask"],
                c1,
                batch["candidate_attention_mask"][:, i],
                c2,
                batch["candidate_attention_mask"][:, j],
            )
            ids[f"{i},{j}"] = cat[0][mask[0].bool()].tolist()
    with torch.no_grad():
        logits = ranker._full_predict(
            batch["source_ids"],
            batch["source_attention_mask"],
            batch["candidate_ids"],
            batch["candidate_attention_mask"],
        )["logits"][0]
    scores = blender.rank(
        [case["source"]], [case["candidates"]], return_scores=True, batch_size=1, disable_tqdm=True, **lengths
    )[0]
    return {"input_ids": ids, "logits": logits.tolist(), "rank_scores": [float(s) for s in scores]}


def main(out: Path) -> None:
    import tempfile

    import llm_blender
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        ranker_dir = build_checkpoint(Path(tmp))
        state = torch.load(ranker_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
        blender = llm_blender.Blender()
        blender.loadranker(str(ranker_dir), device="cpu")
        tok = blender.ranker_tokenizer
        result = {
            "made_by": "tests/candidates/make_pairrm_reference.py via .ci/pairrm-reference.sh",
            "versions": {
                "llm_blender": "0.0.2",
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "tokenizer_class": type(tok).__name__,
            },
            "weights_sha256": weights_digest(state),
            "spm_sha256": spm_digest(ranker_dir),
            "len_tokenizer": len(tok),
            "prefix_ids": {
                "source": tok.source_prefix_id,
                "candidate1": tok.cand1_prefix_id,
                "candidate2": tok.cand2_prefix_id,
                "candidate": tok.cand_prefix_id,
            },
            "embedding_rows": blender.ranker.pretrained_model.get_input_embeddings().weight.shape[0],
            "cases": [
                {
                    **case,
                    "checkpoint_lengths": _reference(blender, case, {}),
                    "overridden_lengths": _reference(blender, case, OVERRIDE),
                }
                for case in CASES
            ],
            "override": OVERRIDE,
        }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES / "reference.json")
