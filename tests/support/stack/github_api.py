"""A fake GitHub REST API, the part a wake calls, as strict as GitHub's own: a workflow_dispatch
(POST /repos/{repo}/actions/workflows/{workflow}/dispatches) and the runs it queues (GET
.../workflows/{workflow}/runs, GET .../actions/runs/{id}), a ref lookup (GET
.../git/ref/heads/{branch}). Served over HTTPS at api.github.com in the emulation's world, or on
loopback.

What GitHub checks, this checks (tests/support/stack/github_api_schema.json holds what the
REST description says of these endpoints; docs/facts.md what was found besides):
- the token (401 otherwise), the repository and workflow (404);
- the dispatch: `ref` required and one that exists (422 "No ref found for: ..."); only the
  workflow's declared inputs (422 "Unexpected inputs provided"); a `choice` input's value among
  its options and a `boolean` one true or false (422); `return_run_details: true` answers 200
  with workflow_run_id, run_url and html_url, else 204 and no body;
- runs as GitHub names them: `display_title` (deploy.yml's run-name), `event`, `status`
  (queued, pending, in_progress, completed), `conclusion`;
- deploy.yml's concurrency group: one run in progress per group; a newer run queued behind it
  cancels the one already pending (GitHub does so even with cancel-in-progress: false).

Each accepted dispatch is recorded and sets `dispatched`, so a scenario can run the pipeline it
stands for (a refresh and an up of the stack) and end its run with `finish_run`."""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback
import yaml

# The workflow a wake dispatches: the fake reads its inputs, run-name and concurrency group from
# the file itself (so the waker is tested against deploy.yml as it is).
DEPLOY_YML = Path(__file__).resolve().parents[3] / ".github" / "workflows" / "deploy.yml"
SCHEMA = Path(__file__).resolve().with_name("github_api_schema.json")
# `${{ inputs.NAME || 'DEFAULT' }}` in a run-name or a concurrency group.
_EXPRESSION = re.compile(r"\$\{\{\s*inputs\.(\w+)\s*\|\|\s*'([^']*)'\s*\}\}")


def schema() -> dict[str, Any]:
    """What github/rest-api-description says of these endpoints (the file names its source)."""
    data: dict[str, Any] = json.loads(SCHEMA.read_text())
    return data


def _workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(DEPLOY_YML.read_text())
    return data


def deploy_inputs() -> dict[str, dict[str, Any]]:
    """deploy.yml's workflow_dispatch inputs, each with its type, options and required
    (YAML reads the key `on` as True)."""
    return dict(_workflow()[True]["workflow_dispatch"]["inputs"])


def _evaluate(template: str, inputs: dict[str, Any]) -> str:
    return _EXPRESSION.sub(lambda m: str(inputs.get(m[1]) or m[2]), template)


def run_name(inputs: dict[str, Any]) -> str:
    """deploy.yml's run-name for a dispatch's inputs, as GitHub evaluates its expressions."""
    return _evaluate(str(_workflow()["run-name"]), inputs)


def concurrency_group(inputs: dict[str, Any]) -> str:
    return _evaluate(str(_workflow()["concurrency"]["group"]), inputs)


def check_inputs(declared: dict[str, dict[str, Any]], given: dict[str, Any]) -> str | None:
    """GitHub's 422 message for a dispatch's inputs, or None when they pass."""
    unknown = sorted(set(given) - set(declared))
    if unknown:
        return f"Unexpected inputs provided: {unknown}"
    for name, spec in declared.items():
        if name not in given:
            if spec.get("required") and "default" not in spec:
                return f"Required input '{name}' not provided"
            continue
        value = given[name]
        if not isinstance(value, str | bool | int | float):
            return f"Provided value for input '{name}' is not a string"
        kind = spec.get("type", "string")
        if kind == "choice" and str(value) not in [str(o) for o in spec.get("options", [])]:
            return f"Provided value '{value}' for input '{name}' not in the list of allowed values"
        if kind == "boolean" and str(value).lower() not in ("true", "false"):
            return f"Provided value '{value}' for input '{name}' is not a boolean"
    return None


def _dispatch_refusal(
    request: Any, branches: frozenset[str], declared: dict[str, dict[str, Any]]
) -> str | None:
    """GitHub's 422 message for a dispatch's body, or None when it passes."""
    if not isinstance(request, dict):
        return "Problems parsing JSON"
    extra = sorted(set(request) - set(schema()["dispatch_request"]["properties"]))
    if extra:
        return f"Invalid request.\n\n{extra} are not permitted keys."
    if not isinstance(request.get("ref"), str):
        return 'Invalid request.\n\n"ref" wasn\'t supplied.'
    if request["ref"].removeprefix("refs/heads/") not in branches:
        return f"No ref found for: {request['ref']}"
    return check_inputs(declared, request.get("inputs") or {})


DISPATCH = re.compile(r"^/repos/([^/]+/[^/]+)/actions/workflows/([^/]+)/dispatches$")
RUNS = re.compile(r"^/repos/([^/]+/[^/]+)/actions/workflows/([^/]+)/runs$")
RUN = re.compile(r"^/repos/([^/]+/[^/]+)/actions/runs/([0-9]+)$")
REF = re.compile(r"^/repos/([^/]+/[^/]+)/git/ref/heads/(.+)$")


