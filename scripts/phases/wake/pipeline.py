"""The pipeline a wake starts: the user's own deploy pipeline, which holds the cloud secrets
(the waker holds no DigitalOcean token and never creates or deletes a Droplet). GitHub Actions'
workflow_dispatch of the deploy workflow for this stack (WAKE_TRIGGER=github; a fine-grained
token limited to Actions on one repository; POST /repos/{repo}/actions/workflows/{workflow}/
dispatches with `return_run_details`, GitHub REST "Create a workflow dispatch event": 200 and
the run's id, which is then followed by id; 204 from an older GitHub Enterprise: the run is
found by its display_title), or a generic webhook (WAKE_TRIGGER=webhook: a POST with a secret
header). It asks and follows; it never saves the waker's state (waker.py does). Every call goes
through the one client set shipped beside the package (scripts/clients/: GitHub's headers, HTTPS
only, no redirect followed with the token, bounded answers)."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from clients import github, transport

from .log import iso, log
from .settings import Settings
from .state import DAY

API_TIMEOUT = 20.0
USER_AGENT = "nemotron-droplet-wake"
# What a call that got no answer raises: no connection, a timeout, an answer over its bound, or
# a URL the token may not go to (Settings.check refuses those first).
UNANSWERED = (OSError, http.client.HTTPException, ValueError, transport.FailedError)
# A run's conclusions that end a wake other than in success (GitHub REST, workflow-run).
RUN_ENDED = "completed"
# Why a run failed, from its failed job's log (GitHub REST "Download job logs for a workflow
# run": a 302 to a signed storage URL valid for a minute, fetched without our token). The
# program refuses a stack in one message, components/spec/config.py ConfigError: "... nothing
# was created:" then one "  - <field>: <why>" line each; pulumi/actions streams the CLI's
# output into the job's log, each line after GitHub's timestamp.
REFUSAL_HEAD = "nothing was created:"
REFUSAL_LINE = re.compile(r"^\s*- (\S.*)$")
LOG_STAMP = re.compile(r"^\ufeff?\d{4}-\d\d-\d\dT[0-9:.]+Z ")
# What a failed up left billing: deploy.yml's clean-up (scripts/ci/lease.py --failed-up) prints
# one line each, headed so, after the up's own output.
BILLING_HEAD = "billing: "
LOG_LIMIT = 4_000_000  # bytes of a job's log read: a refused up stops long before
LOG_SECONDS = 60.0  # and for no longer than this, however slowly it trickles
# The pipeline looked at on start and every PIPELINE_CHECK_SECONDS (a fine-grained token expires,
# 30 days by default; a public repository's workflow is disabled after 60 days without activity):
# a problem is said long before the wake that would meet it.
PIPELINE_CHECK_SECONDS = 6 * 3600
TOKEN_WARN_DAYS = 14


class PipelineError(Exception):
    pass


def refusal_in_log(text: str) -> list[str]:
    """The program's refusal in a job's log: the problems after its last "nothing was created:"
    line (the CLI's diagnostics and pulumi/actions' error annotation both repeat it), or []. One
    pass over the lines: a log of any shape costs its length."""
    found: list[str] = []
    problems: list[str] | None = None  # collecting after a head line
    for raw in text.splitlines():
        line = LOG_STAMP.sub("", raw)
        if problems is not None and (match := REFUSAL_LINE.match(line)):
            problems.append(match[1].strip()[:400])
            continue
        if problems:
            found = problems
        problems = [] if line.rstrip().endswith(REFUSAL_HEAD) else None
    if problems:
        found = problems
    return list(dict.fromkeys(found))[:5]


def billing_in_log(text: str) -> list[str]:
    """What the failed up's clean-up says still bills or was deleted (its `billing:` lines), or
    [] when the job's log has none."""
    lines = (LOG_STAMP.sub("", raw) for raw in text.splitlines())
    found = [
        line.removeprefix(BILLING_HEAD).strip()[:300]
        for line in lines
        if line.startswith(BILLING_HEAD)
    ]
    return found[:6]


def token_expiry(value: str | None) -> float | None:
    """GitHub's `github-authentication-token-expiration` header ('2027-10-12 09:00:00 UTC', or
    an offset in place of UTC), sent with every answer to a token that expires; epoch seconds."""
    if not value:
        return None
    try:
        at = datetime.strptime(value.strip().replace(" UTC", " +0000"), "%Y-%m-%d %H:%M:%S %z")
    except ValueError:
        return None
    return at.timestamp()


