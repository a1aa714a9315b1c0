"""The judge registry: what each `judge.type` is, said once.

Config validation (`JudgeConfig`), the factory (`pofe_candidates.judges.make_judge`), the
candidate pipeline, online refreshes, evaluation and `axolotl pofe plan` ask a type's
`JudgeSpec` instead of comparing type names, as the method registry (`pofe.methods`) does
for methods: whether it gives preference matrices, where its verdicts come from (a user's
function, weights it loads, a server), the `judge.*` keys it reads, its `judge.preferences`,
how many judge calls K candidates cost, how the plan sizes its model, and its factory.

Adding a judge means a spec (here, or from any module through `register_judge`, imported
before the recipe is read: a module listed under `plugins:`) and a module implementing
`ScalarJudge.score` or `PairwiseJudge.preferences` (`pofe_candidates.judges.interface`) whose
factory takes the validated `JudgeConfig`. The factory is a dotted path, imported only when
a judge of that type is built, so this module imports no judge.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pofe_candidates.config.rubric import check_rubric

# where a judge's verdicts come from: a user's Python function (imported before generating; its
# module's hash keys the verdicts), weights it loads from `judge.model` (on a GPU when one is
# visible; their fingerprint keys the verdicts; the plan sizes them), or a server at `judge.base_url`
Source = Literal["function", "weights", "server"]
# one judge call (a function call, a request, a forward) per candidate, or per ordered pair
Calls = Literal["candidate", "ordered_pair"]

# the `judge.*` keys every type reads; any other key is read only by the types whose spec lists it
COMMON_KEYS = ("type", "preferences", "preferences_temperature", "allow_abstain", "max_abstention_rate")
# what a required key holds, for the error that asks for it
_REQUIRED_HINTS = {
    "model": "a local path or hub id",
    "base_url": "an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1",
}
# device_map: accelerate's placement strategies, or one device (torch's spelling)
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_DEVICE = re.compile(r"(cpu|mps|disk|(cuda|xpu|npu|hpu)(:\d+)?|\d+)")


@dataclass(frozen=True)
class JudgeSpec:
    """One judge type's nature and needs."""

    name: str
    # "package.module:attr[.attr]"(cfg: JudgeConfig) -> the judge (a ScalarJudge or PairwiseJudge)
    factory: str
    # gives a (K, K) preference matrix per prompt (`preferences`) instead of a reward per candidate
    pairwise: bool
    # where its verdicts come from (`Source`)
    source: Source
    # `judge.preferences` values it takes, its default first
    preferences: tuple[str, ...]
    # the `judge.*` keys it reads beyond COMMON_KEYS: another key set away from its default is an error
    keys: tuple[str, ...] = ()
    # keys of `keys` it cannot do without
    required: tuple[str, ...] = ()
    # judge calls for a prompt's K candidates: K, or K (K - 1) for every ordered pair
    calls: Calls = "candidate"
    # weights judges: how `axolotl pofe plan` builds `judge.model` to size it
    # (`pofe.run.plan.model_size.KINDS`: sequence_classification, encoder, backbone)
    model_kind: str | None = None
    # the type's own rules beyond its keys, run first: raise ValueError naming the key to change
    check: Callable[[Any], None] | None = None

    @property
    def calls_functions(self) -> bool:
        """Calls the user's Python (imported before generating, so a bad path fails first)."""
        return self.source == "function"

    @property
    def loads_weights(self) -> bool:
        """Loads `judge.model` into this process, on a GPU when one is visible (else the CPU)."""
        return self.source == "weights"

    def judge_calls(self, k: int) -> int:
        """Judge calls for one prompt's `k` candidates."""
        return k * (k - 1) if self.calls == "ordered_pair" else k


# the registered judge types by name (`judge.type` values); `register_judge` adds to it
JUDGES: dict[str, JudgeSpec] = {}


def register_judge(spec: JudgeSpec) -> JudgeSpec:
    """Make `spec` a judge type: `judge.type: <spec.name>` then builds it. Registering a name
    again is an error unless the spec is the same."""
    known = JUDGES.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"POFE judge type {spec.name!r} is registered already, with another spec")
    if spec.preferences == () or not set(spec.required) <= set(spec.keys):
        raise ValueError(f"judge type {spec.name!r}: preferences must be set and required keys among its keys")
    JUDGES.setdefault(spec.name, spec)
    return spec


