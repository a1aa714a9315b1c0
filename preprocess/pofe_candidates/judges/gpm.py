"""GPM, the general preference model (Zhang et al., ICML 2025, "Beyond Bradley-Terry Models: A
General Preference Model for Language Model Alignment", arXiv 2410.02197), as a pairwise judge.

The model. A causal LM reads the prompt and one response through its chat template; a linear
value head maps the hidden state at the last token to a preference embedding v_y of 2k
dimensions, normalised to unit length. A prompt-dependent skew-symmetric operator

    R(x) = diag(lambda_1(x) J, ..., lambda_k(x) J),   J = [[0, -1], [1, 0]],
    lambda(x) = softmax(W_p h_x)   (the prompt head on the prompt's last hidden state; 1 without one)

gives the preference score and probability (the paper's general preference score, Sec. 3)

    s_ij = <R(x) v_i, v_j> = sum_l lambda_l (v_i,2l v_j,2l+1 - v_i,2l+1 v_j,2l)
    P(y_i beats y_j | x) = sigmoid(s_ij / tau)

s is skew-symmetric (s_ji = -s_ij): P_ij + P_ji = 1 and P_ii = 1/2, and the K x K matrix costs
K forward passes (PairRM runs K (K - 1)). One block with unnormalised v_y = (r_y, 1) gives
s_ij = r_i - r_j: Bradley-Terry is the special case. Unit vectors in one block already express
cycles (three at 120 degrees beat each other in turn), which no scalar reward can.

Checkpoints, in the authors' layout (general-preference/general-preference-model: the loader of
`gpm_example_usage.py`, the model in `general_preference/models`): the base model's config.json
(model_type llama, gemma2, ...) and tokenizer, and safetensors (one file, or shards with
`model.safetensors.index.json`) holding the causal LM (`model.*`, `lm_head.weight`) beside
`value_head.weight` (2k, hidden) and, where the model has one, `prompt_head.weight` (k, hidden).
Neither 2k nor the prompt head is in the config: both are read off the weights, as the authors'
loader does. The language-model head is not loaded (nothing reads it). Nor is tau stored:
`judge.tau`, 0.1 by default, the authors' training and ranking temperature.

Input, as the authors' dataset and pipeline build it: the chat template over the prompt's
messages and the response as the assistant's turn (no generation prompt), tokenised with the
tokenizer's own special tokens, cut to `max_length` from the right, the last token replaced by
EOS (the embedding is read there). The prompt head reads the hidden state at the last token of
the prompt's own rendering (the template over its messages alone); attention is causal, so
every candidate's forward holds the same state there, and the prompt's first candidate's is
used for all of them. A prompt whose rendering alone fills `max_length` leaves no response to
read: its pairs abstain (`PROMPT_TOO_LONG`). A response cut to fit is read at its cut, as the
authors' truncation reads it; such inputs are counted in a warning.

Preferences (`judge.preferences`): `probability` (default), the model's own P = sigmoid(s / tau),
the probability it was trained to give; `authors`, what the authors' SPPO scripts trained on
(`LLM-Alignment/scripts/compute_prob_from_raw.py`: sigmoid(T_ij - T_ji) over the score table
T = s / tau), i.e. sigmoid(2 s / tau).

Deviations, stated: the authors' latest training code also divides the prompt head's logits by
sqrt(hidden) and multiplies lambda by k, through a name it never defines (it cannot run); the
published example and the SPPO scripts use the plain softmax, as here. The two heads run in
float32 on the backbone's hidden states (the authors' in the weights' dtype). With a multi-turn
prompt the prompt head reads the end of all its turns (the authors' scripts have one user turn).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pofe.batching import length_sorted_batches
from pofe.logs import logger_name
from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges.interface import JudgeStats, PairwiseVerdict
from pofe_candidates.render import Prompt, as_messages

LOG = logging.getLogger(logger_name(__name__))
PreferenceMode = Literal["probability", "authors"]
# an abstention's reason starts with this (its kind in summary.json's judge_abstention_reasons)
PROMPT_TOO_LONG = "prompt longer than judge.max_length"
# checkpoint keys the backbone does not hold: read apart (the heads) or not at all (the LM head)
HEAD_KEYS = ("value_head.weight", "prompt_head.weight")


def gpm_scores(embeddings: Tensor, scales: Tensor | None = None) -> Tensor:
    """The general preference scores of K responses to one prompt.

    s_ij = <R v_i, v_j> = sum_l lambda_l (v_i,2l v_j,2l+1 - v_i,2l+1 v_j,2l)

    Args:
        embeddings: (K, 2k) preference embeddings v (as the model gives them: unit length).
        scales: (k,) lambda, each block's eigenvalue scale (the prompt head's softmax);
            None: 1 for every block (a checkpoint without a prompt head).
    Returns:
        (K, K) float64 s, exactly skew-symmetric (s + s.T == 0, zero diagonal).
    """
    if embeddings.dim() != 2 or embeddings.shape[1] % 2:
        raise ValueError(f"embeddings must be (K, 2k), an even width; got shape {tuple(embeddings.shape)}")
    v = embeddings.to(torch.float64)
    lam = torch.ones(v.shape[1] // 2, dtype=torch.float64) if scales is None else scales.to(torch.float64)
    if lam.shape != (v.shape[1] // 2,):
        raise ValueError(f"scales must be (k,) = ({v.shape[1] // 2},) for embeddings {tuple(v.shape)}")
    first, second = v[:, 0::2], v[:, 1::2]  # (K, k): each block's two coordinates
    s = (first * lam) @ second.T - (second * lam) @ first.T  # (K, K)
    # the two products round differently: halve the difference so s_ji is exactly -s_ij
    return (s - s.T) / 2


def gpm_preferences(scores: Tensor, tau: float, mode: PreferenceMode = "probability") -> Tensor:
    """(K, K) P from skew-symmetric scores: sigmoid(s / tau) ("probability"), or the authors' SPPO
    scripts' sigmoid((s_ij - s_ji) / tau) = sigmoid(2 s / tau) ("authors"). float64, diagonal 1/2."""
    if mode not in ("probability", "authors"):
        raise ValueError(f"unknown GPM preference mode {mode!r}; expected 'probability' or 'authors'")
    return torch.sigmoid(scores.to(torch.float64) * ((2.0 if mode == "authors" else 1.0) / tau))


