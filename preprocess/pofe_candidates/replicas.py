"""Several servers of one model behind one client: `base_url` as a list.

Replicas on other nodes (or the ranks of a data-parallel deployment, each with its own URL)
share the stage's in-flight window: each request goes to the live server with the fewest
requests in flight, ties taken in turn (so requests sent one at a time still use every server,
and a server that died between requests is found). A request that fails on a server in a way a retry could fix, after that
server's own retries (unreachable, timing out, HTTP 5xx: `EndpointError.transient`), marks the
server dead for the rest of the stage and is sent to another; only when none is left does the
stage stop. Any other failure (a 4xx: the request itself is wrong) stops it at once, as with
one server. The samples do not depend on the server: each request carries its own seed.
"""

from __future__ import annotations

import logging
import threading

from pofe.logs import logger_name
from pofe_candidates.config import GenerateConfig, JudgeConfig
from pofe_candidates.openai_client import EndpointError, OpenAIClient

LOG = logging.getLogger(logger_name(__name__))


def base_urls(base_url: str | list[str] | None) -> list[str]:
    """A `base_url` key's servers, in the order given."""
    if base_url is None:
        return []
    return [base_url] if isinstance(base_url, str) else list(base_url)


def client_for(cfg: GenerateConfig | JudgeConfig) -> OpenAIClient:
    """The client for a `generate` or `judge` block: one server's, or a ReplicaClient."""
    urls = base_urls(cfg.base_url)
    if len(urls) == 1:
        return OpenAIClient.from_config(cfg.model_copy(update={"base_url": urls[0]}))
    return ReplicaClient([OpenAIClient.from_config(cfg.model_copy(update={"base_url": u})) for u in urls])


class ReplicaClient(OpenAIClient):
    """An OpenAIClient over several servers (each with its own retries); see the module."""

    def __init__(self, clients: list[OpenAIClient]):
        if len(clients) < 2:
            raise ValueError(f"a ReplicaClient needs at least two servers, got {len(clients)}")
        first = clients[0]
        super().__init__(", ".join(c.base_url for c in clients), timeout=first.timeout, max_retries=first.max_retries)
        self.key_env = first.key_env
        self.clients = clients
        for c in clients:
            c.stats = self.stats  # one count of requests, retries and failures for the stage
        self.busy = [0] * len(clients)
        self.dead: set[int] = set()
        self._next = 0  # where the next tie-break starts: the server after the last one picked
        self._lock = threading.Lock()

    def _pick(self) -> int | None:
        with self._lock:
            live = [k for k in range(len(self.clients)) if k not in self.dead]
            if not live:
                return None
            n = len(self.clients)
            k = min(live, key=lambda j: (self.busy[j], (j - self._next) % n))
            self.busy[k] += 1
            self._next = (k + 1) % n
            return k

    def post(self, route: str, payload: dict) -> dict:
        last: EndpointError | None = None
        while (k := self._pick()) is not None:
            try:
                return self.clients[k].post(route, payload)
            except EndpointError as e:
                if not e.transient:
                    raise
                last = e
                with self._lock:
                    if k not in self.dead:
                        self.dead.add(k)
                        LOG.warning(
                            f"POFE: {self.clients[k].base_url} failed ({e.cause}); sending its requests to "
                            f"the other {len(self.clients) - len(self.dead)} server(s)"
                        )
            finally:
                with self._lock:
                    self.busy[k] -= 1
        if last is None:
            raise EndpointError(f"{self.base_url}/{route.lstrip('/')}", "every server failed earlier in this stage", 0)
        raise EndpointError(
            last.url,
            f"{last.cause} (and every other server of {self.base_url} failed too)",
            last.tries,
            last.hint,
            transient=True,
        )