def judge_spec(name: str) -> JudgeSpec:
    """The spec of judge type `name`, with an error listing the known types."""
    try:
        return JUDGES[name]
    except KeyError:
        raise ValueError(f"unknown judge.type {name!r}; known: {', '.join(JUDGES)}") from None


def types_taking(key: str) -> list[str]:
    """The judge types that read `judge.<key>`."""
    return [name for name, spec in JUDGES.items() if key in spec.keys or key in COMMON_KEYS]


def check_judge_keys(cfg: Any, defaults: dict[str, Any]) -> None:
    """Refuse the keys `cfg`'s type does not read, set away from their `defaults` (against the
    defaults, not the keys given: a dumped config, every key present, validates again), and
    the keys it needs left unset."""
    spec = judge_spec(cfg.type)
    stray = [k for k, d in defaults.items() if k not in COMMON_KEYS and k not in spec.keys and getattr(cfg, k) != d]
    if len(stray) == 1:
        raise ValueError(
            f"judge.{stray[0]} applies to judge.type: {' / '.join(types_taking(stray[0]))}, not to judge.type: "
            f"{cfg.type}; remove it."
        )
    if stray:
        said = ", ".join(f"judge.{k} ({' / '.join(types_taking(k))})" for k in stray)
        raise ValueError(f"{said} apply to other judge types, not to judge.type: {cfg.type}; remove them.")
    for key in spec.required:
        if not getattr(cfg, key):
            raise ValueError(f"judge.type={cfg.type} needs judge.{key} ({_REQUIRED_HINTS.get(key, 'a value')}).")


# ---- the built-in types' own rules -------------------------------------------------------


def _check_function(cfg: Any) -> None:
    """A python judge calls `function` or `reward_funcs`; python_pairwise calls `function`."""
    batched = "reward_funcs" in judge_spec(cfg.type).keys
    if batched and cfg.reward_funcs is not None:
        if cfg.function:
            raise ValueError(
                "judge.function and judge.reward_funcs are both set: a python judge calls one "
                "per-candidate function or a list of batched reward functions; keep one."
            )
        bad = [f for f in cfg.reward_funcs if "." not in f.strip(".") or ":" in f]
        if bad:
            raise ValueError(
                f"judge.reward_funcs: {bad} are not dotted paths 'package.module.function' (as axolotl's trl.reward_funcs)."
            )
    elif not cfg.function or ":" not in cfg.function:
        hint = " or judge.reward_funcs: [package.module.function, ...]" if batched else ""
        raise ValueError(
            f"judge.type={cfg.type} needs judge.function: 'module:function' (e.g. pofe.demo.task:reward){hint}."
        )
    if batched and cfg.reward_weights is not None:
        if cfg.reward_funcs is None:
            raise ValueError("judge.reward_weights weighs judge.reward_funcs, which is not set; remove it.")
        if len(cfg.reward_weights) != len(cfg.reward_funcs):
            raise ValueError(
                f"judge.reward_weights has {len(cfg.reward_weights)} weights for {len(cfg.reward_funcs)} "
                "reward_funcs; give one weight per function."
            )


def _check_device_map(cfg: Any) -> None:
    dm = cfg.device_map
    if isinstance(dm, int) and dm < 0:
        raise ValueError(f"judge.device_map: a GPU index is >= 0, got {dm}.")
    if isinstance(dm, str) and dm not in DEVICE_MAP_STRATEGIES and not _DEVICE.fullmatch(dm):
        raise ValueError(
            f"judge.device_map: {dm!r} is neither {' | '.join(DEVICE_MAP_STRATEGIES)} nor a device (cpu, cuda, "
            "cuda:N, N, mps)."
        )
    if isinstance(dm, dict):
        bad = {m: d for m, d in dm.items() if not (isinstance(d, int) and d >= 0 or _DEVICE.fullmatch(str(d)))}
        if not dm or bad:
            raise ValueError(
                f"judge.device_map: a map of module name -> device (cpu, cuda:N, N, disk), e.g. {{'': 'cuda:0'}}; "
                f"{f'not devices: {bad}' if bad else 'got an empty map'}."
            )


