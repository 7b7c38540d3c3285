#!/usr/bin/env python3
"""wake: the front's waker. While no replica answers, it holds the keyed requests Caddy sends it,
wakes the GPU set (once) when none exists, and relays each held request to the first replica
that is ready.

Runs on the balancer Droplet (the front that holds the endpoint's address) as its own service,
on loopback, on aiohttp (a production HTTP/1.1 server: its parser frames every body by its
length or its chunks, so a body is never read as a request, and it serves many held requests
from one thread). It is in the data path only while no replica is ready: it keeps the file
WAKE_HOLD_FILE while that is so, and Caddy's gateway sends a keyed request here only while
that file exists (a `file` matcher, after the gate has checked the key); awake, Caddy proxies
to the replicas and no request passes through Python. Unkeyed requests never reach it, but
`GET /health`, which it answers itself and which never wakes anything. Stopped (SIGTERM), it
answers what it holds with 503 and `x-should-retry: true` and leaves the file: through a
restart Caddy keeps sending keyed requests here, retrying the connection until the next waker
listens, which takes up a wake under way (its run, no second dispatch); stopped for good,
systemd removes the file's folder.

Ready means a replica answers its /health 200 and Caddy routes to it: the member phase
(scripts/phases/member.sh) writes a replica's upstream file, reloads Caddy (and, with the front's
router, has the router take it), and only then writes the file's join mark (JOINED_SUFFIX);
until the mark, a keyed request Caddy proxied to the replicas would get Caddy's 503 "no
upstreams", so the waker keeps holding (the replica exists: nothing is woken).

Asleep means no replica exists: no upstream file, or every upstream refused the connection
(or was unreachable) at WAKE_ASLEEP_LOOKS looks in a row spanning WAKE_ASLEEP_SECONDS. A
replica that answers anything, a 503 while it drains for a `pulumi up`, exists: the requests
are held until it is ready, and nothing is woken. One that accepts the connection but does not
answer within LOOK_TIMEOUT is busy (a saturated vLLM answers late), never gone: it stays what
its last answer said, so a ready replica under load keeps the front awake, for WAKE_BUSY_SECONDS
at most (a look waits that long for its answer, as Caddy's own health checks do): one whose
look gets no answer in that time is hung, there but not ready.

A wake starts the user's own deploy pipeline, which holds the cloud secrets (this service holds
no DigitalOcean token and never creates or deletes a Droplet): GitHub Actions' workflow_dispatch
of the deploy workflow for this stack (WAKE_TRIGGER=github; a fine-grained token limited to
Actions on one repository; POST /repos/{repo}/actions/workflows/{workflow}/dispatches with
`return_run_details`, GitHub REST "Create a workflow dispatch event": 200 and the run's id,
which is then followed by id; 204 from an older GitHub Enterprise: the run is found by its
display_title), or a generic webhook (WAKE_TRIGGER=webhook: a POST with a secret header). One
wake at a time; after one fails, none for WAKE_COOLDOWN_MINUTES; at most WAKE_MAX_PER_DAY in
any 24 hours. A refusal names the setting.

Held requests: a streamed one ('"stream": true') gets its 200 and a first SSE comment at once
(': waking ...', then every WAKE_COMMENT_SECONDS), then the replica's stream, or an SSE error
event and [DONE] if the replica fails it; any other request waits silently. Past
WAKE_HOLD_SECONDS the answer is 503 with `x-should-retry: true` and a short Retry-After (the
OpenAI clients retry it, each try held again); when the wake failed or cannot start, 503 with
`x-should-retry: false` and the real Retry-After, and an OpenAI-style error saying why.
openai-python `_base_client.py` `_should_retry`: `x-should-retry` decides unless Retry-After
exceeds 120 s. At most WAKE_MAX_HELD requests and WAKE_MAX_HELD_BYTES of their bodies are held,
and as many can be relayed at once (sessions()).

State for people and tools: GET /nemotron/wake (JSON: mode, since, the last wake's timeline),
POST /nemotron/wake (wake now, the same guards), GET|HEAD /health (200 while awake, else 503
with the mode). Every event is one JSON log line (the journal); no token and no request line
is ever printed.

Settings (environment; the token from the file WAKE_TOKEN_FILE, a systemd credential):
WAKE_LISTEN, WAKE_UPSTREAMS_DIR (Caddy's upstream files: 'to <host>:<port>'), WAKE_HOLD_FILE,
WAKE_TRIGGER, WAKE_STACK, WAKE_GITHUB_API, WAKE_GITHUB_REPO, WAKE_GITHUB_WORKFLOW,
WAKE_GITHUB_REF, WAKE_WEBHOOK_URL, WAKE_WEBHOOK_HEADER, WAKE_HOLD_SECONDS,
WAKE_EXPECTED_SECONDS, WAKE_COOLDOWN_MINUTES, WAKE_MAX_PER_DAY, WAKE_DEADLINE_MINUTES,
WAKE_STATE_FILE, WAKE_HEALTH_SECONDS, WAKE_COMMENT_SECONDS, WAKE_ASLEEP_SECONDS,
WAKE_ASLEEP_LOOKS, WAKE_BUSY_SECONDS, WAKE_MAX_HELD, WAKE_MAX_HELD_BYTES,
WAKE_RUN_POLL_SECONDS.

It wakes and holds, and never scales: the set's count is the stack's fixed `replicas` (the
Droplet autoscaler retired for the Kubernetes platform's engines: docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import inspect
import json
import math
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web, web_server

# One upstream per file, as the balancer phase writes them ('to 10.110.0.2:8080').
UPSTREAM = re.compile(r"^\s*to\s+([0-9A-Za-z.\-\[\]:]+):([0-9]{1,5})\s*$", re.M)
# A file's join mark: `<file><JOINED_SUFFIX>`, written by the member phase once Caddy routes to
# its replica (components/spec/catalog.py BALANCER_JOINED_SUFFIX: tests/test_wake.py holds them
# equal).
JOINED_SUFFIX = ".joined"
DAY = 86400.0
# The keyed control path the gate sends here as it came: components/host/wake.py's value
# (tests/test_wake.py holds them equal).
CONTROL_PATH = "/nemotron/wake"
MAX_BODY = 16_000_000  # the gate's own limit: nothing larger gets this far
FORWARD_TIMEOUT = 3600.0  # a held request, once sent, may generate for long
API_TIMEOUT = 20.0
# A look at one replica's /health has LOOK_TIMEOUT to answer. One that did not is asked for a
# bare connection (_connects, the same budget): accepted, the replica is busy, not gone (a
# saturated vLLM answers its /health late:
# docs/facts.md, "A busy vLLM answers its health check late"); refused, or not accepted in
# time, it is gone.
LOOK_TIMEOUT = 2.0
# Headers a held request keeps when it is sent on to a replica (the gate already checked the key).
FORWARDED = ("authorization", "content-type", "accept", "user-agent", "openai-organization",
             "openai-project", "idempotency-key")  # fmt: skip
# What a replica's answer does not pass on: hop-by-hop, and what aiohttp writes itself.
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-authorization", "proxy-authenticate", "content-length", "server", "date",
       "content-encoding"}  # fmt: skip
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


def log(event: str, **fields: Any) -> None:
    """One JSON line per event, on stdout (the journal)."""
    line = {"event": event, "at": round(time.time(), 3), **fields}
    print(json.dumps(line, sort_keys=True), flush=True)


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Settings:
    listen: tuple[str, int]
    upstreams_dir: Path
    hold_file: Path
    trigger: str  # github | webhook
    stack: str
    token: str
    # The defaults are from_env's, the one place that reads the environment.
    github_api: str
    github_repo: str
    github_workflow: str
    github_ref: str
    webhook_url: str
    webhook_header: str
    hold_seconds: float
    expected_seconds: float
    cooldown_minutes: float
    max_per_day: int
    deadline_minutes: float
    state_file: Path | None
    health_seconds: float
    comment_seconds: float
    asleep_seconds: float
    asleep_looks: int
    busy_seconds: float
    max_held: int
    max_held_bytes: int
    run_poll_seconds: float

    @staticmethod
    def from_env(env: dict[str, str]) -> Settings:
        host, _, port = env.get("WAKE_LISTEN", "127.0.0.1:8092").rpartition(":")
        token_file = env.get("WAKE_TOKEN_FILE", "")
        token = Path(token_file).read_text().strip() if token_file else ""
        trigger = env.get("WAKE_TRIGGER", "github")
        if trigger not in ("github", "webhook"):
            raise SystemExit(f"WAKE_TRIGGER={trigger!r}: accepted: github, webhook")
        if trigger == "webhook" and not (
            env.get("WAKE_WEBHOOK_URL") and env.get("WAKE_WEBHOOK_HEADER")
        ):
            # Never a webhook called without its secret (the program sets both: WakeConfig).
            raise SystemExit("WAKE_TRIGGER=webhook needs WAKE_WEBHOOK_URL and WAKE_WEBHOOK_HEADER")
        for url_key in ("WAKE_GITHUB_API", "WAKE_WEBHOOK_URL"):
            url = urllib.parse.urlsplit(env.get(url_key, ""))
            if url.scheme and url.scheme != "https" and url.hostname != "127.0.0.1":
                raise SystemExit(f"{url_key}: the token goes over HTTPS only")
        state = env.get("WAKE_STATE_FILE", "")
        return Settings(
            listen=(host or "127.0.0.1", int(port)),
            upstreams_dir=Path(env.get("WAKE_UPSTREAMS_DIR", "/etc/caddy/upstreams")),
            hold_file=Path(env.get("WAKE_HOLD_FILE", "/run/nemotron-wake/hold")),
            trigger=trigger,
            stack=env.get("WAKE_STACK", ""),
            token=token,
            github_api=env.get("WAKE_GITHUB_API", "https://api.github.com").rstrip("/"),
            github_repo=env.get("WAKE_GITHUB_REPO", ""),
            github_workflow=env.get("WAKE_GITHUB_WORKFLOW", "deploy.yml"),
            github_ref=env.get("WAKE_GITHUB_REF", "main"),
            webhook_url=env.get("WAKE_WEBHOOK_URL", ""),
            webhook_header=env.get("WAKE_WEBHOOK_HEADER", ""),
            hold_seconds=float(env.get("WAKE_HOLD_SECONDS", "540")),
            expected_seconds=float(env.get("WAKE_EXPECTED_SECONDS", "900")),
            cooldown_minutes=float(env.get("WAKE_COOLDOWN_MINUTES", "10")),
            max_per_day=int(env.get("WAKE_MAX_PER_DAY", "6")),
            deadline_minutes=float(env.get("WAKE_DEADLINE_MINUTES", "45")),
            state_file=Path(state) if state else None,
            health_seconds=float(env.get("WAKE_HEALTH_SECONDS", "2")),
            comment_seconds=float(env.get("WAKE_COMMENT_SECONDS", "10")),
            asleep_seconds=float(env.get("WAKE_ASLEEP_SECONDS", "10")),
            asleep_looks=int(env.get("WAKE_ASLEEP_LOOKS", "3")),
            busy_seconds=float(env.get("WAKE_BUSY_SECONDS", "15")),
            max_held=int(env.get("WAKE_MAX_HELD", "2000")),
            max_held_bytes=int(env.get("WAKE_MAX_HELD_BYTES", "200000000")),
            run_poll_seconds=float(env.get("WAKE_RUN_POLL_SECONDS", "10")),
        )


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


@dataclass
class Refusal:
    """Why a keyed request cannot be served now, when to come back, and whether a client's
    own retry may help (`x-should-retry`)."""

    message: str
    retry_after: int
    code: str = "wake_unavailable"
    retry: bool = False


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
    found = [line.removeprefix(BILLING_HEAD).strip()[:300] for line in lines
             if line.startswith(BILLING_HEAD)]  # fmt: skip
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


def read_bounded(resp: Any, limit: int, deadline: float) -> str:
    """At most `limit` bytes of an answer, read in chunks until `deadline` (a socket timeout
    bounds one read only: a trickle would not end)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit and time.monotonic() < deadline:
        chunk = resp.read(min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 302 comes back as an HTTPError with its Location: urllib would follow it carrying our
    Authorization header to another host."""

    def redirect_request(self, *_: Any) -> None:
        return None


# What one look at one replica found: ready (/health 200), there (any other answer: it exists),
# busy (no answer within LOOK_TIMEOUT, but it accepts connections: it exists, and it stays what
# its last answer said: Waker.heard), or gone (the connection refused or unreachable).
READY, THERE, BUSY, GONE = "ready", "there", "busy", "gone"


@dataclass
class Waker:
    """The set's state. One event loop: no locks; `changed` wakes every held request."""

    s: Settings
    clock: Callable[[], float] = time.time
    # awake | unready (no replica ready, one may exist) | asleep | waking | failed
    mode: str = "unready"
    since: float = field(default_factory=time.time)
    healthy: list[tuple[str, int]] = field(default_factory=list)
    wakes: list[float] = field(default_factory=list)  # start times, the last day's
    reason: str = ""  # why the last wake failed
    failed_at: float | None = None
    timeline: dict[str, Any] = field(default_factory=dict)
    checked_at: float = 0.0
    # Looks in a row that found no replica at all, and when the first of them was; the
    # upstreams the last look listed.
    gone_looks: int = 0
    gone_since: float | None = None
    listed: set[tuple[str, int]] = field(default_factory=set)
    # What each replica's last answer said (READY or THERE), which a busy look keeps; the
    # replicas the last look found busy.
    answered: dict[tuple[str, int], str] = field(default_factory=dict)
    busy: list[tuple[str, int]] = field(default_factory=list)
    # The /health look still waiting on each busy replica (look_one): up to WAKE_BUSY_SECONDS.
    late_looks: dict[tuple[str, int], asyncio.Future[str]] = field(default_factory=dict)
    answered_late: set[tuple[str, int]] = field(default_factory=set)
    held: int = 0
    reading: int = 0  # requests whose bodies are still arriving (counted in held_bytes)
    held_bytes: int = 0
    held_total: int = 0  # since this service started
    turn: int = 0  # round robin over the ready replicas
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    looking: asyncio.Lock = field(default_factory=asyncio.Lock)
    stopping: bool = False  # SIGTERM: held requests are answered, none is woken for
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    # The last look at the pipeline (check_pipeline): can a wake start, and until when.
    pipeline: dict[str, Any] = field(default_factory=dict)
    checking: asyncio.Lock = field(default_factory=asyncio.Lock)
    # What was last logged per subject (once: each said once per change).
    said: dict[str, str] = field(default_factory=dict)

    # ---- state ---------------------------------------------------------------------------------

    def load(self) -> None:
        """The wakes of the last day and the last timeline survive a restart of this service:
        otherwise a crash loop would reset the day's budget."""
        if not self.s.state_file or not self.s.state_file.exists():
            return
        try:
            data = json.loads(self.s.state_file.read_text())
        except (OSError, ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            log("state_reset", why="the state file did not parse")
            return
        # Field by field: one that does not parse is lost alone (the wakes forgotten would
        # reset the day's budget).
        now = self.clock()
        wakes = data.get("wakes")
        self.wakes = [t for t in map(_finite, wakes if isinstance(wakes, list) else [])
                      if t is not None and now - t < DAY]  # fmt: skip
        timeline = data.get("timeline")
        self.timeline = dict(timeline) if isinstance(timeline, dict) else {}
        failed_at = _finite(data.get("failed_at"))
        if failed_at and now - failed_at < self.cooldown():
            self.failed_at, self.reason = failed_at, str(data.get("reason"))
        self.resume(now)

    def resume(self, now: float) -> None:
        """A wake whose pipeline had started, or was being started, when this service stopped (a
        crash; the deploy's own `pulumi up` installing a new waker) goes on as it was: waking,
        its run followed (by its id, or by its title when the stop came before the id was
        saved), never dispatched a second time. A dispatch that never reached GitHub then ends
        at wake.deadlineMinutes, as a run that never brings a replica does."""
        t = self.timeline
        started = "pipeline_started" in t or "dispatching" in t
        if not self.wakes or not started or "ready" in t or "failed" in t:
            return
        if now - self.wakes[-1] < self.s.deadline_minutes * 60:
            self.mode, self.since = "waking", self.wakes[-1]
            log("wake_resumed", run=t.get("run_id"))

    def save(self) -> None:
        if not self.s.state_file:
            return
        data = {"wakes": self.wakes, "timeline": self.timeline, "failed_at": self.failed_at,
                "reason": self.reason}  # fmt: skip
        tmp = self.s.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.s.state_file)

    def cooldown(self) -> float:
        return self.s.cooldown_minutes * 60

    def snapshot(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "mode": self.mode,
            "since": iso(self.since),
            "replicas_healthy": len(self.healthy),
            "replicas_busy": len(self.busy),
            "trigger": self.s.trigger,
            "wakes_last_day": len([t for t in self.wakes if now - t < DAY]),
            "max_per_day": self.s.max_per_day,
            "hold_seconds": self.s.hold_seconds,
            "expected_seconds": self.s.expected_seconds,
            "held": self.held,
            "reading": self.reading,
            "held_total": self.held_total,
            "held_bytes": self.held_bytes,
            "last_failure": self.reason or None,
            "last_wake": self.timeline or None,
            "pipeline": self.pipeline or None,
        }

    def set_mode(self, mode: str, **fields: Any) -> None:
        """A new mode, logged, the hold file set to match, and told to every held request."""
        if mode != self.mode:
            self.mode, self.since = mode, self.clock()
            log("mode", mode=mode, **fields)
        self.route_file()
        self.notify()

    def notify(self) -> None:
        """Every held request looks again. A fresh event each time: one left set would make
        every later wait return at once (the held requests would spin)."""
        self.changed.set()
        self.changed = asyncio.Event()

    def route_file(self) -> None:
        """Caddy sends keyed requests here while this file exists: whenever no replica is
        ready. Awake, it is gone and Caddy proxies to the replicas itself."""
        if self.mode == "awake":
            self.s.hold_file.unlink(missing_ok=True)
        elif not self.s.hold_file.exists():
            self.s.hold_file.parent.mkdir(parents=True, exist_ok=True)
            self.s.hold_file.write_text("hold\n")

    # ---- the guards ------------------------------------------------------------------------------

    def admit(self) -> Refusal | None:
        """Start a wake if the set is asleep and the guards allow; the refusal when they do not.
        Awake, waking, or a replica that exists but is not ready: nothing to start."""
        now = self.clock()
        if self.mode in ("awake", "waking", "unready"):
            return None
        if self.failed_at is not None and now - self.failed_at < self.cooldown():
            return self.cooldown_refusal()
        recent = sorted(t for t in self.wakes if now - t < DAY)
        if len(recent) >= self.s.max_per_day:
            left = int(recent[0] + DAY - now) + 1
            return Refusal(
                f"the GPU set is asleep and today's wakes are spent: {len(recent)} of "
                f"wake.maxPerDay ({self.s.max_per_day}); the next may start in {left} s",
                left,
                "wake_budget_spent",
            )
        self.wakes = [*recent, now]
        self.failed_at, self.reason = None, ""
        self.timeline = {"request_in": iso(now)}
        self.set_mode("waking", trigger=self.s.trigger)
        self.save()
        self.spawn(self.start_pipeline(now))
        return None

    def cooldown_refusal(self) -> Refusal:
        """The last wake failed: why, and when the next may start."""
        left = max(1, int((self.failed_at or 0) + self.cooldown() - self.clock()) + 1)
        return Refusal(
            f"the wake failed: {self.reason}; the next may start in {left} s "
            f"(wake.cooldownMinutes: {self.s.cooldown_minutes:g})",
            left,
            "wake_failed",
        )

    def fail(self, reason: str) -> None:
        """The wake failed; held requests are answered, no retry by itself."""
        if self.mode != "waking":
            return
        self.reason, self.failed_at = reason, self.clock()
        self.timeline["failed"] = iso(self.failed_at)
        self.timeline["reason"] = reason
        self.set_mode("failed", reason=reason)
        self.save()

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ---- the pipeline ----------------------------------------------------------------------------

    async def start_pipeline(self, started: float) -> None:
        # Said before the call: a waker stopped between GitHub's accepting the dispatch and the
        # save below (a SIGKILL, an OOM kill) must not dispatch it again when it starts; it
        # follows the run by its title instead (resume, find_run).
        self.timeline["dispatching"] = iso(self.clock())
        self.save()
        try:
            if self.s.trigger == "github":
                run_id = await asyncio.to_thread(self.dispatch_github)
            else:
                await asyncio.to_thread(self.call_webhook)
                run_id = None
        except PipelineError as err:
            self.fail(str(err))
            return
        if self.mode != "waking":
            return
        self.timeline["pipeline_started"] = iso(self.clock())
        if run_id is not None:
            self.timeline["run_id"] = run_id
        log("pipeline_started", trigger=self.s.trigger, stack=self.s.stack, run=run_id)
        self.save()
        if self.s.trigger == "github":
            await self.watch_github_run(started, run_id)

    def _request(self, method: str, url: str, body: dict[str, Any] | None,
                 headers: dict[str, str]) -> tuple[int, Any]:  # fmt: skip
        data = json.dumps(body).encode() if body is not None else None
        # Settings.from_env allows https:// (and http:// to 127.0.0.1 alone) for these URLs.
        req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=API_TIMEOUT) as resp:  # noqa: S310
                raw = resp.read()
                return resp.status, json.loads(raw) if raw.strip() else None
        except urllib.error.HTTPError as err:
            try:
                detail = json.loads(err.read() or b"null")
            except ValueError:
                detail = None
            return err.code, detail
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
            raise PipelineError(
                f"the pipeline could not be reached: {type(err).__name__}"
            ) from None

    def _github_headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.s.token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "Content-Type": "application/json",
            "User-Agent": "nemotron-droplet-wake",
        }

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
        status, detail = self._request("POST", url, body, self._github_headers())
        said = str((detail or {}).get("message", "")) if isinstance(detail, dict) else ""
        if status == 422 and "return_run_details" in said:
            # A GitHub that does not know the parameter yet: the dispatch as it was before.
            del body["return_run_details"]
            status, detail = self._request("POST", url, body, self._github_headers())
            said = str((detail or {}).get("message", "")) if isinstance(detail, dict) else ""
        if status == 200 and isinstance(detail, dict) and detail.get("workflow_run_id"):
            return int(detail["workflow_run_id"])
        if status in (200, 204):
            return None
        why = {401: "the token was refused", 403: "the token may not run workflows",
               404: "no such repository or workflow (or the token cannot see it)",
               422: "the workflow refused the dispatch"}.get(status, "an error")  # fmt: skip
        raise PipelineError(f"GitHub refused the wake (HTTP {status}: {why}"
                            f"{': ' + said if said else ''})")  # fmt: skip

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
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
            return found | {"warning": f"GitHub could not be reached ({type(err).__name__})"}
        expires = token_expiry(sent.get("github-authentication-token-expiration"))
        found["token_expires"] = iso(expires)
        found["workflow_state"] = body.get("state") if status == 200 else None
        # GitHub's primary limit (x-ratelimit-remaining: 0) and its secondary ones (Retry-After,
        # a message that says so) answer 403 or 429: not the token's fault.
        limited = sent.get("x-ratelimit-remaining") == "0" or sent.get("retry-after") or \
            "rate limit" in str(body.get("message", "")).lower()  # fmt: skip
        if status == 429 or (status == 403 and limited):
            return found | {"warning": "GitHub's rate limit: the pipeline was not checked now"}
        where = f"{self.s.github_repo}'s {self.s.github_workflow}"
        problem = {
            401: "wake.token: GitHub refused it (expired or revoked): make a new one and "
                 "`pulumi config set --secret --path wake.token` (it asks for it), then pulumi up",
            403: f"wake.token may not read {where} (it needs Actions: read and write)",
            404: f"wake.githubRepo, wake.githubWorkflow: {where} is not there, or wake.token "
                 "cannot see it",
        }.get(status)  # fmt: skip
        if problem is None and status != 200:
            return found | {"warning": f"GitHub answered HTTP {status}"}
        if problem is None and found["workflow_state"] != "active":
            problem = (f"{where} is {found['workflow_state']}: enable it (Actions > "
                       f"{self.s.github_workflow} > Enable workflow)")  # fmt: skip
        warnings = []
        if problem is None and self.ref_missing():
            warnings.append(f"wake.githubRef: GitHub says {self.s.github_repo} has no branch "
                            f"{self.s.github_ref!r}: if so, each wake gets 422")  # fmt: skip
        if problem is None and expires is not None and expires - now < TOKEN_WARN_DAYS * DAY:
            warnings.append(f"wake.token expires on {iso(expires)}: make a new one before then, "
                            "or the first wake after it fails")  # fmt: skip
        return found | {"problem": problem, "warning": "; ".join(warnings) or None}

    def _ask_workflow(self) -> tuple[int, Any, Any]:
        """GET the workflow with the token: (status, JSON body or {}, the answer's headers)."""
        headers = {k: v for k, v in self._github_headers().items() if k != "Content-Type"}
        url = self._repo_url(f"workflows/{self.s.github_workflow}")
        req = urllib.request.Request(url, headers=headers)  # noqa: S310 (from_env: https only)
        try:
            with urllib.request.urlopen(req, timeout=API_TIMEOUT) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read(1_000_000) or b"{}"), resp.headers
        except urllib.error.HTTPError as err:
            try:
                said = json.loads(err.read(100_000) or b"{}")
            except (ValueError, http.client.HTTPException, OSError):
                said = {}
            return err.code, said if isinstance(said, dict) else {}, err.headers

    def ref_missing(self) -> bool:
        """Whether the dispatch's branch is known not to exist (GET .../git/ref/heads/{ref}: 404
        once the repository answered; a token without Contents: read gets 403: not known)."""
        url = f"{self.s.github_api}/repos/{self.s.github_repo}/git/ref/heads/{self.s.github_ref}"
        try:
            status, _ = self._request("GET", url, None, self._github_headers())
        except PipelineError:
            return False
        return status == 404

    async def pipeline_checks(self) -> None:
        """check_pipeline on start and every PIPELINE_CHECK_SECONDS; each result logged."""
        while True:
            await self.look_at_pipeline()
            await asyncio.sleep(PIPELINE_CHECK_SECONDS)

    async def look_at_pipeline(self) -> dict[str, Any]:
        """One check_pipeline, kept and logged; one at a time (the phase may ask for one while
        the periodic one runs: it gets that one's answer)."""
        async with self.checking:
            try:
                self.pipeline = await asyncio.to_thread(self.check_pipeline)
            except Exception as err:  # noqa: BLE001 (the next check must still come)
                self.pipeline = {"checked_at": iso(self.clock()), "problem": None,
                                 "warning": f"the check failed ({type(err).__name__})"}  # fmt: skip
            log("pipeline_check", **self.pipeline)
            return self.pipeline

    def call_webhook(self) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "nemotron-droplet-wake",
                   self.s.webhook_header: self.s.token}  # fmt: skip
        body = {"stack": self.s.stack, "event": "wake"}
        status, _ = self._request("POST", self.s.webhook_url, body, headers)
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
        status, body = self._request("GET", url, None, self._github_headers())
        for run in _runs_of(status, body) or []:
            created = _epoch(run.get("created_at"))
            if created is not None and created >= started - 5 and self._title_matches(run) \
                    and _run_id(run) is not None:  # fmt: skip
                return dict(run)
        return None

    def recent_runs(self) -> list[dict[str, Any]] | None:
        """The workflow's newest runs, any event (None when GitHub did not answer them)."""
        url = self._repo_url(f"workflows/{self.s.github_workflow}/runs?per_page=20")
        try:
            status, body = self._request("GET", url, None, self._github_headers())
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

    async def watch_github_run(self, started: float, run_id: int | None) -> None:
        """Follow the run the wake's dispatch queued: one that ends other than in success fails
        the wake with its link; a success leaves the wake to the replicas (their readiness ends
        it, or the deadline)."""

        def found(run_id: int) -> None:
            self.timeline["run_id"] = run_id  # found by its title: kept from now
            self.save()

        ended = await self.follow_run(started, run_id, lambda: self.mode == "waking", found,
                                      self.note_approval)  # fmt: skip
        if ended is None:
            return
        if ended[0]:
            self.timeline["run_succeeded"] = iso(self.clock())
        else:
            self.fail(ended[1])

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
                        self._request, "GET", self._repo_url(f"runs/{run_id}"), None,
                        self._github_headers(),
                    )  # fmt: skip
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

    def note_approval(self, run: dict[str, Any]) -> None:
        """A run that waits for a reviewer (status `waiting`: the deploy job's environment has
        required reviewers) waits on a person, not on the cloud: the timeline and the held
        requests say so, with the run's link, until it runs."""
        waiting = run.get("status") == "waiting"
        if waiting and "run_waiting" not in self.timeline:
            self.timeline["run_waiting"] = iso(self.clock())
            self.timeline["run_url"] = str(run.get("html_url") or "")
            log("run_waiting", run=run.get("id"))
            self.save()
        elif not waiting and "run_waiting" in self.timeline and "run_approved" not in self.timeline:
            self.timeline["run_approved"] = iso(self.clock())
            log("run_approved", run=run.get("id"))
            self.save()

    def awaiting_approval(self) -> str:
        """While the wake's run waits for a reviewer: what to tell held requests; else ''."""
        t = self.timeline
        if self.mode != "waking" or "run_waiting" not in t or "run_approved" in t:
            return ""
        return (f"its deploy run waits for a reviewer to approve the {self.s.stack} "
                f"environment's deployment: {t.get('run_url', '')}")  # fmt: skip

    def failure_of(self, run: dict[str, Any]) -> str:
        """Where and why a run failed, for the held requests: its failed job and step (GET
        .../runs/{id}/jobs) and the program's refusal from that job's log; '' when GitHub does
        not say (the run's link stays the answer)."""
        url = self._repo_url(f"runs/{run.get('id')}/jobs?filter=latest&per_page=100")
        try:
            status, body = self._request("GET", url, None, self._github_headers())
            jobs = body.get("jobs") if status == 200 and isinstance(body, dict) else None
            failed = [j for j in jobs or [] if isinstance(j, dict)
                      and j.get("conclusion") in ("failure", "timed_out")]  # fmt: skip
            if not failed:
                return ""
            steps = [s.get("name") for s in failed[0].get("steps") or []
                     if isinstance(s, dict) and s.get("conclusion") == "failure"]  # fmt: skip
            text = self.job_log(int(failed[0]["id"]))
            problems, billing = refusal_in_log(text), billing_in_log(text)
        except Exception as err:  # noqa: BLE001 (no answer of GitHub's may keep a wake from failing)
            log("run_reason_unread", error=type(err).__name__)
            return ""
        where = f" in job {failed[0].get('name')}" + (f", step {steps[0]}" if steps else "")
        where += f" (the stack was refused: {'; '.join(problems)})" if problems else ""
        return where + (f"; billing: {'; '.join(billing)}" if billing else "")

    def job_log(self, job_id: int) -> str:
        """A job's log (GitHub answers 302 to a storage URL signed for a minute; it is fetched
        without the token, which belongs to GitHub's API alone); '' when it cannot be read."""
        headers = {k: v for k, v in self._github_headers().items() if k != "Content-Type"}
        req = urllib.request.Request(self._repo_url(f"jobs/{job_id}/logs"), headers=headers)  # noqa: S310
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=API_TIMEOUT) as resp:  # a GHES that answers in place
                return read_bounded(resp, LOG_LIMIT, time.monotonic() + LOG_SECONDS)
        except urllib.error.HTTPError as err:
            location = err.headers.get("Location", "") if err.code in (301, 302, 307) else ""
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            return ""
        # HTTPS, or plain HTTP to 127.0.0.1 when the API itself is there (the tests' fake).
        target, api = urllib.parse.urlsplit(location), urllib.parse.urlsplit(self.s.github_api)
        loopback = target.scheme == api.scheme == "http" and target.hostname == "127.0.0.1"
        if not (target.scheme == "https" and target.hostname) and not loopback:
            return ""
        plain = urllib.request.Request(location, headers={"User-Agent": headers["User-Agent"]})  # noqa: S310
        try:
            with urllib.request.urlopen(plain, timeout=API_TIMEOUT) as resp:  # noqa: S310
                return read_bounded(resp, LOG_LIMIT, time.monotonic() + LOG_SECONDS)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            return ""

    # ---- the replicas ----------------------------------------------------------------------------

    def upstreams(self) -> tuple[list[tuple[str, int]], set[tuple[str, int]]]:
        """The replicas in the upstream files, and those of them Caddy routes to: a file whose
        join mark (routed()) is as new as it is."""
        found, routed = [], set()
        for path in sorted(self.s.upstreams_dir.glob("*.caddy")):
            try:
                listed = [(host.strip("[]"), int(port))
                          for host, port in UPSTREAM.findall(path.read_text())]  # fmt: skip
            except OSError:
                continue
            found += listed
            if _routed(path):
                routed.update(listed)
        # An address in two files (one left behind, an address reused) is one replica, looked
        # at once.
        return list(dict.fromkeys(found)), routed

    async def look(self, session: ClientSession) -> None:
        """One look at every replica and the mode that follows. `checked_at` is when it began
        (when it read the upstream files): fresh_look trusts no look that began before it was
        asked, as one that read the files before a member phase wrote one."""
        began = self.clock()
        ups, routed = self.upstreams()
        found = self.heard(ups, await asyncio.gather(*(self.look_one(session, u) for u in ups)))
        now = self.clock()
        self.checked_at = began
        # Ready is what answers /health and what Caddy routes to (its join is marked): a
        # replica whose file is written but whose reload is still under way answers, yet a
        # request Caddy proxied to the replicas now would get Caddy's 503 "no upstreams".
        # Until then it exists (never asleep) and the waker holds.
        self.healthy = [u for u, f in zip(ups, found, strict=True) if f == READY and u in routed]
        for u, f in zip(ups, found, strict=True):
            unrouted = f == READY and u not in routed
            self.once(f"unrouted {u[0]}:{u[1]}", "unrouted" if unrouted else "",
                      "replica_not_routed_yet", replica=f"{u[0]}:{u[1]}")  # fmt: skip
        if set(ups) - self.listed:
            # A replica joined since the last look (its member phase wrote its file): the looks
            # that found none before it say nothing of it; its own count starts now.
            self.gone_looks, self.gone_since = 0, None
        self.listed = set(ups)
        if all(f == GONE for f in found):  # none answered at all (or there are none)
            self.gone_looks += 1
            self.gone_since = self.gone_since or now
        else:
            self.gone_looks, self.gone_since = 0, None
        # A member file newer than the wake: the deploy made a replica and it joined the front
        # (the balancer's member phase writes the file once it is ready).
        joined = any(_mtime(p) > self.since for p in self.s.upstreams_dir.glob("*.caddy"))
        if self.mode == "waking" and joined and "replica_joined" not in self.timeline:
            self.timeline["replica_joined"] = iso(now)
            log("replica_joined")
        gone = not ups or (
            self.gone_looks >= self.s.asleep_looks
            and now - (self.gone_since or now) >= self.s.asleep_seconds
        )
        self.follow(now, gone)
        if self.mode == "asleep" and self.held:
            # Requests held while it was not yet known that no replica exists: wake for them
            # (a refusal reaches them through the mode's notice).
            self.admit()
            self.notify()

    async def look_one(self, session: ClientSession, upstream: tuple[str, int]) -> str:
        """One replica's /health, READY or THERE as it answers, GONE when it cannot be reached.
        One that has not answered within LOOK_TIMEOUT but accepts a bare connection is BUSY, and
        its look goes on: the next look waits on it rather than asking again, so a replica that
        answers late (a saturated vLLM, 3 s, 10 s) is heard, however long its load lasts. A
        look that gets no answer within WAKE_BUSY_SECONDS ends as THERE: hung, not ready."""
        late = self.late_looks.pop(upstream, None)
        task = late or asyncio.ensure_future(_look_at(session, upstream, self.s.busy_seconds))
        done, _ = await asyncio.wait({task}, timeout=LOOK_TIMEOUT)
        if done:
            if late is not None:
                self.answered_late.add(upstream)  # still busy: its answer came late
            return task.result()
        if await _connects(*upstream):
            self.late_looks[upstream] = task
            return BUSY
        task.cancel()
        return GONE

    def heard(self, ups: list[tuple[str, int]], looks: list[str]) -> list[str]:
        """Each replica's state after a look. A busy one (it accepts connections, but did not
        answer within LOOK_TIMEOUT) is what its last answer said: a ready replica too loaded to
        answer in time stays ready (the front stays awake and Caddy keeps proxying to it), one
        never heard from is there (it exists: never gone). For WAKE_BUSY_SECONDS at most: one
        whose look got no answer at all in that time is there, not ready (look_one), as
        Caddy's own checks (a look past catalog.REPLICA_LOOK_TIMEOUT_SECONDS fails) have taken
        it out by then: a hung replica (a wedged process: the kernel still accepts its
        connections) must not keep the front awake for ever. Each replica turning busy is
        logged once (one answering late is still busy: no line each time it answers)."""
        found = []
        late, self.answered_late = self.answered_late, set()
        busy = [u for u, seen in zip(ups, looks, strict=True) if seen == BUSY or u in late]
        for upstream, seen in zip(ups, looks, strict=True):
            name = f"{upstream[0]}:{upstream[1]}"
            counted = self.answered.get(upstream, THERE)
            self.once(f"busy {name}", "busy" if upstream in busy else "", "replica_busy",
                      replica=name, counted_as=counted, budget_seconds=LOOK_TIMEOUT)  # fmt: skip
            if seen == BUSY:
                found.append(counted)
                continue
            found.append(seen)
            if seen == GONE:
                self.answered.pop(upstream, None)
            else:
                self.answered[upstream] = seen
        self.answered = {u: seen for u, seen in self.answered.items() if u in ups}
        for upstream in set(self.late_looks) - set(ups):
            self.late_looks.pop(upstream).cancel()
        self.busy = busy
        listed = {f"{what} {host}:{port}" for host, port in ups for what in ("busy", "unrouted")}
        self.said = {k: v for k, v in self.said.items()
                     if not k.startswith(("busy ", "unrouted ")) or k in listed}  # fmt: skip
        return found

    def follow(self, now: float, gone: bool) -> None:
        """The mode after a look: awake with a ready replica; a wake goes on until its deadline;
        a failure holds for its cooldown; else asleep when no replica exists, unready when one
        may (it answers but is not ready, or has not been missing for long enough)."""
        if self.healthy:
            if self.mode == "waking":
                self.timeline["ready"] = iso(now)
                self.save()
            self.set_mode("awake", replicas=len(self.healthy))
        elif self.mode == "waking":
            if now - self.since > self.s.deadline_minutes * 60:
                self.fail(f"no replica answered within {self.s.deadline_minutes:g} minutes "
                          "(wake.deadlineMinutes)")  # fmt: skip
        elif self.mode != "failed" or now - (self.failed_at or now) >= self.cooldown():
            self.set_mode("asleep" if gone else "unready")

    async def fresh_look(self, session: ClientSession) -> None:
        """A look that begins after this call, one at a time: a caller that finds one under way
        takes the result of the next."""
        asked = self.clock()
        async with self.looking:
            if self.checked_at > asked:
                return
            await self.look(session)

    async def monitor(self, session: ClientSession) -> None:
        """Every WAKE_HEALTH_SECONDS, a look at the replicas."""
        while True:
            try:
                await self.fresh_look(session)
            except Exception as err:  # noqa: BLE001 (the monitor must outlive any one look)
                log("look_failed", error=type(err).__name__)
            await asyncio.sleep(self.s.health_seconds)

    async def wait(self, deadline: float, tick: float) -> None:
        """Until the mode changes, the deadline, or the next tick."""
        left = min(deadline - self.clock(), tick)
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    def next_replica(self) -> list[tuple[str, int]]:
        """The ready replicas, starting with the next in turn."""
        ready = list(self.healthy)
        if not ready:
            return []
        self.turn = (self.turn + 1) % len(ready)
        return ready[self.turn :] + ready[: self.turn]

    def once(self, subject: str, value: str, event: str = "", **fields: Any) -> None:
        """Log `event` when `subject` says something new (a replica turning busy): once per
        change, not every look. An empty value only forgets."""
        if self.said.get(subject) != value:
            self.said[subject] = value
            if value and event:
                log(event, **fields)


