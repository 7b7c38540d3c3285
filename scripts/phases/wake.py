#!/usr/bin/env python3
"""wake: the front's waker. When no replica exists, a keyed request wakes the GPU set, once, and
is held until a replica answers it.

Runs on the balancer Droplet (the front that holds the endpoint's address) as its own service,
on loopback. Caddy asks it before each keyed API request ('forward_auth' to GET /route, after
the gate has checked the key): while a replica is healthy it answers 'Nemotron-Route: awake'
and Caddy proxies to the replicas as always; while none is, 'Nemotron-Route: hold' and Caddy
proxies the request here, where it is held. Unkeyed requests never reach this service, so scans
and bots wake nothing.

A wake starts the user's own deploy pipeline, which holds the cloud secrets (this service holds
no DigitalOcean token and never creates or deletes a Droplet): GitHub Actions' workflow_dispatch
of the deploy workflow for this stack (WAKE_TRIGGER=github; a fine-grained token limited to
Actions on one repository; POST /repos/{repo}/actions/workflows/{workflow}/dispatches, GitHub
REST "Create a workflow dispatch event"), or a generic webhook (WAKE_TRIGGER=webhook: a POST
with a secret header). One wake at a time; after one fails, none for WAKE_COOLDOWN_MINUTES; at
most WAKE_MAX_PER_DAY in any 24 hours. A refusal names the setting.

Held requests: a streamed one ('"stream": true') gets its 200 and SSE comment lines at once
(': waking ...', every WAKE_COMMENT_SECONDS) so the client sees progress, then the replica's
stream; any other request waits silently. Once a replica answers /health, each held request is
sent to it as it came. Past WAKE_HOLD_SECONDS, or when the wake failed (the pipeline refused,
its run failed, no replica answered within WAKE_DEADLINE_MINUTES), held requests get 503 with
Retry-After and an OpenAI-style error body saying why (a stream: an SSE error event). A failed
wake is never retried by itself: the next keyed request after the cooldown starts the next one.

State for people and tools: GET /state (JSON: mode, since, the last wake's timeline: request in,
pipeline started, a replica joined, ready, first token; wakes in the last day), POST /wake (wake
now, the same guards), GET /health (200 while awake, else 503 with the mode and since when).
Every event is one JSON log line (the journal); the pipeline's token is never printed.

Settings (environment; the token from the file WAKE_TOKEN_FILE, a systemd credential):
WAKE_LISTEN, WAKE_UPSTREAMS_DIR (Caddy's upstream files: 'to <host>:<port>'), WAKE_TRIGGER,
WAKE_STACK, WAKE_GITHUB_API, WAKE_GITHUB_REPO, WAKE_GITHUB_WORKFLOW, WAKE_GITHUB_REF,
WAKE_WEBHOOK_URL, WAKE_WEBHOOK_HEADER, WAKE_HOLD_SECONDS, WAKE_EXPECTED_SECONDS,
WAKE_COOLDOWN_MINUTES, WAKE_MAX_PER_DAY, WAKE_DEADLINE_MINUTES, WAKE_STATE_FILE,
WAKE_HEALTH_SECONDS, WAKE_COMMENT_SECONDS. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# One upstream per file, as the balancer phase writes them ('to 10.110.0.2:8080').
UPSTREAM = re.compile(r"^\s*to\s+([0-9A-Za-z.\-\[\]:]+):([0-9]{1,5})\s*$", re.M)
DAY = 86400.0
# The keyed control path the gate sends here as it came, forward_auth's two paths (a keyed
# request, which may wake the set; the /health probe, which never does) and the header of its
# answer: components/wake.py's values (tests/test_wake.py holds them equal).
CONTROL_PATH = "/nemotron/wake"
ROUTE_URI, PROBE_URI = "/route", "/probe"
ROUTE_HEADER = "Nemotron-Route"
MAX_BODY = 16_000_000  # the gate's own limit: nothing larger gets this far
FORWARD_TIMEOUT = 3600.0  # a held request, once sent, may generate for long
API_TIMEOUT = 20.0
# A look at the replicas older than this is looked at again before a keyed request is routed.
FRESH_SECONDS = 5.0
# Headers a held request keeps when it is sent on to a replica (the gate already checked the key).
FORWARDED = ("authorization", "content-type", "accept", "user-agent", "openai-organization")
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
       "proxy-authorization", "proxy-authenticate", "content-length",
       "server", "date"}  # the last two: send_response() writes its own  # fmt: skip


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
        )


@dataclass
class Refusal:
    """Why a keyed request cannot be served now, and when to come back."""

    message: str
    retry_after: int
    code: str = "wake_unavailable"


@dataclass
class Waker:
    """The set's state, shared by the request threads and the monitor thread (under 'cond')."""

    s: Settings
    clock: Callable[[], float] = time.time
    mode: str = "asleep"  # awake | asleep | waking | failed
    since: float = field(default_factory=time.time)
    healthy: list[tuple[str, int]] = field(default_factory=list)
    wakes: list[float] = field(default_factory=list)  # start times, the last day's
    reason: str = ""  # why the last wake failed
    failed_at: float | None = None
    timeline: dict[str, Any] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    checking: threading.Lock = field(default_factory=threading.Lock)
    checked_at: float = 0.0  # when the replicas were last looked at

    # ---- state ---------------------------------------------------------------------------------

    def load(self) -> None:
        """The wakes of the last day and the last timeline survive a restart of this service:
        otherwise a crash loop would reset the day's budget."""
        if not self.s.state_file or not self.s.state_file.exists():
            return
        try:
            data = json.loads(self.s.state_file.read_text())
            now = self.clock()
            self.wakes = [float(t) for t in data.get("wakes", []) if now - float(t) < DAY]
            self.timeline = dict(data.get("timeline") or {})
            if data.get("failed_at") and now - float(data["failed_at"]) < self.cooldown():
                self.failed_at, self.reason = float(data["failed_at"]), str(data.get("reason"))
        except (OSError, ValueError, TypeError, AttributeError):
            log("state_reset", why="the state file did not parse")

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
        with self.cond:
            now = self.clock()
            return {
                "mode": self.mode,
                "since": iso(self.since),
                "replicas_healthy": len(self.healthy),
                "trigger": self.s.trigger,
                "wakes_last_day": len([t for t in self.wakes if now - t < DAY]),
                "max_per_day": self.s.max_per_day,
                "hold_seconds": self.s.hold_seconds,
                "expected_seconds": self.s.expected_seconds,
                "last_failure": self.reason or None,
                "last_wake": self.timeline or None,
            }

    def set_mode(self, mode: str, **fields: Any) -> None:
        """Under the lock: a new mode, logged and told to every held request."""
        if mode != self.mode:
            self.mode, self.since = mode, self.clock()
            log("mode", mode=mode, **fields)
        self.cond.notify_all()

    # ---- the guards ------------------------------------------------------------------------------

    def admit(self) -> Refusal | None:
        """Under the lock: start a wake if the set sleeps and the guards allow; the refusal
        when they do not. Awake or already waking: nothing to do."""
        now = self.clock()
        if self.mode in ("awake", "waking"):
            return None
        if self.failed_at is not None and now - self.failed_at < self.cooldown():
            left = int(self.failed_at + self.cooldown() - now) + 1
            return Refusal(
                f"the last wake failed ({self.reason}); the next may start in {left} s "
                f"(wake.cooldownMinutes: {self.s.cooldown_minutes:g})",
                left,
            )
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
        threading.Thread(target=self.start_pipeline, args=(now,), daemon=True).start()
        return None

    def fail(self, reason: str) -> None:
        """Under the lock: the wake failed; held requests are answered, no retry by itself."""
        self.reason, self.failed_at = reason, self.clock()
        self.timeline["failed"] = iso(self.failed_at)
        self.timeline["reason"] = reason
        self.set_mode("failed", reason=reason)
        self.save()

    # ---- the pipeline ----------------------------------------------------------------------------

    def start_pipeline(self, started: float) -> None:
        try:
            if self.s.trigger == "github":
                self.dispatch_github()
            else:
                self.call_webhook()
        except PipelineError as err:
            with self.cond:
                if self.mode == "waking":
                    self.fail(str(err))
            return
        with self.cond:
            self.timeline["pipeline_started"] = iso(self.clock())
            log("pipeline_started", trigger=self.s.trigger, stack=self.s.stack)
            self.save()
        if self.s.trigger == "github":
            self.watch_github_run(started)

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
        except (urllib.error.URLError, OSError, ValueError) as err:
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

    def dispatch_github(self) -> None:
        """POST .../dispatches: 204 when the run is queued (GitHub REST, actions/workflows)."""
        url = (f"{self.s.github_api}/repos/{self.s.github_repo}/actions/workflows/"
               f"{self.s.github_workflow}/dispatches")  # fmt: skip
        body = {"ref": self.s.github_ref,
                "inputs": {"stack": self.s.stack, "command": "up", "refresh": "true"}}  # fmt: skip
        status, detail = self._request("POST", url, body, self._github_headers())
        if status != 204:
            said = (detail or {}).get("message", "") if isinstance(detail, dict) else ""
            why = {401: "the token was refused", 403: "the token may not run workflows",
                   404: "no such repository or workflow (or the token cannot see it)",
                   422: "the workflow refused the inputs"}.get(status, "an error")  # fmt: skip
            raise PipelineError(f"GitHub refused the wake (HTTP {status}: {why}"
                                f"{': ' + said if said else ''})")  # fmt: skip

    def call_webhook(self) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "nemotron-droplet-wake",
                   self.s.webhook_header: self.s.token}  # fmt: skip
        status, _ = self._request("POST", self.s.webhook_url,
                                  {"stack": self.s.stack, "event": "wake"}, headers)  # fmt: skip
        if not 200 <= status < 300:
            raise PipelineError(f"the webhook refused the wake (HTTP {status})")

    def watch_github_run(self, started: float) -> None:
        """Follow the run the dispatch queued: one that ends other than in success fails the
        wake with its link (GET .../runs?event=workflow_dispatch)."""
        url = (f"{self.s.github_api}/repos/{self.s.github_repo}/actions/workflows/"
               f"{self.s.github_workflow}/runs?event=workflow_dispatch&per_page=10")  # fmt: skip
        while True:
            time.sleep(max(1.0, self.s.health_seconds * 5))
            with self.cond:
                if self.mode != "waking":
                    return
            try:
                status, body = self._request("GET", url, None, self._github_headers())
            except PipelineError:
                continue
            if status != 200 or not isinstance(body, dict):
                continue
            for run in body.get("workflow_runs") or []:
                created = _epoch(run.get("created_at"))
                # This stack's run (deploy.yml's run-name), queued by this dispatch: not another
                # stack's, not one started by hand before it.
                name = str(run.get("display_name") or "")
                if (
                    created is None
                    or created < started - 5
                    or f"deploy {self.s.stack} " not in name
                ):
                    continue
                ended = run.get("status") == "completed"
                # A newer dispatch cancels a queued one (deploy.yml's concurrency): keep waiting.
                if ended and run.get("conclusion") not in ("success", "cancelled"):
                    with self.cond:
                        if self.mode == "waking":
                            self.fail(f"the deploy run ended {run.get('conclusion')}: "
                                      f"{run.get('html_url', '')}")  # fmt: skip
                    return

    # ---- the replicas ----------------------------------------------------------------------------

    def upstreams(self) -> list[tuple[str, int]]:
        found = []
        for path in sorted(self.s.upstreams_dir.glob("*.caddy")):
            try:
                for host, port in UPSTREAM.findall(path.read_text()):
                    found.append((host.strip("[]"), int(port)))
            except OSError:
                continue
        return found

    def check(self) -> None:
        """One look at the replicas (each one's /health) and the mode that follows. One look at
        a time: a caller that finds one under way waits for its result."""
        asked = self.clock()
        with self.checking:
            if self.checked_at >= asked:
                return  # a look that began after this call was made has just ended: its result
            healthy = [u for u in self.upstreams() if _healthy(u)]
            with self.cond:
                self.healthy = healthy
                now = self.clock()
                self.checked_at = now
                # A member file newer than the wake: the deploy made a replica and it joined
                # the front (the balancer's member phase writes the file once it is ready).
                joined = any(_mtime(p) > self.since for p in self.s.upstreams_dir.glob("*.caddy"))
                if self.mode == "waking" and joined and "replica_joined" not in self.timeline:
                    self.timeline["replica_joined"] = iso(now)
                    log("replica_joined")
                if healthy and self.mode != "awake":
                    if self.mode == "waking":
                        self.timeline["ready"] = iso(now)
                        self.save()
                    self.set_mode("awake", replicas=len(healthy))
                elif not healthy and self.mode == "awake":
                    self.set_mode("asleep")
                elif self.mode == "waking" and now - self.since > self.s.deadline_minutes * 60:
                    self.fail(f"no replica answered within {self.s.deadline_minutes:g} minutes "
                              "(wake.deadlineMinutes)")  # fmt: skip
                elif self.mode == "failed" and now - (self.failed_at or now) >= self.cooldown():
                    self.set_mode("asleep")

    def monitor(self) -> None:
        """Every WAKE_HEALTH_SECONDS, a look at the replicas."""
        while True:
            self.check()
            time.sleep(self.s.health_seconds)

    def wait(self, deadline: float, tick: float) -> tuple[str, list[tuple[str, int]]]:
        """Block a held request until awake, failed, the deadline or the next tick; the mode
        and the replicas that answered, read together under the lock."""
        with self.cond:
            end = min(deadline, self.clock() + tick)
            while self.mode == "waking" and self.clock() < end:
                self.cond.wait(timeout=max(0.05, end - self.clock()))
            return self.mode, list(self.healthy)