@dataclass
class Pipeline:
    """The GitHub REST or webhook client of a wake, with the waker's settings and clock."""

    s: Settings
    clock: Callable[[], float] = field(default=time.time)

    def _github(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        """One call of GitHub's API with the token: (status, its JSON or None)."""
        try:
            if method == "POST":
                answer = github.post(url, self.s.token, USER_AGENT, API_TIMEOUT, body)
            else:
                answer = github.get(url, self.s.token, USER_AGENT, API_TIMEOUT)
        except UNANSWERED as err:
            raise PipelineError(
                f"the pipeline could not be reached: {type(err).__name__}"
            ) from None
        return answer.status_code, _detail(answer)

    def _repo_url(self, tail: str) -> str:
        return f"{self.s.github_api}/repos/{self.s.github_repo}/actions/{tail}"

    def dispatch_github(self) -> int | None:
        """POST .../dispatches with return_run_details: 200 and the run's id (GitHub since
        2026-02-19); 204 and no body from an older GitHub Enterprise, whose run is then found
        by its title."""
        url = self._repo_url(f"workflows/{self.s.github_workflow}/dispatches")
        body: dict[str, Any] = {
            "ref": self.s.github_ref,
            "inputs": {"stack": self.s.stack, "command": "up", "refresh": "true"},
            "return_run_details": True,
        }
        status, detail = self._github("POST", url, body)
        said = str((detail or {}).get("message", "")) if isinstance(detail, dict) else ""
        if status == 422 and "return_run_details" in said:
            # A GitHub that does not know the parameter yet: the dispatch as it was before.
            del body["return_run_details"]
            status, detail = self._github("POST", url, body)
            said = str((detail or {}).get("message", "")) if isinstance(detail, dict) else ""
        if status == 200 and isinstance(detail, dict) and detail.get("workflow_run_id"):
            return int(detail["workflow_run_id"])
        if status in (200, 204):
            return None
        why = {
            401: "the token was refused",
            403: "the token may not run workflows",
            404: "no such repository or workflow (or the token cannot see it)",
            422: "the workflow refused the dispatch",
        }.get(status, "an error")
        raise PipelineError(
            f"GitHub refused the wake (HTTP {status}: {why}{': ' + said if said else ''})"
        )

    def check_pipeline(self) -> dict[str, Any]:
        """Can a wake start? GitHub's answer to GET /repos/{repo}/actions/workflows/{workflow}
        (actions/get-workflow) with the token: the workflow there and `active`, the token
        accepted, and when it expires. A definite no is a `problem` (the wake phase fails on
        it); GitHub out of reach or rate-limited, a branch GitHub says it lacks (a token without
        Contents: read may be told so too), or a token that ends within TOKEN_WARN_DAYS, a
        `warning`. A webhook cannot be asked."""
        now = self.clock()
        found: dict[str, Any] = {"checked_at": iso(now), "problem": None, "warning": None}
        if self.s.trigger != "github":
            return found | {"warning": "a webhook is not checked before a wake"}
        try:
            status, body, sent = self._ask_workflow()
        except UNANSWERED as err:
            return found | {"warning": f"GitHub could not be reached ({type(err).__name__})"}
        expires = token_expiry(sent.get("github-authentication-token-expiration"))
        found["token_expires"] = iso(expires)
        found["workflow_state"] = body.get("state") if status == 200 else None
        # GitHub's primary limit (x-ratelimit-remaining: 0) and its secondary ones (Retry-After,
        # a message that says so) answer 403 or 429: not the token's fault.
        limited = (
            sent.get("x-ratelimit-remaining") == "0"
            or sent.get("retry-after")
            or "rate limit" in str(body.get("message", "")).lower()
        )
        if status == 429 or (status == 403 and limited):
            return found | {"warning": "GitHub's rate limit: the pipeline was not checked now"}
        where = f"{self.s.github_repo}'s {self.s.github_workflow}"
        problem = {
            401: "wake.token: GitHub refused it (expired or revoked): make a new one and "
            "`pulumi config set --secret --path wake.token` (it asks for it), then pulumi up",
            403: f"wake.token may not read {where} (it needs Actions: read and write)",
            404: f"wake.githubRepo, wake.githubWorkflow: {where} is not there, or wake.token "
            "cannot see it",
        }.get(status)
        if problem is None and status != 200:
            return found | {"warning": f"GitHub answered HTTP {status}"}
        if problem is None and found["workflow_state"] != "active":
            problem = (
                f"{where} is {found['workflow_state']}: enable it (Actions > "
                f"{self.s.github_workflow} > Enable workflow)"
            )
        warnings = []
        if problem is None and self.ref_missing():
            warnings.append(
                f"wake.githubRef: GitHub says {self.s.github_repo} has no branch "
                f"{self.s.github_ref!r}: if so, each wake gets 422"
            )
        if problem is None and expires is not None and expires - now < TOKEN_WARN_DAYS * DAY:
            warnings.append(
                f"wake.token expires on {iso(expires)}: make a new one before then, "
                "or the first wake after it fails"
            )
        return found | {"problem": problem, "warning": "; ".join(warnings) or None}

    def _ask_workflow(self) -> tuple[int, Any, Any]:
        """GET the workflow with the token: (status, JSON body or {}, the answer's headers).
        A 200 whose body is no JSON raises ValueError (as if GitHub had not answered)."""
        url = self._repo_url(f"workflows/{self.s.github_workflow}")
        answer = github.get(url, self.s.token, USER_AGENT, API_TIMEOUT)
        try:
            said = answer.json()
        except ValueError:
            if answer.status_code == 200:
                raise
            said = {}
        return answer.status_code, said if isinstance(said, dict) else {}, answer.headers

    def ref_missing(self) -> bool:
        """Whether the dispatch's branch is known not to exist (GET .../git/ref/heads/{ref}: 404
        once the repository answered; a token without Contents: read gets 403: not known)."""
        url = f"{self.s.github_api}/repos/{self.s.github_repo}/git/ref/heads/{self.s.github_ref}"
        try:
            status, _ = self._github("GET", url)
        except PipelineError:
            return False
        return status == 404

    def call_webhook(self) -> None:
        """POST the stack to the webhook with its secret header (no redirect followed with it)."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            self.s.webhook_header: self.s.token,
        }
        data = json.dumps({"stack": self.s.stack, "event": "wake"}).encode()
        try:
            answer = transport.request("POST", self.s.webhook_url, headers, API_TIMEOUT, data=data)
        except UNANSWERED as err:
            raise PipelineError(
                f"the pipeline could not be reached: {type(err).__name__}"
            ) from None
        status = answer.status_code
        if not 200 <= status < 300:
            raise PipelineError(f"the webhook refused the wake (HTTP {status})")

    def _title_matches(self, run: dict[str, Any]) -> bool:
        # deploy.yml's run-name: `deploy <stack> <command>` (GitHub's field is display_title).
        return str(run.get("display_title") or "").startswith(f"deploy {self.s.stack} ")

    def find_run(self, started: float) -> dict[str, Any] | None:
        """Without a run id (a 204): the newest workflow_dispatch run of this stack created
        since the dispatch."""
        url = self._repo_url(
            f"workflows/{self.s.github_workflow}/runs?event=workflow_dispatch&per_page=20"
        )
        status, body = self._github("GET", url)
        for run in _runs_of(status, body) or []:
            created = _epoch(run.get("created_at"))
            if (
                created is not None
                and created >= started - 5
                and self._title_matches(run)
                and _run_id(run) is not None
            ):
                return dict(run)
        return None

    def recent_runs(self) -> list[dict[str, Any]] | None:
        """The workflow's newest runs, any event (None when GitHub did not answer them)."""
        url = self._repo_url(f"workflows/{self.s.github_workflow}/runs?per_page=20")
        try:
            status, body = self._github("GET", url)
        except PipelineError:
            return None
        return _runs_of(status, body)

    def replaced_by(self, ours: dict[str, Any]) -> str:
        """The run that took a cancelled run's place in deploy.yml's concurrency group (GitHub
        cancels a pending run when a newer one queues, even with cancel-in-progress: false)."""
        mine = _epoch(ours.get("created_at")) or 0.0
        for run in self.recent_runs() or []:
            created = _epoch(run.get("created_at"))
            # The same stack's group: its push runs are titled as its dispatches are.
            newer = created is not None and created >= mine and run.get("id") != ours.get("id")
            if newer and self._title_matches(run):
                return f" by the newer {run.get('event')} run {run.get('html_url', '')}"
        return ""

    async def follow_run(
        self,
        started: float,
        run_id: int | None,
        going: Callable[[], bool],
        found: Callable[[int], None],
        seen: Callable[[dict[str, Any]], None],
    ) -> tuple[bool, str] | None:
        """Follow the run a wake's dispatch queued, by id (GET .../actions/runs/{id}), or by
        its title when the dispatch gave none (`found` is told its id); `seen` sees each look
        at it. (True, '') when it succeeded; (False, why and its
        link) when it ended otherwise; None when `going` turned false first."""
        while going():
            await asyncio.sleep(self.s.run_poll_seconds)
            if not going():
                return None
            try:
                if run_id is not None:
                    status, run = await asyncio.to_thread(
                        self._github, "GET", self._repo_url(f"runs/{run_id}")
                    )
                    if status != 200 or not isinstance(run, dict):
                        continue
                else:
                    listed = await asyncio.to_thread(self.find_run, started)
                    if listed is None:
                        continue
                    run, run_id = listed, _run_id(listed)
                    if run_id is not None:
                        found(run_id)
            except PipelineError:
                continue
            seen(run)
            if run.get("status") != RUN_ENDED:
                continue
            conclusion = str(run.get("conclusion"))
            if conclusion == "success":
                return True, ""
            link = run.get("html_url", "")
            if conclusion == "cancelled":
                newer = await asyncio.to_thread(self.replaced_by, run)
                return False, f"the deploy run was cancelled{newer or ''}: {link}"
            why = await asyncio.to_thread(self.failure_of, run)
            return False, f"the deploy run ended {conclusion}{why}: {link}"
        return None

    def failure_of(self, run: dict[str, Any]) -> str:
        """Where and why a run failed, for the held requests: its failed job and step (GET
        .../runs/{id}/jobs) and the program's refusal from that job's log; '' when GitHub does
        not say (the run's link stays the answer)."""
        url = self._repo_url(f"runs/{run.get('id')}/jobs?filter=latest&per_page=100")
        try:
            status, body = self._github("GET", url)
            jobs = body.get("jobs") if status == 200 and isinstance(body, dict) else None
            failed = [
                j
                for j in jobs or []
                if isinstance(j, dict) and j.get("conclusion") in ("failure", "timed_out")
            ]
            if not failed:
                return ""
            steps = [
                s.get("name")
                for s in failed[0].get("steps") or []
                if isinstance(s, dict) and s.get("conclusion") == "failure"
            ]
            text = self.job_log(int(failed[0]["id"]))
            problems, billing = refusal_in_log(text), billing_in_log(text)
        except Exception as err:  # noqa: BLE001 (no answer of GitHub's may keep a wake from failing)
            log("run_reason_unread", error=type(err).__name__)
            return ""
        where = f" in job {failed[0].get('name')}" + (f", step {steps[0]}" if steps else "")
        where += f" (the stack was refused: {'; '.join(problems)})" if problems else ""
        return where + (f"; billing: {'; '.join(billing)}" if billing else "")

    def job_log(self, job_id: int) -> str:
        """A job's log, without the token on its signed redirect (clients/github.py job_log);
        '' when it cannot be read."""
        url = self._repo_url(f"jobs/{job_id}/logs")
        try:
            text = github.job_log(
                url, self.s.token, USER_AGENT, API_TIMEOUT, LOG_LIMIT, LOG_SECONDS
            )
        except UNANSWERED:
            return ""
        return text or ""


def _detail(answer: transport.Answer) -> Any:
    """An answer's JSON (None when empty); an error's body that is no JSON is None too, and a
    success's raises PipelineError (not the answer of GitHub's API)."""
    try:
        return answer.json() if answer.body.strip() else None
    except ValueError:
        if answer.status_code < 300:
            raise PipelineError("the pipeline could not be reached: JSONDecodeError") from None
        return None


def _runs_of(status: int, body: Any) -> list[dict[str, Any]] | None:
    """The runs of actions/list-workflow-runs' answer; None when it is not that (an error, or
    a body of another shape: as if GitHub had not answered)."""
    runs = body.get("workflow_runs") if status == 200 and isinstance(body, dict) else None
    if not isinstance(runs, list):
        return None
    return [run for run in runs if isinstance(run, dict)]


def _run_id(run: dict[str, Any]) -> int | None:
    """A run's id when it is one (a positive whole number)."""
    value = run.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _epoch(text: Any) -> float | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