async def _look_at(session: ClientSession, upstream: tuple[str, int], seconds: float) -> str:
    """A replica's /health given `seconds` to answer: READY (200), THERE (any other answer, or
    none in time: it accepted the connection, Waker.look_one asked, so it is hung, not gone),
    GONE (refused, unreachable). aiohttp's total timeout does not say which part ran out (3.8's
    timeout errors have no subclass for it): look_one's bare connect at LOOK_TIMEOUT does."""
    host, port = upstream
    try:
        async with session.get(f"http://{host}:{port}/health",
                               timeout=ClientTimeout(total=seconds)) as resp:  # fmt: skip
            return READY if resp.status == 200 else THERE
    except TimeoutError:
        return THERE
    except (ClientError, OSError, RuntimeError):  # RuntimeError: the session closed (a stop)
        return GONE


async def _connects(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), LOOK_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


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


def _routed(path: Path) -> bool:
    """Caddy routes to the replica of upstream file `path`: its member phase (member.sh) wrote
    the file's join mark (the file's name and JOINED_SUFFIX, which Caddy's import glob and the
    router's start script do not match) after Caddy's reload and the router's add_worker, and
    not before the file (a join that rewrote the file starts over: its mark comes after)."""
    try:
        return (path.parent / (path.name + JOINED_SUFFIX)).stat().st_mtime_ns >= (
            path.stat().st_mtime_ns
        )
    except OSError:
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def error_body(refusal: Refusal) -> bytes:
    """OpenAI's error shape, so clients print the message."""
    return json.dumps({"error": {"message": refusal.message, "type": "service_unavailable",
                                 "code": refusal.code, "param": None}}).encode()  # fmt: skip


