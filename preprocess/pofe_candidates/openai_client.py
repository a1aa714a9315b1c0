"""A small, bounded, retrying client for OpenAI-compatible HTTP servers (vLLM, TGI, ...).

Every request is bounded in count (`max_retries + 1` tries) and in time: `timeout` bounds
each try as a whole, from connecting to the last byte of the body (httpx's own timeouts
bound each network operation, so a server trickling a byte at a time could hold a try for
ever), and the waits between tries are capped. A request that fails for good raises an
error naming the URL, the cause and what the cause usually means. API keys come from the
environment and are only ever placed in the Authorization header (never logged, never in
an error message). A key bound for a plain-http server on another host is warned about when
the client is made, before any request (`sent_in_clear`): it would cross the network
unencrypted. Warned, not refused: vLLM serves plain http unless given a certificate, and a
server on a cluster's own network is commonly reached so.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import ClassVar
from urllib.parse import urlsplit

import httpx

from pofe.errors import PofeError
from pofe.logs import logger_name
from pofe_candidates.config import GenerateConfig, JudgeConfig, read_api_key, redact_url
from pofe_candidates.counts import Counts

# The longest wait a server's `Retry-After` gets: a longer one is cut to this, so a
# misconfigured server cannot park the run for hours.
MAX_RETRY_AFTER = 60.0

# The most characters one token may decode to, generously: the longest tokens of common
# vocabularies are runs of spaces or symbols of a few dozen characters. A completion longer than
# max_tokens times this did not come from max_tokens tokens.
MAX_CHARS_PER_TOKEN = 256

LOG = logging.getLogger(logger_name(__name__))

NETWORK_HINT = (
    "Check that the server is running and reachable at this URL (base_url), or raise request_timeout / max_retries."
)
NOT_OPENAI_HINT = "Check that base_url is the root of an OpenAI-compatible API (usually ending in /v1)."


class EndpointError(PofeError, RuntimeError):
    """A request that failed for good (after retries, or at once for most 4xx)."""

    def __init__(
        self,
        url: str,
        cause: str,
        tries: int,
        hint: str = NETWORK_HINT,
        *,
        transient: bool = False,
        method: str = "POST",
    ):
        # transient: every try failed in a way a retry may fix (the server unreachable, timing out or
        # failing): another replica of it may answer (replicas.py)
        self.url, self.cause, self.tries, self.hint, self.transient = url, cause, tries, hint, transient
        super().__init__(f"{method} {url} failed after {tries} tr{'y' if tries == 1 else 'ies'}: {cause}. {hint}")


def sent_in_clear(url: str) -> bool:
    """Whether requests to `url` cross a network unencrypted: plain http to a host that is not
    this machine's loopback (localhost, 127.0.0.0/8, ::1). Read from the URL alone: nothing is
    resolved or connected to."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    host = parts.hostname
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: only localhost is known to stay on this machine
        return host != "localhost" and not host.endswith(".localhost")


def status_hint(status: int, *, key_env: str | None, model: object) -> str:
    """What an HTTP error status means for a POFE request, and what to do about it."""
    if status in (401, 403):
        source = (
            f"it was read from the environment variable {key_env} (api_key_env): check its value"
            if key_env
            else "none was sent: put it in an environment variable and set api_key_env to that variable's name"
        )
        return f"The server refused the API key, which is missing or wrong ({source})."
    if status == 404:
        return (
            f"Not found: check base_url (the API root, usually ending in /v1) and that the "
            f"server serves the model {model!r} (its /v1/models lists them)."
        )
    if status == 429:
        return "Rate limited: lower in_flight (requests in flight) or raise max_retries."
    if status >= 500:
        return "Server error: see the server's log."
    return (
        "The server rejected the request: check the model name and the settings sent "
        "(e.g. max_new_tokens within the model's context length)."
    )


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a `Retry-After` header (RFC 9110: delay-seconds or an HTTP-date,
    measured from `now`, never negative); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # HTTP-dates are in GMT
    return max(0.0, (when - now).total_seconds())


def _json_object(r: httpx.Response) -> tuple[dict | None, str | None]:
    """A body that is a JSON object, or why it is not."""
    try:
        body = r.json()
    except ValueError:
        return None, f"invalid JSON: {r.text[:120]!r}"
    if not isinstance(body, dict):
        return None, f"invalid JSON: expected an object, got {type(body).__name__}"
    return body, None


