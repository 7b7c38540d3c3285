"""The lease outside the Droplet: delete this project's GPU Droplets that are past their expiry.

    read -rs DIGITALOCEAN_TOKEN && export DIGITALOCEAN_TOKEN   # pasted, not in shell history
    python3 scripts/ci/lease.py --dry-run                      # what it would delete
    python3 scripts/ci/lease.py                                # delete them
    GITHUB_TOKEN=$(gh auth token) python3 scripts/ci/lease.py --status --repo OWNER/REPO

Autodown runs on the Droplet: if the Droplet hangs, its timer dies or someone stops the unit,
nothing deletes it, and DigitalOcean bills a frozen or powered-off Droplet like a running one.
This rule needs nothing from the Droplet. Each GPU Droplet the program creates carries the tags
`nemotron-droplet` and `nemotron-droplet-lease-minutes:<M>` (autodown.maxHours, in minutes;
components/spec/catalog.py); it expires M minutes after DigitalOcean created it (`created_at`), the
same ceiling autodown counts. One past its expiry plus `--grace-minutes` (autodown had its
chance) is deleted by id. `.github/workflows/lease.yml` runs this on a schedule (hourly by
default). It needs the standard library, components/spec/catalog.py and scripts/clients/ (the
DigitalOcean and GitHub clients), nothing to install: the workflow runs it with the runner
image's python3.

What it touches, and the token it needs (DigitalOcean OpenAPI, specification/resources/):
- GET /v2/droplets?type=gpus (droplets_list.yml, `droplet:read`): GPU Droplets are listed only
  with `type=gpus`, which cannot be combined with `tag_name`, so it lists them all, page by page,
  and keeps those tagged `nemotron-droplet`. The balancer (a CPU Droplet), the Reserved IP, the
  cache Volumes and the DNS records are never listed, so never deleted.
- DELETE /v2/droplets/{id} (droplets_destroy.yml, `droplet:delete`); never by tag.
A token with exactly `droplet:read` and `droplet:delete` does it; `--dry-run` needs only the first.

A 429 waits for its Retry-After, a 5xx is tried again (three times), a Droplet deleted between
the list and the delete (404) counts as gone. The token is never printed, and a redirect is
never followed (the token would go with it). Exit 0: nothing failed (deleted or not); 1: a call
failed (the summary says which); 2: the token or the arguments.

`--failed-up STACK --since TIME` is deploy.yml's clean-up after a `pulumi up` that failed (or was
cancelled): it deletes, by id, the stack's GPU Droplets (tagged `stack:<STACK>`) that
DigitalOcean created since TIME (the run's start, less a minute for clocks apart): what that run
made and did not bring to serve. The stack's older Droplets stay (they served before; their
autodown rule and their lease bound them) and are named with their lease. Each line it prints
for the run's log begins `billing:`, which the front's waker relays to the requests a failed
wake held (scripts/phases/wake/). Same token, same scopes.

`--status` asks GitHub instead whether the schedule still runs (GitHub REST, github/
rest-api-description): GET /repos/{repo}/actions/workflows/lease.yml (its `state`: `active`, or
`disabled_inactivity` after 60 days without activity in a public repository, `disabled_manually`,
`disabled_fork`), GET .../workflows/lease.yml/runs?event=schedule&per_page=1 (the last scheduled
run's `created_at`, `status`, `conclusion`) and GET /repos/{repo}/actions/runs/{id}/jobs (whether
the lease step ran or was skipped for want of its secret). The token comes from GITHUB_TOKEN
(`actions: read`; never an argument). `--enable` also re-enables a schedule GitHub disabled for
inactivity (PUT .../workflows/lease.yml/enable, `actions: write`); never one a person disabled.
In a public repository it also reads GET /repos/{repo} (`pushed_at`) and warns from
INACTIVITY_WARN_DAYS without a push, before GitHub disables the schedule at 60.

`--keepalive` (each lease run, `actions: write`) makes that same PUT on an active schedule:
GitHub documents a push as activity, not this call, but a schedule re-enabled this way is not
found disabled for inactivity in practice (liskin/gh-workflow-keepalive action.yml makes only
this call for that purpose; docs/facts.md), so the lease does not lapse with a quiet repository.
Exit 0: the schedule ran within `--max-age-hours` and did its work; 1: it did not (the message
says what to do); 2: the token, the repository or the arguments.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from clients import digitalocean, github, transport  # the one client of each API (scripts/clients/)
from clients.transport import Api, FailedError, RefusedError, token_url_problem

from components.spec import catalog  # the lease tag's one definition

API_URL = digitalocean.API_URL
GITHUB_API_URL = github.API_URL
GRACE_MINUTES = 30.0
# The most one run waits on Retry-After, and one request's bound (scripts/clients/transport.py):
# lease.yml's timeout-minutes must stay above them (tests/test_lease.py holds it).
MAX_WAIT_SECONDS = transport.MAX_WAIT_SECONDS
TIMEOUT_SECONDS = transport.TIMEOUT_SECONDS
# --failed-up: a Droplet created this long before the run's recorded start still counts as the
# run's (the runner's clock and DigitalOcean's apart). A run's Droplet before it was made by the
# run before, which ended (deploy.yml's concurrency: one run per stack) after its bootstrap.
SINCE_MARGIN = timedelta(minutes=1)
BILLING = "billing:"  # the head of the lines the waker relays
# --status: the workflow, the step that does the work (its name is lease.yml's), and how old the
# last scheduled run may be before the check says the schedule is not running.
WORKFLOW = "lease.yml"
LEASE_STEP = "Delete the GPU Droplets past their lease"
MAX_AGE_HOURS = 24.0
# GitHub disables a public repository's scheduled workflows after 60 days without activity:
# --status warns this many days after the last push.
INACTIVITY_WARN_DAYS = 50
REPO = re.compile(r"[A-Za-z0-9-]+/[A-Za-z0-9._-]+")

Clock = Callable[[], float]
Sleep = Callable[[float], None]


def list_gpu_droplets(api: Api) -> list[dict[str, Any]]:
    """Every GPU Droplet of the account, following `links.pages.next` to the last page."""
    return digitalocean.pages(api, "/v2/droplets?type=gpus", "droplets", "droplet:read")


@dataclass
class Verdict:
    """One Droplet of ours, and what the rule does with it."""

    id: int
    name: str
    stack: str
    size: str
    price_hourly: float
    created: datetime
    expires: datetime | None  # None: no lease (autodown.maxHours unset, or a dry run)
    due: bool
    action: str = "kept"


def judge(droplet: dict[str, Any], now: datetime, grace_minutes: float) -> Verdict | None:
    """Ours (tagged with the project), and past expiry plus grace? None: not ours."""
    tags = list(droplet.get("tags") or [])
    if catalog.PROJECT not in tags:
        return None
    created = datetime.fromisoformat(str(droplet["created_at"]).replace("Z", "+00:00"))
    minutes = catalog.lease_minutes(tags)
    expires = None if minutes is None else created.timestamp() + minutes * 60
    due = expires is not None and now.timestamp() > expires + grace_minutes * 60
    stack = next((t for t in tags if t.startswith(catalog.STACK_TAG_PREFIX)), "?")
    stack = stack.removeprefix(catalog.STACK_TAG_PREFIX)
    size = droplet.get("size") or {}
    return Verdict(
        id=int(droplet["id"]),
        name=str(droplet.get("name", "?")),
        stack=stack,
        size=str(droplet.get("size_slug") or size.get("slug") or "?"),
        price_hourly=float(size.get("price_hourly") or 0.0),
        created=created,
        expires=None if expires is None else datetime.fromtimestamp(expires, UTC),
        due=due,
    )


def made_by_run(verdicts: list[Verdict], stack: str, since: datetime) -> list[Verdict]:
    """--failed-up: this stack's GPU Droplets only, due when created since the run began."""
    mine = [v for v in verdicts if catalog.STACK_TAG_PREFIX + v.stack == catalog.stack_tag(stack)]
    for v in mine:
        v.due = v.created >= since - SINCE_MARGIN
    return mine


