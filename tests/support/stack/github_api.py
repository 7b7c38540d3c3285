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
  (queued, pending, waiting for a reviewer's approval, in_progress, completed), `conclusion`;
- deploy.yml's concurrency group, on its deploy job: one in progress per group; with `queue:
  max` (deploy.yml's) the others wait in turn, with GitHub's default (`single`) a newer one
  cancels the one already pending, even with cancel-in-progress: false. A run whose deploy
  waits for the group shows here as `pending` (on GitHub its earlier jobs run meanwhile: the
  run is under way either way, which is what a client reads from it);
- the workflow itself (GET .../actions/workflows/{workflow}: its `state`), and the token's
  expiry in the `github-authentication-token-expiration` header of every answer when set;
- a run's jobs (GET .../actions/runs/{id}/jobs), named and stepped as deploy.yml names them, and
  a job's log (GET .../actions/jobs/{id}/logs): a 302 to a storage URL signed for one minute,
  which refuses a request that carries an Authorization header (the token is GitHub's API's
  alone: a client that follows the redirect with it is caught here).

Each accepted dispatch is recorded and sets `dispatched`, so a scenario can run the pipeline it
stands for (a refresh and an up of the stack) and end its run with `finish_run`."""

from __future__ import annotations

import json
import re
import secrets
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


def deploy_concurrency() -> dict[str, Any]:
    """deploy.yml's concurrency: the deploy job's (the stack's lock), its group and queue."""
    data: dict[str, Any] = _workflow()["jobs"]["deploy"]["concurrency"]
    return data


def concurrency_group(inputs: dict[str, Any]) -> str:
    return _evaluate(str(deploy_concurrency()["group"]), inputs)


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
WORKFLOW = re.compile(r"^/repos/([^/]+/[^/]+)/actions/workflows/([^/]+)$")
RUNS = re.compile(r"^/repos/([^/]+/[^/]+)/actions/workflows/([^/]+)/runs$")
RUN = re.compile(r"^/repos/([^/]+/[^/]+)/actions/runs/([0-9]+)$")
JOBS = re.compile(r"^/repos/([^/]+/[^/]+)/actions/runs/([0-9]+)/jobs$")
JOB_LOG = re.compile(r"^/repos/([^/]+/[^/]+)/actions/jobs/([0-9]+)/logs$")
STORAGE = re.compile(r"^/_storage/logs/([0-9]+)$")
SIGNED_FOR = 60.0  # seconds a log's signed URL is valid (GitHub: "expires after 1 minute")
REF = re.compile(r"^/repos/([^/]+/[^/]+)/git/ref/heads/(.+)$")


def _public(run: dict[str, Any]) -> dict[str, Any]:
    """A run as the API shows it (the fake's own keys start with _)."""
    return {k: v for k, v in run.items() if not k.startswith("_")}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Cut(str):
    """A plain-text answer whose connection closes inside its one chunk."""


def _step_name(step: dict[str, Any]) -> str:
    """A step as GitHub lists it: its name, else "Run " and what it uses or its first line."""
    if step.get("name"):
        return str(step["name"])
    return f"Run {step.get('uses') or str(step.get('run', '')).splitlines()[0]}"


def deploy_jobs() -> list[tuple[str, list[str]]]:
    """deploy.yml's jobs in order, each with its steps as GitHub names them (and its own
    "Set up job" and "Complete job")."""
    jobs = _workflow()["jobs"]
    return [(name, ["Set up job", *(_step_name(s) for s in job.get("steps", [])), "Complete job"])
            for name, job in jobs.items()]  # fmt: skip


def job_log(lines: list[str]) -> str:
    """A job's log as GitHub serves it: each line after its timestamp (a BOM first)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.0000000Z", time.gmtime())
    return "\ufeff" + "".join(f"{stamp} {line}\n" for line in lines)


@dataclass
class GitHub:
    """One repository's deploy workflow, its branches and the one token that may run it."""

    repo: str
    workflow: str
    token: str
    # The workflow's workflow_dispatch inputs (deploy.yml's): their names, types and options.
    inputs: dict[str, dict[str, Any]] = field(default_factory=deploy_inputs)
    branches: frozenset[str] = frozenset({"main"})
    head_sha: str = "0" * 40  # the commit a new run is of (a push moves it)
    workflow_state: str = "active"  # or disabled_inactivity, disabled_manually, ...
    token_expires: str | None = None  # '2027-01-02 03:04:05 UTC': sent with every answer
    # GitHub's primary rate limit spent: every API call gets 403 and x-ratelimit-remaining: 0.
    rate_limited: bool = False
    # A secondary rate limit: 403, a Retry-After, and a message that says so (the remaining count
    # of the primary limit need not be 0).
    secondary_limited: bool = False
    # A job log that cannot be read: "expired" (its signed URL already), "storage-refuses",
    # "no-log-yet" (GitHub's 404), "cut" (the download ends short of its Content-Length).
    log_fault: str | None = None
    # The deploy job's environment has required reviewers (a protection rule): a run waits,
    # status `waiting`, until `approve` (GitHub's "Review pending deployments").
    reviewers: bool = False
    # The group's queue: deploy.yml's (max: every pending run waits its turn), or GitHub's
    # default, single (a newer run cancels the pending one), as a pipeline of the user's may set.
    queue: str = field(default_factory=lambda: str(deploy_concurrency().get("queue", "single")))
    # Seconds an accepted dispatch's answer takes (its run already queued): a client stopped
    # while it waits has been heard without knowing it.
    dispatch_delay: float = 0.0
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    dispatched: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    asked: list[str] = field(default_factory=list)  # every request's path, in order
    # A job log's signatures: signature -> (job id, valid until, monotonic).
    signed: dict[str, tuple[int, float]] = field(default_factory=dict)

    def answer(
        self, method: str, path: str, auth: str, body: bytes, origin: str = ""
    ) -> tuple[int, Any]:
        """(status, JSON reply); a str reply is plain text, {"Location": url} with a 302 a
        redirect. `origin` is scheme://host the request came to (for a signed URL)."""
        url = urllib.parse.urlsplit(path)
        self.asked.append(url.path)
        if found := STORAGE.match(url.path):
            return self._storage(int(found[1]), auth, dict(urllib.parse.parse_qsl(url.query)))
        if refused := self._refusal(auth):
            return refused
        if method == "GET" and (found := JOB_LOG.match(url.path)) and found[1] == self.repo:
            return self._log_redirect(int(found[2]), origin)
        if method == "POST":
            found = DISPATCH.match(url.path)
            if not found or found[1] != self.repo or found[2] != self.workflow:
                return 404, {"message": "Not Found"}
            return self._dispatch(body)
        return self._get(url.path, dict(urllib.parse.parse_qsl(url.query)))

    def _refusal(self, auth: str) -> tuple[int, Any] | None:
        """What GitHub answers before reading a request: a token it does not know (401), or
        any token once the rate limit is spent (403, with x-ratelimit-remaining: 0)."""
        if auth != f"Bearer {self.token}":
            return 401, {"message": "Bad credentials"}
        if self.rate_limited:
            return 403, {"message": "API rate limit exceeded for user ID 1."}
        if self.secondary_limited:
            return 403, {"message": "You have exceeded a secondary rate limit. Please wait a few "
                                    "minutes before you try again."}  # fmt: skip
        return None

    def _get(self, path: str, query: dict[str, str]) -> tuple[int, Any]:
        """A ref, a run by id, a run's jobs, or a workflow's runs."""
        with self.lock:
            if (found := REF.match(path)) and found[1] == self.repo:
                if found[2] not in self.branches:
                    return 404, {"message": "Not Found"}
                return 200, {"ref": f"refs/heads/{found[2]}", "object": {"type": "commit"}}
            if (found := WORKFLOW.match(path)) and found.groups() == (self.repo, self.workflow):
                return 200, self._workflow_object()
            for pattern in (RUN, JOBS):
                if (found := pattern.match(path)) and found[1] == self.repo:
                    return self._run(int(found[2]), jobs=pattern is JOBS)
            found = RUNS.match(path)
            if not found or found[1] != self.repo or found[2] != self.workflow:
                return 404, {"message": "Not Found"}
            return self._list_runs(query)

    def _workflow_object(self) -> dict[str, Any]:
        """The workflow as actions/get-workflow answers: every field the description requires."""
        base = f"https://api.github.com/repos/{self.repo}/actions/workflows/{self.workflow}"
        return {
            "id": 161335, "node_id": "MDg6V29ya2Zsb3cxNjEzMzU=", "name": "deploy",
            "path": f".github/workflows/{self.workflow}", "state": self.workflow_state,
            "url": base, "html_url": f"https://github.com/{self.repo}/blob/main/.github/"
            f"workflows/{self.workflow}", "badge_url": f"https://github.com/{self.repo}/"
            f"workflows/deploy/badge.svg", "created_at": _now(), "updated_at": _now(),
        }  # fmt: skip

    def _run(self, run_id: int, jobs: bool) -> tuple[int, Any]:
        """Under the lock: a run by id, or its jobs."""
        run = next((r for r in self.runs if r["id"] == run_id), None)
        if run is None:
            return 404, {"message": "Not Found"}
        if not jobs:
            return 200, _public(run)
        listed = [_public(j) for j in run["_jobs"]]
        return 200, {"total_count": len(listed), "jobs": listed}

    def _list_runs(self, query: dict[str, str]) -> tuple[int, Any]:
        """Under the lock: the workflow's runs, newest first, filtered by `event` and `head_sha`,
        one page of them (`per_page` at most 100, `page` from 1), as GitHub pages them."""
        runs = [_public(r) for r in reversed(self.runs)
                if query.get("event") in (None, r["event"])
                and query.get("head_sha") in (None, r["head_sha"])]  # fmt: skip
        per_page = min(int(query.get("per_page", "30")), 100)
        first = (int(query.get("page", "1")) - 1) * per_page
        return 200, {"total_count": len(runs), "workflow_runs": runs[first : first + per_page]}

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
            run = self._queue("workflow_dispatch", request.get("inputs") or {}, request["ref"])
            # After its run is queued: a test that sees the dispatch may look at the run.
            self.dispatches.append({k: v for k, v in request.items() if k != "return_run_details"})
        self.dispatched.set()
        time.sleep(self.dispatch_delay)
        if request.get("return_run_details") is True:
            base = f"https://api.github.com/repos/{self.repo}/actions/runs/{run['id']}"
            return 200, {"workflow_run_id": run["id"], "run_url": base, "html_url": run["html_url"]}
        return 204, None

    def _queue(self, event: str, inputs: dict[str, Any], ref: str) -> dict[str, Any]:
        """Under the lock: a new run in its concurrency group. One runs at a time; the others
        wait in turn, or with a `single` queue a newer one cancels the run still pending."""
        group = concurrency_group(inputs)
        number = len(self.runs) + 1
        busy = False
        for other in self.runs:
            if other["_group"] != group or other["status"] == "completed":
                continue
            if other["status"] == "pending" and self.queue == "single":
                other.update(status="completed", conclusion="cancelled", updated_at=_now())
            else:
                busy = True
        run = {
            "id": 9000 + number, "name": "deploy", "display_title": run_name(inputs),
            "event": event, "head_branch": ref, "head_sha": self.head_sha,
            "status": "pending" if busy else "waiting" if self.reviewers else "in_progress",
            "conclusion": None, "run_attempt": 1, "created_at": _now(), "updated_at": _now(),
            "html_url": f"https://github.com/{self.repo}/actions/runs/{9000 + number}",
            "_group": group, "_inputs": dict(inputs),
        }  # fmt: skip
        run["_jobs"] = [self._job(run, i, name, steps)
                        for i, (name, steps) in enumerate(deploy_jobs())]  # fmt: skip
        self.runs.append(run)
        return run

    def _job(self, run: dict[str, Any], i: int, name: str, steps: list[str]) -> dict[str, Any]:
        """One of a run's jobs as the REST description's `job` has it (the fields a client reads,
        and the check run it is)."""
        job_id = run["id"] * 10 + i
        return {
            "id": job_id, "run_id": run["id"], "name": name, "status": "queued",
            "conclusion": None, "run_attempt": 1, "head_branch": run["head_branch"],
            "html_url": f"https://github.com/{self.repo}/actions/runs/{run['id']}/job/{job_id}",
            "check_run_url": f"https://api.github.com/repos/{self.repo}/check-runs/{job_id}",
            "steps": [{"name": step, "status": "queued", "conclusion": None, "number": n + 1}
                      for n, step in enumerate(steps)],
            "_log": "",
        }  # fmt: skip

    def _log_redirect(self, job_id: int, origin: str) -> tuple[int, Any]:
        with self.lock:
            job = next((j for r in self.runs for j in r["_jobs"] if j["id"] == job_id), None)
            if job is None or job["status"] != "completed" or self.log_fault == "no-log-yet":
                return 404, {"message": "Not Found"}
            sig = secrets.token_urlsafe(16)
            valid = -1.0 if self.log_fault == "expired" else SIGNED_FOR
            self.signed[sig] = (job_id, time.monotonic() + valid)
        return 302, {"Location": f"{origin}/_storage/logs/{job_id}?sig={sig}"}

    def _storage(self, job_id: int, auth: str, query: dict[str, str]) -> tuple[int, Any]:
        """The storage host behind a log's signed URL: the signature alone, within its minute."""
        if auth:
            return 403, "AuthenticationFailed: a signed URL takes no Authorization header"
        if self.log_fault == "storage-refuses":
            return 403, "AuthorizationFailure"
        with self.lock:
            signed = self.signed.get(query.get("sig", ""))
            if signed is None or signed[0] != job_id or time.monotonic() > signed[1]:
                return 403, "AuthenticationFailed: signature not valid or expired"
            job = next(j for r in self.runs for j in r["_jobs"] if j["id"] == job_id)
            text = str(job["_log"])
            return 200, Cut(text) if self.log_fault == "cut" else text

    def push(self) -> dict[str, Any]:
        """A push to main: deploy.yml's push run, in the default stack's group."""
        with self.lock:
            return dict(self._queue("push", {}, "main"))

    def wake(self) -> dict[str, Any]:
        """A wake's dispatch of the dev stack, queued as the front's would be."""
        with self.lock:
            return dict(self._queue("workflow_dispatch", {"stack": "dev", "command": "up",
                                                          "refresh": "true"}, "main"))  # fmt: skip

    def approve(self, run_id: int) -> None:
        """A reviewer approved the waiting run's deployment: it runs."""
        with self.lock:
            run = next(r for r in self.runs if r["id"] == run_id)
            assert run["status"] == "waiting", run["status"]
            run.update(status="in_progress", updated_at=_now())

    def finish_run(
        self,
        conclusion: str,
        run_id: int | None = None,
        log: list[str] | None = None,
        tested: str | None = None,
    ) -> None:
        """The run in progress (or `run_id`) ended (`success`, `failure`, `startup_failure`,
        ...); the next pending one in its group starts. Its jobs end as deploy.yml's would:
        `tested` passes, `test` passes on a push (a commit's first run) and is skipped on a
        dispatch (a wake of a commit that passed), `deploy` ends as the run did, its
        pulumi/actions step failing with `log` (the lines the job printed). `tested` says how
        `test` ended instead."""
        with self.lock:
            run = next(r for r in reversed(self.runs)
                       if (r["id"] == run_id if run_id
                           else r["status"] in ("in_progress", "waiting")))  # fmt: skip
            run.update(status="completed", conclusion=conclusion, updated_at=_now())
            test = tested or ("success" if run["event"] == "push" else "skipped")
            ends = {"tested": "success", "test": test, "deploy": conclusion}
            for job in run["_jobs"] if conclusion != "startup_failure" else []:
                job.update(status="completed", conclusion=ends.get(job["name"], "success"))
                for step in job["steps"]:
                    failed = conclusion == "failure" and "pulumi/actions" in step["name"]
                    done = "skipped" if job["conclusion"] == "skipped" else "success"
                    step.update(status="completed", conclusion="failure" if failed else done)
                if job["name"] == "deploy":
                    job["_log"] = job_log(log or [])
            for other in self.runs:
                if other["_group"] == run["_group"] and other["status"] == "pending":
                    other["status"] = "waiting" if self.reviewers else "in_progress"
                    break


def serve(github: GitHub, sock: socket.socket, tls: ssl.SSLContext | None) -> loopback.Server:
    """Serve `github` on a bound socket (made in the world's namespace, say), over HTTPS when
    `tls`; stop with loopback.stop (shutdown() and server_close())."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            origin = f"{'https' if tls else 'http'}://{self.headers.get('Host', '')}"
            status, reply = github.answer(
                self.command, self.path, self.headers.get("Authorization", ""), body, origin
            )
            self.send_response(status)
            if github.rate_limited:
                self.send_header("x-ratelimit-remaining", "0")
            if github.secondary_limited:
                self.send_header("retry-after", "60")
            if github.token_expires and not self.path.startswith("/_storage/"):
                self.send_header("github-authentication-token-expiration", github.token_expires)
            if status == 302:
                self.send_header("Location", reply["Location"])
                reply = None
            if isinstance(reply, Cut):
                # Chunked, and cut inside a chunk: a client's read raises (IncompleteRead).
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                data = reply.encode()
                self.wfile.write(f"{len(data) + 4096:x}\r\n".encode() + data[: len(data) // 2])
                self.close_connection = True
                return
            if isinstance(reply, str):
                data = reply.encode()
                self.send_header("Content-Type", "text/plain; charset=utf-8")
            else:
                data = b"" if reply is None else json.dumps(reply).encode()
                if reply is not None:
                    self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve  # noqa: N815

        def log_message(self, *_: Any) -> None:
            pass

    return loopback.serve(Handler, sock, tls=tls)
