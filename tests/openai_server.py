"""A loopback stand-in for an OpenAI-compatible server (`FakeServer`), scripted per request,
for the tests and benchmarks of POFE's OpenAI client, backends and LLM judges."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pofe_candidates.openai_client import OpenAIClient

# What vLLM 0.32's server answers to GET /v1/models (entrypoints/openai/models/serving.py)
VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "policy",
            "object": "model",
            "created": 1700000000,
            "owned_by": "vllm",
            "root": "/models/policy",
            "parent": None,
            "max_model_len": 256,
            "permission": [],
        }
    ],
}


class FakeServer:
    """A scripted OpenAI-ish server. `behaviour(path, body, attempt) -> (status, text, delay_s)`,
    or `(status, text, delay_s, response_headers)`; `request_headers` records what came in.
    GET `/v1/models` answers `models` (status, text), by default 404 as a server without the
    route; `gets` records the GET paths."""

    def __init__(self, behaviour, models: tuple[int, str] = (404, '{"error": "not found"}')):
        self.behaviour = behaviour
        self.models = models
        self.requests: list[tuple[str, dict]] = []
        self.request_headers: list[dict[str, str]] = []
        self.gets: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.gets.append(self.path)
                status, text = outer.models if self.path == "/v1/models" else (404, "{}")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(text.encode())

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                outer.request_headers.append(dict(self.headers))
                status, text, delay, *extra = outer.behaviour(self.path, body, len(outer.requests))
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    for name, value in (extra[0] if extra else {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(text.encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def completions_ok(path, body, attempt):
    choices = [{"index": i, "text": f"cand {body['seed']}-{i}"} for i in range(body["n"])]
    return 200, json.dumps({"choices": list(reversed(choices))}), 0.0


def openai_client(url, **kw):
    kw.setdefault("backoff", 0.01)
    return OpenAIClient(url, **kw)


def chat_reply(content, top=None):
    choice = {"index": 0, "message": {"role": "assistant", "content": content}}
    if top is not None:
        choice["logprobs"] = {
            "content": [{"token": top[0]["token"], "logprob": top[0]["logprob"], "top_logprobs": top}]
        }
    return json.dumps({"choices": [choice]})