def billing_lines(verdicts: list[Verdict], stack: str, now: datetime) -> list[str]:
    """What the failed up leaves billing, one `billing:` line each, for the run's log (the
    front relays them to the requests a failed wake held)."""
    made = [v for v in verdicts if v.due]
    gone = [v for v in made if v.action in ("deleted", "already gone")]
    stopped = sum(v.price_hourly for v in gone)
    lines = [f"{BILLING} the failed up of stack {stack} made {len(made)} GPU Droplet(s); "
             f"{len(gone)} deleted (${stopped:.2f}/h stopped)"]  # fmt: skip
    for v in verdicts:
        what = f"{v.name} ({v.id}, ${v.price_hourly:.2f}/h)"
        if v.due:
            lines.append(f"{BILLING} {what}: made by this run: {v.action}")
        else:
            lines.append(f"{BILLING} {what}: older than this run, kept: its autodown rule "
                         f"and its lease bound it ({describe(v, now)})")  # fmt: skip
    return lines


def describe(v: Verdict, now: datetime) -> str:
    """Why it was kept or went, in words."""
    if v.expires is None:
        return "no lease (autodown.maxHours unset, or dryRun)"
    minutes = (v.expires - now).total_seconds() / 60
    if minutes >= 0:
        return f"expires in {_duration(minutes)}"
    return f"expired {_duration(-minutes)} ago"