class GPMModel(nn.Module):
    """The backbone (the causal LM without its head) and the preference heads."""

    def __init__(self, backbone: nn.Module, value_head: Tensor, prompt_head: Tensor | None):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(value_head.shape[1], value_head.shape[0], bias=False, dtype=torch.float32)
        self.value_head.weight.data.copy_(value_head)
        self.prompt_head = None
        if prompt_head is not None:
            self.prompt_head = nn.Linear(prompt_head.shape[1], prompt_head.shape[0], bias=False, dtype=torch.float32)
            self.prompt_head.weight.data.copy_(prompt_head)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, last: Tensor, prompt_end: Tensor):
        """input_ids, attention_mask: (B, T), right-padded; last, prompt_end: (B,) positions of
        each row's last token and its prompt's last token. Returns (v (B, 2k) unit embeddings,
        lambda (B, k) or None), float32."""
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        rows = torch.arange(h.shape[0], device=h.device)
        v = F.normalize(self.value_head(h[rows, last].float()), p=2, dim=-1)  # (B, 2k)
        if self.prompt_head is None:
            return v, None
        return v, torch.softmax(self.prompt_head(h[rows, prompt_end].float()), dim=-1)  # (B, k)


def _checkpoint_dir(path: str) -> Path:
    if Path(path).is_dir():
        return Path(path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja", "*.txt"]))


def read_heads(path: Path) -> dict[str, Tensor]:
    """The preference heads (`HEAD_KEYS`) of a checkpoint in the authors' layout, read from the
    safetensors file that holds each; ValueError naming what is missing."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.exists():
        where = json.loads(index.read_text())["weight_map"]
    elif (path / "model.safetensors").exists():
        where = dict.fromkeys(HEAD_KEYS, "model.safetensors")
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json (GPM weights)")
    heads = {}
    for key in HEAD_KEYS:
        if key in where:
            with safe_open(str(path / where[key]), framework="pt") as f:
                if key in f.keys():
                    heads[key] = f.get_tensor(key).float()
    if "value_head.weight" not in heads:
        raise ValueError(
            f"{path}: no value_head.weight: not a GPM checkpoint in the authors' layout (the causal LM's "
            "weights beside value_head.weight (2k, hidden) and, optionally, prompt_head.weight (k, hidden))"
        )
    return heads


def load_gpm(path: str, dtype: str = "auto") -> tuple[GPMModel, object]:
    """Model and tokenizer from a local directory or hub id in the authors' layout (module
    docstring); the backbone in `dtype` (auto: the checkpoint's)."""
    from transformers import MODEL_MAPPING, AutoConfig, AutoTokenizer

    p = _checkpoint_dir(path)
    heads = read_heads(p)
    config = AutoConfig.from_pretrained(p)
    hidden = config.get_text_config().hidden_size
    value, prompt = heads["value_head.weight"], heads.get("prompt_head.weight")
    if value.dim() != 2 or value.shape[1] != hidden or value.shape[0] % 2:
        raise ValueError(
            f"{p}: value_head.weight has shape {tuple(value.shape)}; a GPM's is (2k, hidden = {hidden}), an even 2k"
        )
    if prompt is not None and prompt.shape != (value.shape[0] // 2, hidden):
        raise ValueError(
            f"{p}: prompt_head.weight has shape {tuple(prompt.shape)}; with value_head.weight "
            f"{tuple(value.shape)} it is ({value.shape[0] // 2}, {hidden}): one scale per 2 x 2 block"
        )
    if type(config) not in MODEL_MAPPING:
        raise ValueError(f"{p}: model_type {config.model_type!r} has no transformers backbone to read GPM's states")
    base = MODEL_MAPPING[type(config)]
    # the checkpoint's heads are read apart and its language-model head is never used: not unexpected
    backbone_class = type(
        f"GPM{base.__name__}",
        (base,),
        {"_keys_to_ignore_on_load_unexpected": [r"^(lm_head|value_head|prompt_head)\.weight$"]},
    )
    backbone, info = backbone_class.from_pretrained(p, dtype=dtype, output_loading_info=True)
    if info["missing_keys"]:
        raise ValueError(
            f"{p}: the backbone's weights are not all there (missing {sorted(info['missing_keys'])[:5]}); "
            "expected the causal LM's state dict (model.*) beside value_head.weight, the authors' layout"
        )
    tokenizer = AutoTokenizer.from_pretrained(p)
    if not getattr(tokenizer, "chat_template", None) or tokenizer.eos_token_id is None:
        raise ValueError(f"{p}: a GPM reads conversations through its tokenizer's chat template and EOS; it has none")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # as the authors' get_tokenizer
    return GPMModel(backbone, value, prompt), tokenizer


@dataclass(frozen=True)
class Encoded:
    """One candidate's input ids (cut to max_length, the last one EOS) and where its prompt ends."""

    ids: list[int]
    prompt_end: int
    cut: bool


class GPMJudge:
    """Pairwise judge: one GPM forward per candidate, the (K, K) preferences from the embeddings."""

    # the dataset's prompt: the GPM renders it with its own chat template, as a reward model does
    reads_rendered_prompt = False
    reads_columns = False

    def __init__(
        self,
        model: GPMModel,
        tokenizer,
        *,
        batch_size: int = 8,
        max_length: int = 1024,
        tau: float = 0.1,
        mode: PreferenceMode = "probability",
        allow_abstain: bool = True,
        device: str | None = None,
    ):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.batch_size, self.max_length, self.tau, self.mode = batch_size, max_length, tau, mode
        self.allow_abstain = allow_abstain
        self.stats = JudgeStats()
        self._warned = False  # the cut-response warning, once per judge

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str = "auto", **kwargs) -> GPMJudge:
        model, tokenizer = load_gpm(path, dtype)
        return cls(model, tokenizer, **kwargs)

    @classmethod
    def from_config(cls, cfg: JudgeConfig) -> GPMJudge:
        return cls.from_pretrained(
            cfg.model,
            dtype=cfg.dtype,
            batch_size=cfg.batch_size,
            max_length=cfg.max_length,
            tau=cfg.tau,
            mode=cfg.preferences,
            allow_abstain=cfg.allow_abstain,
        )

    def encode(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Encoded] | None]:
        """Each prompt's candidates' inputs (module docstring), None for a prompt whose own
        rendering fills max_length. The tokenizer runs once over every text."""
        tok = self.tokenizer
        convs = [as_messages(p) for p in prompts]
        heads = tok([tok.apply_chat_template(c, tokenize=False) for c in convs], verbose=False)["input_ids"]
        texts = [
            tok.apply_chat_template(c + [{"role": "assistant", "content": r}], tokenize=False)
            for c, rs in zip(convs, responses, strict=True)
            for r in rs
        ]
        ids = iter(tok(texts, verbose=False)["input_ids"] if texts else [])
        out: list[list[Encoded] | None] = []
        for head, rs in zip(heads, responses, strict=True):
            full = [next(ids) for _ in rs]
            if len(head) >= self.max_length:
                out.append(None)
                continue
            # cut to max_length from the right, the last token replaced by EOS (the authors' `ids[-1] = eos`)
            kept = [min(len(x), self.max_length) for x in full]
            out.append(
                [Encoded([*x[: n - 1], tok.eos_token_id], len(head) - 1, n < len(x)) for x, n in zip(full, kept)]
            )
        return out

    @torch.no_grad()
    def embed(self, inputs: list[Encoded]) -> tuple[Tensor, Tensor | None]:
        """N inputs -> (N, 2k) embeddings and (N, k) block scales (None without a prompt head),
        float32 on the CPU, in length-sorted, right-padded batches (padding is masked)."""
        value_dim = self.model.value_head.out_features
        v = torch.zeros(len(inputs), value_dim)
        lam = None if self.model.prompt_head is None else torch.zeros(len(inputs), value_dim // 2)
        pad = self.tokenizer.pad_token_id
        for batch in length_sorted_batches([len(e.ids) for e in inputs], self.batch_size):
            t = max(len(inputs[n].ids) for n in batch)
            ids = torch.tensor([inputs[n].ids + [pad] * (t - len(inputs[n].ids)) for n in batch], device=self.device)
            mask = torch.tensor([[1] * len(inputs[n].ids) + [0] * (t - len(inputs[n].ids)) for n in batch])
            last = torch.tensor([len(inputs[n].ids) - 1 for n in batch], device=self.device)
            ends = torch.tensor([inputs[n].prompt_end for n in batch], device=self.device)
            vb, lb = self.model(ids, mask.to(self.device), last, ends)
            v[batch] = vb.cpu()
            if lam is not None:
                lam[batch] = lb.cpu()
        self.stats.count_call(len(inputs))
        return v, lam

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[PairwiseVerdict]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} response lists")
        encoded = self.encode(prompts, responses)
        flat = [e for row in encoded if row is not None for e in row]
        v, lam = self.embed(flat) if flat else (torch.zeros(0, 0), None)
        cut = sum(e.cut for e in flat)
        if cut and not self._warned:
            self._warned = True
            LOG.warning(
                f"POFE: {cut} GPM input(s) longer than judge.max_length={self.max_length} tokens are read with "
                "their response cut to fit (the authors' right truncation); raise judge.max_length to read them whole."
            )
        verdicts, start = [], 0
        for p, row in enumerate(encoded):
            k = len(responses[p])
            if row is None:
                verdicts.append(self._abstained(k, p, f"{PROMPT_TOO_LONG}: its rendering alone fills the input"))
                continue
            scales = None if lam is None else lam[start]
            verdicts.append(self._verdict(v[start : start + k], scales, p))
            start += k
        return verdicts

    def _verdict(self, v: Tensor, scales: Tensor | None, p: int) -> PairwiseVerdict:
        """One prompt's (K, K) matrix; a candidate whose embedding is not finite (an overflow)
        ties every pair it is in (1/2), each counted as abstained."""
        good = torch.isfinite(v).all(dim=1)
        if scales is not None and not torch.isfinite(scales).all():
            good[:] = False
        pref = torch.full((len(v), len(v)), 0.5, dtype=torch.float64)
        idx = good.nonzero().flatten()
        pref[idx[:, None], idx[None, :]] = gpm_preferences(gpm_scores(v[idx], scales), self.tau, self.mode)
        bad_pairs = sum(1 for i in range(len(v)) for j in range(i + 1, len(v)) if not (good[i] and good[j]))
        reasons = tuple(
            self.stats.abstain(
                "non-finite GPM embedding", allow=self.allow_abstain, where="a pair (gpm)", prompt=p
            ).reason
            for _ in range(bad_pairs)
        )
        return PairwiseVerdict(pref, abstained_pairs=bad_pairs, abstain_reasons=reasons)

    def _abstained(self, k: int, p: int, reason: str) -> PairwiseVerdict:
        pairs = k * (k - 1) // 2
        at = dict(allow=self.allow_abstain, where=f"every pair (gpm, limit {self.max_length} tokens)", prompt=p)
        reasons = tuple(self.stats.abstain(reason, **at).reason for _ in range(pairs))
        return PairwiseVerdict(
            torch.full((k, k), 0.5, dtype=torch.float64), abstained_pairs=pairs, abstain_reasons=reasons
        )


__all__ = ["GPMJudge", "GPMModel", "gpm_preferences", "gpm_scores", "load_gpm", "read_heads"]
