"""A loopback stand-in for an OpenAI-compatible server (`FakeServer`), scripted per request,
for the tests and benchmarks of POFE's OpenAI client, backends and LLM judges."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pofe.preprocess.openai_client import OpenAIClient


class FakeServer:
    """A scripted OpenAI-ish server. `behaviour(path, body, attempt) -> (status, text, delay_s)`,
    or `(status, text, delay_s, response_headers)`; `request_headers` records what came in."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.requests: list[tuple[str, dict]] = []
        self.request_headers: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
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
