"""A fake GitHub REST API, the part `scripts/ci/lease.py --status` calls, on loopback.

Field names and values are GitHub's (github/rest-api-description, api.github.com):
- GET /repos/{owner}/{repo}/actions/workflows/{workflow_id} (actions/get-workflow): a `workflow`
  with `state` one of active, deleted, disabled_fork, disabled_inactivity, disabled_manually;
- GET .../workflows/{workflow_id}/runs (actions/list-workflow-runs): `total_count` and
  `workflow_runs`, newest first, filtered by `event`, `per_page` (default 30, at most 100);
  each run with `id`, `display_title`, `event`, `status`, `conclusion`, `created_at`,
  `updated_at`, `run_number`, `html_url`;
- GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs (actions/list-jobs-for-workflow-run):
  `jobs[].steps[]` with `name`, `status`, `conclusion`, `number`;
- PUT .../workflows/{workflow_id}/enable (actions/enable-workflow): 204, with a token that may
  write Actions (else 403 "Resource not accessible by integration").
A wrong token gets 401 "Bad credentials"; a repository the token cannot see, 404 (GitHub does not
tell the two apart). A run's steps are lease.yml's own: GitHub names a `uses:` step "Run
<action>", wraps them in "Set up job" and "Complete job", and marks a step whose `if:` is false
`skipped`; here the `if:` on HAS_TOKEN is decided by whether the run had the secret."""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml
from loopback import reply, serve, stop, url

LEASE_YML = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "lease.yml"
STATES = ("active", "deleted", "disabled_fork", "disabled_inactivity", "disabled_manually")


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def lease_steps(has_token: bool) -> list[dict[str, Any]]:
    """The steps of one lease.yml job as GitHub lists them, each `success` or `skipped`."""
    job = yaml.safe_load(LEASE_YML.read_text())["jobs"]["lease"]
    names = ["Set up job"]
    outcomes = ["success"]
    for step in job["steps"]:
        names.append(step.get("name") or f"Run {step['uses']}")
        condition = str(step.get("if", ""))
        runs = (
            True
            if not condition
            else has_token == ("== 'true'" in condition)  # the two forms lease.yml uses
        )
        outcomes.append("success" if runs else "skipped")
    names.append("Complete job")
    outcomes.append("success")
    return [
        {"name": n, "status": "completed", "conclusion": c, "number": i}
        for i, (n, c) in enumerate(zip(names, outcomes, strict=True), start=1)
    ]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # by lowercase name


@dataclass
class FakeGitHub:
    repo: str = "someone/nemotron-droplet"
    state: str = "active"
    private: bool = False
    pushed_at: datetime | None = None  # the repository's last push (None: a week before now)
    # token -> the Actions permission it carries on `repo` ("read" or "write")
    tokens: dict[str, str] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_token(self, name: str, actions: str = "read") -> str:
        token = f"ghs_fake_{name}_0123456789abcdef"
        self.tokens[token] = actions
        return token

    def add_run(
        self,
        created_at: datetime,
        *,
        event: str = "schedule",
        status: str = "completed",
        conclusion: str | None = "success",
        has_token: bool = True,
    ) -> dict[str, Any]:
        run_id = 9_000_000 + len(self.runs)
        run = {
            "id": run_id,
            "name": "lease",
            "display_title": "lease",
            "event": event,
            "status": status,
            "conclusion": conclusion if status == "completed" else None,
            "created_at": _stamp(created_at),
            "updated_at": _stamp(created_at + timedelta(seconds=40)),
            "run_started_at": _stamp(created_at),
            "run_number": len(self.runs) + 1,
            "path": ".github/workflows/lease.yml",
            "html_url": f"https://github.com/{self.repo}/actions/runs/{run_id}",
        }
        self.runs.append(run)
        steps = lease_steps(has_token)
        self.jobs[run_id] = [
            {
                "id": run_id * 10,
                "run_id": run_id,
                "name": "lease",
                "status": run["status"],
                "conclusion": run["conclusion"],
                "steps": steps if status == "completed" else [],
            }
        ]
        return run

    def __enter__(self) -> FakeGitHub:
        self._server = serve(self._handler())
        self.url = url(self._server)
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self._server)

    def _workflow(self) -> dict[str, Any]:
        return {
            "id": 161335,
            "node_id": "MDg6V29ya2Zsb3cxNjEzMzU=",
            "name": "lease",
            "path": ".github/workflows/lease.yml",
            "state": self.state,
            "created_at": "2026-01-05T10:00:00.000Z",
            "updated_at": "2026-11-30T10:00:00.000Z",
            "url": f"https://api.github.com/repos/{self.repo}/actions/workflows/161335",
            "html_url": f"https://github.com/{self.repo}/blob/main/.github/workflows/lease.yml",
            "badge_url": f"https://github.com/{self.repo}/workflows/lease/badge.svg",
        }

    def answer(self, method: str, path: str, query: dict[str, list[str]], auth: str) -> Any:
        """(status, body or None) for one request."""
        actions = self.tokens.get(auth.removeprefix("Bearer "))
        if not auth.startswith("Bearer ") or actions is None:
            return 401, {"message": "Bad credentials", "status": "401"}
        workflow = f"/repos/{self.repo}/actions/workflows/lease.yml"
        if method == "PUT" and path == f"{workflow}/enable":
            if actions != "write":
                return 403, {"message": "Resource not accessible by integration", "status": "403"}
            self.state = "active"
            return 204, None
        body = self._get(path, query) if method == "GET" else None
        return (404, {"message": "Not Found", "status": "404"}) if body is None else (200, body)

    def _get(self, path: str, query: dict[str, list[str]]) -> dict[str, Any] | None:
        if path == f"/repos/{self.repo}":
            # GitHub REST repos/get (full-repository): the fields --status reads, both required.
            pushed = self.pushed_at or datetime.now(UTC) - timedelta(days=7)
            return {"full_name": self.repo, "private": self.private, "pushed_at": _stamp(pushed)}
        base = f"/repos/{self.repo}/actions"
        workflow = f"{base}/workflows/lease.yml"
        if path == workflow:
            return self._workflow()
        if path == f"{workflow}/runs":
            runs = [r for r in self.runs if r["event"] in query.get("event", [r["event"]])]
            runs.sort(key=lambda r: r["created_at"], reverse=True)
            per_page = min(100, int(query.get("per_page", ["30"])[0]))
            return {"total_count": len(runs), "workflow_runs": runs[:per_page]}
        jobs = re.fullmatch(rf"{re.escape(base)}/runs/(\d+)/jobs", path)
        if jobs and int(jobs[1]) in self.jobs:
            found = self.jobs[int(jobs[1])]
            return {"total_count": len(found), "jobs": found}
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                split = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(split.query)
                auth = self.headers.get("Authorization", "")
                with fake._lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    fake.requests.append(Seen(self.command, split.path, query, headers))
                    status, body = fake.answer(self.command, split.path, query, auth)
                if body is None:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                reply(self, status, json.dumps(body).encode(), "application/json")

            def do_GET(self) -> None:
                self._any()

            def do_PUT(self) -> None:
                self._any()

        return Handler
