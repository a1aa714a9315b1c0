"""PairRM (Jiang et al. 2023, LLM-Blender, arXiv 2306.02561), reimplemented for transformers 5.

llm-blender does not import on transformers >= 5, so POFE carries the model and checks it
against llm-blender 0.0.2's own outputs (tests/candidates/make_pairrm_reference.py).

Checkpoints. `llm-blender/PairRM` holds llm-blender's RankerConfig as `config.json` (`ranker_type:
pairranker`, `model_type: deberta`, `model_name: microsoft/deberta-v3-large`, `source_maxlength: 1224`,
`candidate_maxlength: 412`, `n_tasks`, `drop_out`, ...) and `pytorch_model.bin`, the plain state dict
of `CrossCompareReranker`: the encoder as `pretrained_model.*`, the Dropout/Linear/Tanh/Dropout/Linear
head as `head_layer.{1,4}.*`. As llm-blender does, the encoder's config and tokenizer come from
`model_name`, the tokenizer gets four prefix tokens and the word embeddings are sized to
`len(tokenizer)` (128,005 rows for deberta-v3-large, whose config says 128,100). A directory whose
`config.json` is a DeBERTa-v2 config instead (the `llm-blender/PairRM-hf` layout) supplies config
and tokenizer itself, with the same state-dict names.

Input, as llm-blender's `CrossCompareCollator` and `cat_ids` build it for one prompt:

    [CLS] <|source|> x [SEP] [CLS] <|candidate1|> a [SEP] [CLS] <|candidate2|> b [SEP]

`<|source|> x` is cut to `source_maxlength` tokens (specials included), each candidate to
`candidate_maxlength + (source_maxlength - len(source)) // 2`. The final hidden states at the
three prefix tokens feed one shared head:

    s_1 = head([h_src ; h_c1]),  s_2 = head([h_src ; h_c2])      (B, n_tasks) each
    C = mean_tasks(s_1 - s_2)                                     (B,) logit that a beats b

The source is the prompt as the SPPO scripts pass it (`scripts/rank.py`: the policy's chat
template applied to the prompt): the pipeline hands PairRM the rendered prompt its generate
stage sampled from (`PairRMJudge.reads_rendered_prompt`). Called directly, a plain-string
prompt is used verbatim and a message list gives its last user turn.

Deviation, stated: llm-blender sizes the candidates' budget from the longest source in the batch;
here it is computed per pair, which equals llm-blender at `batch_size=1` (how the SPPO scripts call
`rank`). llm-blender runs fp16 on CUDA when the config says `fp16`; POFE runs the model in float32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file
from torch import nn

from pofe.batching import length_sorted_batches
from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges.interface import JudgeStats, PairwiseVerdict
from pofe_candidates.judges.pairrm_inputs import (
    CAND1_PREFIX,
    CAND2_PREFIX,
    PREFIX_TOKENS,
    SOURCE_PREFIX,
    encode_pair,
    encode_prompts,
)
from pofe_candidates.render import Prompt, prompt_text
from pofe_candidates.win_rates import symmetrize_preferences

PreferenceMode = Literal["authors", "both_orders"]


def preferences_from_logits(logits: torch.Tensor, mode: PreferenceMode = "authors") -> torch.Tensor:
    """The (K, K) preference matrix from PairRM's ordered-pair logits.

    Args:
        logits: (K, K), logits[i, j] = C_ij, the logit that y_i beats y_j with y_i shown as
            candidate 1; the diagonal is ignored.
        mode: "authors": the SPPO scripts' formation. `Blender.rank` scores each candidate
            s_i = mean_j (C_ij - C_ji) over all K (llm-blender's "max_logits"; the j = i term
            is 0), and `compute_prob.py` sets P_ij = sigmoid(s_i - s_j).
            "both_orders": each order's probability, averaged,
            P_ij = (sigmoid(C_ij) + 1 - sigmoid(C_ji)) / 2 (`symmetrize_preferences`).
    Returns:
        (K, K) float64, P + P.T = 1, diagonal 1/2.
    """
    if logits.dim() != 2 or logits.shape[0] != logits.shape[1]:
        raise ValueError(f"logits must be a square (K, K) matrix, got shape {tuple(logits.shape)}")
    c = logits.to(torch.float64).clone()
    c.fill_diagonal_(0.0)
    if mode == "authors":
        s = (c - c.T).mean(dim=1)  # (K,)
        return torch.sigmoid(s[:, None] - s[None, :])
    if mode == "both_orders":
        return symmetrize_preferences(torch.sigmoid(c))
    raise ValueError(f"unknown PairRM preference mode {mode!r}; expected 'authors' or 'both_orders'")


@dataclass(frozen=True)
class PairRMSettings:
    """The RankerConfig fields inference needs; defaults are llm-blender/PairRM's values."""

    n_tasks: int = 1
    drop_out: float = 0.05
    source_maxlength: int = 1224
    candidate_maxlength: int = 412

    @classmethod
    def from_ranker_config(cls, raw: dict) -> PairRMSettings:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if raw.get(k) is not None})

    def capped(self, max_length: int | None) -> PairRMSettings:
        """Lengths for a total budget of `max_length` tokens, split in the checkpoint's proportion
        source : candidate : candidate (1224 : 412 : 412 for PairRM). None keeps the checkpoint's."""
        if max_length is None:
            return self
        source = max_length * self.source_maxlength // (self.source_maxlength + 2 * self.candidate_maxlength)
        return replace(self, source_maxlength=source, candidate_maxlength=(max_length - source) // 2)


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


def load_tokenizer(path: Path):
    """The tokenizer in `path`. A DeBERTa-v3 directory with only `spm.model` (as
    microsoft/deberta-v3-large ships) is built here, not by transformers' converter: that one
    parses the model with protobuf, whose generated module may not match the installed
    runtime. Pieces come from sentencepiece's own API; the normaliser is the one transformers 4
    (llm-blender's) builds for DeBERTa-v2: [Lowercase,] Strip, the model's precompiled
    character map (NFKC for DeBERTa-v3), runs of spaces collapsed."""
    from transformers import AutoTokenizer

    if (path / "tokenizer.json").exists() or not (path / "spm.model").exists():
        return AutoTokenizer.from_pretrained(path)
    import sentencepiece
    from tokenizers import Regex, normalizers
    from transformers import DebertaV2Tokenizer

    model = path / "spm.model"
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    cfg_file = path / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    specials = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
    keys = ("do_lower_case", "split_by_punct") + tuple(f"{t}_token" for t in specials)
    tok = DebertaV2Tokenizer(vocab=vocab, **{k: cfg[k] for k in keys if isinstance(cfg.get(k), (str, bool))})
    steps = [normalizers.Lowercase()] if cfg.get("do_lower_case") else []
    steps.append(normalizers.Strip())
    charsmap = _precompiled_charsmap(model.read_bytes())
    if charsmap:
        steps.append(normalizers.Precompiled(charsmap))
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    tok.backend_tokenizer.normalizer = normalizers.Sequence(steps)
    added = path / "added_tokens.json"
    for token, index in sorted(json.loads(added.read_text()).items() if added.exists() else [], key=lambda kv: kv[1]):
        if token not in tok.get_vocab():
            tok.add_tokens([token])
        if tok.convert_tokens_to_ids(token) != index:
            raise ValueError(f"{added}: {token!r} should have id {index}, got {tok.convert_tokens_to_ids(token)}")
    return tok


def _precompiled_charsmap(model_proto: bytes) -> bytes:
    """ModelProto.normalizer_spec (field 3).precompiled_charsmap (field 2), read from the
    protobuf wire format directly (see load_tokenizer for why not through protobuf)."""

    def fields(buf: bytes):
        i = 0
        while i < len(buf):
            key, i = varint(buf, i)
            wire = key & 7
            if wire == 0:
                value, i = varint(buf, i)
            elif wire == 2:
                n, i = varint(buf, i)
                value, i = buf[i : i + n], i + n
            elif wire in (1, 5):  # fixed 64 / 32 bits
                n = 8 if wire == 1 else 4
                value, i = buf[i : i + n], i + n
            else:
                raise ValueError(f"spm.model: unexpected protobuf wire type {wire}")
            yield key >> 3, value

    def varint(buf: bytes, i: int) -> tuple[int, int]:
        out = shift = 0
        while True:
            b = buf[i]
            i += 1
            out |= (b & 0x7F) << shift
            if b < 0x80:
                return out, i
            shift += 7

    spec = next((v for f, v in fields(model_proto) if f == 3), b"")
    return next((v for f, v in fields(spec) if f == 2), b"")


def load_pairrm(path: str, max_length: int | None = None) -> tuple[PairRMModel, object]:
    """Model and tokenizer from a local directory or hub id in either layout (module docstring).
    `max_length` caps the whole input (see `PairRMSettings.capped`)."""
    from transformers import AutoConfig

    p = Path(path)
    if not p.is_dir():
        from huggingface_hub import snapshot_download

        p = Path(snapshot_download(path))
    cfg_file = p / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{p}: no config.json (llm-blender's ranker config or a DeBERTa-v2 config)")
    raw = json.loads(cfg_file.read_text())
    if "ranker_type" in raw:  # llm-blender/PairRM: encoder config and tokenizer from model_name
        if raw["ranker_type"] != "pairranker" or not str(raw.get("model_type")).startswith("deberta"):
            raise ValueError(
                f"{cfg_file}: ranker_type {raw['ranker_type']!r}, model_type {raw.get('model_type')!r}; "
                "PairRM is ranker_type 'pairranker' on a DeBERTa backbone (model_type 'deberta')."
            )
        if not raw.get("model_name"):
            raise ValueError(
                f"{cfg_file}: model_name is empty; it names the DeBERTa backbone (microsoft/deberta-v3-large)"
            )
        settings = PairRMSettings.from_ranker_config(raw)
        backbone = Path(raw["model_name"])
        if not backbone.is_dir():
            from huggingface_hub import snapshot_download

            name = raw["model_name"]
            try:  # the backbone's config and tokenizer only: the ranker's state dict holds every weight
                backbone = Path(snapshot_download(name, allow_patterns=["*.json", "*.model"]))
            except OSError as e:
                raise FileNotFoundError(
                    f"{cfg_file}: model_name {name!r} (the DeBERTa backbone) is neither a directory nor reachable "
                    f"on the hub ({type(e).__name__}); its config.json, tokenizer_config.json and spm.model are "
                    f"needed. Fetch them once: hf download {name} config.json tokenizer_config.json spm.model"
                ) from e
    else:  # llm-blender/PairRM-hf: a DeBERTa-v2 config carrying the ranker fields
        settings = PairRMSettings.from_ranker_config(raw)
        backbone = p
    config = AutoConfig.from_pretrained(backbone)
    if config.model_type != "deberta-v2":
        raise ValueError(
            f"{backbone}: config.json has model_type {config.model_type!r}; "
            "PairRM's backbone is DeBERTa-v2/v3 ('deberta-v2')"
        )
    tokenizer = load_tokenizer(backbone)
    prefix_ids = ensure_prefix_tokens(tokenizer)
    config.vocab_size = len(tokenizer)  # llm-blender: resize_token_embeddings(len(tokenizer))
    model = PairRMModel(config, settings.capped(max_length), prefix_ids)
    # Checkpoints saved by older transformers carry the embeddings' position_ids buffer,
    # which is not persistent any more: dropping it is safe; anything else must match.
    state = {k: v for k, v in _load_state_dict(p).items() if not k.endswith("embeddings.position_ids")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{p}: weights do not match PairRM's layout (missing {missing[:5]}, unexpected {unexpected[:5]}); "
            "expected llm-blender's CrossCompareReranker state dict (pretrained_model.*, head_layer.*)."
        )
    return model, tokenizer


class PairRMJudge:
    """Pairwise judge: PairRM logits for every ordered pair of a prompt's responses, made into
    preferences by `preferences_from_logits` (default: the SPPO authors' formation)."""

    # the chat-templated prompt is the source text the SPPO scripts rank with
    reads_rendered_prompt = True
    reads_columns = False

    def __init__(
        self,
        model: PairRMModel,
        tokenizer,
        *,
        batch_size: int = 8,
        device: str | None = None,
        mode: PreferenceMode = "authors",
    ):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.mode = mode
        self.stats = JudgeStats()

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        batch_size: int = 8,
        device: str | None = None,
        max_length: int | None = None,
        mode: PreferenceMode = "authors",
    ) -> PairRMJudge:
        model, tokenizer = load_pairrm(path, max_length)
        return cls(model, tokenizer, batch_size=batch_size, device=device, mode=mode)

    @classmethod
    def from_config(cls, cfg: JudgeConfig) -> PairRMJudge:
        """judge.max_length caps the input only when set; else the checkpoint's lengths (1224 + 2 x 412)."""
        cap = cfg.max_length if "max_length" in cfg.model_fields_set else None
        return cls.from_pretrained(cfg.model, batch_size=cfg.batch_size, max_length=cap, mode=cfg.preferences)

    def pair_logits(self, items: list[tuple[Prompt, str, str]]) -> torch.Tensor:
        """items: N (prompt, a, b) -> (N,) logits of 'a beats b'."""
        m = self.model
        return self.forward_sequences(
            [encode_pair(self.tokenizer, m.settings, m.prefix_ids, prompt_text(p), a, b) for p, a, b in items]
        )

    @torch.no_grad()
    def forward_sequences(self, seqs: list[list[int]]) -> torch.Tensor:
        """N encoded pairs -> (N,) logits, in their order. Batches are length-sorted and
        right-padded: padding never changes a pair's logit (attention mask), so sorting only
        cuts the padded positions the encoder runs over."""
        out = torch.zeros(len(seqs))
        pad = self.tokenizer.pad_token_id
        for batch in length_sorted_batches([len(s) for s in seqs], self.batch_size):
            t = max(len(seqs[n]) for n in batch)
            ids = torch.tensor([seqs[n] + [pad] * (t - len(seqs[n])) for n in batch], device=self.device)  # (b, T)
            mask = torch.tensor([[1] * len(seqs[n]) + [0] * (t - len(seqs[n])) for n in batch], device=self.device)
            out[batch] = self.model(ids, mask).float().cpu()
        return out

    def logit_matrices(self, prompts: list[Prompt], responses: list[list[str]]) -> list[torch.Tensor]:
        """One (K_p, K_p) matrix C per prompt, C[i, j] = logit that y_i (candidate 1) beats y_j;
        every ordered pair i != j of every prompt in one batched pass, diagonal 0 (llm-blender's
        `_full_predict`)."""
        m = self.model
        jobs = encode_prompts(self.tokenizer, m.settings, m.prefix_ids, [prompt_text(p) for p in prompts], responses)
        logits = self.forward_sequences([ids for _, _, _, ids in jobs])
        self.stats.count_call(len(jobs))
        mats = [torch.zeros(len(c), len(c)) for c in responses]
        for (p, i, j, _), v in zip(jobs, logits.tolist(), strict=True):
            mats[p][i, j] = v
        return mats

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[PairwiseVerdict]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} response lists")
        return [
            PairwiseVerdict(preferences_from_logits(c, self.mode)) for c in self.logit_matrices(prompts, responses)
        ]


def _load_state_dict(p: Path) -> dict:
    if (p / "model.safetensors").exists():
        return load_file(str(p / "model.safetensors"))
    if (p / "pytorch_model.bin").exists():
        return torch.load(p / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{p}: no pytorch_model.bin or model.safetensors (PairRM weights)")


__all__ = [
    "PREFIX_TOKENS",
    "PairRMJudge",
    "PairRMModel",
    "PairRMSettings",
    "PreferenceMode",
    "encode_pair",
    "ensure_prefix_tokens",
    "load_pairrm",
    "load_tokenizer",
    "preferences_from_logits",
]
