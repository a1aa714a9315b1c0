"""Tokenizers that behave like real models', built from the tokenizer files mistral_common ships
(no download), with the models' published chat templates; and tiny random models of their
vocabularies.

- `mistral`: Mistral-7B v0.1/v0.2's sentencepiece BPE (`tokenizer.model.v1`, 32,000 pieces),
  converted as transformers' LlamaConverter does (legacy: a prefix space, spaces as "▁", byte
  fallback). The template writes `<s>` AND the tokenizer adds it (Mistral v0.2, Llama 2).
- `llama3`: a byte-level BPE (the first 32,000 ranks of `tekken_240911.json`, merges
  recovered from the ranks as tiktoken's are), Llama 3's pre-tokenizer split and special
  tokens; the template writes `<|begin_of_text|>` and the tokenizer adds it too.
- `qwen`: the same byte-level BPE with Qwen2.5's chatml template: no BOS at all.
- `mistral_v3`: Mistral-7B v0.3's sentencepiece (`..._240323.model.v3`, `[INST]` as control
  tokens), whose template writes a space before the reply and trims it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

MISTRAL_V2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
MISTRAL_V3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{- '[INST] ' + message['content'] + '[/INST]' }}{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content']|trim + eos_token }}{%- endif %}{%- endfor %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n' }}{%- endif %}{%- for message in messages %}{%- if (message.role == 'user') or "
    "(message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
BPE_RANKS = 32_000
KINDS = ("mistral", "llama3", "qwen", "mistral_v3")
EOS_SCALE = 0.3


def _data_dir() -> Path:
    import mistral_common

    return Path(mistral_common.__file__).parent / "data"


def _sentencepiece(model_file: Path, template: str):
    """A sentencepiece BPE model as transformers' LlamaConverter converts it (legacy normaliser:
    a "▁" prepended, spaces replaced; byte fallback), adding BOS."""
    import sentencepiece
    from tokenizers import normalizers
    from transformers import LlamaTokenizer, PreTrainedTokenizerFast

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for piece, i in vocab.items():  # every split of a piece into two pieces, ordered by the pieces' ids
        pairs = sorted(
            ((piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab),
            key=lambda m: (vocab[m[0]], vocab[m[1]]),
        )
        merges += [(i, pair) for pair in pairs]
    merges = [pair for _, pair in sorted(merges, key=lambda m: m[0])]
    controls = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size()) if sp.is_control(i)]
    llama = LlamaTokenizer(
        vocab=vocab, merges=merges, legacy=True, add_bos_token=True, additional_special_tokens=controls or None
    )
    backend = llama.backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    # saved as a plain fast tokenizer: loading a `LlamaTokenizer` rebuilds its normaliser (no
    # prefix space after <s>), so vLLM's process would tokenise otherwise than this one
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=template,
        clean_up_tokenization_spaces=False,
    )


def _bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Merges of a tiktoken-style rank table: each token's last merge, found by running BPE on
    its bytes with the tokens ranked below it."""
    merges = []
    for token, _rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            k = min(range(len(parts) - 1), key=lambda j: ranks.get(parts[j] + parts[j + 1], 1 << 30))
            parts[k : k + 2] = [parts[k] + parts[k + 1]]
        merges.append((parts[0], parts[1]))
    return merges


def _byte_level(specials: list[str], bos: str | None, eos: str, template: str):
    """The first BPE_RANKS ranks of tekken's byte-level BPE, with Llama 3's split; `bos` added
    by the tokenizer when set."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = json.loads((_data_dir() / "tekken_240911.json").read_text())["vocab"][:BPE_RANKS]
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in table}
    chars = bytes_to_unicode()

    def s(b: bytes) -> str:
        return "".join(chars[x] for x in b)

    backend = Tokenizer(
        models.BPE(
            {s(b): r for b, r in ranks.items()}, [(s(a), s(b)) for a, b in _bpe_merges(ranks)], ignore_merges=True
        )
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    if bos is not None:
        bos_id = backend.token_to_id(bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        chat_template=template,
        clean_up_tokenization_spaces=False,
    )


def build(kind: str):
    """The tokenizer of `kind` (one of KINDS)."""
    if kind == "mistral":
        return _sentencepiece(_data_dir() / "tokenizer.model.v1", MISTRAL_V2_TEMPLATE)
    if kind == "mistral_v3":
        return _sentencepiece(_data_dir() / "mistral_instruct_tokenizer_240323.model.v3", MISTRAL_V3_TEMPLATE)
    if kind == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        return _byte_level(specials, "<|begin_of_text|>", "<|eot_id|>", LLAMA3_TEMPLATE)
    if kind == "qwen":
        return _byte_level(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", QWEN_TEMPLATE)
    raise ValueError(kind)


def save_tiny_model(tokenizer, path: Path, favoured: list[str], *, seed: int = 0) -> Path:
    """A random 1-layer Llama (hidden 128, head_dim 64 for vLLM's CPU attention) of the
    tokenizer's vocabulary, saved with it. Its output layer is zero but for the `favoured`
    tokens and eos (random rows, scaled up), so it samples those: responses whose text
    re-tokenises otherwise ("▁" then "Hello" is one token "▁Hello" when tokenised again) and
    that often end at eos, which a uniform random model of 32k tokens seldom samples."""
    import torch
    from transformers import LlamaForCausalLM

    from pofe.demo.tiny import build_config

    config = build_config(tokenizer, hidden_size=128, num_layers=1)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in favoured] + [tokenizer.eos_token_id]
    if tokenizer.unk_token_id in ids[:-1] or None in ids:
        raise ValueError(f"favoured tokens {favoured} not all in the vocabulary: {ids}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            rows = model.lm_head.weight[ids].clone()
            model.lm_head.weight.zero_()
            rows = rows / rows.std()  # logits ~ +-11: these outweigh 32k zeros
            rows[-1] *= EOS_SCALE  # eos at full strength ends most responses at once
            model.lm_head.weight[ids] = rows
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