def _duration(minutes: float) -> str:
    whole = math.floor(minutes)
    return f"{whole // 60} h {whole % 60:02d} min" if whole >= 60 else f"{whole} min"


def enforce(api: Api, verdicts: list[Verdict], dry_run: bool) -> list[str]:
    """Delete what is due (by id); the failures, in words. A refused token stops the deletes
    (every other would be refused too) and is raised once the Droplet says so."""
    failures: list[str] = []
    for v in verdicts:
        if not v.due:
            continue
        if dry_run:
            v.action = "would delete (dry run)"
            continue
        try:
            answer = api.call("DELETE", f"/v2/droplets/{v.id}", "droplet:delete")
        except RefusedError:
            v.action = "refused"
            raise
        except FailedError as err:
            v.action = "delete failed"
            failures.append(f"{v.name} ({v.id}): {err}")
            continue
        if answer.status_code == 204:
            v.action = "deleted"
        elif answer.status_code == 404:
            v.action = "already gone"  # deleted between the list and the delete
        else:
            v.action = "delete failed"
            failures.append(f"{v.name} ({v.id}): HTTP {answer.status_code}")
    return failures


def summary(
    verdicts: list[Verdict],
    now: datetime,
    dry_run: bool,
    failures: list[str],
    listed: int | None = None,
    grace_minutes: float = GRACE_MINUTES,
) -> str:
    """The job summary: what it saw, each Droplet of ours, what was done, and the bill before
    and after. `listed`: the account's GPU Droplets it read (None: the list failed)."""
    gone = [v for v in verdicts if v.action in ("deleted", "already gone")]
    left = [v for v in verdicts if v not in gone]
    title = "Lease (dry run: nothing deleted)" if dry_run else "Lease"
    seen = (
        "The list of GPU Droplets failed: nothing was seen, nothing deleted."
        if listed is None
        else f"Saw {listed} GPU Droplet(s) in the account; the ones tagged `{catalog.PROJECT}` "
        f"are this project's. Grace past a lease: {grace_minutes:g} min."
    )
    lines = [
        f"## {title}: {now.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        seen,
        "",
        f"{len(verdicts)} GPU Droplet(s) of this project; {len(gone)} deleted "
        f"(${sum(v.price_hourly for v in gone):.2f}/h stopped); {len(left)} kept "
        f"(${sum(v.price_hourly for v in left):.2f}/h still billing).",
        "",
    ]
    if verdicts:
        lines += [
            "| Droplet | stack | size | $/h | created | lease | done |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for v in sorted(verdicts, key=lambda v: (v.stack, v.name)):
            lines.append(
                f"| {v.name} ({v.id}) | {v.stack} | {v.size} | {v.price_hourly:.2f} | "
                f"{v.created.strftime('%Y-%m-%d %H:%M')} | {describe(v, now)} | {v.action} |"
            )
    if failures:
        lines += ["", "Failed (the next run tries again):", *[f"- {f}" for f in failures]]
    return "\n".join(lines) + "\n"


# ---- --status: is the schedule alive? ---------------------------------------------------------

# What each `state` of a workflow (GitHub REST `workflow.state`) means for the lease, and the fix.
STATES = {
    "disabled_inactivity": "GitHub disabled its schedule after 60 days without activity in this "
    "public repository; re-enable it (`gh workflow enable {workflow} --repo {repo}`, the Actions "
    "tab, or this check with --enable and a token with actions: write); a push also counts as "
    "activity",
    "disabled_manually": "someone disabled it (Actions > lease > Enable workflow); --enable leaves "
    "a person's choice alone",
    "disabled_fork": "a fork's workflows stay off until they are enabled in its Actions tab",
    "deleted": "the workflow file is gone from the default branch",
}


@dataclass
class Status:
    """What --status saw, and what is wrong (nothing: the schedule runs and does its work)."""

    seen: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def lease_status(api: Api, repo: str, now: datetime, max_age: timedelta, enable: bool) -> Status:
    """Ask GitHub whether lease.yml is enabled, when its schedule last ran and whether that run
    did the lease's work; with `enable`, re-enable a schedule GitHub disabled for inactivity."""
    out = Status()
    base = f"/repos/{repo}/actions/workflows/{WORKFLOW}"
    answer = api.call("GET", base, "actions: read")
    if answer.status_code == 404:
        raise RefusedError(
            f"GITHUB_TOKEN: GET {base}: HTTP 404: no {WORKFLOW} on {repo}'s default branch, or "
            "the token cannot see the repository (GitHub answers 404 to both)"
        )
    if answer.status_code != 200:
        raise FailedError(f"GET {base}: HTTP {answer.status_code}")
    state = str(answer.json().get("state"))
    out.seen.append(f"{WORKFLOW} on {repo}: state `{state}`")
    reenabled = False
    if state == "disabled_inactivity" and enable:
        put = api.call("PUT", f"{base}/enable", "actions: write")
        if put.status_code != 204:
            raise FailedError(f"PUT {base}/enable: HTTP {put.status_code}")
        reenabled = True
        out.seen.append(
            "re-enabled it (PUT .../enable): the schedule runs again from its next tick"
        )
    elif state != "active":
        why = STATES.get(state, "it does not run").format(workflow=WORKFLOW, repo=repo)
        out.problems.append(f"{WORKFLOW} is `{state}`: {why}")
    else:
        _activity(api, repo, now, out)
    answer = api.call("GET", f"{base}/runs?event=schedule&per_page=1", "actions: read")
    if answer.status_code != 200:
        raise FailedError(f"GET {base}/runs: HTTP {answer.status_code}")
    runs = answer.json().get("workflow_runs") or []
    if not runs:
        out.problems.append(
            f"{WORKFLOW} has never run on its schedule (GitHub runs a schedule from the default "
            f"branch only; try it by hand: `gh workflow run {WORKFLOW} --repo {repo} -f "
            "dry_run=true`)"
        )
        return out
    run = runs[0]
    created = _when(str(run["created_at"]))
    age = now - created
    status, conclusion = run.get("status"), run.get("conclusion")
    out.seen.append(
        f"last scheduled run: {run.get('display_title', '?')} ({run.get('event', '?')}), created "
        f"{created.strftime('%Y-%m-%d %H:%M UTC')}, {_duration(age.total_seconds() / 60)} ago, "
        f"updated {run.get('updated_at', '?')}, {status}"
        + (f" / {conclusion}" if conclusion else "")
        + (f": {run['html_url']}" if run.get("html_url") else "")
    )
    if age > max_age and not reenabled:
        out.problems.append(
            f"the last scheduled run is {_duration(age.total_seconds() / 60)} old, more than "
            f"{max_age.total_seconds() / 3600:g} h: GitHub delays or drops scheduled runs under "
            "load and stops them all when a private repository's billed minutes run out; until "
            "it runs again only autodown on the Droplet stops a forgotten one"
        )
    _judge_run(api, repo, run, out)
    return out


def _activity(api: Api, repo: str, now: datetime, out: Status) -> None:
    """A public repository's last push (GET /repos/{repo}: `private`, `pushed_at`): from
    INACTIVITY_WARN_DAYS without one, GitHub's 60 days are near."""
    answer = api.call("GET", f"/repos/{repo}", "metadata: read")
    if answer.status_code != 200:
        out.seen.append(f"could not read {repo}'s last push (HTTP {answer.status_code})")
        return
    body = answer.json()
    if body.get("private") is not False or not body.get("pushed_at"):
        return  # the 60 days hold for public repositories
    days = (now - _when(str(body["pushed_at"]))).days
    out.seen.append(f"last push to {repo}: {days} day(s) ago (a public repository)")
    if days >= INACTIVITY_WARN_DAYS:
        out.problems.append(
            f"no push to {repo} for {days} days: GitHub disables a public repository's "
            "schedules after 60 days without activity. Each lease run renews its own "
            "(--keepalive), which GitHub does not document as activity: push a commit to be sure"
        )


def keepalive(api: Api, repo: str) -> str:
    """PUT .../workflows/lease.yml/enable on an active schedule (or one GitHub disabled for
    inactivity); a schedule a person disabled is left alone. What it did, in one line."""
    base = f"/repos/{repo}/actions/workflows/{WORKFLOW}"
    answer = api.call("GET", base, "actions: read")
    if answer.status_code != 200:
        raise FailedError(f"GET {base}: HTTP {answer.status_code}")
    state = str(answer.json().get("state"))
    if state not in ("active", "disabled_inactivity"):
        return f"{WORKFLOW} is `{state}`: left alone"
    put = api.call("PUT", f"{base}/enable", "actions: write")
    if put.status_code != 204:
        raise FailedError(f"PUT {base}/enable: HTTP {put.status_code}")
    return f"{WORKFLOW} was `{state}`: enabled again (PUT .../enable), its schedule renewed"


def _judge_run(api: Api, repo: str, run: dict[str, Any], out: Status) -> None:
    """Did the last scheduled run do the lease's work: finished, and its lease step ran?"""
    status, conclusion = run.get("status"), run.get("conclusion")
    if status != "completed":
        out.seen.append("that run has not finished: its outcome is not known yet")
    elif conclusion in ("success", "neutral"):
        target = f"/repos/{repo}/actions/runs/{run['id']}/jobs"
        answer = api.call("GET", target, "actions: read")
        if answer.status_code != 200:
            raise FailedError(f"GET {target}: HTTP {answer.status_code}")
        steps = [s for job in answer.json().get("jobs") or [] for s in job.get("steps") or []]
        leased = [s for s in steps if s.get("name") == LEASE_STEP]
        if not leased:
            out.problems.append(
                f"that run has no step '{LEASE_STEP}': lease.yml and lease.py disagree on its name"
            )
        elif not any(s.get("conclusion") == "success" for s in leased):
            out.problems.append(
                f"the lease is off: that run skipped '{LEASE_STEP}' because the repository "
                "secret DIGITALOCEAN_LEASE_TOKEN is not set (a token with droplet:read and "
                "droplet:delete); each run deletes nothing"
            )
    else:
        out.problems.append(
            f"the last scheduled run ended `{conclusion}`: its summary says why"
            + (f" ({run['html_url']})" if run.get("html_url") else "")
        )


def status_summary(out: Status, now: datetime) -> str:
    lines = [f"## Lease schedule: {now.strftime('%Y-%m-%d %H:%M UTC')}", ""]
    lines += [f"- {line}" for line in out.seen]
    if out.problems:
        lines += ["", "Not guarding:", *[f"- {p}" for p in out.problems]]
    else:
        lines += ["", "The schedule runs and does the lease's work."]
    return "\n".join(lines) + "\n"


def _warn(message: str) -> None:
    """A warning: a GitHub annotation in a workflow run (shown on the run's page), else stderr."""
    if os.environ.get("GITHUB_ACTIONS") == "true":
        escaped = message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        print(f"::warning title=lease::{escaped}")
    else:
        print(f"warning: {message}", file=sys.stderr)


def _loopback_or_https(parser: argparse.ArgumentParser, option: str, url: str) -> None:
    if problem := token_url_problem(url):
        parser.error(f"{option}: {problem}")


def _summary_path(given: Path | None) -> Path | None:
    if given is not None:
        return given
    return (
        Path(os.environ["GITHUB_STEP_SUMMARY"]) if os.environ.get("GITHUB_STEP_SUMMARY") else None
    )


def _utc(text: str) -> datetime:
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError("no zone")
    return when


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="list what it would delete")
    parser.add_argument(
        "--grace-minutes",
        type=float,
        default=GRACE_MINUTES,
        help=f"past the expiry, how long autodown has to act first (default {GRACE_MINUTES:g})",
    )
    parser.add_argument(
        "--summary", type=Path, help="append the Markdown summary here ($GITHUB_STEP_SUMMARY)"
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="delete nothing: ask GitHub whether lease.yml's schedule runs (GITHUB_TOKEN)",
    )
    parser.add_argument(
        "--repo",
        default=os.environ.get("GITHUB_REPOSITORY"),
        help="--status: OWNER/REPO that holds lease.yml (default $GITHUB_REPOSITORY)",
    )
    parser.add_argument(
        "--max-age-hours",
        type=float,
        default=MAX_AGE_HOURS,
        help=f"--status: how old the last scheduled run may be (default {MAX_AGE_HOURS:g})",
    )
    parser.add_argument(
        "--enable",
        action="store_true",
        help="--status: re-enable a schedule GitHub disabled for inactivity (actions: write)",
    )
    parser.add_argument(
        "--keepalive",
        action="store_true",
        help="delete nothing: renew lease.yml's schedule (PUT .../enable; actions: write)",
    )
    parser.add_argument(
        "--failed-up",
        metavar="STACK",
        help="after a failed pulumi up (deploy.yml): delete the stack's GPU Droplets made since "
        "--since",
    )
    parser.add_argument(
        "--since",
        type=_utc,
        help="--failed-up: when the run began, ISO 8601 with its zone (2026-12-05T03:00:00Z)",
    )
    parser.add_argument("--api-url", default=API_URL, help=argparse.SUPPRESS)
    # In a workflow run the runner's GITHUB_API_URL (GitHub Enterprise's API too), else github.com.
    github_api = os.environ.get("GITHUB_API_URL") or GITHUB_API_URL
    parser.add_argument("--github-api-url", default=github_api, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None, clock: Clock = time.time, sleep: Sleep = time.sleep) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.status or args.keepalive:
        return _status(parser, args, clock, sleep)
    if args.enable:
        parser.error("--enable: only with --status")
    _loopback_or_https(parser, "--api-url", args.api_url)
    # nan and inf would keep every Droplet past its lease: a number it can count to, or nothing.
    if not (math.isfinite(args.grace_minutes) and args.grace_minutes >= 0):
        parser.error("--grace-minutes: a number of minutes, 0 or more")
    if (args.failed_up is None) != (args.since is None):
        parser.error("--failed-up STACK and --since TIME go together (deploy.yml's clean-up)")
    token = os.environ.get("DIGITALOCEAN_TOKEN", "")
    if not token:
        print("error: DIGITALOCEAN_TOKEN is not set (scopes: droplet:read, droplet:delete)",
              file=sys.stderr)  # fmt: skip
        return 2
    summary_path = _summary_path(args.summary)
    api = digitalocean.api(args.api_url, token, sleep)
    now = datetime.fromtimestamp(clock(), UTC)
    verdicts: list[Verdict] = []
    failures: list[str] = []
    listed: int | None = None
    code = 0
    try:
        droplets = list_gpu_droplets(api)
        listed = len(droplets)
        verdicts = [v for d in droplets if (v := judge(d, now, args.grace_minutes)) is not None]
        if args.failed_up is not None:
            verdicts = made_by_run(verdicts, args.failed_up, args.since)
        failures = enforce(api, verdicts, args.dry_run)
    except RefusedError as err:
        failures, code = [str(err)], 2
    except FailedError as err:
        failures, code = [f"listing the GPU Droplets failed: {err}"], 1
    print(f"Saw {listed if listed is not None else 'no'} GPU Droplet(s) in the account; "
          f"{len(verdicts)} of this project.")  # fmt: skip
    for v in verdicts:
        print(f"{v.name} ({v.id}, stack {v.stack}, {v.size}, ${v.price_hourly:.2f}/h): "
              f"{describe(v, now)}: {v.action}")  # fmt: skip
    if args.failed_up is not None and listed is not None:
        print("\n".join(billing_lines(verdicts, args.failed_up, now)))
    if summary_path is not None:
        with summary_path.open("a") as out:
            out.write(summary(verdicts, now, args.dry_run, failures, listed, args.grace_minutes))
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return code or (1 if failures else 0)