def refusal_response(refusal: Refusal) -> web.Response:
    """503 with the reason. `x-should-retry` tells OpenAI's clients whether their own retry
    helps (openai-python _base_client.py _should_retry reads it first, unless Retry-After is
    over 120 s)."""
    headers = {"Retry-After": str(refusal.retry_after),
               "x-should-retry": "true" if refusal.retry else "false"}  # fmt: skip
    return web.Response(status=503, body=error_body(refusal), headers=headers,
                        content_type="application/json")  # fmt: skip


def _is_stream(body: bytes) -> bool:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("stream") is True


SSE_REPLICA_FAILED = {"error": {"message": "no replica answered the held request",
                                 "type": "service_unavailable", "code": "replica_failed",
                                 "param": None}}  # fmt: skip
SSE_REPLICA_CUT = {"error": {"message": "the replica stopped mid-answer",
                             "type": "service_unavailable", "code": "replica_failed",
                             "param": None}}  # fmt: skip


async def sse_error(out: web.StreamResponse, error: bytes) -> None:
    """End a stream whose 200 is out with an error event (the OpenAI clients raise on an SSE
    event whose data holds `error`) and [DONE]."""
    try:
        data = json.loads(error)
    except ValueError:
        data = None
    if not (isinstance(data, dict) and "error" in data):
        data = {"error": {"message": error.decode(errors="replace")[:500],
                          "type": "service_unavailable", "code": None, "param": None}}  # fmt: skip
    await out.write(b"data: " + json.dumps(data).encode() + b"\n\ndata: [DONE]\n\n")
    await out.write_eof()


