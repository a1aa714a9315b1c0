"""A small, bounded, retrying client for OpenAI-compatible HTTP servers (vLLM, TGI, ...).

Every request loop is bounded in count (`max_retries + 1` tries) and in time (`timeout`
per try, back-off capped), so a dead server ends the run with an error that names the URL
and the cause instead of hanging it. API keys come from the environment and are only ever
placed in the Authorization header (never logged, never in an error message).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import ClassVar

import httpx

from .counts import Counts


class EndpointError(RuntimeError):
    """A request that failed for good (after retries, or at once for 4xx)."""

    def __init__(self, url: str, cause: str, tries: int):
        self.url, self.cause, self.tries = url, cause, tries
        super().__init__(
            f"POST {url} failed after {tries} tr{'y' if tries == 1 else 'ies'}: {cause}. "
            "Check that the server is running and reachable at this URL (generate/judge base_url), "
            "or raise request_timeout / max_retries."
        )


@dataclass
class ClientStats(Counts):
    """Requests, retries and failures (by cause), for summary.json."""

    REASONS: ClassVar[str] = "causes"
    requests: int = 0
    retries: int = 0
    failures: int = 0
    causes: dict[str, int] = field(default_factory=dict)


class OpenAIClient:
    """POST JSON to `{base_url}/{route}` with exponential back-off.

    Retried: connection refused/reset, timeouts, HTTP 429 and 5xx, bodies that are not JSON.
    Not retried: other 4xx (a bad request stays bad). Back-off: backoff * 2**attempt seconds,
    at most max_backoff.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout))
        self.stats = ClientStats()

    def post(self, route: str, payload: dict) -> dict:
        url = f"{self.base_url}/{route.lstrip('/')}"
        cause = "no attempt made"
        tries = 0
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats.add("retries")
                time.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            tries += 1
            self.stats.add("requests")
            try:
                r = self._client.post(url, content=json.dumps(payload))
            except httpx.ConnectError as e:
                cause = f"connection refused: {e}"
                continue
            except httpx.TimeoutException:
                cause = f"timeout: no answer within {self.timeout}s"
                continue
            except httpx.TransportError as e:
                cause = f"transport error: {type(e).__name__}: {e}"
                continue
            if r.status_code == 429 or r.status_code >= 500:
                cause = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code >= 400:
                cause = f"HTTP {r.status_code}: {r.text[:300]}"
                self.stats.add("failures", reason=cause)
                raise EndpointError(url, cause, tries)
            try:
                body = r.json()
            except ValueError:
                cause = f"invalid JSON: {r.text[:120]!r}"
                continue
            if not isinstance(body, dict):
                cause = f"invalid JSON: expected an object, got {type(body).__name__}"
                continue
            return body
        self.stats.add("failures", reason=cause)
        raise EndpointError(url, cause, tries)

    def completions(self, payload: dict) -> list[dict]:
        """POST /completions; the choices sorted by their index. Raises EndpointError if absent."""
        body = self.post("completions", payload)
        choices = body.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) and "text" in c for c in choices):
            self.stats.add("failures", reason="bad response: no choices[].text")
            raise EndpointError(
                f"{self.base_url}/completions", f"bad response: no choices[].text in {str(body)[:200]!r}", 1
            )
        return sorted(choices, key=lambda c: c.get("index", 0))

    def close(self) -> None:
        self._client.close()
