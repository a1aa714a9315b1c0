"""How many requests to keep in flight on servers POFE did not start (`base_url`).

A window too small leaves a server idle between replies (a vLLM server kept 8 prompts of 4
samples busy took 2.07x as long as with every prompt in flight); one too large floods a paid
API. So POFE asks each server's `/v1/models` once: vLLM answers with `owned_by: "vllm"` on its
model cards (vLLM 0.32: `vllm.entrypoints.serve.engine.protocol.ModelCard`, which also carries
`max_model_len` but not the scheduler's `max_num_seqs`), and a vLLM server gets
`VLLM_WINDOW` requests; any other server, or one whose `/v1/models` fails, gets
`OTHER_WINDOW`, with one log line naming the key that sets the window (`in_flight`).
"""

from __future__ import annotations

import logging

from pofe.logs import logger_name
from pofe_candidates.openai_client import EndpointError, OpenAIClient

LOG = logging.getLogger(logger_name(__name__))

# vLLM's max_num_seqs when its server is started without --max-num-seqs: 256 on most GPUs,
# 1024 on GPUs of 70 GiB and more (H100, H200, B200), 128 per tensor-parallel rank on CPU
# (vLLM 0.32, EngineArgs.get_batch_defaults; the LLM class: 256 on CPU). /v1/models does not say
# which, so a request per sequence slot of the common GPU default: a generate request holds n
# sequences (256 x n >= 1024 from n = 4), and the server queues what it cannot run yet at no cost.
VLLM_WINDOW = 256
# A server that does not say it is vLLM (a paid API, a proxy): enough to keep a vLLM behind a
# proxy busy (32 prompts x 4 samples fill the CPU server's 128 slots) without sending a paid
# API more than a few dozen requests at once (429s are retried after Retry-After).
OTHER_WINDOW = 32
# /v1/models answers at once on a live server; a slow one gets the default, not a stalled stage
MODELS_TIMEOUT = 10.0


def says_vllm(models: dict) -> bool:
    """Whether a `/v1/models` body comes from vLLM: a model card owned by "vllm"."""
    cards = models.get("data")
    return isinstance(cards, list) and any(isinstance(c, dict) and c.get("owned_by") == "vllm" for c in cards)


def server_window(client: OpenAIClient, key: str) -> int:
    """Requests to keep in flight on `client`'s server(s), summed over the servers of a
    ReplicaClient (`client.clients`); one log line per server saying what was found and that
    `key` (e.g. "generate.in_flight") sets another window."""
    total = 0
    for server in getattr(client, "clients", [client]):
        try:
            vllm = says_vllm(server.get("models", timeout=min(server.timeout, MODELS_TIMEOUT)))
        except EndpointError as e:
            LOG.warning(
                f"POFE: {server.base_url}/models did not answer ({e.cause}): {OTHER_WINDOW} requests in flight "
                f"there, the default for a server that does not say what it runs; set {key} to change it"
            )
            total += OTHER_WINDOW
            continue
        window = VLLM_WINDOW if vllm else OTHER_WINDOW
        what = "a vLLM server" if vllm else "not a vLLM server (no model card owned_by vllm)"
        LOG.info(f"POFE: {server.base_url} is {what}: {window} requests in flight there; set {key} to change it")
        total += window
    return total