@dataclass
class Place:
    """One held request's bytes in the hold's count (Waker.held_bytes), which never passes
    WAKE_MAX_HELD_BYTES: grown before the bytes are taken, given back when the request ends."""

    waker: Waker
    size: int = 0

    def grow(self, to: int) -> bool:
        """Count `to` bytes for this request, if the hold has room for the difference."""
        more = to - self.size
        if more <= 0:
            return True
        if self.waker.held_bytes + more > self.waker.s.max_held_bytes:
            return False
        self.waker.held_bytes += more
        self.size = to
        return True

    def full(self) -> str:
        bound = self.waker.s.max_held_bytes
        return f"the bodies held may not pass {bound} bytes (WAKE_MAX_HELD_BYTES)"

    def release(self) -> None:
        self.waker.held_bytes -= self.size
        self.size = 0


@dataclass
class Front:
    """The waker's HTTP side: /health, the control path, and the held requests. Two client
    sessions, each with its own pool (sessions()): `relays` carries the held requests to a
    replica, `looks` the replicas' /health."""

    waker: Waker
    relays: ClientSession
    looks: ClientSession

    def app(self) -> web.Application:
        application = web.Application(client_max_size=MAX_BODY)
        application.router.add_get("/health", self.health)  # HEAD too (aiohttp's allow_head)
        application.router.add_route("GET", CONTROL_PATH, self.control)
        application.router.add_route("POST", CONTROL_PATH, self.control)
        application.router.add_route("*", "/{tail:.*}", self.hold)
        return application

    async def health(self, _: web.Request) -> web.Response:
        w = self.waker
        return web.json_response(
            {"status": w.mode, "since": iso(w.since), "expected_seconds": w.s.expected_seconds},
            status=200 if w.mode == "awake" else 503,
        )

    async def control(self, request: web.Request) -> web.Response:
        """GET: the state. POST: wake now, within the same guards as a request."""
        w = self.waker
        if request.method == "POST":
            if w.mode == "unready":
                why = "no wake: a replica exists but is not ready yet (starting or draining)"
                return refusal_response(Refusal(why, 30))
            refusal = w.admit()
            if refusal:
                return refusal_response(refusal)
            return web.json_response(w.snapshot(), status=202)
        if request.query.get("pipeline") == "check":
            # The wake phase's fresh look (Caddy's gate passes this path without a query, so
            # only the front itself asks): after a fix that changed nothing on the front (a
            # workflow enabled, a token given more permissions) the old answer must not stand.
            await w.look_at_pipeline()
        return web.json_response(w.snapshot())

    async def hold(self, request: web.Request) -> web.StreamResponse:
        """A keyed request Caddy sent while no replica was ready: counted, held, relayed. Its
        place counts the bytes it declared before a byte is read, then those that arrive as
        they arrive (a chunked body declares none), so the bodies held never pass
        WAKE_MAX_HELD_BYTES, however many come at once."""
        w, s = self.waker, self.waker.s
        if not request.path.startswith("/v1/"):
            # The gate sends only the API's routes here: anything else wakes nothing.
            return web.Response(status=404, text="not found")
        place = Place(w)
        if w.held + w.reading >= s.max_held:
            return self.busy(f"at most {s.max_held} are held (WAKE_MAX_HELD)")
        if not place.grow(request.content_length or 0):
            return self.busy(place.full())
        try:
            # Held (and woken for) once its body is in: a body that never ends wakes nothing.
            w.reading += 1
            try:
                body = await self.read_body(request, place)
            finally:
                w.reading -= 1
            if isinstance(body, web.Response):
                return body
            w.held += 1
            w.held_total += 1
            try:
                return await self.held_request(request, body)
            finally:
                w.held -= 1
        finally:
            place.release()

    async def read_body(self, request: web.Request, place: Place) -> bytes | web.Response:
        """The body as it arrives, each piece counted in `place` before it is kept: the busy
        answer the moment the held bodies would pass WAKE_MAX_HELD_BYTES."""
        pieces: list[bytes] = []
        got = 0
        async for piece in request.content.iter_any():
            got += len(piece)
            if got > MAX_BODY:
                return web.Response(status=413, text=f"request body over {MAX_BODY} bytes")
            if not place.grow(got):
                return self.busy(place.full())
            pieces.append(piece)
        return b"".join(pieces)

    def busy(self, why: str) -> web.Response:
        """503, retry shortly: the hold is full (its count or its bytes), and which."""
        w = self.waker
        log("held_full", held=w.held, held_bytes=w.held_bytes)
        return refusal_response(Refusal(
            f"the front holds {w.held} requests ({w.held_bytes} bytes of bodies) already while "
            f"the GPU set wakes: {why}; retry shortly", 5, "front_busy", retry=True))  # fmt: skip

    async def held_request(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Wait for a ready replica (progress comments on a stream), or answer why not."""
        w, s = self.waker, self.waker.s
        started = time.monotonic()
        deadline = w.clock() + s.hold_seconds
        stream = _is_stream(body)
        sse: web.StreamResponse | None = None
        while True:
            if w.mode == "awake" and w.healthy:
                return await self.forward(request, body, sse)
            if w.mode == "asleep":
                # Look again before a wake: a replica that joined since the last look (the
                # deploy's own ready probe comes a moment after) must not wake the set.
                await w.fresh_look(self.looks)
                if w.mode == "awake" and w.healthy:
                    continue
            now = w.clock()
            refusal = w.admit() if w.mode == "asleep" and not w.stopping else None
            if refusal is None and (w.stopping or w.mode == "failed" or now >= deadline):
                refusal = self.held_refusal(int(time.monotonic() - started), now)
            if refusal is not None:
                log("held_answered", outcome=refusal.code, waited=int(time.monotonic() - started))
                if sse is None:
                    return refusal_response(refusal)
                await sse_error(sse, error_body(refusal))
                return sse
            if stream and sse is None:
                sse = web.StreamResponse(status=200, headers={
                    "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})  # fmt: skip
                await sse.prepare(request)
            if sse is not None:
                approval = w.awaiting_approval()
                await sse.write(
                    (f": {w.mode}: {approval}\n\n" if approval else
                     f": {w.mode}: the GPU set is starting ({int(now - w.since)} s so far, about "
                     f"{int(s.expected_seconds)} s expected)\n\n").encode()
                )  # fmt: skip
            await w.wait(deadline, s.comment_seconds)

    def held_refusal(self, waited: int, now: float) -> Refusal:
        w, s = self.waker, self.waker.s
        if w.stopping:
            # The client's retry reaches the next waker: through a restart the hold file stays
            # and Caddy retries the connection until it listens (components/host/wake.py).
            return Refusal("the front's waker is restarting (or stopping); retry now",
                           1, "waker_restarting", retry=True)  # fmt: skip
        if w.mode == "failed":
            return w.cooldown_refusal()
        what = "waking" if w.mode == "waking" else "not ready (starting or draining)"
        if approval := w.awaiting_approval():
            what = f"waking ({approval})"
        left = max(30, int(s.expected_seconds - (now - w.since)))
        # Retry at once: the next try is held again (the hold is the wait); a client that
        # honours Retry-After up to 60 s (older openai-python) or 120 s (2.52+) retries it.
        return Refusal(
            f"the GPU set is still {what} after {waited} s (wake.holdSeconds: "
            f"{s.hold_seconds:g}); about {left} s more expected",
            1,
            "waking",
            retry=True,
        )

    async def forward(self, request: web.Request, body: bytes,
                      sse: web.StreamResponse | None) -> web.StreamResponse:  # fmt: skip
        """Send the held request to a ready replica and relay its answer. A replica that
        cannot be reached before it answers is skipped for the next (a chat completion has no
        side effect until it answers); after progress comments, a failure is an SSE error."""
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        for host, port in self.waker.next_replica():
            try:
                async with self.relays.request(
                    request.method, f"http://{host}:{port}{request.raw_path}", data=body or None,
                    headers=headers, timeout=ClientTimeout(total=FORWARD_TIMEOUT, sock_connect=5),
                    allow_redirects=False,
                ) as resp:  # fmt: skip
                    return await self.relay(request, resp, sse)
            except (ClientError, OSError, TimeoutError) as err:
                log("forward_failed", error=type(err).__name__)
        failed = json.dumps(SSE_REPLICA_FAILED).encode()
        if sse is not None:
            await sse_error(sse, failed)
            return sse
        return web.Response(status=502, body=failed, content_type="application/json",
                            headers={"x-should-retry": "true"})  # fmt: skip

    async def relay(self, request: web.Request, resp: Any,
                    sse: web.StreamResponse | None) -> web.StreamResponse:  # fmt: skip
        """The replica's answer as it comes; the wake's first token noted."""
        w = self.waker
        if sse is not None and resp.status != 200:
            # The stream's 200 is out: the replica's error goes as the SSE error event.
            await sse_error(sse, await resp.read())
            return sse
        out = sse
        if out is None:
            out = web.StreamResponse(status=resp.status, reason=resp.reason)
            for k, v in resp.headers.items():
                if k.lower() not in HOP:
                    out.headers.add(k, v)
            await out.prepare(request)
        try:
            async for chunk in resp.content.iter_any():
                if "first_token" not in w.timeline and "ready" in w.timeline:
                    w.timeline["first_token"] = iso(w.clock())
                    log("first_token")
                    w.save()
                await out.write(chunk)
        except (ClientError, OSError, TimeoutError) as err:
            log("forward_cut", error=type(err).__name__)
            if sse is not None or "text/event-stream" in resp.headers.get("Content-Type", ""):
                await sse_error(out, json.dumps(SSE_REPLICA_CUT).encode())
            elif request.transport is not None:
                # Any other answer is cut as the replica cut it: ended cleanly, its half would
                # pass for a whole one (a 200 whose JSON does not parse, not retried); cut, the
                # client sees a connection error, which the OpenAI clients retry.
                request.transport.close()
            return out
        await out.write_eof()
        return out


def _cancel_on_disconnect() -> dict[str, Any]:
    """A held request whose client went away is let go at once (its place and its body's
    bytes freed): aiohttp 3.9+ does so with `web_server.Server`'s `handler_cancellation`, off
    by default (the front's Ubuntu 24.04 has python3-aiohttp 3.9.1). 3.8 refuses the keyword,
    so it is passed only where the server takes it; there (Debian 12's 3.8.4, which the
    emulation's front runs) a gone client keeps its place until its hold ends, since 3.8.2
    no longer cancels (aio-libs/aiohttp#6727)."""
    accepted = inspect.signature(web_server.Server.__init__).parameters
    return {"handler_cancellation": True} if "handler_cancellation" in accepted else {}


def sessions(settings: Settings) -> tuple[ClientSession, ClientSession]:
    """The relays' client session and the looks'. One session shared them (aiohttp's default
    pool: 100 connections, aiohttp connector.py TCPConnector `limit=100`): past 100 held
    requests whose answers took a while, the rest waited for a connection, and so did the
    looks, which then timed out and called a serving replica unready (issue 42). The relays'
    pool is what the front promises to hold, WAKE_MAX_HELD (a held request is relayed once,
    on one connection, while it counts in `held`), so none waits for another; the looks' pool
    is their own, unbounded (a look per replica at most), so none waits
    behind a relay."""
    relays = ClientSession(auto_decompress=False,
                           connector=TCPConnector(limit=settings.max_held))  # fmt: skip
    looks = ClientSession(auto_decompress=False, connector=TCPConnector(limit=0))
    return relays, looks


async def serve(settings: Settings) -> None:
    waker = Waker(settings)
    waker.load()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    relays, looks = sessions(settings)
    async with relays, looks:
        await waker.look(looks)  # the hold file matches the replicas before the first request
        waker.route_file()
        if waker.mode == "waking" and settings.trigger == "github":
            waker.spawn(waker.watch_github_run(waker.since, waker.timeline.get("run_id")))
        runner = web.AppRunner(Front(waker, relays, looks).app(), access_log=None,
                               handle_signals=False, **_cancel_on_disconnect())  # fmt: skip
        await runner.setup()
        # Many held requests may arrive at once while the set wakes: a deep accept queue.
        site = web.TCPSite(runner, settings.listen[0], settings.listen[1], backlog=4096)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else settings.listen[1]
        log("listening", address=f"{settings.listen[0]}:{bound}", trigger=settings.trigger,
            stack=settings.stack, mode=waker.mode)  # fmt: skip
        monitor = asyncio.ensure_future(waker.monitor(looks))
        checks = asyncio.ensure_future(waker.pipeline_checks())
        await stop.wait()
        monitor.cancel()
        checks.cancel()
        # Held requests are answered (retry now), and the hold file stays: through a restart
        # systemd keeps its folder (RuntimeDirectoryPreserve=restart) and Caddy, still sending
        # keyed requests here, retries the connection until the next waker listens; a stop
        # removes the folder, and Caddy proxies to the replicas (components/host/wake.py).
        waker.stopping = True
        waker.notify()
        await runner.cleanup()


def main() -> int:
    asyncio.run(serve(Settings.from_env(dict(os.environ))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
