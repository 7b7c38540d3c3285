"""A fake ACME CA (RFC 8555) that refuses: its directory and nonces work, and every account or
order request gets the problem document it was given, as a CA's refusal reaches Caddy."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

import loopback


class RefusingCA:
    def __init__(self, status: int, problem_type: str, detail: str) -> None:
        self.status, self.problem = status, {"type": problem_type, "detail": detail}
        self.posts: list[str] = []
        ca = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict[str, Any] | None, kind: str) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Replay-Nonce", f"nonce-{len(ca.posts)}")
                self.send_header("Cache-Control", "no-store")
                if data:
                    self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/directory":
                    base = f"http://{self.headers['Host']}"
                    names = ("newNonce", "newAccount", "newOrder", "revokeCert", "keyChange")
                    paths = ("nonce", "account", "order", "revoke", "key-change")
                    directory = {n: f"{base}/{p}" for n, p in zip(names, paths, strict=True)}
                    self._send(200, directory, "application/json")
                else:
                    self._send(200 if self.path == "/nonce" else 404, None, "")

            def do_HEAD(self) -> None:
                self._send(200, None, "")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ca.posts.append(self.path)
                self._send(ca.status, ca.problem, "application/problem+json")

            def log_message(self, *_: Any) -> None:
                pass

        self.server = loopback.serve(Handler)
        self.directory = f"{loopback.url(self.server)}/directory"

    def close(self) -> None:
        loopback.stop(self.server)
