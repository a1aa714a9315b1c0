"""OpenAI-compatible backend: `/v1/completions` with `n` samples per prompt.

Works with `vllm serve` / `python -m vllm.entrypoints.openai.api_server`, `axolotl vllm-serve`
and other OpenAI-compatible servers, on this machine or another node. Prompts are sent already
rendered with the policy's chat template (the completions route, not chat), as the trainer's
token ids by default (`openai_prompt: token_ids`; the completions API takes a list of ints):
text would be tokenised again by the server, which adds BOS by default, so a template that
writes BOS would be sampled after two. `openai_prompt: text` sends the text with vLLM's
`add_special_tokens: false`. Either way the server's prompt token count (`usage`, or vLLM's
`prompt_token_ids`) must equal the ids POFE has, or the stage stops. `return_token_ids` (vLLM)
asks for the sampled ids, which training then scores instead of re-tokenising the text.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from pofe_candidates.config import Sampling
from pofe_candidates.generators.interface import Completion, check_prompt_seen
from pofe_candidates.generators.stream import Finished, ShardJob, one_job, run_window
from pofe_candidates.openai_client import EndpointError, OpenAIClient
from pofe_candidates.render import Rendered


class OpenAIGenerator:
    """Reproducibility: prompt i of a call (of a job) is sent with `seed = sampling.seed + i`
    (servers that honour `seed`, such as vLLM, then return the same samples, whatever else
    they run at the time)."""

    name = "openai"

    def __init__(self, client: OpenAIClient, model: str, *, concurrency: int = 8, prompt_as: str = "token_ids"):
        self.client = client
        self.model = model
        self.concurrency = concurrency  # requests in flight for the whole stage (one per prompt)
        self.prompt_as = prompt_as

    def generate(self, prompts: list[Rendered], n: int, sampling: Sampling) -> list[list[str]]:
        """prompts: P rendered prompts -> P lists of n candidates (order preserved)."""
        return one_job(self.generate_stream, prompts, n, sampling)

    def generate_stream(self, jobs: Iterable[ShardJob], n: int) -> Iterator[tuple[int, list[list[str]]]]:
        """Each job's candidates as soon as its last prompt's request answered, `concurrency`
        requests in flight across shard boundaries (the next shard's flow while the last of one
        finish)."""
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            running: set[Future] = set()

            def submit(job: ShardJob, i: int) -> None:
                if job.sampling.strategy != "sample":
                    raise ValueError(
                        f"the openai backend supports strategy 'sample' only, got {job.sampling.strategy!r}"
                    )
                running.add(pool.submit(lambda: (job.key, i, self._one(job.prompts[i], i, n, job.sampling))))

            def wait_some() -> list[Finished]:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                running.difference_update(done)
                return [f.result() for f in done]  # the first failure stops the stage

            try:
                yield from run_window(jobs, self.concurrency, submit, wait_some)
            finally:
                for f in running:  # stopped early: requests not yet sent are not sent
                    f.cancel()

    def _one(self, prompt: Rendered, i: int, n: int, sampling: Sampling) -> list[str]:
        choices, usage = self._request(self._payload(prompt, n, sampling, sampling.seed + i))
        if len(choices) != n:
            raise EndpointError(
                f"{self.client.base_url}/completions",
                f"asked for n={n} completions, got {len(choices)}",
                1,
                "The server must honour the completions API's `n` (vLLM does); check base_url.",
            )
        self._check_prompt(prompt.ids, choices, usage, i)
        # finish_reason: "stop" or "length", the completions API's values (unknown if absent)
        return [
            Completion(c["text"], c["finish_reason"], c.get("token_ids")) if c.get("finish_reason") else c["text"]
            for c in choices
        ]

    def _payload(self, prompt: Rendered, n: int, sampling: Sampling, seed: int) -> dict:
        payload = {
            "model": self.model,
            "n": n,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed,
            "return_token_ids": True,  # vLLM extension: the sampled and the prompt's ids
        }
        if self.prompt_as == "token_ids":
            payload["prompt"] = list(prompt.ids)
        else:
            payload.update(prompt=prompt.text, add_special_tokens=False)  # vLLM extension
        if sampling.top_k > 0:
            payload["top_k"] = sampling.top_k  # vLLM extension of the OpenAI schema
        return payload

    def _request(self, payload: dict) -> tuple[list[dict], dict | None]:
        try:
            return self.client.completions_with_usage(payload)
        except EndpointError as e:
            if self.prompt_as != "token_ids" or not e.cause.startswith(("HTTP 400", "HTTP 422")):
                raise
            raise EndpointError(
                e.url,
                e.cause,
                e.tries,
                (
                    "POFE sends the prompt as token ids (generate.openai_prompt: token_ids); a server that takes "
                    "text only needs generate.openai_prompt: text, and must then honour add_special_tokens: false "
                    "(POFE checks the prompt token count it reports)."
                ),
            ) from e

    def _check_prompt(self, ids: list[int], choices: list[dict], usage: dict | None, i: int) -> None:
        """The prompt ids the server says it conditioned on (vLLM's prompt_token_ids, else the
        count in `usage`) must be POFE's."""
        where = f"the server at {self.client.base_url}"
        for c in choices:
            check_prompt_seen(ids, c.get("prompt_token_ids"), where, i)
        counted = None if usage is None else usage.get("prompt_tokens")
        if isinstance(counted, int) and counted != len(ids):
            raise ValueError(
                f"{where} counted {counted} prompt tokens for prompt {i} of the batch; POFE sent {len(ids)} "
                f"({self.prompt_as}): it tokenised the prompt otherwise (a second BOS when it adds special "
                "tokens to a template that writes one). Send token ids (generate.openai_prompt: token_ids), or "
                "use a server that honours add_special_tokens: false."
            )