@dataclass
class ClientStats(Counts):
    """Requests, retries and failures (by cause), for summary.json."""

    REASONS: ClassVar[str] = "causes"
    requests: int = 0
    retries: int = 0
    failures: int = 0
    causes: dict[str, int] = field(default_factory=dict)


class OpenAIClient:
    """POST JSON to `{base_url}/{route}`, retrying what may pass on a second try.

    Retried: connection refused/reset, timeouts, HTTP 429 and 5xx, bodies that are not JSON.
    Not retried: other 4xx (a bad request stays bad). The wait before retry n (1, 2, ...) is
    the server's `Retry-After` when it sent one (at most `max_retry_after` seconds), else
    `min(backoff * 2**(n-1), max_backoff)` times a uniform factor in [1/2, 1): the jitter
    keeps requests that failed together (one per thread) from retrying together.
    `sleep` and `rng` are injectable so tests can read the waits instead of timing them.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        key_env: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = MAX_RETRY_AFTER,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.key_env = key_env  # the variable's name, for error messages
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
            if sent_in_clear(self.base_url):
                LOG.warning(
                    f"POFE: {redact_url(self.base_url)} is plain http to a host other than this machine: every "
                    f"request sends the API key{f' from {key_env}' if key_env else ''} unencrypted, readable on "
                    "the network on its way. Serve over https (base_url https://...), or reach the server "
                    "through an SSH tunnel to 127.0.0.1."
                )
        # built once: loading the CA bundle for every try would cost more than the request
        self._ssl = httpx.create_ssl_context()
        self.stats = ClientStats()

    @classmethod
    def from_config(cls, cfg: GenerateConfig | JudgeConfig) -> OpenAIClient:
        """The client for a `generate` or `judge` block (base_url, api_key_env, request_timeout, max_retries)."""
        return cls(
            cfg.base_url,
            api_key=read_api_key(cfg.api_key_env),
            key_env=cfg.api_key_env,
            # judge.timeout, where set, bounds an llm judge's try as it bounds a python judge's call
            timeout=getattr(cfg, "timeout", None) or cfg.request_timeout,
            max_retries=cfg.max_retries,
        )

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        return min(self.backoff * 2 ** (retry - 1), self.max_backoff) * (0.5 + 0.5 * self.rng.random())

    async def _send(self, url: str, content: str) -> httpx.Response:
        # asyncio.timeout is the deadline for the whole try (httpx has no total timeout);
        # a client per try, because an async client's connections belong to one event loop.
        async with asyncio.timeout(self.timeout):
            async with httpx.AsyncClient(headers=self.headers, timeout=self.timeout, verify=self._ssl) as client:
                return await client.post(url, content=content)

    async def _get(self, url: str, timeout: float) -> httpx.Response:
        async with asyncio.timeout(timeout):
            async with httpx.AsyncClient(headers=self.headers, timeout=timeout, verify=self._ssl) as client:
                return await client.get(url)

    def get(self, route: str, *, timeout: float) -> dict:
        """GET `{base_url}/{route}`: one try, bounded by `timeout` seconds as a whole, not
        counted in `stats`. For what POFE can do without (a server's limits): the caller
        falls back on an EndpointError (unreachable, timing out, HTTP >= 400, not a JSON object)."""
        url = f"{self.base_url}/{route.lstrip('/')}"
        try:
            r = asyncio.run(self._get(url, timeout))
        except (httpx.TimeoutException, TimeoutError):
            raise EndpointError(url, f"timeout: no answer within {timeout}s", 1, method="GET") from None
        except httpx.TransportError as e:
            raise EndpointError(url, f"{type(e).__name__}: {e}", 1, method="GET") from None
        if r.status_code >= 400:
            raise EndpointError(url, f"HTTP {r.status_code}: {r.text[:120]}", 1, NOT_OPENAI_HINT, method="GET")
        try:
            body = r.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise EndpointError(url, f"not a JSON object: {r.text[:120]!r}", 1, NOT_OPENAI_HINT, method="GET")
        return body

    def post(self, route: str, payload: dict) -> dict:
        """POST `payload` to `{base_url}/{route}`; the JSON object answered."""
        return self._post(route, payload, _json_object)

    def post_text(self, route: str, payload: dict) -> str:
        """POST as `post` does, for a route that answers plain text (vLLM's
        /v1/load_lora_adapter: "Success: ..."); the text."""
        return self._post(route, payload, lambda r: (r.text, None))

    def _post(self, route: str, payload: dict, read: Callable[[httpx.Response], tuple]):
        """The retrying POST; `read(response) -> (value, None)`, or `(None, cause)` for a body
        that is not what the route answers (retried, as a server failing mid-reply may)."""
        url = f"{self.base_url}/{route.lstrip('/')}"
        content = json.dumps(payload)
        cause, hint, retry_after = "no attempt made", NETWORK_HINT, None
        tries = 0
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats.add("retries")
                self.sleep(self.delay(attempt, retry_after))
            tries += 1
            retry_after = None
            self.stats.add("requests")
            try:
                r = asyncio.run(self._send(url, content))
            except httpx.ConnectError as e:
                cause, hint = f"connection refused: {e}", NETWORK_HINT
                continue
            except (httpx.TimeoutException, TimeoutError):
                cause, hint = (
                    f"timeout: no answer within {self.timeout}s (request_timeout, for the whole try)",
                    NETWORK_HINT,
                )
                continue
            except httpx.TransportError as e:
                cause, hint = f"transport error: {type(e).__name__}: {e}", NETWORK_HINT
                continue
            if r.status_code >= 400:
                cause = f"HTTP {r.status_code}: {r.text[:300]}"
                hint = status_hint(r.status_code, key_env=self.key_env, model=payload.get("model"))
                if r.status_code == 429 or r.status_code >= 500:
                    retry_after = retry_after_seconds(r.headers.get("Retry-After"), datetime.now(UTC))
                    continue
                self.stats.add("failures", reason=cause)
                raise EndpointError(url, cause, tries, hint)
            value, bad = read(r)
            if bad is None:
                return value
            cause, hint = bad, NOT_OPENAI_HINT
        self.stats.add("failures", reason=cause)
        raise EndpointError(url, cause, tries, hint, transient=True)

    def check_lengths(self, route: str, payload: dict, texts: list[str], *, raise_: bool = True) -> str | None:
        """Why texts returned for `payload` are far longer than its `max_tokens` tokens can be
        (`MAX_CHARS_PER_TOKEN`), or None; raised as an EndpointError naming the server's `route`
        unless `raise_` is false (a server ignoring max_tokens would fill the shards)."""
        if not isinstance(payload.get("max_tokens"), int):
            return None
        limit = payload["max_tokens"] * MAX_CHARS_PER_TOKEN
        longest = max((len(t) for t in texts), default=0)
        if longest <= limit:
            return None
        cause = (
            f"bad response: a reply of {longest} characters for max_tokens={payload['max_tokens']} "
            f"(at most {limit} at {MAX_CHARS_PER_TOKEN} characters per token)"
        )
        if raise_:
            self.stats.add("failures", reason=cause)
            raise EndpointError(f"{self.base_url}/{route}", cause, 1, NOT_OPENAI_HINT)
        return cause

    def completions(self, payload: dict) -> list[dict]:
        """POST /completions; the choices sorted by their index. Raises EndpointError if absent."""
        return self.completions_with_usage(payload)[0]

    def completions_with_usage(self, payload: dict) -> tuple[list[dict], dict | None]:
        """POST /completions; the choices sorted by their index, and the body's `usage` (None
        if absent or not an object). Raises EndpointError if the choices are absent, if a text
        is null (no completion, not an empty one), or if one is far longer than `max_tokens`
        tokens can be (`MAX_CHARS_PER_TOKEN`)."""
        body = self.post("completions", payload)
        choices = body.get("choices")
        cause = None
        if not isinstance(choices, list) or not all(isinstance(c, dict) and "text" in c for c in choices):
            cause = f"bad response: no choices[].text in {str(body)[:200]!r}"
        elif any(not isinstance(c["text"], str) for c in choices):
            cause = f"bad response: a choices[].text is {next(c['text'] for c in choices if not isinstance(c['text'], str))!r}, not text"
        else:
            cause = self.check_lengths("completions", payload, [c["text"] for c in choices], raise_=False)
        if cause is not None:
            self.stats.add("failures", reason=cause)
            raise EndpointError(f"{self.base_url}/completions", cause, 1, NOT_OPENAI_HINT)
        usage = body.get("usage")
        return sorted(choices, key=lambda c: c.get("index", 0)), usage if isinstance(usage, dict) else None
