"""Secrets in the config are refused, and never repeated: not by POFE's errors, not by
pydantic's (`input_value=...`), not by axolotl's when the recipe goes through the CLI's path."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from pofe.args import PofeConfig
from pofe_candidates.config import (
    CandidatesConfig,
    GenerateConfig,
    JudgeConfig,
    looks_like_key,
    read_api_key,
    redact,
    redact_text,
    redact_url,
    resolve_env,
)
from tests.helpers import ROOT

KEY = "sk-proj-Zq81vPx0aLm4Tr7YbN2cWd9EeKf3"
HF_KEY = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm1234567"
PASSWORD = "hunter2-Pw0rd"
OPENAI = {"backend": "openai", "base_url": "http://127.0.0.1:8000/v1"}
RECIPE = ROOT / "recipes" / "tiny-rrhf-cpu.yml"


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
    with pytest.raises(
        ValueError, match=r"api_key_env='POFE_UNSET_VAR_X' names an environment variable that is not set"
    ):
        read_api_key("POFE_UNSET_VAR_X")


def test_redact_url():
    assert redact_url("http://user:pw@host:8000/v1") == "http://***@host:8000/v1"
    assert redact_url("https://tok@host/v1?x=1") == "https://***@host/v1?***"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


@pytest.mark.parametrize(
    "url", [f"http://user:{PASSWORD}@127.0.0.1:8000/v1", f"https://{PASSWORD}@api.example.com/v1"]
)
def test_credentials_in_base_url_are_refused_and_redacted(url):
    text = _refused(
        lambda: GenerateConfig(backend="openai", base_url=url),
        PASSWORD,
        match=r"generate.base_url must not contain credentials \(user:password@host\), got https?://\*\*\*@.*"
        r"set generate.api_key_env to its name",
    )
    assert "//user" not in text
    _refused(
        lambda: JudgeConfig(type="llm", base_url=url), PASSWORD, match=r"judge.base_url must not contain credentials"
    )


def _axolotl_validate(pofe_changes: dict) -> None:
    """The CLI's path (`axolotl.cli.config.load_cfg`): plugins register, then axolotl validates."""
    from axolotl.cli.config import prepare_plugins
    from axolotl.utils.config import validate_config
    from axolotl.utils.dict import DictDefault

    raw = yaml.safe_load(RECIPE.read_text())
    for block, changes in pofe_changes.items():
        # a judge of another type shares none of the recipe's judge keys (each type reads its own)
        kept = {} if "type" in changes else raw["pofe"][block]
        raw["pofe"][block] = {**kept, **changes}
    cfg = DictDefault(raw)
    prepare_plugins(cfg)
    cpu = {"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None}
    validate_config(cfg, capabilities=cpu, env_capabilities={"torch_version": "2.13.0"})


@pytest.mark.parametrize(
    "changes, secret, match",
    [
        ({"generate": {"api_key": KEY}}, KEY, "api_key: keys are never read from the config"),
        (
            {"judge": {"type": "llm", "base_url": "http://h/v1", "api_key_env": HF_KEY}},
            HF_KEY,
            "looks like an API key",
        ),
        (
            {"judge": {"type": "llm", "base_url": f"http://u:{PASSWORD}@h/v1"}},
            PASSWORD,
            "must not contain credentials",
        ),
    ],
)
def test_axolotl_cli_path_does_not_repeat_secrets(changes, secret, match):
    _refused(lambda: _axolotl_validate(changes), secret, match=match)


# ---- secrets that must stay in the config: masked wherever it is written (bad case 2 of issue 20) ----

SERVE = "vllm serve {model} --port {port}"


@pytest.mark.parametrize(
    "text, shown",
    [
        (f"{SERVE} --api-key {KEY}", f"{SERVE} --api-key ***"),
        (f"{SERVE} --api-key={PASSWORD} --dtype float32", f"{SERVE} --api-key=*** --dtype float32"),
        (f"srv --hf-token '{PASSWORD}' --x 1", "srv --hf-token *** --x 1"),
        (f"srv --token-file /k {HF_KEY}", "srv --token-file *** ***"),  # a flag naming a secret, a key's prefix
        (f"GET http://h:1/v1?api_key={PASSWORD}&x=1 ok", "GET http://h:1/v1?api_key=***&x=*** ok"),
        (f"Authorization: Bearer {PASSWORD}", "Authorization: Bearer ***"),
        # not secrets: flags whose words are not a secret's, hashes, paths
        ("srv --max-num-batched-tokens 512 --tokenizer /t --kv-cache-dtype auto", None),
        ("prompts_sha256 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", None),
    ],
)
def test_redact_text(text, shown):
    assert redact_text(text) == (text if shown is None else shown)


def test_a_served_commands_secrets_are_its_keys_not_its_paths():
    """The model path of a real run (long, digits and letters: `looks_like_key` on its own
    would take it) stays; the flag's value and a prefixed key are the secrets."""
    from pofe_candidates.config.credentials import command_secrets

    words = [
        "python",
        "-m",
        "vllm",
        "--model",
        "/tmp/pytest-of-root/pytest-52/tiny0/model",
        "--api-key",
        PASSWORD,
        "--x",
        KEY,
        "--port",
        "45173",
    ]
    assert command_secrets(words) == (PASSWORD, KEY)
    assert GenerateConfig(
        backend="openai", serve={"command": SERVE, "env": {"VLLM_CACHE_ROOT": "/data/cache2024/vllm0models1234567"}}
    ).serve.env


def test_redact_masks_known_secrets_everywhere_in_a_structure():
    obj = {"a": [f"x {PASSWORD} y", 3, None], "b": {"c": (f"--api-key {KEY}",)}}
    assert redact(obj, (PASSWORD,)) == {"a": ["x *** y", 3, None], "b": {"c": ("--api-key ***",)}}


@pytest.mark.parametrize("env", [{"HF_TOKEN": HF_KEY}, {"VLLM_API_KEY": "abc"}, {"SOME_SETTING": KEY}])
def test_a_secret_in_serve_env_is_refused_unrepeated(env):
    (value,) = env.values()
    _refused(
        lambda: GenerateConfig(backend="openai", serve={"command": SERVE, "env": env}),
        value,
        match=r"generate.serve.env.\w+ holds a secret in the recipe.*write \w+: \$\{\w+\}",
    )


def test_serve_env_passes_a_variable_through_by_reference(monkeypatch):
    """`HF_TOKEN: ${MY_HF}`: accepted, written as the reference, resolved only for the server."""
    cfg = GenerateConfig(
        backend="openai", serve={"command": SERVE, "env": {"HF_TOKEN": "${MY_HF}", "VLLM_CPU_KVCACHE_SPACE": "2"}}
    )
    monkeypatch.setenv("MY_HF", HF_KEY)
    assert resolve_env(cfg.serve.env) == {"HF_TOKEN": HF_KEY, "VLLM_CPU_KVCACHE_SPACE": "2"}
    assert cfg.public_dict()["serve"]["env"] == {"HF_TOKEN": "${MY_HF}", "VLLM_CPU_KVCACHE_SPACE": "2"}
    monkeypatch.delenv("MY_HF")
    with pytest.raises(
        ValueError, match=r"serve.env.HF_TOKEN: \$\{MY_HF\} names an environment variable that is not set"
    ):
        resolve_env(cfg.serve.env)


def test_a_query_string_in_base_url_is_refused_unrepeated():
    url = f"http://127.0.0.1:8000/v1?api_key={PASSWORD}"
    _refused(
        lambda: GenerateConfig(backend="openai", base_url=url),
        PASSWORD,
        match=r"generate.base_url must not contain a query string.*got http://127.0.0.1:8000/v1\?\*\*\*",
    )
    _refused(lambda: JudgeConfig(type="llm", base_url=url), PASSWORD, match="judge.base_url must not contain a query")


class _Scripted:
    name = "scripted"

    def generate(self, prompts, n, sampling):
        return [[f"r{k}" for k in range(n)] for _ in prompts]


def _length(prompt, response):
    return float(len(response))


def test_summary_and_manifest_mask_the_served_policys_key(tiny_policy, tmp_path):
    """summary.json (which the hub's dataset repo gets) and generate/manifest.json: the key in
    serve.command masked, both readable by their owner only."""
    from pofe_candidates.pipeline import run_pipeline

    cfg = GenerateConfig(backend="openai", num_candidates=2, serve={"command": f"{SERVE} --api-key {KEY}"})
    res = run_pipeline(
        [{"prompt": "1+1="}],
        policy_path=str(tiny_policy),
        method="rrhf",
        generate=cfg,
        judge=JudgeConfig(type="python", function=f"{__name__}:_length"),
        candidates=CandidatesConfig(out_dir=str(tmp_path), progress=False),
        generator=_Scripted(),
    )
    for path in (res.summary_path, tmp_path / "generate" / "manifest.json", tmp_path / "judge" / "manifest.json"):
        text = path.read_text()
        assert KEY not in text and path.stat().st_mode & 0o777 == 0o600, path
    assert res.summary["generate"]["serve"]["command"] == f"{SERVE} --api-key ***"


def test_server_log_masks_the_command_and_what_the_server_prints(tmp_path):
    """A server that prints its arguments back (vLLM logs its non-default args, the key among
    them) and a secret it was given another way (here its environment): neither reaches
    server.log or the error that quotes it."""
    import sys

    from pofe_candidates.generators.served import ServerProcess

    other = "env-secret-7Hq2"
    script = "import os, sys; print('args:', sys.argv[1:], 'env:', os.environ['POFE_T_SECRET'], flush=True)"
    server = ServerProcess(
        [sys.executable, "-c", script, "--api-key", PASSWORD, "--other", "x"],
        tmp_path / "server.log",
        "http://x",
        env={"POFE_T_SECRET": other},
        secrets=(other,),
    )
    server.proc.wait(timeout=30)
    described = server.describe("exited")
    text = (tmp_path / "server.log").read_text()
    for secret in (PASSWORD, other):
        assert secret not in text and secret not in described
    assert "--api-key ***" in text.splitlines()[1]  # POFE's line naming the command
    assert "args: ['--api-key', '***', '--other', 'x'] env: ***" in text
    assert (tmp_path / "server.log").stat().st_mode & 0o777 == 0o600


def test_stage_logs_and_console_mask_keys(tmp_path, capsys):
    """What a stage prints (axolotl's dump of the recipe) reaches its log and the terminal masked."""
    import sys

    from pofe.run.rounds.processes import run_logged

    run_logged(
        [sys.executable, "-c", f"print('command: srv --api-key {PASSWORD}')"],
        tmp_path / "s.log",
        echo=print,
        stream=True,
    )
    log = (tmp_path / "s.log").read_text()
    assert log.splitlines()[1:] == ["command: srv --api-key ***"] and PASSWORD not in log  # under the command line
    assert PASSWORD not in capsys.readouterr().out
    assert (tmp_path / "s.log").stat().st_mode & 0o777 == 0o600


def test_axolotls_config_dump_masks_the_served_policys_key(tiny_model, tmp_path, caplog):
    """axolotl's load_cfg logs the whole validated config (console, and output_dir/debug.log),
    masking only its own key fields; POFE's plugin masks the rest."""
    import logging

    from pofe.run.recipe import load_recipe

    raw = yaml.safe_load(RECIPE.read_text())
    raw.update(base_model=str(tiny_model), output_dir=str(tmp_path / "out"))
    raw["datasets"][0]["path"] = str(tmp_path / "p.jsonl")
    raw["pofe"]["generate"] = {"backend": "openai", "serve": {"command": f"{SERVE} --api-key {KEY}"}}
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(raw))
    with caplog.at_level(logging.INFO):
        load_recipe(tmp_path / "recipe.yml")
    dump = [r.getMessage() for r in caplog.records if r.getMessage().startswith("config:")]
    assert dump and "--api-key ***" in dump[0]
    assert KEY not in caplog.text


