"""Secrets in the config are refused, and never repeated: not by POFE's errors, not by
pydantic's (`input_value=...`), not by axolotl's when the recipe goes through the CLI's path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from pofe.args import PofeConfig
from pofe.preprocess.config import GenerateConfig, JudgeConfig, looks_like_key, read_api_key, redact_url

KEY = "sk-proj-Zq81vPx0aLm4Tr7YbN2cWd9EeKf3"
HF_KEY = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm1234567"
PASSWORD = "hunter2-Pw0rd"
OPENAI = {"backend": "openai", "base_url": "http://127.0.0.1:8000/v1"}
RECIPE = Path(__file__).parents[2] / "recipes" / "tiny-rrhf-cpu.yml"


def _refused(build, *secrets: str, match: str) -> str:
    """The error `build()` raises: it must match and repeat no 6 characters in a row of any
    of `secrets` (pydantic shortens long inputs to their ends: a part is a leak too)."""
    with pytest.raises((ValidationError, ValueError), match=match) as e:
        build()
    text = str(e.value)
    for secret in secrets:
        leaked = [secret[i : i + 6] for i in range(max(1, len(secret) - 5)) if secret[i : i + 6] in text]
        assert not leaked, f"{leaked} repeated in: {text}"
    return text


def test_inline_api_key_is_refused_unrepeated():
    says = r"api_key: keys are never read from the config.*set api_key_env"
    _refused(lambda: GenerateConfig(**OPENAI, api_key=KEY), KEY, match=says)
    _refused(lambda: JudgeConfig(type="llm", base_url="http://h/v1", api_key=KEY), KEY, match=says)
    # nested: the outer model decides whether inputs are shown
    pofe = {"generate": {**OPENAI, "api_key": KEY}, "judge": {"type": "python", "function": "a:b"}}
    _refused(lambda: PofeConfig.model_validate(pofe), KEY, match=says)


def test_any_rejected_input_is_not_repeated():
    """Not only api_key: a key pasted into any field (here a bounded number) stays out of the error."""
    _refused(lambda: GenerateConfig(temperature=KEY), KEY, match="temperature")
    _refused(lambda: PofeConfig.model_validate({"generate": {"seed": KEY}, "judge": {}}), KEY, match="seed")


@pytest.mark.parametrize("value", [KEY, HF_KEY, "ghp_" + "a1B2c3D4" * 4, "a3f9c2e81b7d4f60a3f9c2e81b7d4f60"])
def test_key_in_api_key_env_is_refused_unrepeated(value):
    assert looks_like_key(value)
    _refused(
        lambda: GenerateConfig(**OPENAI, api_key_env=value),
        value,
        match=r"generate.api_key_env looks like an API key, not the NAME of an environment variable",
    )
    _refused(
        lambda: JudgeConfig(type="pairwise_llm", base_url="http://h/v1", api_key_env=value),
        value,
        match=r"judge.api_key_env looks like an API key",
    )


@pytest.mark.parametrize("value", ["MY KEY", "1PASSWORD", "KEY=abc", "key$", ""])
def test_api_key_env_must_be_a_variable_name(value):
    _refused(
        lambda: GenerateConfig(**OPENAI, api_key_env=value),
        *([value] if value else []),
        match=r"must be the NAME of an environment variable: letters, digits and '_'",
    )


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "HF_TOKEN", "hf_token", "_KEY", "MY_COMPANY_OPENAI_API_KEY_2"])
def test_variable_names_pass(name):
    assert not looks_like_key(name)
    assert GenerateConfig(**OPENAI, api_key_env=name).api_key_env == name


def test_unset_variable_names_the_variable_only():
    with pytest.raises(ValueError, match=r"api_key_env='POFE_UNSET_VAR_X' names an environment variable that is not set"):
        read_api_key("POFE_UNSET_VAR_X")


def test_redact_url():
    assert redact_url("http://user:pw@host:8000/v1") == "http://***@host:8000/v1"
    assert redact_url("https://tok@host/v1?x=1") == "https://***@host/v1?x=1"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


@pytest.mark.parametrize("url", [f"http://user:{PASSWORD}@127.0.0.1:8000/v1", f"https://{PASSWORD}@api.example.com/v1"])
def test_credentials_in_base_url_are_refused_and_redacted(url):
    text = _refused(
        lambda: GenerateConfig(backend="openai", base_url=url),
        PASSWORD,
        match=r"generate.base_url must not contain credentials \(user:password@host\), got https?://\*\*\*@.*"
        r"set generate.api_key_env to its name",
    )
    assert "//user" not in text
    _refused(lambda: JudgeConfig(type="llm", base_url=url), PASSWORD, match=r"judge.base_url must not contain credentials")


def _axolotl_validate(pofe_changes: dict) -> None:
    """The CLI's path (`axolotl.cli.config.load_cfg`): plugins register, then axolotl validates."""
    from axolotl.cli.config import prepare_plugins
    from axolotl.utils.config import validate_config
    from axolotl.utils.dict import DictDefault

    raw = yaml.safe_load(RECIPE.read_text())
    for block, changes in pofe_changes.items():
        raw["pofe"][block] = {**raw["pofe"][block], **changes}
    cfg = DictDefault(raw)
    prepare_plugins(cfg)
    cpu = {"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None}
    validate_config(cfg, capabilities=cpu, env_capabilities={"torch_version": "2.13.0"})


@pytest.mark.parametrize(
    "changes, secret, match",
    [
        ({"generate": {"api_key": KEY}}, KEY, "api_key: keys are never read from the config"),
        ({"judge": {"type": "llm", "base_url": "http://h/v1", "api_key_env": HF_KEY}}, HF_KEY, "looks like an API key"),
        ({"judge": {"type": "llm", "base_url": f"http://u:{PASSWORD}@h/v1"}}, PASSWORD, "must not contain credentials"),
    ],
)
def test_axolotl_cli_path_does_not_repeat_secrets(changes, secret, match):
    _refused(lambda: _axolotl_validate(changes), secret, match=match)
