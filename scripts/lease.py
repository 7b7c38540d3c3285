"""The lease outside the Droplet: delete this project's GPU Droplets that are past their expiry.

    DIGITALOCEAN_TOKEN=dop_v1_... python scripts/lease.py --dry-run   # what it would delete
    DIGITALOCEAN_TOKEN=dop_v1_... python scripts/lease.py             # delete them

Autodown runs on the Droplet: if the Droplet hangs, its timer dies or someone stops the unit,
nothing deletes it, and DigitalOcean bills a frozen or powered-off Droplet like a running one.
This rule needs nothing from the Droplet. Each GPU Droplet the program creates carries the tags
`nemotron-droplet` and `nemotron-droplet-lease-minutes:<M>` (autodown.maxHours, in minutes;
components/catalog.py); it expires M minutes after DigitalOcean created it (`created_at`), the
same ceiling autodown counts. One past its expiry plus `--grace-minutes` (autodown had its
chance) is deleted by id. `.github/workflows/lease.yml` runs this every 15 minutes.

What it touches, and the token it needs (DigitalOcean OpenAPI, specification/resources/):
- GET /v2/droplets?type=gpus (droplets_list.yml, `droplet:read`): GPU Droplets are listed only
  with `type=gpus`, which cannot be combined with `tag_name`, so it lists them all, page by page,
  and keeps those tagged `nemotron-droplet`. The balancer (a CPU Droplet), the Reserved IP, the
  cache Volumes and the DNS records are never listed, so never deleted.
- DELETE /v2/droplets/{id} (droplets_destroy.yml, `droplet:delete`); never by tag.
A token with exactly `droplet:read` and `droplet:delete` does it; `--dry-run` needs only the first.

A 429 waits for its Retry-After, a 5xx is tried again (three times), a Droplet deleted between
the list and the delete (404) counts as gone. The token is never printed. Exit 0: nothing failed
(deleted or not); 1: a call failed (the summary says which); 2: the token or the arguments.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from components import catalog  # the lease tag's one definition

API_URL = "https://api.digitalocean.com"
TIMEOUT_SECONDS = 30
PER_PAGE = 200  # the most DigitalOcean gives per page (description.yml, "Links & Pagination")
SERVER_ERROR_TRIES = 3
GRACE_MINUTES = 30.0
# The most one run waits on Retry-After in total: the workflow runs again in 15 minutes.
MAX_WAIT_SECONDS = 300.0

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class RefusedError(Exception):
    """The token cannot do this (401: the token; 403: a scope): stop, say which."""


class FailedError(Exception):
    """A call that did not succeed after its retries."""


@dataclass
class Api:
    url: str
    token: str
    sleep: Sleep = time.sleep
    waited: float = 0.0

    def call(self, method: str, target: str, scope: str) -> requests.Response:
        """One call with DigitalOcean's retry rules: 429 waits for Retry-After (within the run's
        budget), 5xx and dropped connections are tried again, 401/403 stop."""
        url = target if target.startswith(("http://", "https://")) else f"{self.url}{target}"
        failed = 0  # 5xx answers and dropped connections; a 429 is not a failure, only a wait
        while True:
            try:
                answer = requests.request(
                    method,
                    url,
                    headers={"Authorization": f"Bearer {self.token}"},
                    timeout=TIMEOUT_SECONDS,
                )
            except requests.RequestException as err:
                failed += 1
                if failed == SERVER_ERROR_TRIES:
                    raise FailedError(f"{method} {_path(url)}: {type(err).__name__}") from None
                self.sleep(2.0**failed)
                continue
            if answer.status_code == 401:
                raise RefusedError("DIGITALOCEAN_TOKEN: DigitalOcean refused it (HTTP 401)")
            if answer.status_code == 403:
                raise RefusedError(
                    f"DIGITALOCEAN_TOKEN: {method} {_path(url)} refused (HTTP 403): the token "
                    f"needs the scope {scope}"
                )
            if answer.status_code == 429:
                wait = _retry_after(answer.headers.get("retry-after"))
                if self.waited + wait > MAX_WAIT_SECONDS:
                    raise FailedError(f"{method} {_path(url)}: rate limited (HTTP 429) too long")
                self.waited += wait
                self.sleep(wait)
                continue
            if answer.status_code >= 500:
                failed += 1
                if failed < SERVER_ERROR_TRIES:
                    self.sleep(2.0**failed)
                    continue
            return answer


def _path(url: str) -> str:
    return urllib.parse.urlsplit(url).path


def _retry_after(header: str | None) -> float:
    """Seconds from a Retry-After of delta-seconds (DigitalOcean's, shared/headers.yml); 60 when
    it is missing or unreadable."""
    try:
        return max(1.0, float(header or "60"))
    except ValueError:
        return 60.0


def list_gpu_droplets(api: Api) -> list[dict[str, Any]]:
    """Every GPU Droplet of the account, following `links.pages.next` to the last page."""
    droplets: list[dict[str, Any]] = []
    target: str | None = f"/v2/droplets?type=gpus&per_page={PER_PAGE}"
    while target:
        answer = api.call("GET", target, "droplet:read")
        if answer.status_code != 200:
            raise FailedError(f"GET /v2/droplets: HTTP {answer.status_code}")
        body = answer.json()
        droplets += body.get("droplets", [])
        target = ((body.get("links") or {}).get("pages") or {}).get("next")
        if target:
            # Follow the next page on the API we were given (a link names api.digitalocean.com).
            split = urllib.parse.urlsplit(target)
            target = f"{split.path}?{split.query}"
    return droplets


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
    stack = next((t.removeprefix("stack:") for t in tags if t.startswith("stack:")), "?")
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


def summary(verdicts: list[Verdict], now: datetime, dry_run: bool, failures: list[str]) -> str:
    """The job summary: each Droplet of ours, what was done, and the bill before and after."""
    gone = [v for v in verdicts if v.action in ("deleted", "already gone")]
    left = [v for v in verdicts if v not in gone]
    title = "Lease (dry run: nothing deleted)" if dry_run else "Lease"
    lines = [
        f"## {title}: {now.strftime('%Y-%m-%d %H:%M UTC')}",
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


def main(argv: list[str] | None = None, clock: Clock = time.time, sleep: Sleep = time.sleep) -> int:
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
    parser.add_argument("--api-url", default=API_URL, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    api_url = urllib.parse.urlsplit(args.api_url)
    if api_url.scheme != "https" and api_url.hostname != "127.0.0.1":
        parser.error("--api-url: the token goes over HTTPS only (plain HTTP to 127.0.0.1 alone)")
    # nan and inf would keep every Droplet past its lease: a number it can count to, or nothing.
    if not (math.isfinite(args.grace_minutes) and args.grace_minutes >= 0):
        parser.error("--grace-minutes: a number of minutes, 0 or more")
    token = os.environ.get("DIGITALOCEAN_TOKEN", "")
    if not token:
        print("error: DIGITALOCEAN_TOKEN is not set (scopes: droplet:read, droplet:delete)",
              file=sys.stderr)  # fmt: skip
        return 2
    summary_path = args.summary or (
        Path(os.environ["GITHUB_STEP_SUMMARY"]) if os.environ.get("GITHUB_STEP_SUMMARY") else None
    )
    api = Api(args.api_url.rstrip("/"), token, sleep)
    now = datetime.fromtimestamp(clock(), UTC)
    verdicts: list[Verdict] = []
    failures: list[str] = []
    code = 0
    try:
        listed = list_gpu_droplets(api)
        verdicts = [v for d in listed if (v := judge(d, now, args.grace_minutes)) is not None]
        failures = enforce(api, verdicts, args.dry_run)
    except RefusedError as err:
        failures, code = [str(err)], 2
    except FailedError as err:
        failures, code = [f"listing the GPU Droplets failed: {err}"], 1
    for v in verdicts:
        print(f"{v.name} ({v.id}, stack {v.stack}, {v.size}, ${v.price_hourly:.2f}/h): "
              f"{describe(v, now)}: {v.action}")  # fmt: skip
    if summary_path is not None:
        with summary_path.open("a") as out:
            out.write(summary(verdicts, now, args.dry_run, failures))
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return code or (1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