def _chat_judge_check(known: tuple[str, ...], required: tuple[str, ...]) -> Callable[[Any], None]:
    """An LLM judge's rules: its window is `in_flight` (not `batch_size`), and its rubric fills
    `known` placeholders and must use `required` ones."""

    def check(cfg: Any) -> None:
        if cfg.batch_size != type(cfg).model_fields["batch_size"].default:
            servers = len(cfg.base_url) if isinstance(cfg.base_url, list) else 1
            raise ValueError(
                f"judge.batch_size applies to judge.type: {' / '.join(types_taking('batch_size'))}: judge.type: "
                f"{cfg.type} keeps judge.in_flight requests in flight (default: 256 per vLLM server, 32 per other "
                f"server); set judge.in_flight: {cfg.batch_size * servers} instead "
                "(batch_size per server was the window before)."
            )
        if cfg.rubric is not None:
            check_rubric(cfg.rubric, cfg.type, known, required)
        lo, hi = cfg.score_range
        if not lo < hi:
            raise ValueError(f"judge.score_range must be (low, high) with low < high, got {cfg.score_range}.")

    return check


_FUNCTION_KEYS = ("function", "timeout", "stage_timeout")
_MODEL_KEYS = ("model", "batch_size", "max_length")
_SERVER_KEYS = ("model", "base_url", "api_key_env", "rubric", "in_flight", "request_timeout", "timeout", "max_retries")
_SCALAR_PREFERENCES = ("bradley_terry", "hard")

PYTHON = JudgeSpec(
    name="python",
    factory="pofe_candidates.judges.python:python_judge",
    pairwise=False,
    source="function",
    preferences=_SCALAR_PREFERENCES,
    keys=(*_FUNCTION_KEYS, "reward_funcs", "reward_weights"),
    check=_check_function,
)
PYTHON_PAIRWISE = JudgeSpec(
    name="python_pairwise",
    factory="pofe_candidates.judges.python:PythonPairwiseJudge.from_config",
    pairwise=True,
    source="function",
    preferences=("both_orders",),
    keys=_FUNCTION_KEYS,
    calls="ordered_pair",
    check=_check_function,
)
REWARD_MODEL = JudgeSpec(
    name="reward_model",
    factory="pofe_candidates.judges.reward_model:RewardModelJudge.from_config",
    pairwise=False,
    source="weights",
    preferences=_SCALAR_PREFERENCES,
    keys=(
        *_MODEL_KEYS,
        *("dtype", "device_map", "trust_remote_code", "score_output", "score_index", "prefix_sharing"),
    ),
    required=("model",),
    model_kind="sequence_classification",
    check=_check_device_map,
)
LLM = JudgeSpec(
    name="llm",
    factory="pofe_candidates.judges.llm:LLMRubricJudge.from_config",
    pairwise=False,
    source="server",
    preferences=_SCALAR_PREFERENCES,
    keys=(*_SERVER_KEYS, "score_range", "max_new_tokens"),
    required=("base_url",),
    check=_chat_judge_check(("prompt", "response", "low", "high"), ("response",)),
)
PAIRWISE_LLM = JudgeSpec(
    name="pairwise_llm",
    factory="pofe_candidates.judges.pairwise:PairwiseLLMJudge.from_config",
    pairwise=True,
    source="server",
    preferences=("both_orders",),
    keys=(*_SERVER_KEYS, "use_logprobs", "max_new_tokens"),
    required=("base_url",),
    calls="ordered_pair",
    check=_chat_judge_check(("prompt", "response_a", "response_b"), ("response_a", "response_b")),
)
PAIRRM = JudgeSpec(
    name="pairrm",
    factory="pofe_candidates.judges.pairrm:PairRMJudge.from_config",
    pairwise=True,
    source="weights",
    preferences=("authors", "both_orders"),  # "authors" needs PairRM's logits (judges/pairrm.py)
    keys=_MODEL_KEYS,
    required=("model",),
    calls="ordered_pair",
    model_kind="encoder",
)
GPM = JudgeSpec(
    name="gpm",
    factory="pofe_candidates.judges.gpm:GPMJudge.from_config",
    pairwise=True,
    source="weights",
    preferences=("probability", "authors"),  # judges/gpm.py
    keys=(*_MODEL_KEYS, "dtype", "tau"),
    required=("model",),
    model_kind="backbone",  # the checkpoint's transformer without its language-model head
)

for _spec in (PYTHON, PYTHON_PAIRWISE, REWARD_MODEL, LLM, PAIRWISE_LLM, PAIRRM, GPM):
    register_judge(_spec)
