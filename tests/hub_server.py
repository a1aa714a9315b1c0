"""A loopback stand-in for the Hugging Face Hub's HTTP API, for `huggingface_hub.HfApi`.

It answers the calls a push makes (who am I, create a repo, ask each file's upload mode,
commit) and records them: `created` ({repo_id: {"type", "visibility"}}) and `files`
({(repo_type, repo_id): {path: bytes}}). Every file is declared "regular" (its bytes travel
base64 in the commit), so no LFS or Xet storage is involved; any other call is answered 404
and recorded in `unknown`.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = re.compile(r"/api/(models|datasets|spaces)/(.+)/(preupload|commit)/([^/]+)")


class HubServer:
    def __init__(self):
        self.created: dict[str, dict] = {}
        self.files: dict[tuple[str, str], dict[str, bytes]] = {}
        self.commits: list[dict] = []
        self.unknown: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, code: int, body: dict | None = None):
                data = json.dumps(body or {}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/api/repos/create":
                    req = json.loads(body)
                    repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    server.created[repo_id] = {"type": req.get("type", "model"), "visibility": req.get("visibility")}
                    return self._reply(200, {"url": f"{server.url}/{repo_id}", "name": repo_id})
                match = COMMIT.fullmatch(self.path.split("?")[0])
                if match is None:
                    server.unknown.append(f"POST {self.path}")
                    return self._reply(404, {"error": "unknown"})
                kind, repo_id, action, _revision = match.groups()
                repo_type = kind[:-1]
                if action == "preupload":
                    paths = [f["path"] for f in json.loads(body)["files"]]
                    return self._reply(
                        200, {"files": [{"path": p, "uploadMode": "regular", "shouldIgnore": False} for p in paths]}
                    )
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                header = next(x["value"] for x in lines if x["key"] == "header")
                stored = server.files.setdefault((repo_type, repo_id), {})
                for x in lines:
                    if x["key"] == "file":
                        stored[x["value"]["path"]] = base64.b64decode(x["value"]["content"])
                server.commits.append({"repo": (repo_type, repo_id), "summary": header["summary"]})
                oid = f"{len(server.commits):040x}"
                return self._reply(
                    200,
                    {"commitUrl": f"{server.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None},
                )

            def do_GET(self):
                if self.path == "/api/whoami-v2":  # axolotl checks the token before it starts
                    return self._reply(
                        200, {"name": "pofe-test", "type": "user", "auth": {"accessToken": {"role": "write"}}}
                    )
                server.unknown.append(f"GET {self.path}")
                self._reply(404, {"error": "unknown"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