class PipelineError(Exception):
    pass


def _epoch(text: Any) -> float | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _healthy(upstream: tuple[str, int]) -> bool:
    conn = http.client.HTTPConnection(*upstream, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def error_body(refusal: Refusal) -> bytes:
    """OpenAI's error shape, so clients print the message."""
    return json.dumps({"error": {"message": refusal.message, "type": "service_unavailable",
                                 "code": refusal.code, "param": None}}).encode()  # fmt: skip


def handler(waker: Waker) -> type[BaseHTTPRequestHandler]:
    s = waker.s

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass  # every event is logged by name; never a request line (it may hold a key)

        def send_json(self, status: int, body: bytes, retry_after: int | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if retry_after is not None:
                self.send_header("Retry-After", str(retry_after))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in (ROUTE_URI, PROBE_URI):
                return self.route(may_wake=self.path == ROUTE_URI)
            if self.path == CONTROL_PATH:
                return self.send_json(200, json.dumps(waker.snapshot()).encode())
            if self.path == "/health":
                snap = waker.snapshot()
                status = 200 if snap["mode"] == "awake" else 503
                return self.send_json(status, json.dumps(
                    {"status": snap["mode"], "since": snap["since"],
                     "expected_seconds": s.expected_seconds}).encode())  # fmt: skip
            return self.hold()

        def do_POST(self) -> None:
            if self.path == CONTROL_PATH:
                with waker.cond:
                    refusal = waker.admit()
                if refusal:
                    return self.send_json(503, error_body(refusal), refusal.retry_after)
                return self.send_json(202, json.dumps(waker.snapshot()).encode())
            return self.hold()

        def route(self, may_wake: bool) -> None:
            """forward_auth: awake, or hold (a wake started; or, for the health probe, which
            never wakes, the waker's own answer), or the refusal as the answer."""
            with waker.cond:
                # Look again before a wake (the monitor's last look may be seconds old, and a
                # replica that just joined must not wake the set), and before "awake" on an old
                # look (a set autodown just deleted must be held and woken, not proxied to).
                old = waker.clock() - waker.checked_at > FRESH_SECONDS
                stale = may_wake and (waker.mode != "awake" or old)
            if stale:
                waker.check()
            with waker.cond:
                if waker.mode == "awake":
                    route = "awake"
                elif not may_wake:
                    route = "hold"
                else:
                    refusal = waker.admit()
                    if refusal:
                        log("refused", why=refusal.code)
                        return self.send_json(503, error_body(refusal), refusal.retry_after)
                    route = "hold"
            self.send_response(200)
            self.send_header(ROUTE_HEADER, route)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def hold(self) -> None:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                # Caddy passes a chunked body through; OpenAI clients send a length.
                self.close_connection = True
                return self.send_json(411, b'{"error":{"message":"send a Content-Length"}}')
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.close_connection = True  # the unread body must not pass for a request
                return self.send_json(413, b'{"error":{"message":"body too large"}}')
            body = self.rfile.read(length) if length else b""
            stream = _is_stream(body)
            started = time.monotonic()
            deadline = waker.clock() + s.hold_seconds
            commented = False
            while True:
                mode, healthy = waker.wait(deadline, s.comment_seconds)
                if mode == "awake" and healthy:
                    return self.forward(healthy[0], body, commented)
                now = waker.clock()
                if mode in ("failed", "asleep") or now >= deadline:
                    waited = int(time.monotonic() - started)
                    if mode == "failed":
                        refusal = Refusal(f"the wake failed: {waker.reason}",
                                          int(waker.cooldown()) or 60, "wake_failed")  # fmt: skip
                    elif mode == "asleep":
                        refusal = Refusal("the GPU set is asleep and no wake is running", 60)
                    else:
                        left = max(30, int(s.expected_seconds - (now - waker.since)))
                        refusal = Refusal(
                            f"the GPU set is still waking after {waited} s (wake.holdSeconds: "
                            f"{s.hold_seconds:g}); retry in about {left} s",
                            left,
                            "waking",
                        )
                    log("held_answered", outcome=refusal.code, waited=waited)
                    if commented:
                        self.wfile.write(b"data: " + error_body(refusal) + b"\n\n")
                        self.wfile.write(b"data: [DONE]\n\n")
                        self.wfile.flush()
                        self.close_connection = True
                        return None
                    return self.send_json(503, error_body(refusal), refusal.retry_after)
                if stream:
                    if not commented:
                        self.send_response(200)
                        self.send_header("Content-Type", "text/event-stream")
                        self.send_header("Cache-Control", "no-cache")
                        self.send_header("Connection", "close")
                        self.end_headers()
                        commented = True
                    since = int(now - waker.since)
                    self.wfile.write(
                        f": waking: the GPU set is starting ({since} s so far, about "
                        f"{int(s.expected_seconds)} s expected)\n\n".encode()
                    )
                    self.wfile.flush()

        def forward(self, upstream: tuple[str, int], body: bytes, commented: bool) -> None:
            """Send the held request to a replica that answered and relay its answer (after
            progress comments, the stream's status line is already out)."""
            host, port = upstream
            headers = {k: v for k, v in self.headers.items() if k.lower() in FORWARDED}
            conn = http.client.HTTPConnection(host, port, timeout=FORWARD_TIMEOUT)
            try:
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                first, sent = True, commented
                if not commented:
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in HOP:
                            self.send_header(k, v)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    sent = True
                self.close_connection = True
                while chunk := resp.read1(65536):
                    if first:
                        first = False
                        with waker.cond:
                            if "first_token" not in waker.timeline and "ready" in waker.timeline:
                                waker.timeline["first_token"] = iso(waker.clock())
                                log("first_token")
                                waker.save()
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (OSError, http.client.HTTPException) as err:
                log("forward_failed", error=type(err).__name__)
                if not sent:  # one status line per response: after it, the stream just ends
                    self.send_json(502, b'{"error":{"message":"the replica did not answer"}}')
            finally:
                conn.close()

    return Handler


def _is_stream(body: bytes) -> bool:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("stream") is True


def main() -> int:
    settings = Settings.from_env(dict(os.environ))
    waker = Waker(settings)
    waker.load()
    server = ThreadingHTTPServer(settings.listen, handler(waker))
    server.daemon_threads = True
    threading.Thread(target=waker.monitor, daemon=True).start()
    log("listening", address=f"{settings.listen[0]}:{server.server_address[1]}",
        trigger=settings.trigger, stack=settings.stack)  # fmt: skip
    server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
