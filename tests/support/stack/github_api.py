"""A fake GitHub REST API, the part a wake calls: a workflow_dispatch (POST
/repos/{repo}/actions/workflows/{workflow}/dispatches: 204, or 401 for another token, 422 for an
input the workflow does not declare) and its runs (GET .../runs). Served over HTTPS at
api.github.com in the emulation's world, or on loopback. Each accepted dispatch is recorded and
sets `dispatched`, so a scenario can run the pipeline it stands for (a refresh and an up of the
stack) and report the run's outcome in `runs`."""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

# The workflow a wake dispatches: the fake accepts its declared inputs and names its runs as its
# run-name does, read from the file itself (so the waker is tested against deploy.yml as it is).
DEPLOY_YML = Path(__file__).resolve().parents[3] / ".github" / "workflows" / "deploy.yml"
# `${{ inputs.NAME || 'DEFAULT' }}` in a run-name.
_EXPRESSION = re.compile(r"\$\{\{\s*inputs\.(\w+)\s*\|\|\s*'([^']*)'\s*\}\}")


def deploy_inputs() -> frozenset[str]:
    """deploy.yml's workflow_dispatch inputs (YAML reads the key `on` as True)."""
    workflow = yaml.safe_load(DEPLOY_YML.read_text())
    return frozenset(workflow[True]["workflow_dispatch"]["inputs"])


def run_name(inputs: dict[str, Any]) -> str:
    """deploy.yml's run-name for a dispatch's inputs, as GitHub evaluates its expressions."""
    template = str(yaml.safe_load(DEPLOY_YML.read_text())["run-name"])
    return _EXPRESSION.sub(lambda m: str(inputs.get(m[1]) or m[2]), template)


DISPATCH = re.compile(r"^/repos/([^/]+/[^/]+)/actions/workflows/([^/]+)/dispatches$")
RUNS = re.compile(r"^/repos/([^/]+/[^/]+)/actions/workflows/([^/]+)/runs(\?.*)?$")


@dataclass
class GitHub:
    """One repository's deploy workflow and the one token that may run it."""

    repo: str
    workflow: str
    token: str
    # The workflow's workflow_dispatch inputs (deploy.yml's): any other input is refused.
    inputs: frozenset[str] = field(default_factory=deploy_inputs)
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    dispatched: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, method: str, path: str, auth: str, body: bytes) -> tuple[int, Any]:
        if auth != f"Bearer {self.token}":
            return 401, {"message": "Bad credentials"}
        found = DISPATCH.match(path) if method == "POST" else RUNS.match(path)
        if not found or found.group(1) != self.repo or found.group(2) != self.workflow:
            return 404, {"message": "Not Found"}
        if method == "GET":
            with self.lock:
                return 200, {"total_count": len(self.runs), "workflow_runs": list(self.runs)}
        request = json.loads(body or b"{}")
        unknown = set(request.get("inputs") or {}) - self.inputs
        if unknown or "ref" not in request:
            return 422, {"message": f"Unexpected inputs provided: {sorted(unknown)}"}
        with self.lock:
            self.dispatches.append(request)
        self.dispatched.set()
        return 204, None

    def finish_run(self, conclusion: str) -> None:
        """The run the last dispatch queued ended (`success`, `failure`, ...); named as
        deploy.yml's run-name names it."""
        with self.lock:
            name = run_name(self.dispatches[-1]["inputs"])
            self.runs.append({
                "display_name": name,
                "id": len(self.runs) + 1, "status": "completed", "conclusion": conclusion,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "html_url": f"https://github.com/{self.repo}/actions/runs/{len(self.runs) + 1}",
            })  # fmt: skip


def serve(github: GitHub, sock: socket.socket, tls: ssl.SSLContext | None) -> ThreadingHTTPServer:
    """Serve `github` on an already listening socket (made in the world's namespace); stop
    with shutdown() and server_close()."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, reply = github.answer(
                self.command, self.path, self.headers.get("Authorization", ""), body
            )
            data = b"" if reply is None else json.dumps(reply).encode()
            self.send_response(status)
            if reply is not None:
                self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve  # noqa: N815

        def log_message(self, *_: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def finish_request(self, request: Any, client_address: Any) -> None:
            if tls is not None:
                request.settimeout(30)
                try:
                    request = tls.wrap_socket(request, server_side=True)
                except (OSError, ssl.SSLError):
                    return
            super().finish_request(request, client_address)

    server = Server(sock.getsockname()[:2], Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()  # fmt: skip
    return server
