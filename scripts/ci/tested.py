"""Did this commit already pass its tests? deploy.yml's first job asks GitHub, so that a wake (the
front's workflow_dispatch) or any second run of a commit does not wait minutes for a suite that
already passed on that same commit.

What counts: a run of the same workflow file (deploy.yml) for the same commit (`head_sha` ==
GITHUB_SHA) whose job named `test` completed with conclusion `success`, in any of its attempts.
The same file at the same commit defines that job, so it ran the same suite on the same code.
A skipped test job concludes `skipped`, so only a real pass counts, never a skip resting on an
earlier skip. Two REST calls with the job's GITHUB_TOKEN (`actions: read`), per
github/rest-api-description (operations actions/list-workflow-runs, actions/list-jobs-for-
workflow-run):

  GET {api}/repos/{repo}/actions/workflows/{workflow}/runs?head_sha={sha}&event=push&...&page=N
      -> {"workflow_runs": [{"id", "head_sha", "status", "conclusion", ...}]}, newest first
  GET {api}/repos/{repo}/actions/runs/{run_id}/jobs?filter=all
      -> {"jobs": [{"name", "status", "conclusion", "run_attempt", ...}]}

Which runs it reads: every wake is a run of the same commit whose `test` job is skipped, so after
twenty wakes the push run that passed is far down the list. The push runs of the commit come
first (`event=push`: the run that tests a commit, one or two of them), then every run of it, a
page of 100 at a time, until a passed job is found, the runs end, or DEADLINE_S.

Anything it cannot read (an HTTP error, a time-out, a missing permission, a body it does not
understand) counts as "not passed": the suite runs, and a warning says why. `destroy` runs no
program code (Pulumi deletes what the state lists), and a broken commit must never block the
command that stops the bill, so it needs no tests.

Writes `run-tests=true|false` to $GITHUB_OUTPUT and one line to $GITHUB_STEP_SUMMARY.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from clients import github, transport  # the one GitHub client (scripts/clients/)

TIMEOUT_S = 10  # one request
DEADLINE_S = 30  # all of them: past it, the suite runs
PER_PAGE = 100  # GitHub's largest page of runs
# deploy.yml's triggers: a run of either tested the commit's own tree (a pull_request run would
# test a merge commit, whatever its head_sha; deploy.yml has none, and none counts).
TESTED_EVENTS = ("push", "workflow_dispatch")
MAX_PAGES = 5  # of each listing: 500 runs of one commit, far past any month of wakes


class UnknownError(Exception):
    """GitHub's answer could not be read: treat the commit as not tested."""


def get(url: str, token: str, deadline: float) -> Any:
    """One GET within the deadline, not tried again; a redirect is an answer, never followed
    (the token must not go with it: scripts/clients/transport.py)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise UnknownError(f"no answer within {DEADLINE_S} s")
    try:
        answer = github.get(url, token, "nemotron-droplet-tested", min(TIMEOUT_S, left))
        if answer.status_code != 200:
            hint = (
                " (does the job have `permissions: actions: read`?)"
                if answer.status_code in (401, 403, 404)
                else ""
            )
            raise UnknownError(f"GET {url}: HTTP {answer.status_code}{hint}")
        return answer.json()
    except (OSError, ValueError, http.client.HTTPException, transport.FailedError) as e:
        raise UnknownError(f"GET {url}: {e}") from e


def get_list(url: str, key: str, token: str, deadline: float) -> list[Any]:
    """The list GitHub answers under `key` (workflow_runs, jobs), or UnknownError."""
    body = get(url, token, deadline)
    found = body.get(key) if isinstance(body, dict) else None
    if not isinstance(found, list):
        raise UnknownError(f"GET {url}: no {key} in the answer")
    return found


def commit_runs(
    api: str, repo: str, workflow: str, sha: str, token: str, deadline: float
) -> Iterator[dict[str, Any]]:
    """This commit's runs of `workflow`: its push runs first, then all of them, page by page,
    each once (a generator: the caller stops at the first pass)."""
    seen: set[int] = set()
    path = f"{api}/repos/{repo}/actions/workflows/{urllib.parse.quote(workflow)}/runs"
    for event in ("push", None):
        for page in range(1, MAX_PAGES + 1):
            query = {"head_sha": sha, "exclude_pull_requests": "true", "per_page": PER_PAGE,
                     "page": page, **({"event": event} if event else {})}  # fmt: skip
            url = f"{path}?{urllib.parse.urlencode(query)}"
            runs = get_list(url, "workflow_runs", token, deadline)
            for run in runs:
                if not isinstance(run, dict) or run.get("head_sha") != sha:
                    continue  # the filter is GitHub's; the check is ours
                if run.get("event") not in TESTED_EVENTS:
                    continue  # deploy.yml's own events: what they test is this commit's tree
                if not isinstance(run.get("id"), int):
                    raise UnknownError(f"GET {url}: a run without an id")
                if run["id"] not in seen:
                    seen.add(run["id"])
                    yield run
            if len(runs) < PER_PAGE:
                break


def passed_run(api: str, repo: str, workflow: str, job: str, sha: str, token: str) -> str | None:
    """The html_url of a run of `workflow` for `sha` whose job `job` succeeded, or None."""
    deadline = time.monotonic() + DEADLINE_S
    for run in commit_runs(api, repo, workflow, sha, token, deadline):
        run_id = run["id"]
        jobs_url = f"{api}/repos/{repo}/actions/runs/{run_id}/jobs?filter=all&per_page=100"
        for j in get_list(jobs_url, "jobs", token, deadline):
            if (
                isinstance(j, dict)
                and j.get("name") == job
                and j.get("status") == "completed"
                and j.get("conclusion") == "success"
            ):
                return str(run.get("html_url") or f"run {run_id}")
    return None


def decide(args: argparse.Namespace, env: dict[str, str]) -> tuple[bool, str]:
    """(run the tests?, why), never raising for what GitHub answers."""
    if args.command == "destroy":
        return False, "destroy runs no program code and stops the bill: no tests before it"
    sha = env.get("GITHUB_SHA", "")
    try:
        missing = [
            k for k in ("GITHUB_API_URL", "GITHUB_REPOSITORY", "GITHUB_SHA", "GITHUB_TOKEN")
            if not env.get(k)
        ]  # fmt: skip
        if missing:
            raise UnknownError(f"{', '.join(missing)} not set")
        where = passed_run(
            env["GITHUB_API_URL"].rstrip("/"), env["GITHUB_REPOSITORY"], args.workflow, args.job,
            sha, env["GITHUB_TOKEN"],
        )  # fmt: skip
    except UnknownError as e:
        print(f"::warning::could not tell whether {sha[:12]} passed its tests ({e}): running them")
        return True, f"could not tell ({e}): the tests run"
    if where:
        return False, f"{sha[:12]} passed job `{args.job}` of {args.workflow} already: {where}"
    return True, f"no passed `{args.job}` job of {args.workflow} for {sha[:12]} yet: the tests run"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workflow", required=True, help="the workflow file, e.g. deploy.yml")
    parser.add_argument("--job", required=True, help="the test job's name, e.g. test")
    parser.add_argument("--command", default="up", help="the deploy's command (up, destroy)")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    run_tests, why = decide(args, env)
    print(f"[tested] {why}")
    for name, line in (
        ("GITHUB_OUTPUT", f"run-tests={'true' if run_tests else 'false'}\n"),
        ("GITHUB_STEP_SUMMARY", f"Tests: {why}\n"),
    ):
        if env.get(name):
            with open(env[name], "a", encoding="utf-8") as f:
                f.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
