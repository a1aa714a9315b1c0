"""API keys and server URLs in the config: only an environment variable's NAME is stored,
and nothing that looks like a key or a password is ever repeated in an error."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Prefixes of common API keys (OpenAI, Hugging Face, GitHub, Groq, Replicate, xAI).
_KEY_PREFIXES = ("sk-", "sk_", "hf_", "ghp_", "gho_", "github_pat_", "gsk_", "r8_", "xai-")


def looks_like_key(value: str) -> bool:
    """A known key prefix on a long value, or 24+ letters and digits with no '_' between words
    (variable names are words joined by '_'; keys are random characters)."""
    if value.startswith(_KEY_PREFIXES) and len(value) >= 20:
        return True
    return (
        len(value) >= 24
        and "_" not in value
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
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
    """`url` with any `user:password@` replaced by `***@`."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def check_base_url(url: str | None, block: str) -> None:
    # Credentials in the URL would be written wherever the URL is (errors, logs, manifest,
    # summary, config dump): refuse them; the key goes in an environment variable.
    if url is not None and "@" in urlsplit(url).netloc:
        raise ValueError(
            f"{block}.base_url must not contain credentials (user:password@host), got "
            f"{redact_url(url)}: the URL is written to logs and outputs. Remove them, put the key in "
            f"an environment variable and set {block}.api_key_env to its name (the key is sent as "
            "`Authorization: Bearer <key>`)."
        )


def read_api_key(name: str | None) -> str | None:
    """The key from the named env var (None if no name). Raises if the variable is unset."""
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise ValueError(f"api_key_env={name!r} names an environment variable that is not set.")
    return key