@pytest.mark.parametrize(
    ("url", "in_clear"),
    [
        ("http://10.0.0.5:8000/v1", True),
        ("http://judge.example.com/v1", True),
        ("http://[2001:db8::1]:8000/v1", True),
        ("http://127.0.0.1:8000/v1", False),
        ("http://127.0.0.2:8000/v1", False),
        ("http://localhost:8000/v1", False),
        ("http://[::1]:8000/v1", False),
        ("https://judge.example.com/v1", False),
    ],
)
def test_plain_http_to_another_host_is_sent_in_clear(url, in_clear):
    from pofe_candidates.openai_client import sent_in_clear

    assert sent_in_clear(url) is in_clear


# for each URL: builds an LLM judge as a run does (the key from $JUDGE_KEY), then judges one candidate
LLM_JUDGES = """
import logging, sys
from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges import make_judge
logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")
for url in sys.argv[1:]:
    print("-- making", url, flush=True)
    judge = make_judge(JudgeConfig(type="llm", base_url=url, model="m", api_key_env="JUDGE_KEY", max_retries=0))
    print("-- judging", flush=True)
    try:
        judge.score(["2+2="], [["4"]])
    except Exception as e:
        print("-- raised", type(e).__name__, flush=True)
"""


def test_a_key_bound_for_plain_http_to_another_host_is_warned_before_any_request():
    """In a network namespace of the test's own (`unshare -rn`: no interface up, so no request
    can leave, and each fails at once): the plain-http URL of another host (192.0.2.7, a
    documentation address) is warned about as the judge is made, before its first request,
    naming the variable and not the key; loopback and https are not."""
    import os
    import subprocess
    import sys

    urls = ["http://192.0.2.7:8000/v1", "http://127.0.0.1:9/v1", "https://192.0.2.7/v1"]
    proc = subprocess.run(
        ["unshare", "-rn", sys.executable, "-c", LLM_JUDGES, *urls],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JUDGE_KEY": "sk-test-abcdefghijklmnopqrstuvwx"},
        check=True,
    )
    assert "sk-test" not in proc.stdout + proc.stderr
    made = {}
    for part in proc.stdout.split("-- making ")[1:]:
        url, _, rest = part.partition("\n")
        before, _, after = rest.partition("-- judging")
        made[url] = before
        assert "-- raised EndpointError" in after  # the request made after the warning: unreachable here
    warned = "is plain http to a host other than this machine: every request sends the API key from JUDGE_KEY"
    assert {url: warned in before for url, before in made.items()} == dict(zip(urls, [True, False, False]))
    assert f"POFE: {urls[0]} {warned} unencrypted" in made[urls[0]]