def _status(
    parser: argparse.ArgumentParser, args: argparse.Namespace, clock: Clock, sleep: Sleep
) -> int:
    if args.dry_run:
        parser.error("--dry-run: --status and --keepalive delete nothing anyway")
    if args.status and args.keepalive:
        parser.error("--keepalive: on its own (each lease run), not with --status")
    if not args.repo or not REPO.fullmatch(args.repo):
        parser.error("--repo: OWNER/REPO, the repository that holds lease.yml")
    if not (math.isfinite(args.max_age_hours) and args.max_age_hours > 0):
        parser.error("--max-age-hours: a number of hours above 0")
    _loopback_or_https(parser, "--github-api-url", args.github_api_url)
    token = os.environ.get("GITHUB_TOKEN", "")
    if not token:
        print(f"error: GITHUB_TOKEN is not set (a token that may read {args.repo}'s Actions: "
              "actions: read; --enable: actions: write)", file=sys.stderr)  # fmt: skip
        return 2
    api = github.api(args.github_api_url, token, "nemotron-droplet-lease", sleep)
    now = datetime.fromtimestamp(clock(), UTC)
    try:
        if args.keepalive:
            print(keepalive(api, args.repo))
            return 0
        out = lease_status(api, args.repo, now, timedelta(hours=args.max_age_hours), args.enable)
    except RefusedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except FailedError as err:
        print(f"error: asking GitHub failed: {err}", file=sys.stderr)
        return 1
    for line in out.seen:
        print(line)
    for problem in out.problems:
        _warn(problem)
    summary_path = _summary_path(args.summary)
    if summary_path is not None:
        with summary_path.open("a") as written:
            written.write(status_summary(out, now))
    if not out.problems:
        print("The lease's schedule runs and does its work.")
    return 1 if out.problems else 0


if __name__ == "__main__":
    sys.exit(main())