def _public(run: dict[str, Any]) -> dict[str, Any]:
    """A run as the API shows it (the fake's own keys start with _)."""
    return {k: v for k, v in run.items() if not k.startswith("_")}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class GitHub:
    """One repository's deploy workflow, its branches and the one token that may run it."""

    repo: str
    workflow: str
    token: str
    # The workflow's workflow_dispatch inputs (deploy.yml's): their names, types and options.
    inputs: dict[str, dict[str, Any]] = field(default_factory=deploy_inputs)
    branches: frozenset[str] = frozenset({"main"})
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    dispatched: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, method: str, path: str, auth: str, body: bytes) -> tuple[int, Any]:
        if auth != f"Bearer {self.token}":
            return 401, {"message": "Bad credentials"}
        url = urllib.parse.urlsplit(path)
        if method == "POST":
            found = DISPATCH.match(url.path)
            if not found or found[1] != self.repo or found[2] != self.workflow:
                return 404, {"message": "Not Found"}
            return self._dispatch(body)
        return self._get(url.path, dict(urllib.parse.parse_qsl(url.query)))

    def _get(self, path: str, query: dict[str, str]) -> tuple[int, Any]:
        """A ref, a run by id, or a workflow's runs (newest first, `event` and `per_page`)."""
        with self.lock:
            if (found := REF.match(path)) and found[1] == self.repo:
                if found[2] not in self.branches:
                    return 404, {"message": "Not Found"}
                return 200, {"ref": f"refs/heads/{found[2]}", "object": {"type": "commit"}}
            if (found := RUN.match(path)) and found[1] == self.repo:
                run = next((r for r in self.runs if r["id"] == int(found[2])), None)
                return (200, _public(run)) if run else (404, {"message": "Not Found"})
            found = RUNS.match(path)
            if not found or found[1] != self.repo or found[2] != self.workflow:
                return 404, {"message": "Not Found"}
            runs = [_public(r) for r in reversed(self.runs)
                    if query.get("event") in (None, r["event"])]  # fmt: skip
        per_page = int(query.get("per_page", "30"))
        return 200, {"total_count": len(runs), "workflow_runs": runs[:per_page]}

    def _dispatch(self, body: bytes) -> tuple[int, Any]:
        """A workflow_dispatch, checked as GitHub checks it; its run queued."""
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        refused = _dispatch_refusal(request, self.branches, self.inputs)
        if refused:
            return 422, {"message": refused}
        with self.lock:
            self.dispatches.append({k: v for k, v in request.items() if k != "return_run_details"})
            run = self._queue("workflow_dispatch", request.get("inputs") or {}, request["ref"])
        self.dispatched.set()
        if request.get("return_run_details") is True:
            base = f"https://api.github.com/repos/{self.repo}/actions/runs/{run['id']}"
            return 200, {"workflow_run_id": run["id"], "run_url": base, "html_url": run["html_url"]}
        return 204, None

    def _queue(self, event: str, inputs: dict[str, Any], ref: str) -> dict[str, Any]:
        """Under the lock: a new run in its concurrency group. One runs at a time; a newer one
        cancels the run still pending in the same group."""
        group = concurrency_group(inputs)
        number = len(self.runs) + 1
        busy = False
        for other in self.runs:
            if other["_group"] != group or other["status"] == "completed":
                continue
            if other["status"] == "pending":
                other.update(status="completed", conclusion="cancelled", updated_at=_now())
            else:
                busy = True
        run = {
            "id": 9000 + number, "name": "deploy", "display_title": run_name(inputs),
            "event": event, "head_branch": ref, "status": "pending" if busy else "in_progress",
            "conclusion": None, "run_attempt": 1, "created_at": _now(), "updated_at": _now(),
            "html_url": f"https://github.com/{self.repo}/actions/runs/{9000 + number}",
            "_group": group,
        }  # fmt: skip
        self.runs.append(run)
        return run

    def push(self) -> dict[str, Any]:
        """A push to main: deploy.yml's push run, in the default stack's group."""
        with self.lock:
            return dict(self._queue("push", {}, "main"))

    def finish_run(self, conclusion: str, run_id: int | None = None) -> None:
        """The run in progress (or `run_id`) ended (`success`, `failure`, `startup_failure`,
        ...); the next pending one in its group starts."""
        with self.lock:
            run = next(r for r in reversed(self.runs)
                       if (r["id"] == run_id if run_id else r["status"] == "in_progress"))  # fmt: skip
            run.update(status="completed", conclusion=conclusion, updated_at=_now())
            for other in self.runs:
                if other["_group"] == run["_group"] and other["status"] == "pending":
                    other["status"] = "in_progress"
                    break


def serve(github: GitHub, sock: socket.socket, tls: ssl.SSLContext | None) -> loopback.Server:
    """Serve `github` on a bound socket (made in the world's namespace, say), over HTTPS when
    `tls`; stop with loopback.stop (shutdown() and server_close())."""

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

    return loopback.serve(Handler, sock, tls=tls)
