"""PairRM (Jiang et al. 2023, LLM-Blender, arXiv 2306.02561), reimplemented for transformers 5.

llm-blender itself does not import on transformers >= 5, so POFE carries the model: a
DeBERTa-v2/v3 encoder reads one sequence

    [CLS] <|source|> prompt [SEP] [SEP] [CLS] <|candidate1|> a [SEP] [SEP] [CLS] <|candidate2|> b [SEP] [SEP]

(each part cut after its last [SEP]), takes the final hidden states at the three prefix
tokens, and scores each side with one shared head on (h_source ++ h_candidate):

    s_1 = head([h_src ; h_c1]),  s_2 = head([h_src ; h_c2])      (B, n_tasks) each
    logit = mean_tasks(s_1 - s_2)                                  (B,)
    P(a beats b) = sigmoid(logit)

Module and parameter names follow llm-blender's `CrossCompareReranker` (`pretrained_model.*`
for the encoder, `head_layer.{1,4}.*` for the two Linear layers of the Dropout/Linear/Tanh/
Dropout/Linear head), so the state dict of the published `llm-blender/PairRM` checkpoint
(`pytorch_model.bin`, a plain state dict, beside a DeBERTa `config.json`, its tokenizer and
`ranker_config.json`) loads with `strict=True`.

Deviation, stated: llm-blender sizes the candidates' token budget from the longest SOURCE in
the batch (`candidate_maxlength + remaining // 2`); here the budget is computed per pair, so
a pair's score never depends on what else is in its batch. Identical whenever the source
fits in `source_maxlength` and candidates fit in `candidate_maxlength`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .judges.base import JudgeStats, PairwiseVerdict
from .judges.pairwise import preferences_both_orders
from .render import Prompt, prompt_text

SOURCE_PREFIX = "<|source|>"
CAND1_PREFIX = "<|candidate1|>"
CAND2_PREFIX = "<|candidate2|>"
CAND_PREFIX = "<|candidate|>"
PREFIX_TOKENS = (SOURCE_PREFIX, CAND1_PREFIX, CAND2_PREFIX, CAND_PREFIX)


@dataclass(frozen=True)
class PairRMSettings:
    """The parts of llm-blender's ranker_config.json that inference needs (PairRM's values)."""

    n_tasks: int = 1
    drop_out: float = 0.05
    source_maxlength: int = 1224
    candidate_maxlength: int = 412

    @classmethod
    def from_dir(cls, path: Path) -> PairRMSettings:
        f = path / "ranker_config.json"
        if not f.exists():
            return cls()
        raw = json.loads(f.read_text())
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class PairRMModel(nn.Module):
    """Encoder + shared pair head. Attribute names match llm-blender's checkpoint keys."""

    def __init__(self, config, settings: PairRMSettings, prefix_ids: dict[str, int]):
        super().__init__()
        from transformers import DebertaV2Model

        self.settings = settings
        self.prefix_ids = prefix_ids
        self.pretrained_model = DebertaV2Model(config)
        h = config.hidden_size
        self.head_layer = nn.Sequential(
            nn.Dropout(settings.drop_out),
            nn.Linear(2 * h, h),
            nn.Tanh(),
            nn.Dropout(settings.drop_out),
            nn.Linear(h, settings.n_tasks),
        )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: (B, T), each row holding exactly one of each prefix token.
        Returns logits (B,): log-odds that candidate 1 beats candidate 2."""
        for name in (SOURCE_PREFIX, CAND1_PREFIX, CAND2_PREFIX):
            count = (input_ids == self.prefix_ids[name]).sum(dim=1)
            if not torch.all(count == 1):
                raise ValueError(f"PairRM input rows must hold {name} exactly once; counts {count.tolist()}")
        enc = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)

        def at(name: str) -> torch.Tensor:  # (B, H): hidden state at the row's prefix token
            pos = (input_ids == self.prefix_ids[name]).float().argmax(dim=1)
            return enc[torch.arange(enc.shape[0]), pos]

        src = at(SOURCE_PREFIX)
        left = self.head_layer(torch.cat([src, at(CAND1_PREFIX)], dim=-1))  # (B, n_tasks)
        right = self.head_layer(torch.cat([src, at(CAND2_PREFIX)], dim=-1))  # (B, n_tasks)
        return (left - right).mean(dim=-1)


def ensure_prefix_tokens(tokenizer) -> dict[str, int]:
    """Add PairRM's four prefix tokens if the tokenizer lacks them; return their ids."""
    missing = [t for t in PREFIX_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_tokens(missing)
    return {t: tokenizer.convert_tokens_to_ids(t) for t in PREFIX_TOKENS}


def encode_pair(tokenizer, settings: PairRMSettings, prefix_ids: dict[str, int], source: str, a: str, b: str) -> list[int]:
    """Token ids of one (source, a, b) sequence in PairRM's layout (see module docstring)."""
    sep = tokenizer.sep_token or tokenizer.eos_token
    sep_id = tokenizer.convert_tokens_to_ids(sep)
    # The separator inside texts would split parts wrongly: llm-blender replaces it by a space.
    clean = lambda s: s.replace(sep, " ")  # noqa: E731
    src = tokenizer(SOURCE_PREFIX + clean(source) + sep, truncation=True, max_length=settings.source_maxlength)["input_ids"]
    budget = settings.candidate_maxlength + max(0, settings.source_maxlength - len(src)) // 2

    def cand(text: str, prefix: str) -> list[int]:
        ids = tokenizer(CAND_PREFIX + clean(text) + sep, truncation=True, max_length=budget)["input_ids"]
        return [prefix_ids[prefix] if t == prefix_ids[CAND_PREFIX] else t for t in ids]

    def upto_last_sep(ids: list[int]) -> list[int]:
        last = max(i for i, t in enumerate(ids) if t == sep_id)
        return ids[: last + 1]

    return upto_last_sep(src) + upto_last_sep(cand(a, CAND1_PREFIX)) + upto_last_sep(cand(b, CAND2_PREFIX))


class PairRMJudge:
    """Pairwise judge: P(a beats b) = sigmoid(PairRM logit), both orders combined per prompt."""

    def __init__(self, model: PairRMModel, tokenizer, *, batch_size: int = 8, device: str | None = None):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.stats = JudgeStats()

    @classmethod
    def from_pretrained(cls, path: str, *, batch_size: int = 8, device: str | None = None) -> PairRMJudge:
        """Load a directory holding config.json (DeBERTa-v2), the tokenizer, ranker_config.json
        and pytorch_model.bin or model.safetensors (llm-blender's state dict)."""
        from transformers import AutoConfig, AutoTokenizer

        p = Path(path)
        if not p.is_dir():
            from huggingface_hub import snapshot_download

            p = Path(snapshot_download(path))
        config = AutoConfig.from_pretrained(p)
        tokenizer = AutoTokenizer.from_pretrained(p)
        prefix_ids = ensure_prefix_tokens(tokenizer)
        if len(tokenizer) > config.vocab_size:
            raise ValueError(
                f"{p}: tokenizer has {len(tokenizer)} tokens (with PairRM's prefix tokens) but config.json's "
                f"vocab_size is {config.vocab_size}; this is not a PairRM checkpoint."
            )
        model = PairRMModel(config, PairRMSettings.from_dir(p), prefix_ids)
        # Checkpoints saved by older transformers carry the embeddings' position_ids buffer,
        # which is not persistent any more: dropping it is safe; anything else must match.
        state = {k: v for k, v in _load_state_dict(p).items() if not k.endswith("embeddings.position_ids")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{p}: weights do not match PairRM's layout (missing {missing[:5]}, unexpected {unexpected[:5]}); "
                "expected llm-blender's CrossCompareReranker state dict (pretrained_model.*, head_layer.*)."
            )
        return cls(model, tokenizer, batch_size=batch_size, device=device)

    @torch.no_grad()
    def pair_logits(self, items: list[tuple[Prompt, str, str]]) -> torch.Tensor:
        """items: N (prompt, a, b) -> (N,) logits of 'a beats b'. Batches are right-padded;
        padding never changes a pair's logit (attention mask)."""
        out = []
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(items), self.batch_size):
            seqs = [
                encode_pair(self.tokenizer, self.model.settings, self.model.prefix_ids, prompt_text(p), a, b)
                for p, a, b in items[start : start + self.batch_size]
            ]
            t = max(len(s) for s in seqs)
            ids = torch.tensor([s + [pad] * (t - len(s)) for s in seqs], device=self.device)  # (b, T)
            mask = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs], device=self.device)
            out.append(self.model(ids, mask).float().cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def judge_pairs(self, items: list[tuple[Prompt, str, str]]) -> list[float]:
        return torch.sigmoid(self.pair_logits(items)).tolist()

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[PairwiseVerdict]:
        return preferences_both_orders(self.judge_pairs, prompts, responses, self.stats)


def _load_state_dict(p: Path) -> dict:
    if (p / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(p / "model.safetensors"))
    if (p / "pytorch_model.bin").exists():
        return torch.load(p / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{p}: no pytorch_model.bin or model.safetensors (PairRM weights)")


__all__ = ["PairRMModel", "PairRMJudge", "PairRMSettings", "encode_pair", "ensure_prefix_tokens", "PREFIX_TOKENS"]
