"""API keys and server URLs in the config: only an environment variable's NAME is stored,
and nothing that looks like a key or a password is ever repeated in an error.

Some secrets must stay in the config to work (a served policy's `--api-key` in
`generate.serve.command`): `redact` masks them, and is applied by every writer of config or
of a server's output (summary.json, the manifests, server.log, the stage logs, the console's
config dump, so the hub's copy of summary.json too).
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Prefixes of common API keys (OpenAI, Hugging Face, GitHub, Groq, Replicate, xAI).
_KEY_PREFIXES = ("sk-", "sk_", "hf_", "ghp_", "gho_", "github_pat_", "gsk_", "r8_", "xai-")
# Words that make a variable or a command-line flag name a secret (HF_TOKEN, --api-key).
_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "auth", "credential", "credentials"}
)
MASK = "***"
_PREFIXED_KEY = re.compile(r"(?<![\w-])(?:" + "|".join(map(re.escape, _KEY_PREFIXES)) + r")[A-Za-z0-9_\-]{16,}")
_FLAG_VALUE = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)(=|\s+)(\"[^\"]*\"|'[^']*'|[^\s\"']+)")
_URL_USER = re.compile(r"(://)[^/\s@]+@")
_URL_QUERY = re.compile(r"(://[^\s?#\"']*\?)([^\s#\"']+)")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"']+")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def looks_like_secret_value(value: str) -> bool:
    """A value (a command-line word, a variable's value) that is a key: a known key prefix,
    or `looks_like_key` without a path's '/' or '.' (a model path is long and has digits too)."""
    if value.startswith(_KEY_PREFIXES) and len(value) >= 20:
        return True
    return looks_like_key(value) and not any(c in value for c in "/.")


def names_secret(name: str) -> bool:
    """A variable or flag name with a secret's word among its parts (HF_TOKEN, --api-key;
    not --max-num-batched-tokens or --tokenizer)."""
    return any(part in _SECRET_WORDS for part in re.split(r"[-_]+", name.lower().lstrip("-")))


def env_reference(value: str) -> str | None:
    """NAME when `value` is exactly `${NAME}` (an environment variable passed through)."""
    m = _REFERENCE.fullmatch(value)
    return m.group(1) if m else None


def redact_text(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with every secret masked: the given `secrets` verbatim; a secret-named flag's
    value (`--api-key X`, `--hf-token=X`); a known key prefix (sk-..., hf_...); a URL's
    user:password@ and query values (`?api_key=X`); a `Bearer` token."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    text = _FLAG_VALUE.sub(lambda m: f"{m[1]}{m[2]}{MASK}" if names_secret(m[1]) else m[0], text)
    text = _PREFIXED_KEY.sub(MASK, text)
    text = _URL_USER.sub(rf"\1{MASK}@", text)
    text = _URL_QUERY.sub(lambda m: m[1] + "&".join(f"{kv.partition('=')[0]}={MASK}" for kv in m[2].split("&")), text)
    return _BEARER.sub(rf"\1{MASK}", text)


def command_secrets(words: list[str]) -> tuple[str, ...]:
    """The values a command line's secret-named flags carry (`--api-key X`, `--api-key=X`) and
    its words that look like keys: what a server may print back (vLLM logs its arguments)."""
    found = []
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if word.startswith("-") and names_secret(name):
            if eq:
                found.append(value)
            elif i + 1 < len(words):
                found.append(words[i + 1])
        elif looks_like_secret_value(word):
            found.append(word)
    return tuple(found)


def redact(obj, secrets: tuple[str, ...] = ()):
    """`obj` (JSON-like: dicts, lists, strings) with `redact_text` applied to every string value."""
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    if isinstance(obj, dict):
        return {k: redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v, secrets) for v in obj)
    return obj


def check_serve_env(env: dict[str, str]) -> None:
    # A secret written in the recipe would be copied wherever the config goes: refuse it (never
    # repeating it); `${NAME}` passes POFE's variable through, read only when the server starts.
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(
                f"generate.serve.env: {name!r} is not an environment variable name (letters, "
                "digits and '_', not starting with a digit)."
            )
        if env_reference(value) is None and (names_secret(name) or looks_like_secret_value(value)):
            raise ValueError(
                f"generate.serve.env.{name} holds a secret in the recipe (its value is not repeated here), "
                f"which would be written to the run's files and logs. Export it where POFE runs (the server "
                f"inherits POFE's environment) and drop it here, or write {name}: ${{{name}}} (or ${{OTHER}}) to "
                "pass a variable of POFE's environment through under this name."
            )


def resolve_env(env: dict[str, str]) -> dict[str, str]:
    """serve.env with each `${NAME}` replaced by POFE's environment variable NAME."""
    resolved = {}
    for name, value in env.items():
        ref = env_reference(value)
        if ref is not None and ref not in os.environ:
            raise ValueError(f"generate.serve.env.{name}: ${{{ref}}} names an environment variable that is not set.")
        resolved[name] = os.environ[ref] if ref is not None else value
    return resolved


def looks_like_key(value: str) -> bool:
    """A known key prefix on a long value, or 24+ letters and digits with no '_' between words
    (variable names are words joined by '_'; keys are random characters)."""
    if value.startswith(_KEY_PREFIXES) and len(value) >= 20:
        return True
    return (
        len(value) >= 24 and "_" not in value and any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
    )


def check_key_env(name: str | None, block: str) -> None:
    # A key pasted where the variable NAME belongs would end up in logs, summary.json and
    # the config dump: refuse it, and never repeat it in the error.
    if name is None:
        return
    if looks_like_key(name):
        raise ValueError(
            f"{block}.api_key_env looks like an API key, not the NAME of an environment variable "
            "(its value is not repeated here). Put the key in an environment variable "
            f"(export OPENAI_API_KEY=...) and set {block}.api_key_env: OPENAI_API_KEY."
        )
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(
            f"{block}.api_key_env must be the NAME of an environment variable: letters, digits "
            "and '_', not starting with a digit, e.g. OPENAI_API_KEY (the value given is not "
            "repeated here, in case it is a key)."
        )


def redact_url(url: str) -> str:
    """`url` with any `user:password@` replaced by `***@` and its query string dropped."""
    parts = urlsplit(url)
    netloc = MASK + "@" + parts.netloc.rpartition("@")[2] if "@" in parts.netloc else parts.netloc
    return urlunsplit(parts._replace(netloc=netloc, query=MASK if parts.query else ""))


def check_base_url(url: str | list[str] | None, block: str) -> None:
    # A list: several servers of one model (replicas.py), each checked; none twice (a server
    # listed twice would get twice the share of the window, which is never what was meant).
    if isinstance(url, list):
        if not url:
            raise ValueError(f"{block}.base_url is an empty list: give one server root (.../v1) or several.")
        twice = sorted({u for u in url if url.count(u) > 1})
        if twice:
            raise ValueError(
                f"{block}.base_url lists {[redact_url(u) for u in twice]} more than once: list each server once."
            )
        for u in url:
            check_base_url(u, block)
        return
    # Credentials in the URL would be written wherever the URL is (errors, logs, manifest,
    # summary, config dump): refuse them; the key goes in an environment variable. A query
    # string (`?api_key=...`) is refused too: requests append their route to base_url, after it.
    parts = urlsplit(url) if url is not None else None
    if parts is not None and ("@" in parts.netloc or parts.query):
        what = "credentials (user:password@host)" if "@" in parts.netloc else "a query string (?...)"
        raise ValueError(
            f"{block}.base_url must not contain {what}, got {redact_url(url)}: the URL is written to logs "
            f"and outputs. Remove it, put the key in an environment variable and set {block}.api_key_env "
            "to its name (the key is sent as `Authorization: Bearer <key>`)."
        )


def read_api_key(name: str | None) -> str | None:
    """The key from the named env var (None if no name). Raises if the variable is unset."""
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise ValueError(f"api_key_env={name!r} names an environment variable that is not set.")
    return key
