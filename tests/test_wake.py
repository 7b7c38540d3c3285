"""scripts/phases/wake/, the front's waker, for real on loopback: a fake GitHub as strict as
GitHub's REST API (tests/support/stack/github_api.py), fake replicas (tests/support/fake_openai.py)
behind the upstream files Caddy reads, and clients that send what Caddy sends it while its hold
file exists; then behind the real Caddy with the balancer's Caddyfile as the gateway phase renders
it, asleep and awake, with the shipped settings, a burst, a silent hold past a minute and the
official OpenAI client at its default retries."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import aiohttp
import fake_openai
import front_bench
import loopback
import nemodrop_cli
import openai
import pytest
import requests
import script_module
from pulumi_harness import stack_config
from sandbox import CADDY, free_port
from stack import github_api
from stack.github_api import GitHub
from test_gateway import KEY, adapt, run_caddy
from test_gateway_attacks import Upstream, read_body

from components.host import gateway, wake
from components.spec import catalog, config

ROOT = Path(__file__).resolve().parent.parent
WAKER = ROOT / "scripts" / "phases" / "wake"
# The waker's code, every module of it: what it reads and sends, read from its source.
WAKE_SOURCE = "\n".join(path.read_text() for path in sorted(WAKER.glob("*.py")))
TOKEN = "github_pat_WAKEtestTOKEN000000000000000000000000"
API_KEY = KEY  # the gateway's test key (test_gateway.spawn_caddy gives Caddy this one)
CHAT = {"model": "nemotron", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
KEYED = {"Authorization": f"Bearer {API_KEY}"}
DISPATCH = {"ref": "main", "inputs": {"stack": "dev", "command": "up", "refresh": "true"}}


@dataclass
class FakeGitHub(GitHub):
    """The shared strict fake GitHub for the repository and workflow the waker is set up with
    here; `refuse` answers an accepted dispatch with that status instead, `on_dispatch` is the
    pipeline an accepted one starts, `old` answers as a GitHub Enterprise that predates
    `return_run_details` (204, no run id)."""

    repo: str = "me/llm"
    workflow: str = "deploy.yml"
    token: str = TOKEN
    refuse: int | None = None
    old: bool = False
    on_dispatch: Callable[[], None] | None = None

    def answer(
        self, method: str, path: str, auth: str, body: bytes, origin: str = ""
    ) -> tuple[int, Any]:
        if self.old and method == "POST" and body:
            request = json.loads(body)
            if "return_run_details" in request:
                return 422, {"message": "Invalid request.\n\n\"return_run_details\" is not a "
                                        "permitted key."}  # fmt: skip
        if method == "POST" and self.refuse:
            return self.refuse, {"message": "refused"}  # and no run queued
        status, reply = super().answer(method, path, auth, body, origin)
        if status in (200, 204) and method == "POST" and self.on_dispatch:
            threading.Thread(target=self.on_dispatch, daemon=True).start()
        return status, reply

    def wait_dispatches(self, count: int, seconds: float = 10) -> None:
        """The waker dispatches from a task of its own: a test that has seen the wake begin
        waits for its POST to arrive before counting it (then it must be exactly `count`)."""
        end = time.monotonic() + seconds
        while len(self.dispatches) < count and time.monotonic() < end:
            time.sleep(0.05)
        assert len(self.dispatches) == count, self.dispatches


@dataclass
class Front:
    """The waker on loopback, its upstream folder, its hold file and the fakes around it."""

    url: str
    upstreams: Path
    hold_file: Path
    github: FakeGitHub
    proc: subprocess.Popen[str]
    env: dict[str, str]
    replicas: list[subprocess.Popen[str]] = field(default_factory=list)
    # Behind a Caddy (caddy_front): a join is marked complete after Caddy's reload, as the
    # member phase does; on its own, nothing routes but the waker: at once.
    behind_caddy: bool = False

    def start_replica(self, name: str = "r0", *args: str) -> None:
        """What the deploy does in the end: a replica answers and joins the balancer."""
        fake = fake_openai.start("--tokens", "4", "--itl", "0.01", *args, key=API_KEY)
        self.replicas.append(fake.proc)
        self.join(name, fake.port)

    def join(self, name: str, port: int) -> None:
        """The member phase's file (member.sh); its join mark once Caddy routes to it."""
        (self.upstreams / f"{name}.caddy").write_text(f"to 127.0.0.1:{port}\n")
        if not self.behind_caddy:
            mark_joined(self.upstreams)

    def stop_replicas(self) -> None:
        for proc in self.replicas:
            proc.kill()
            proc.wait()
        self.replicas.clear()

    def send(self, body: dict[str, Any], stream: bool = False, path: str = "/v1/chat/completions",
             timeout: float = 60) -> requests.Response:  # fmt: skip
        """A keyed request, as Caddy sends it on while the hold file exists."""
        return requests.post(f"{self.url}{path}", json=body, stream=stream, headers=KEYED,
                             timeout=timeout)  # fmt: skip

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = requests.get(f"{self.url}{wake.CONTROL_PATH}", timeout=5).json()
        return data

    def wait_mode(self, mode: str, seconds: float = 10) -> None:
        end = time.monotonic() + seconds
        while self.state()["mode"] != mode:
            assert time.monotonic() < end, f"not {mode}: {self.state()}"
            time.sleep(0.05)

    def wake_in_background(self, body: dict[str, Any] | None = None) -> list[requests.Response]:
        """A held request on its own thread (its answer lands in the list)."""
        return in_background(lambda: self.send(body or CHAT))

    def wait_held(self, count: int, seconds: float = 10) -> dict[str, Any]:
        """Until `count` requests are held and no body is still arriving; the state then."""
        end = time.monotonic() + seconds
        while ((state := self.state())["held"], state["reading"]) != (count, 0):
            assert time.monotonic() < end, state
            time.sleep(0.05)
        return state


def mark_joined(upstreams: Path) -> None:
    """The member phase's last step for each file in `upstreams`: its join mark, written after
    Caddy's reload (a mark already as new as its file stays)."""
    for path in upstreams.glob("*.caddy"):
        mark = path.parent / (path.name + catalog.BALANCER_JOINED_SUFFIX)
        if not mark.exists() or mark.stat().st_mtime_ns < path.stat().st_mtime_ns:
            mark.write_text(path.read_text())


def in_background(send: Callable[[], requests.Response]) -> list[requests.Response]:
    """`send` on its own thread (its answer lands in the list). A test that ends while it is
    still held stops the waker under it: that lost answer is nobody's failure."""
    answers: list[requests.Response] = []

    def held() -> None:
        with contextlib.suppress(requests.ConnectionError):
            answers.append(send())

    threading.Thread(target=held, daemon=True).start()
    return answers


def later(seconds: float, then: Callable[[], None]) -> Callable[[], None]:
    """The fake pipeline: `then` (a replica joins) after `seconds` of deploying."""

    def run() -> None:
        time.sleep(seconds)
        then()

    return run


# Fast looks for the tests; test_the_shipped_settings_hold_silently_past_a_minute_through_caddy
# runs the values the program renders.
FAST = {"WAKE_HOLD_SECONDS": "30", "WAKE_EXPECTED_SECONDS": "5", "WAKE_HEALTH_SECONDS": "0.2",
        "WAKE_COMMENT_SECONDS": "0.3", "WAKE_ASLEEP_SECONDS": "0.6", "WAKE_ASLEEP_LOOKS": "2",
        "WAKE_RUN_POLL_SECONDS": "0.2"}  # fmt: skip


@pytest.fixture
def front_factory(tmp_path: Path) -> Iterator[Callable[..., Front]]:
    fronts: list[Front] = []
    servers = []

    def make(github: FakeGitHub | None = None, fast: bool = True, like: Front | None = None,
             **settings: str) -> Front:  # fmt: skip
        """A waker; `like`: the next one after that one stopped, with its address, folders
        and state (systemd restarting it)."""
        github = like.github if like else github or FakeGitHub()
        server = github_api.serve(github, socket.create_server(("127.0.0.1", 0)), None)
        servers.append(server)
        upstreams = tmp_path / f"upstreams{len(fronts)}"
        upstreams.mkdir(exist_ok=True)
        hold = tmp_path / f"run{len(fronts)}" / "hold"
        if like:
            upstreams, hold = like.upstreams, like.hold_file
            settings = {**like.env, "WAKE_GITHUB_API": loopback.url(server),
                        "WAKE_LISTEN": like.url.removeprefix("http://"), **settings}  # fmt: skip
        token = tmp_path / "token"
        token.write_text(TOKEN + "\n")
        command, run_env = script_module.package_command(WAKER)
        env = {
            **rendered_env(), **run_env,
            "PATH": os.environ["PATH"], "WAKE_LISTEN": "127.0.0.1:0",
            "WAKE_UPSTREAMS_DIR": str(upstreams), "WAKE_HOLD_FILE": str(hold),
            "WAKE_TRIGGER": "github", "WAKE_STACK": "dev",
            "WAKE_TOKEN_FILE": str(token), "WAKE_GITHUB_API": loopback.url(server),
            "WAKE_GITHUB_REPO": "me/llm", "WAKE_GITHUB_WORKFLOW": "deploy.yml",
            "WAKE_STATE_FILE": str(tmp_path / f"state{len(fronts)}.json"),
            **(FAST if fast else {}), **settings,
        }  # fmt: skip
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        assert proc.stdout is not None
        # Its first look comes before it listens (the hold file matches the replicas first).
        first = json.loads(proc.stdout.readline())
        while first["event"] in ("mode", "wake_resumed"):
            first = json.loads(proc.stdout.readline())
        assert first["event"] == "listening", first
        front = Front(f"http://{first['address']}", upstreams, hold, github, proc, env)
        fronts.append(front)
        return front

    yield make
    for front in fronts:
        front.stop_replicas()
        front.proc.kill()
        out, _ = front.proc.communicate(timeout=10)
        assert TOKEN not in out, "the pipeline's token is never logged"
        assert API_KEY not in out, "nor the API key of a held request"
    for server in servers:
        loopback.stop(server)


# ---- the waker on its own ----------------------------------------------------------------------


def test_a_keyed_request_wakes_the_set_once_and_is_held_until_a_replica_answers(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github)
    github.on_dispatch = later(1.0, front.start_replica)
    assert front.state()["mode"] == "asleep", "no upstream file: no replica exists"
    assert front.hold_file.exists(), "asleep, Caddy sends keyed requests to the waker"
    answers: list[requests.Response] = []
    held = [threading.Thread(target=lambda: answers.append(front.send(CHAT))) for _ in range(3)]
    for thread in held:
        thread.start()
    for thread in held:
        thread.join(timeout=30)
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert answers[0].json()["choices"][0]["message"]["content"]
    assert github.dispatches == [DISPATCH], "three held requests, one wake"
    front.wait_mode("awake")
    assert not front.hold_file.exists(), "awake, Caddy proxies to the replicas itself"
    last = front.state()["last_wake"]
    assert list(last) == [
        "request_in", "dispatching", "pipeline_started", "run_id", "replica_joined", "ready",
        "first_token",
    ]  # fmt: skip
    assert last["run_id"] == github.runs[0]["id"], "the run the dispatch answered with"


def test_a_streamed_request_gets_its_200_and_a_first_comment_at_once(
    front_factory: Callable[..., Front],
) -> None:
    """At the shipped comment interval (10 s): the 200 and the first progress comment come at
    once, not at the first tick; then the replica's stream."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_COMMENT_SECONDS=str(wake.COMMENT_SECONDS))
    github.on_dispatch = later(2.0, front.start_replica)
    started = time.monotonic()
    with front.send({**CHAT, "stream": True}, stream=True) as answer:
        assert answer.status_code == 200 and time.monotonic() - started < 1.5
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        lines = answer.iter_lines(decode_unicode=True)
        first = next(line for line in lines if line)
        assert time.monotonic() - started < 1.5 and first.startswith(": waking"), first
        rest = [line for line in lines if line]
    data = [line for line in rest if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    chunks = [json.loads(d.removeprefix("data: ")) for d in data[:-1]]
    assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)


@pytest.mark.parametrize("conclusion", ["failure", "startup_failure", "timed_out"])
def test_a_run_that_ends_badly_answers_the_held_requests_with_why_and_is_not_retried(
    front_factory: Callable[..., Front], conclusion: str
) -> None:
    """The run is followed by the id the dispatch answered with; GitHub names it by
    display_title. A startup_failure (a broken workflow file) ends a wake like any failure."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_COOLDOWN_MINUTES="5")
    github.on_dispatch = later(0.5, lambda: github.finish_run(conclusion))
    started = time.monotonic()
    answer = front.send(CHAT)
    assert answer.status_code == 503 and time.monotonic() - started < 20
    error = answer.json()["error"]
    assert error["code"] == "wake_failed"
    run = github.runs[0]
    where = {"failure": " in job deploy, step Run pulumi/actions@v7", "timed_out": " in job deploy",
             "startup_failure": ""}[conclusion]  # a startup_failure runs no job  # fmt: skip
    assert f"the deploy run ended {conclusion}{where}: {run['html_url']}" in error["message"]
    assert answer.headers["x-should-retry"] == "false", "no client retry can help"
    assert int(answer.headers["Retry-After"]) > 0
    time.sleep(1.5)
    assert len(github.dispatches) == 1, "a failed wake is not retried by itself"
    again = front.send(CHAT)
    assert again.status_code == 503
    assert "wake.cooldownMinutes: 5" in again.json()["error"]["message"]
    assert len(github.dispatches) == 1


# What a refused `pulumi up` prints in the deploy job, as pulumi/actions streams the CLI's output
# (the program's one message: components/spec/config.py ConfigError), and the action's own
# error line after it.
REFUSED_LOG = [
    "Updating (dev)",
    "    pulumi:pulumi:Stack nemotron-droplet-dev running error: the stack configuration has 1 problem(s); nothing was created:",
    "Diagnostics:",
    "  pulumi:pulumi:Stack (nemotron-droplet-dev):",
    "    error: the stack configuration has 1 problem(s); nothing was created:",
    "      - droplet.size: gpu-h100x1-80gb is not offered in nyc2 today, where this stack's front Droplet 7 (nemotron-dev-lb) stay (offered in: tor1); wait and wake or up again",
    "",
    "##[error]code: 255",
]  # fmt: skip


def test_a_refused_up_reaches_the_held_requests_in_the_programs_own_words(
    front_factory: Callable[..., Front],
) -> None:
    """A wake whose `pulumi up` the program refuses (the size sold out where the front is): the
    held request's 503 names the failed job and step and quotes the refusal, read from the job's
    log. GitHub answers the log with a 302 to a storage URL signed for a minute; the fake
    storage refuses a request that carries the token, so a waker that followed the redirect
    with its Authorization header would get no reason here."""
    github = FakeGitHub()
    front = front_factory(github)
    github.on_dispatch = later(0.5, lambda: github.finish_run("failure", log=REFUSED_LOG))
    answer = front.send(CHAT)
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert "ended failure in job deploy, step Run pulumi/actions@v7 (the stack was refused: " \
        "droplet.size: gpu-h100x1-80gb is not offered in nyc2 today" in message, message  # fmt: skip
    assert message.count("not offered in nyc2") == 1, "the repeated diagnostics are said once"
    assert "code: 255" not in message and "Diagnostics" not in message
    assert github.signed, "the log was asked for through GitHub's redirect"
    assert front.state()["last_wake"]["reason"] == front.state()["last_failure"]


# A wake whose up failed at the driver phase, then deploy.yml's clean-up (lease.py --failed-up).
FAILED_UP_LOG = [
    "Diagnostics:",
    "    error: phase driver failed: see its output above",
    "##[error]code: 255",
    "billing: the failed up of stack dev made 1 GPU Droplet(s); 1 deleted ($3.39/h stopped)",
    "billing: nemotron-dev (7, $3.39/h): made by this run: deleted",
]


def test_a_failed_wake_says_what_its_clean_up_deleted(
    front_factory: Callable[..., Front],
) -> None:
    """Issue 42: the operator of a 3 a.m. wake that failed learns from the held request's 503
    (and the front's state) whether anything still bills: the clean-up's `billing:` lines,
    read from the failed job's log."""
    github = FakeGitHub()
    front = front_factory(github)
    github.on_dispatch = later(0.5, lambda: github.finish_run("failure", log=FAILED_UP_LOG))
    answer = front.send(CHAT)
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert ("step Run pulumi/actions@v7; billing: the failed up of stack dev made 1 GPU "
            "Droplet(s); 1 deleted ($3.39/h stopped); nemotron-dev (7, $3.39/h): made by this "
            "run: deleted") in message, message  # fmt: skip
    assert "1 deleted ($3.39/h stopped)" in front.state()["last_failure"]


def pipeline_of(front: Front) -> dict[str, Any]:
    """The waker's look at the pipeline, taken on start (check_pipeline)."""
    end = time.monotonic() + 10
    while not (found := front.state()["pipeline"]):
        assert time.monotonic() < end, "the waker did not look at the pipeline"
        time.sleep(0.05)
    return dict(found)


def expires_in(days: float) -> str:
    """A token's expiry as GitHub's header gives it."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() + days * 86400))


def test_on_start_the_waker_says_whether_a_wake_could_start_and_until_when(
    front_factory: Callable[..., Front],
) -> None:
    """The workflow is there and active and the token accepted: no problem, and the token's
    expiry (GitHub's github-authentication-token-expiration header) in the state."""
    front = front_factory(FakeGitHub(token_expires=expires_in(60)))
    found = pipeline_of(front)
    assert found["problem"] is None and found["warning"] is None, found
    assert found["workflow_state"] == "active" and found["token_expires"].startswith("20")
    assert front.github.dispatches == [], "a look dispatches nothing"


@pytest.mark.parametrize(
    ("github", "problem", "warning"),
    [
        (lambda: FakeGitHub(token_expires=expires_in(3)), None, "wake.token expires on "),
        (lambda: FakeGitHub(workflow_state="disabled_inactivity"),
         "me/llm's deploy.yml is disabled_inactivity: enable it", None),
        (lambda: FakeGitHub(token=TOKEN + "x"), "wake.token: GitHub refused it", None),
        (lambda: FakeGitHub(rate_limited=True), None, "GitHub's rate limit: the pipeline was"),
        (lambda: FakeGitHub(secondary_limited=True), None, "GitHub's rate limit: the pipeline"),
        (lambda: FakeGitHub(branches=frozenset({"trunk"})), None,
         "wake.githubRef: GitHub says me/llm has no branch 'main'"),
        (lambda: FakeGitHub(workflow="other.yml"),
         "wake.githubRepo, wake.githubWorkflow: me/llm's deploy.yml is not there", None),
    ],
    ids=["expiring", "disabled", "refused", "rate-limited", "secondary-limit", "no-branch",
         "missing"],
)  # fmt: skip
def test_a_pipeline_that_would_fail_a_wake_is_said_on_start_not_at_the_wake(
    front_factory: Callable[..., Front],
    github: Callable[[], FakeGitHub],
    problem: str | None,
    warning: str | None,
) -> None:
    """A fine-grained token ends (30 days by default); GitHub disables a public repository's
    workflows after 60 days without activity: the waker says so when it starts (the wake phase
    of `pulumi up` prints it) and every 6 hours, not at the first wake after."""
    front = front_factory(github())
    found = pipeline_of(front)
    assert (found["problem"] or "").startswith(problem or "") and bool(found["problem"]) == bool(
        problem
    ), found
    assert (found["warning"] or "").startswith(warning or "") and bool(found["warning"]) == bool(
        warning
    ), found
    assert TOKEN not in json.dumps(found)


def test_a_fix_that_changes_nothing_on_the_front_is_seen_by_the_next_look(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    """The workflow GitHub disabled is enabled again: nothing on the front changes, so the wake
    phase's next run asks for a fresh look (?pipeline=check) and passes; only the front itself
    may ask for one (Caddy's gate passes the exact control path alone), keyed or not."""
    github = FakeGitHub(workflow_state="disabled_inactivity")
    front = front_factory(github)
    assert pipeline_of(front)["problem"], "the disabled workflow is a problem"
    github.workflow_state = "active"
    assert front.state()["pipeline"]["problem"], "the last look stands until a new one"
    fresh = requests.get(f"{front.url}{wake.CONTROL_PATH}?pipeline=check", timeout=60).json()
    assert fresh["pipeline"]["problem"] is None, fresh["pipeline"]
    cf = caddy_front(front)
    asked = len(github.asked)
    for headers in ({}, KEYED):
        outside = requests.get(f"{cf.url}{wake.CONTROL_PATH}?pipeline=check", headers=headers,
                               timeout=10)  # fmt: skip
        assert outside.status_code in (401, 404), (outside.status_code, outside.text)
    assert len(github.asked) == asked, "no look at GitHub from outside the front"


@pytest.mark.parametrize("fault", ["expired", "storage-refuses", "no-log-yet", "cut"])
def test_a_log_that_cannot_be_read_still_names_the_job_and_step(
    front_factory: Callable[..., Front], fault: str
) -> None:
    """The log's signed URL expired, the storage refuses, GitHub has no log yet (404), or the
    download is cut mid-way: the answer still names the failed job and step, at once."""
    github = FakeGitHub()
    front = front_factory(github)
    github.log_fault = fault
    github.on_dispatch = later(0.5, lambda: github.finish_run("failure", log=REFUSED_LOG))
    started = time.monotonic()
    message = front.send(CHAT).json()["error"]["message"]
    assert time.monotonic() - started < 20
    assert "ended failure in job deploy, step Run pulumi/actions@v7: https://github.com/" in message
    assert "refused" not in message, message


def test_a_wake_cancelled_in_the_concurrency_group_fails_naming_the_run_that_replaced_it(
    front_factory: Callable[..., Front],
) -> None:
    """A push deploys (in progress); the wake's run queues behind it (pending); a second push
    queues and GitHub cancels the pending wake run, even with cancel-in-progress: false, in a
    pipeline whose group keeps GitHub's default queue (deploy.yml's `queue: max` never does:
    test_a_push_queued_behind_a_pending_wake_cancels_nothing). The wake fails saying so, and
    the push run is not taken for the wake's own."""
    github = FakeGitHub(queue="single")
    github.push()
    front = front_factory(github)
    answers = front.wake_in_background()
    github.wait_dispatches(1)
    wake_run = github.runs[-1]
    assert wake_run["status"] == "pending"
    newer = github.push()
    assert wake_run["conclusion"] == "cancelled"
    end = time.monotonic() + 20
    while not answers:
        assert time.monotonic() < end
        time.sleep(0.05)
    [answer] = answers
    assert answer.status_code == 503
    message = answer.json()["error"]["message"]
    assert f"the deploy run was cancelled by the newer push run {newer['html_url']}" in message
    assert wake_run["html_url"] in message


def test_a_push_queued_behind_a_pending_wake_cancels_nothing() -> None:
    """deploy.yml's group keeps every pending run (`queue: max`): a push queued behind a wake
    that waits for a running deploy leaves the wake's run to run next, then the push's."""
    github = FakeGitHub()
    assert github.queue == "max", "the fake reads deploy.yml's queue"
    running = github.push()
    wake = github.wake()
    newer = github.push()
    assert [r["status"] for r in github.runs] == ["in_progress", "pending", "pending"]
    github.finish_run("success", run_id=running["id"])
    assert [r["status"] for r in github.runs[1:]] == ["in_progress", "pending"]
    assert github.runs[1]["id"] == wake["id"] and github.runs[2]["id"] == newer["id"]
    assert all(r["conclusion"] != "cancelled" for r in github.runs)


def test_an_older_github_without_run_details_is_followed_by_the_runs_title(
    front_factory: Callable[..., Front],
) -> None:
    """A GitHub Enterprise that refuses `return_run_details`: the dispatch is sent again
    without it (204), and the run is found among the workflow_dispatch runs by display_title."""
    github = FakeGitHub(old=True)
    front = front_factory(github)
    github.on_dispatch = later(0.5, lambda: github.finish_run("failure"))
    answer = front.send(CHAT)
    assert answer.status_code == 503
    message = answer.json()["error"]["message"]
    assert (
        f"ended failure in job deploy, step Run pulumi/actions@v7: {github.runs[0]['html_url']}"
        in message
    )
    assert github.dispatches == [DISPATCH]


def test_a_refused_token_fails_the_wake_with_githubs_reason(
    front_factory: Callable[..., Front],
) -> None:
    front = front_factory(FakeGitHub(refuse=403))
    answer = front.send(CHAT)
    assert answer.status_code == 503
    message = answer.json()["error"]["message"]
    assert "GitHub refused the wake (HTTP 403: the token may not run workflows" in message


def test_a_ref_or_stack_github_does_not_know_fails_the_wake_with_its_422(
    front_factory: Callable[..., Front],
) -> None:
    """The strict fake refuses as GitHub does (and validate says so before the first wake)."""
    front = front_factory(WAKE_GITHUB_REF="release")
    answer = front.send(CHAT)
    assert "HTTP 422" in answer.json()["error"]["message"]
    assert "No ref found for: release" in answer.json()["error"]["message"]
    other = front_factory(WAKE_STACK="staging")
    message = other.send(CHAT).json()["error"]["message"]
    assert "'staging' for input 'stack' not in the list of allowed values" in message


def test_the_day_budget_refuses_naming_wake_max_per_day(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github, WAKE_MAX_PER_DAY="1")
    github.on_dispatch = front.start_replica
    assert front.send(CHAT).status_code == 200
    front.wait_mode("awake")
    front.stop_replicas()  # autodown deleted the set
    front.wait_mode("asleep")
    refused = front.send(CHAT)
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) > 80000
    assert refused.headers["x-should-retry"] == "false"
    error = refused.json()["error"]
    assert error["code"] == "wake_budget_spent" and "wake.maxPerDay (1)" in error["message"]
    assert len(github.dispatches) == 1


def test_a_hold_past_wake_hold_seconds_asks_the_client_to_retry_at_once(
    front_factory: Callable[..., Front],
) -> None:
    front = front_factory(WAKE_HOLD_SECONDS="1.5", WAKE_EXPECTED_SECONDS="120")
    started = time.monotonic()
    answer = front.send(CHAT)
    assert answer.status_code == 503 and 1.4 < time.monotonic() - started < 10
    message = answer.json()["error"]["message"]
    assert "still waking" in message and "wake.holdSeconds: 1.5" in message
    # openai-python retries it (x-should-retry) after Retry-After, and the retry is held again.
    assert answer.headers["x-should-retry"] == "true" and answer.headers["Retry-After"] == "1"
    assert front.state()["mode"] == "waking", "the wake goes on for the next request"


def test_a_run_waiting_for_a_reviewer_is_said_to_held_requests_until_it_is_approved(
    front_factory: Callable[..., Front],
) -> None:
    """The deploy job's environment has required reviewers: the wake's run waits (status
    `waiting`) on a person, not on the cloud. A held request is told so, with the run's link,
    instead of "about N s more expected"; once approved, the wake goes on as any other."""
    github = FakeGitHub(reviewers=True)
    front = front_factory(github, WAKE_HOLD_SECONDS="2", WAKE_EXPECTED_SECONDS="120")
    answer = front.send(CHAT)
    assert answer.status_code == 503, answer.text
    run = github.runs[0]
    message = answer.json()["error"]["message"]
    assert "still waking (its deploy run waits for a reviewer to approve the dev environment's " \
           f"deployment: {run['html_url']})" in message, message  # fmt: skip
    assert answer.headers["x-should-retry"] == "true"
    with front.send({**CHAT, "stream": True}, stream=True) as streamed:
        first = next(line for line in streamed.iter_lines(decode_unicode=True) if line)
    assert first == f": waking: its deploy run waits for a reviewer to approve the dev " \
                    f"environment's deployment: {run['html_url']}", first  # fmt: skip
    assert "run_waiting" in front.state()["last_wake"]

    github.approve(run["id"])
    github.on_dispatch = None
    end = time.monotonic() + 10
    while "run_approved" not in front.state()["last_wake"]:
        assert time.monotonic() < end, front.state()
        time.sleep(0.05)
    front.start_replica()
    assert front.send(CHAT).status_code == 200
    assert len(github.dispatches) == 1, "approval goes on with the same wake"


def test_health_get_and_head_answer_the_mode_and_never_wake(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github)
    health = requests.get(f"{front.url}/health", timeout=5)
    assert health.status_code == 503 and health.json()["status"] == "asleep"
    head = requests.head(f"{front.url}/health", timeout=5)
    assert head.status_code == 503 and head.content == b""
    time.sleep(0.5)
    assert github.dispatches == [], "/health is not a keyed request: it wakes nothing"
    front.wake_in_background()
    front.wait_mode("waking")
    health = requests.get(f"{front.url}/health", timeout=5).json()
    assert health["status"] == "waking" and health["since"].endswith("Z")
    github.wait_dispatches(1)


def raw_exchange(url: str, data: bytes, seconds: float = 3) -> bytes:
    """Bytes on one connection, and whatever comes back within `seconds`."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=seconds) as sock:
        sock.sendall(data)
        got = b""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            got += chunk
        return got


# An attacker's request with no key, hidden in a body: Caddy's gate never sees it as a request,
# and the waker (which trusts the gate and checks no key) would hold it and wake the set if it
# read it as one.
SMUGGLED = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: 2\r\n\r\n{}")  # fmt: skip


def test_a_body_on_health_is_never_read_as_a_request(
    front_factory: Callable[..., Front],
) -> None:
    """The desync that woke the set: a /health whose body is a keyed request. The body is the
    body (framed by its length, or its chunks), never a second request."""
    github = FakeGitHub()
    front = front_factory(github)
    by_length = (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(SMUGGLED)).encode()
                 + b"\r\n\r\n" + SMUGGLED)  # fmt: skip
    chunk = hex(len(SMUGGLED))[2:].encode()
    by_chunks = (b"GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk
                 + b"\r\n" + SMUGGLED + b"\r\n0\r\n\r\n")  # fmt: skip
    for attack in (by_length, by_chunks):
        got = raw_exchange(front.url, attack, 2)
        assert got.count(b"HTTP/1.1 ") == 1 and b" 503 " in got.split(b"\r\n")[0], got[:200]
    time.sleep(0.5)
    assert github.dispatches == [] and front.state()["mode"] == "asleep"
    # The keyed control path with a body: the next request on the connection is its own.
    wake_now = (b"GET " + wake.CONTROL_PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 5\r\n\r\nhello"
                b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # fmt: skip
    got = raw_exchange(front.url, wake_now, 2)
    assert got.count(b"HTTP/1.1 200 ") == 1 and got.count(b"HTTP/1.1 503 ") == 1, got[:400]
    assert b" 501 " not in got


def test_the_day_budget_survives_a_restart_of_the_waker(
    front_factory: Callable[..., Front],
) -> None:
    """A crash loop must not reset the day's wakes: a wake that failed, the waker killed and
    started again, and the next keyed request meets wake.maxPerDay (no cooldown here, so the
    budget is what answers)."""
    github = FakeGitHub()
    github.on_dispatch = later(0.3, lambda: github.finish_run("failure"))
    front = front_factory(github, WAKE_MAX_PER_DAY="1", WAKE_COOLDOWN_MINUTES="0")
    assert front.send(CHAT).json()["error"]["code"] == "wake_failed"
    front.proc.kill()
    front.proc.wait()
    again = front_factory(like=front)
    refused = again.send(CHAT)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "wake_budget_spent"
    assert len(github.dispatches) == 1


def test_keyed_requests_with_a_query_are_held_woken_for_and_answered(
    front_factory: Callable[..., Front],
) -> None:
    """GET /v1/models?limit=5 is held and wakes the set; the replica gets the query."""
    github = FakeGitHub()
    front = front_factory(github)
    github.on_dispatch = later(0.5, front.start_replica)
    answer = requests.get(f"{front.url}/v1/models?limit=5", headers=KEYED, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"][0]["id"] == "nemotron"
    assert github.dispatches == [DISPATCH]


def test_a_chunked_keyed_request_is_held_not_bounced(front_factory: Callable[..., Front]) -> None:
    github = FakeGitHub()
    front = front_factory(github)
    github.on_dispatch = later(0.5, front.start_replica)
    body = json.dumps(CHAT).encode()
    answer = requests.post(f"{front.url}/v1/chat/completions", data=iter([body[:10], body[10:]]),
                           headers={**KEYED, "Content-Type": "application/json"},
                           timeout=30)  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]


class Dying(BaseHTTPRequestHandler):
    """A replica whose /health says ready and which dies on the request itself."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        loopback.reply(self, 200, b"{}", "application/json")

    def do_POST(self) -> None:
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, *_: Any) -> None:
        pass


def test_a_replica_that_dies_after_the_comments_ends_the_stream_with_an_error(
    front_factory: Callable[..., Front],
) -> None:
    """After the 200 and the progress comments, a replica that fails the request: an SSE error
    event (and [DONE]), which the official client raises, never an empty answer."""
    github = FakeGitHub()
    front = front_factory(github)
    dying = loopback.serve(Dying)
    try:
        port = int(loopback.url(dying).rsplit(":", 1)[1])
        github.on_dispatch = later(1.0, lambda: front.join("r0", port))
        client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=API_KEY, max_retries=0)
        stream = client.chat.completions.create(model="nemotron", messages=CHAT["messages"],
                                                max_tokens=4, stream=True)  # fmt: skip
        with pytest.raises(openai.APIError) as raised:
            for _ in stream:
                pass
        assert "no replica answered the held request" in str(raised.value)
        # Not streamed: 502, and the client may retry.
        answer = front.send(CHAT)
        assert answer.status_code == 502 and answer.headers["x-should-retry"] == "true"
    finally:
        loopback.stop(dying)


def test_the_held_requests_are_bounded_and_the_rest_told_to_come_back(
    front_factory: Callable[..., Front],
) -> None:
    front = front_factory(WAKE_MAX_HELD="3", WAKE_EXPECTED_SECONDS="60")
    held = [front.wake_in_background() for _ in range(3)]
    end = time.monotonic() + 10
    while front.state()["held"] < 3:
        assert time.monotonic() < end, front.state()
        time.sleep(0.05)
    over = front.send(CHAT, timeout=10)
    assert over.status_code == 503 and over.json()["error"]["code"] == "front_busy"
    assert over.headers["x-should-retry"] == "true"
    assert all(answers == [] for answers in held), "the three are still held"


def sized(size: int) -> bytes:
    """A chat request's JSON of exactly `size` bytes."""
    empty = len(json.dumps({**CHAT, "messages": [{"role": "user", "content": ""}]}))
    return json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * (size - empty)}]},
                      ).encode()  # fmt: skip


def post_body(url: str, body: bytes, chunked: bool) -> requests.Response:
    """A keyed POST of `body`, with its length or (chunked) in two chunks and no length."""
    data: bytes | Iterator[bytes] = iter([body[:100], body[100:]]) if chunked else body
    return requests.post(f"{url}/v1/chat/completions", data=data, timeout=30,
                         headers={**KEYED, "Content-Type": "application/json"})  # fmt: skip


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
@pytest.mark.parametrize("via", ["waker", "caddy"])
def test_the_bodies_held_never_pass_wake_max_held_bytes(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront], via: str,
    chunked: bool,
) -> None:  # fmt: skip
    """WAKE_MAX_HELD_BYTES bounds the bytes of the held bodies, counted as they arrive: a
    chunked body declares no length (it counted 0 and was never checked once read, so two at
    once passed the bound). Over it: the busy answer, retry shortly, naming the bound."""
    front = front_factory(WAKE_MAX_HELD_BYTES="3000", WAKE_EXPECTED_SECONDS="60")
    url = caddy_front(front).url if via == "caddy" else front.url
    in_background(lambda: post_body(url, sized(1500), chunked))
    assert front.wait_held(1)["held_bytes"] == 1500
    over = post_body(url, sized(2000), chunked)
    assert over.status_code == 503, over.text
    assert over.json()["error"]["code"] == "front_busy"
    assert "may not pass 3000 bytes (WAKE_MAX_HELD_BYTES)" in over.json()["error"]["message"]
    assert over.headers["x-should-retry"] == "true"
    state = front.state()
    assert (state["held"], state["held_bytes"]) == (1, 1500), state
    in_background(lambda: post_body(url, sized(1500), chunked))
    assert front.wait_held(2)["held_bytes"] == 3000, "what fits is held"


class Draining(BaseHTTPRequestHandler):
    """A replica draining for a routine `pulumi up`: /health 503 until `ready` is set."""

    protocol_version = "HTTP/1.1"
    ready = threading.Event()

    def do_GET(self) -> None:
        status = 200 if self.ready.is_set() else 503
        loopback.reply(self, status, b'{"status":"draining"}', "application/json")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"choices": [{"message": {"content": "back"}}]}).encode()
        loopback.reply(self, 200, body, "application/json")

    def log_message(self, *_: Any) -> None:
        pass


def test_a_replica_answering_503_for_seconds_is_not_asleep_and_gets_no_dispatch(
    front_factory: Callable[..., Front],
) -> None:
    """Asleep means no replica exists. A replica that answers, even 503 while it drains, holds
    the requests without a wake, and they are answered once it is ready."""
    github = FakeGitHub()
    Draining.ready = threading.Event()
    draining = loopback.serve(Draining)
    try:
        front = front_factory(github)
        front.join("r0", int(loopback.url(draining).rsplit(":", 1)[1]))
        front.wait_mode("unready")
        answers = [front.wake_in_background() for _ in range(3)]
        time.sleep(4)  # many looks, far past WAKE_ASLEEP_SECONDS
        assert front.state()["mode"] == "unready" and github.dispatches == []
        assert all(a == [] for a in answers), "held, not bounced"
        Draining.ready.set()
        end = time.monotonic() + 10
        while not all(answers):
            assert time.monotonic() < end
            time.sleep(0.05)
        assert [a[0].json()["choices"][0]["message"]["content"] for a in answers] == ["back"] * 3
        assert github.dispatches == [] and front.state()["mode"] == "awake"
        refused = requests.post(f"{front.url}{wake.CONTROL_PATH}", timeout=5)
        assert refused.status_code == 202 and github.dispatches == [], "awake: nothing to wake"
    finally:
        loopback.stop(draining)


def test_a_set_deleted_since_the_last_look_is_held_and_woken_not_proxied_to(
    front_factory: Callable[..., Front],
) -> None:
    """Autodown deleted the set: the next look raises the hold file (Caddy sends the keyed
    requests here), and once no replica has answered over the window, the held request wakes
    the set."""
    github = FakeGitHub()
    front = front_factory(github)
    front.start_replica()
    front.wait_mode("awake")
    assert not front.hold_file.exists()
    front.stop_replicas()
    end = time.monotonic() + 5
    while not front.hold_file.exists():
        assert time.monotonic() < end
        time.sleep(0.05)
    front.wake_in_background()
    github.wait_dispatches(1)


def test_the_openai_client_at_its_default_retries_ends_as_the_readme_says(
    front_factory: Callable[..., Front],
) -> None:
    """The official client, as a user runs it (max_retries 2): a hold that runs out is retried
    twice, each try held again, then raises with the reason; a failed wake raises at once."""
    front = front_factory(WAKE_HOLD_SECONDS="1", WAKE_EXPECTED_SECONDS="300")
    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=API_KEY)
    assert client.max_retries == 2
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="nemotron", messages=CHAT["messages"], max_tokens=4)
    assert raised.value.status_code == 503 and front.state()["held_total"] == 3
    assert "still waking" in str(raised.value) and "wake.holdSeconds: 1" in str(raised.value)

    github = FakeGitHub()
    github.on_dispatch = later(0.3, lambda: github.finish_run("failure"))
    failing = front_factory(github, WAKE_HOLD_SECONDS="20")
    client = openai.OpenAI(base_url=f"{failing.url}/v1", api_key=API_KEY)
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="nemotron", messages=CHAT["messages"], max_tokens=4)
    assert failing.state()["held_total"] == 1, "x-should-retry: false: no retry of a failed wake"
    assert "the deploy run ended failure" in str(raised.value)


def test_the_webhook_trigger_posts_the_stack_with_its_secret_header(
    front_factory: Callable[..., Front],
) -> None:
    """wake.trigger: webhook, for any other CI: a POST with the token in the named header; a
    refusal fails the wake with the status."""
    calls: list[tuple[str, dict[str, Any]]] = []
    status = [200]

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append((self.headers.get("X-Wake-Token", ""), body))
            loopback.reply(self, status[0], b"{}", "application/json")

        def log_message(self, *_: Any) -> None:
            pass

    hook = loopback.serve(Hook)
    try:
        front = front_factory(
            WAKE_TRIGGER="webhook", WAKE_WEBHOOK_URL=f"{loopback.url(hook)}/deploy",
            WAKE_WEBHOOK_HEADER="X-Wake-Token",
        )  # fmt: skip
        front.wake_in_background()
        front.wait_mode("waking")
        end = time.monotonic() + 10
        while not calls:
            assert time.monotonic() < end
            time.sleep(0.05)
        assert calls == [(TOKEN, {"stack": "dev", "event": "wake"})]
        end = time.monotonic() + 10
        while not front.state()["last_wake"].get("pipeline_started"):
            assert time.monotonic() < end
            time.sleep(0.05)
        status[0] = 500
        second = front_factory(
            WAKE_TRIGGER="webhook", WAKE_WEBHOOK_URL=f"{loopback.url(hook)}/deploy",
            WAKE_WEBHOOK_HEADER="X-Wake-Token",
        )  # fmt: skip
        answer = second.send(CHAT)
        assert answer.status_code == 503
        assert "the webhook refused the wake (HTTP 500)" in answer.json()["error"]["message"]
    finally:
        loopback.stop(hook)


def wake_tool(front: Front, *args: str) -> subprocess.CompletedProcess[str]:
    """nemodrop/wake.py against the front (here the waker itself answers /nemotron/wake)."""
    env = {"PATH": os.environ["PATH"], "OPENAI_API_KEY": API_KEY}
    return subprocess.run(
        [*nemodrop_cli.argv("wake"), "--endpoint", f"{front.url}/v1",
         *args], env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_waker_and_the_program_share_their_names() -> None:
    """The gate's route to the waker and the hold file: the program's (components/host/wake.py), the
    waker's own (it runs on the front on Ubuntu's Python and aiohttp, without the program) and
    the tool's (the tools' venv has no pydantic, which the program's module needs)."""
    found = {
        path: re.search(r'^CONTROL_PATH = "([^"]+)"', (ROOT / path).read_text(), re.M)
        for path in ("components/host/wake.py", "scripts/phases/wake/relay.py", "nemodrop/wake.py")
    }
    assert {path: m.group(1) if m else None for path, m in found.items()} == dict.fromkeys(
        found, "/nemotron/wake"
    )
    waker = WAKE_SOURCE
    # The waker has no defaults of its own: it requires the file's path the program renders.
    assert '"WAKE_HOLD_FILE"' in (WAKER / "settings.py").read_text()
    rendered = dict(line.split("=", 1) for line in wake.env_text(wake_cfg()).splitlines())
    assert rendered["WAKE_HOLD_FILE"] == wake.HOLD_FILE
    # A replica's join mark, as the member phase writes it (pool.joined_file) and the waker
    # reads it.
    assert f'JOINED_SUFFIX = "{catalog.BALANCER_JOINED_SUFFIX}"' in waker
    assert f"RuntimeDirectory={wake.HOLD_DIR.removeprefix('/run/')}" in wake.unit_text()
    # Kept through a restart, so the hold file is (test_behind_caddy_a_waker_restarted_...).
    assert "RuntimeDirectoryPreserve=restart" in wake.unit_text()


# ---- behind the real Caddy, with the balancer's Caddyfile as the gateway phase renders it -------


def rendered_env() -> dict[str, str]:
    """Every setting of the waker as the program renders it (env_text, and the unit's token
    path), with no state file and no token: a test gives its own where it needs them."""
    rendered = dict(line.split("=", 1) for line in wake.env_text(wake_cfg()).splitlines())
    return {**rendered, "WAKE_STATE_FILE": "", "WAKE_TOKEN_FILE": ""}


def wake_cfg() -> config.StackConfig:
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": False}
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": TOKEN}
    return config.parse(raw, "dev", frozenset({"wake"}))


@dataclass
class CaddyFront:
    front: Front
    url: str
    reload: Callable[[], None]


@pytest.fixture
def caddy_front(
    front_factory: Callable[..., Front], tmp_path: Path
) -> Iterator[Callable[..., CaddyFront]]:
    """The waker behind the pinned Caddy running the front's rendered Caddyfile; `reload` is
    the member phase's graceful reload after a replica's file is written, and its join mark
    after it."""
    sock_dir = Path(tempfile.mkdtemp(prefix="nemo-admin-"))  # a socket path under 108 bytes
    stacks: list[Iterator[Any]] = []

    def make(front: Front, edit: Callable[[str], str] = str) -> CaddyFront:
        """`edit`: what the test changes in the rendered Caddyfile (nothing by default)."""
        admin = sock_dir / f"admin{len(stacks)}.sock"
        listen = gateway.Listen(http_port=free_port(), https_port=free_port(),
                                admin_socket=str(admin), upstreams=f"{front.upstreams}/*.caddy",
                                waker=front.url.removeprefix("http://"),
                                wake_hold_file=str(front.hold_file))  # fmt: skip
        url = f"http://127.0.0.1:{listen.http_port}"
        folder = tmp_path / f"caddy{len(stacks)}"
        running = run_caddy(folder, edit(gateway.balancer_site(wake_cfg(), "front.example", listen)),
                            f"{url}/health")  # fmt: skip
        next(running)
        stacks.append(running)

        front.behind_caddy = True

        def reload() -> None:
            subprocess.run(
                [str(CADDY), "reload", "--config", str(folder / "Caddyfile"), "--adapter",
                 "caddyfile", "--address", f"unix/{admin}"],
                env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), gateway.API_KEY_ENV: KEY},
                capture_output=True, check=True, timeout=30,
            )  # fmt: skip
            mark_joined(front.upstreams)

        return CaddyFront(front, url, reload)

    yield make
    for running in stacks:
        with pytest.raises(StopIteration):
            next(running)
    shutil.rmtree(sock_dir, ignore_errors=True)


def keyless_flood(url: str, rounds: int = 100) -> set[int]:
    """Keyed-looking requests without the key (none, a wrong one, the right one twice), 16 at a
    time; the statuses they got."""

    def knock(headers: dict[str, str]) -> int:
        return requests.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers,
                             timeout=10).status_code  # fmt: skip

    bad = [{}, {"Authorization": "Bearer sk-wrong"},
           {"Authorization": f"Bearer {API_KEY}, Bearer {API_KEY}"}] * rounds  # fmt: skip
    with ThreadPoolExecutor(16) as pool:
        return set(pool.map(knock, bad))


def test_behind_caddy_keyless_floods_wake_nothing_and_awake_requests_skip_the_waker(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    github = FakeGitHub()
    front = front_factory(github, WAKE_EXPECTED_SECONDS="60")
    cf = caddy_front(front)
    chat = f"{cf.url}/v1/chat/completions"

    def deploy() -> None:
        """The pipeline's end, as on the front: the replica answers, its member phase writes
        its upstream file and reloads Caddy gracefully."""
        time.sleep(1.0)
        front.start_replica()
        cf.reload()

    github.on_dispatch = deploy

    assert keyless_flood(cf.url) == {401}
    assert github.dispatches == [], "nothing without the key wakes the set"
    health = requests.get(f"{cf.url}/health", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "asleep"
    assert requests.head(f"{cf.url}/health", timeout=10).status_code == 503
    assert requests.get(f"{cf.url}/nemotron/wake", timeout=10).status_code == 401
    answer = requests.post(chat, json=CHAT, headers=KEYED, timeout=60)
    assert answer.status_code == 200, answer.text
    assert len(github.dispatches) == 1
    front.wait_mode("awake")
    # Awake, no request passes through Python: with the waker stopped, the front still answers.
    front.proc.send_signal(signal.SIGSTOP)
    try:
        for path in ("/v1/chat/completions", "/v1/models?limit=5"):
            again = requests.request("POST" if "chat" in path else "GET", f"{cf.url}{path}",
                                     json=CHAT if "chat" in path else None, headers=KEYED,
                                     timeout=10)  # fmt: skip
            assert again.status_code == 200, (path, again.text)
        assert requests.get(f"{cf.url}/health", timeout=10).status_code == 200
    finally:
        front.proc.send_signal(signal.SIGCONT)
    state = requests.get(f"{cf.url}/nemotron/wake", headers=KEYED, timeout=10).json()
    assert state["mode"] == "awake" and state["wakes_last_day"] == 1
    assert len(github.dispatches) == 1


def test_behind_caddy_a_request_while_caddy_reloads_a_new_replica_is_held_not_503(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    """The member phase writes a replica's upstream file, then reloads Caddy: until the reload
    is done Caddy has no such upstream, and a keyed request it proxies to the replicas gets its
    503 "no upstreams" (a CI run under load met it after the waker, seeing the file and the
    replica's /health, dropped its hold file). Here the reload (a loaded front's) waits until
    a keyed request was sent in that window: it is held by the waker, and answered 200, and
    the set is not called awake until the member phase marks its join after the reload."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_EXPECTED_SECONDS="60")
    cf = caddy_front(front)
    chat = f"{cf.url}/v1/chat/completions"
    written, sent = threading.Event(), threading.Event()

    def deploy() -> None:
        """The pipeline's end: the replica answers and its file is written; the reload comes
        once the request in the window is held (both held), or 10 s after it was sent."""
        front.start_replica()
        written.set()
        assert sent.wait(30)
        end = time.monotonic() + 10
        while front.state()["held"] < 2 and time.monotonic() < end:
            time.sleep(0.05)
        cf.reload()

    github.on_dispatch = deploy
    first = in_background(lambda: requests.post(chat, json=CHAT, headers=KEYED, timeout=60))
    assert written.wait(30)
    time.sleep(1.0)  # five of the waker's looks: it has seen the file and the replica's /health
    assert front.state()["mode"] == "waking", "not awake before Caddy routes to the replica"
    assert front.hold_file.exists()
    sent.set()
    in_window = requests.post(chat, json=CHAT, headers=KEYED, timeout=60)
    assert in_window.status_code == 200, (in_window.status_code, in_window.text)
    front.wait_mode("awake")
    assert not front.hold_file.exists()
    assert [a.status_code for a in first] == [200]
    assert len(github.dispatches) == 1


@pytest.fixture
def recorder() -> Iterator[Upstream]:
    """A replica that records every request that reaches it (test_gateway_attacks.Upstream):
    the waker's looks and Caddy's health checks at /health, keyless and not forwarded, aside."""
    up = Upstream()
    up.probes_only = True
    yield up
    up.close()


def statuses(got: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", got)]


SMUGGLING = {
    "health-body": b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: "
    + str(len(SMUGGLED)).encode() + b"\r\n\r\n" + SMUGGLED,
    "cl-te": b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
    "te-cl": b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n" + hex(len(SMUGGLED))[2:].encode() + b"\r\n"
    + SMUGGLED + b"\r\n0\r\n\r\n",
    "pipelined": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
}  # fmt: skip


def test_behind_caddy_a_smuggled_request_wakes_nothing_in_either_state(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront],
    recorder: Upstream,
) -> None:  # fmt: skip
    """CL.TE, TE.CL, a body on /health and pipelining, through the real Caddy: asleep (the
    waker behind it) and awake (a recording replica behind it) alike, nothing unkeyed is held,
    dispatched for or proxied to the replica: the replica sees /health alone, and the
    pipelined keyless POST is Caddy's own 401."""
    github = FakeGitHub()
    front = front_factory(github)
    cf = caddy_front(front)
    for state in ("asleep", "awake"):
        for name, attack in SMUGGLING.items():
            got = statuses(raw_exchange(cf.url, attack, 2))
            # The first request is /health (the waker's 503 asleep, the replica's 200 awake; a
            # POST to it, 404); whatever Caddy reads after it is a request of its own, keyless.
            first = {"asleep": 503, "awake": 200}[state] if name != "cl-te" else 404
            assert got[0] == first and set(got[1:]) <= {401}, (state, name, got)
            if name == "pipelined":
                assert got == [first, 401], got
        time.sleep(0.5)
        assert github.dispatches == [] and front.state()["held_total"] == 0, state
        if state == "asleep":
            assert front.state()["mode"] == "asleep"
            front.join("r0", int(recorder.url.rsplit(":", 1)[1]))
            cf.reload()
            front.wait_mode("awake")
    # Awake, the replica got the three /health requests alone, each with its body as a body.
    assert [(s["method"], s["path"]) for s in recorder.seen] == [("GET", "/health")] * 3
    # The keyed unsmuggled request still reaches the replica awake.
    assert requests.post(f"{cf.url}/v1/chat/completions", json=CHAT, headers=KEYED,
                         timeout=10).status_code == 200  # fmt: skip
    assert recorder.seen[-1]["path"] == "/v1/chat/completions"


def test_behind_caddy_a_burst_of_500_keyed_requests_while_waking_are_all_answered(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    """500 keyed requests at once while the set wakes: every one held and answered 200 once a
    replica is ready, none reset, none left without an answer; the waker's memory is read."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_EXPECTED_SECONDS="60")
    cf = caddy_front(front)
    rss: list[int] = []

    def deploy() -> None:
        time.sleep(4.0)
        rss.append(_rss_kib(front.proc.pid))
        front.start_replica("r0", "--capacity", "600")
        cf.reload()

    github.on_dispatch = deploy

    async def burst() -> list[int]:
        limits = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=limits) as session:

            async def one() -> int:
                async with session.post(f"{cf.url}/v1/chat/completions", json=CHAT,
                                        headers=KEYED,
                                        timeout=aiohttp.ClientTimeout(total=120)) as r:  # fmt: skip
                    await r.read()
                    return r.status

            return await asyncio.gather(*(one() for _ in range(500)), return_exceptions=True)  # type: ignore[arg-type]

    codes = front_bench.run(burst())
    assert [c for c in codes if c != 200] == [], sorted(map(str, codes))[:5]
    assert len(github.dispatches) == 1
    print(f"waker RSS with 500 requests held: {rss[0]} KiB")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def paused_upload(url: str, body: bytes, pause: float, timeout: float = 200) -> tuple[int, bytes]:
    """A keyed request whose client sends half its body, says nothing for `pause` seconds, then
    sends the rest; its answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        half = len(body) // 2
        sock.sendall(_keyed_head() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:half])
        time.sleep(pause)
        with contextlib.suppress(OSError):  # cut while it paused: the answer (or none) says so
            sock.sendall(body[half:])
        answer = http.client.HTTPResponse(sock)
        try:
            answer.begin()
        except (http.client.HTTPException, OSError):
            return 0, b""
        return answer.status, answer.read()


def test_the_shipped_settings_hold_silently_past_a_minute_through_caddy(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    """The waker with the settings the program renders (wake.env_text: hold 540 s, its health,
    comment and asleep intervals), only its addresses and paths this test's, behind the pinned
    Caddy with the front's timeouts as rendered: a request held silently for 70 s, and one whose
    client paused 65 s in the middle of its body (Caddy 2.11.7's default read_body_idle, one
    minute, cut that one with 499), are both answered."""
    rendered = dict(line.split("=", 1) for line in wake.env_text(wake_cfg()).splitlines())
    local = {"WAKE_LISTEN", "WAKE_UPSTREAMS_DIR", "WAKE_HOLD_FILE", "WAKE_STATE_FILE",
             "WAKE_GITHUB_API"}  # fmt: skip
    shipped = {k: v for k, v in rendered.items() if k not in local}
    assert shipped["WAKE_HOLD_SECONDS"] == "540"
    github = FakeGitHub()
    front = front_factory(github, fast=False, **shipped)
    cf = caddy_front(front)

    def deploy() -> None:
        time.sleep(70)
        front.start_replica()
        cf.reload()

    github.on_dispatch = deploy
    with ThreadPoolExecutor(1) as pool:
        paused = pool.submit(paused_upload, cf.url, json.dumps(CHAT).encode(), 65)
        started = time.monotonic()
        answer = requests.post(f"{cf.url}/v1/chat/completions", json=CHAT, headers=KEYED,
                               timeout=200)  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert time.monotonic() - started > 70
        status, text = paused.result()
    assert status == 200, (status, text)
    assert json.loads(text)["choices"][0]["message"]["content"]
    assert github.dispatches == [DISPATCH]


def test_the_front_runs_the_timeouts_it_renders(tmp_path: Path) -> None:
    """What the pinned Caddy makes of the front's timeouts (`caddy adapt`): each one set, none
    left to a default (2.11.7 gives read_body_idle and write_idle one minute when unset)."""
    adapted, _ = adapt(tmp_path, gateway.balancer_site(wake_cfg(), "203.0.113.201"))
    [server] = adapted["apps"]["http"]["servers"].values()
    minute, second = 60 * 10**9, 10**9
    timeouts = {k: v for k, v in server.items() if "timeout" in k or k.endswith("_rate")}
    assert timeouts == {
        "read_header_timeout": 30 * second,
        "read_idle_timeout": 5 * minute,
        "read_min_rate": 10_000,
        "write_idle_timeout": minute,
        "idle_timeout": 5 * minute,
    }, timeouts
    # read_body and write: 0s, no hard deadline (Caddy's JSON leaves a zero out).
    assert "read_timeout" not in server and "write_timeout" not in server


def test_a_replica_that_just_joined_is_found_before_any_wake(
    front_factory: Callable[..., Front],
) -> None:
    """The deploy's own ready probe comes through the front a moment after the replica joins,
    before the monitor's next look (the hold file still there): the waker looks again before it
    wakes anything, and sends the request on."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_HEALTH_SECONDS="60")
    front.wait_mode("asleep")
    front.start_replica()
    answer = front.send(CHAT)
    assert answer.status_code == 200, answer.text
    assert github.dispatches == [] and front.state()["mode"] == "awake"


def _keyed_head(path: str = "/v1/chat/completions") -> bytes:
    """A keyed request's first lines, its header block not yet ended."""
    return (f"POST {path} HTTP/1.1\r\nHost: front.example\r\nAuthorization: Bearer {API_KEY}\r\n"
            "Content-Type: application/json\r\n").encode()  # fmt: skip


def test_behind_caddy_a_client_that_goes_away_frees_its_place_in_the_hold(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    """Twenty keyed requests held while the set wakes, their clients gone (a closed laptop, a
    client timeout): Caddy drops each upstream request and the waker lets each go at once, so
    the hold's places and bytes (wake.maxHeld) are not kept by requests nobody waits for."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_EXPECTED_SECONDS="120", WAKE_HOLD_SECONDS="120")
    cf = caddy_front(front)
    host, port = cf.url.removeprefix("http://").split(":")
    body = json.dumps(CHAT).encode()
    clients = []
    for _ in range(20):
        client = socket.create_connection((host, int(port)), timeout=5)
        client.sendall(_keyed_head() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        clients.append(client)
    end = time.monotonic() + 10
    while front.state()["held"] < 20:
        assert time.monotonic() < end, front.state()
        time.sleep(0.05)
    assert front.state()["held_bytes"] == 20 * len(body)
    # The wake they asked for: its dispatch runs beside the hold, and may land just after the
    # twentieth request is counted (a CI run under load saw none yet at the end).
    end = time.monotonic() + 10
    while not github.dispatches:
        assert time.monotonic() < end, "no wake dispatched for twenty held requests"
        time.sleep(0.05)
    for client in clients:
        client.close()
    end = time.monotonic() + 10
    while (state := front.state())["held"] or state["held_bytes"]:
        assert time.monotonic() < end, f"the gone clients are still held: {state}"
        time.sleep(0.05)
    assert len(github.dispatches) == 1, "one wake for them all, none more as they went"


@pytest.mark.parametrize("state", ["asleep", "awake"])
def test_behind_caddy_slow_headers_hold_no_place_and_delay_no_keyed_request(
    state: str, front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    """Slowloris against the front: 300 connections that send a keyed request's headers a line
    every half second and never end them. Caddy alone carries them (its read_header timeout,
    30 s, ends each): none reaches the waker or wakes the set, and a whole keyed request beside
    them is held and answered asleep, answered at once awake."""
    github = FakeGitHub()
    front = front_factory(github)
    cf = caddy_front(front)
    if state == "awake":
        front.start_replica()
        cf.reload()
        front.wait_mode("awake")
    else:
        github.on_dispatch = later(1.0, lambda: (front.start_replica(), cf.reload()))
    host, port = cf.url.removeprefix("http://").split(":")
    stop = threading.Event()
    slow: list[socket.socket] = []
    for _ in range(300):
        conn = socket.create_connection((host, int(port)), timeout=5)
        conn.sendall(_keyed_head())
        slow.append(conn)

    def trickle() -> None:
        line = 0
        while not stop.wait(0.5):
            line += 1
            for conn in slow:
                with contextlib.suppress(OSError):
                    conn.sendall(f"X-Slow-{line}: {line}\r\n".encode())

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(1.5)
        assert github.dispatches == [] and front.state()["held_total"] == 0
        started = time.monotonic()
        answer = requests.post(f"{cf.url}/v1/chat/completions", json=CHAT, headers=KEYED,
                               timeout=30)  # fmt: skip
        waited = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        if state == "awake":
            assert waited < 5, waited
            assert github.dispatches == [] and front.state()["held_total"] == 0
        else:
            assert len(github.dispatches) == 1 and front.state()["held_total"] == 1
    finally:
        stop.set()
        trickler.join(5)
        for conn in slow:
            conn.close()


# ---- the gateway's attack classes against the front, asleep and awake, through the real Caddy --


@dataclass
class Attacked:
    """The front in one state behind the real Caddy, with a recording replica that joins when
    the set wakes (asleep) or has joined (awake)."""

    state: str
    front: Front
    cf: CaddyFront
    replica: Upstream
    github: FakeGitHub

    def join(self) -> None:
        self.front.join("r0", int(self.replica.url.rsplit(":", 1)[1]))
        self.cf.reload()

    def keyed(self, **headers: str) -> requests.Response:
        """A whole keyed request: held and answered once the replica joins (asleep), or
        answered by it (awake)."""
        return requests.post(f"{self.cf.url}/v1/chat/completions", json=CHAT, timeout=30,
                             headers={**KEYED, **headers})  # fmt: skip

    def reached(self) -> list[dict[str, Any]]:
        """What got past the gate to the replica (the waker's looks and Caddy's checks aside)."""
        return list(self.replica.seen)


@pytest.fixture
def attacked(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront],
    recorder: Upstream,
) -> Callable[..., Attacked]:  # fmt: skip
    def make(state: str, edit: Callable[[str], str] = str) -> Attacked:
        github = FakeGitHub()
        front = front_factory(github, WAKE_EXPECTED_SECONDS="60")
        a = Attacked(state, front, caddy_front(front, edit), recorder, github)
        if state == "awake":
            a.join()
            front.wait_mode("awake")
        else:
            github.on_dispatch = later(0.5, a.join)
        recorder.seen.clear()
        return a

    return make


STATES = pytest.mark.parametrize("state", ["asleep", "awake"])


@STATES
def test_behind_caddy_bodies_over_the_limit_reach_nothing(
    attacked: Callable[..., Attacked], state: str
) -> None:
    """A declared length over 16 MB is refused long before its body is in, key or not (Caddy
    reads up to 256 KiB of an unread body before it answers: net/http maxPostHandlerReadBytes);
    a chunked keyed body is cut at the limit: nothing held, nothing woken, no
    whole body at the replica."""
    a = attacked(state)
    declared = b"Content-Length: 16000001\r\n\r\n" + b" " * 300_000
    assert statuses(raw_exchange(a.cf.url, _keyed_head() + declared, 2)) == [413]
    keyless = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + declared
    assert statuses(raw_exchange(a.cf.url, keyless, 2)) == [413]
    try:
        outcome: int | str = post_body(a.cf.url, b"{" + b" " * 17_000_000 + b"}", True).status_code
    except requests.ConnectionError:
        outcome = "closed while sending"  # Caddy stopped reading at the limit
    assert outcome in (413, "closed while sending"), outcome
    a.front.wait_held(0)
    assert a.github.dispatches == [] and a.front.state()["mode"] == state
    assert all(seen["body"] <= 16_000_000 for seen in a.reached()), a.reached()


def trickled(url: str, head: bytes, count: int, seconds: float) -> list[tuple[float, list[int]]]:
    """`count` connections that send `head` and then a byte of body every half second, for up
    to `seconds`: when each was answered (or closed), and with what."""
    host, port = url.removeprefix("http://").split(":")
    conns = [socket.create_connection((host, int(port)), timeout=5) for _ in range(count)]
    for conn in conns:
        conn.sendall(head)
        conn.setblocking(False)
    started = time.monotonic()
    got: dict[int, bytes] = {}
    done: dict[int, float] = {}
    while len(done) < count and time.monotonic() - started < seconds:
        time.sleep(0.5)
        for i, conn in enumerate(conns):
            if i in done:
                continue
            with contextlib.suppress(OSError):
                conn.send(b"x")
            try:
                while chunk := conn.recv(65536):
                    got[i] = got.get(i, b"") + chunk
                done[i] = time.monotonic() - started  # closed
            except BlockingIOError:
                pass
            except OSError:
                done[i] = time.monotonic() - started
    for conn in conns:
        conn.close()
    return [(done.get(i, -1.0), statuses(got.get(i, b""))) for i in range(count)]


@STATES
def test_behind_caddy_a_trickled_body_is_answered_and_let_go(
    attacked: Callable[..., Attacked], state: str
) -> None:
    """RUDY: bodies that arrive a byte at a time. A refused request's answer waits for its body
    (docs/facts.md), so read_body_idle's minimum rate is what ends them: here after 3 s, not the
    rendered 5 minutes (test_the_front_runs_the_timeouts_it_renders reads that value, and the
    shipped-settings test runs it). Keyless ones (declared or chunked) get their 401 and are
    closed; a keyed one is let go by the waker or the replica behind (Caddy ends the upstream
    request; its client's own connection stays Caddy's while it trickles); none wakes the set
    or brings a whole body to the replica, and a whole keyed request beside them is answered."""
    slow = "read_body_idle 3s 10000"
    a = attacked(state, lambda text: text.replace("read_body_idle 5m 10000", slow))
    keyless = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    results = trickled(a.cf.url, keyless + b"Content-Length: 1000\r\n\r\n", 40, 20)
    results += trickled(a.cf.url, keyless + b"Transfer-Encoding: chunked\r\n\r\n400\r\n", 40, 20)
    assert all(2 < took < 10 and got == [401] for took, got in results), results
    trickled(a.cf.url, _keyed_head() + b"Content-Length: 1000\r\n\r\n", 1, 8)
    state_now = a.front.wait_held(0)
    assert (state_now["reading"], state_now["held_bytes"], state_now["held_total"]) == (0, 0, 0)
    assert a.github.dispatches == [], "a body that never ended wakes nothing"
    assert all(seen["body"] < 1000 for seen in a.reached()), a.reached()
    answer = a.keyed()
    assert answer.status_code == 200, answer.text
    assert a.reached()[-1]["path"] == "/v1/chat/completions" and a.reached()[-1]["body"] > 0


SPOOFED = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Host": "evil.example",
           "X-Forwarded-Proto": "https", "X-Real-IP": "203.0.113.9",
           "Forwarded": "for=203.0.113.9;host=evil.example"}  # fmt: skip


@STATES
def test_behind_caddy_spoofed_host_and_forwarding_headers_change_nothing(
    attacked: Callable[..., Attacked], state: str
) -> None:
    """A Host naming the waker's own address or another site, and forwarding headers claiming
    another client: without the key still 401 (the API and the waker's control path), nothing
    held or woken; with it, answered as any keyed request, and the replica gets Caddy's own
    X-Forwarded-* (awake: Caddy trusts no proxy, so it replaces them) or none (asleep: the
    waker forwards none)."""
    a = attacked(state)
    for host in ("127.0.0.1:8092", "localhost", "front.example"):
        spoofed = {"Host": host, **SPOOFED}
        for path in ("/v1/chat/completions", wake.CONTROL_PATH):
            r = requests.post(f"{a.cf.url}{path}", json=CHAT, headers=spoofed, timeout=10)
            assert r.status_code == 401, (host, path, r.status_code)
    assert a.github.dispatches == [] and a.front.state()["held_total"] == 0 and a.reached() == []
    answer = a.keyed(Host="127.0.0.1:8092", **SPOOFED)
    assert answer.status_code == 200, answer.text
    [seen] = a.reached()
    forwarded = {k: v for k, v in seen["headers"].items() if k.lower().startswith("x-forwarded")}
    if state == "awake":
        assert forwarded == {"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http",
                             "X-Forwarded-Host": "127.0.0.1:8092"}, forwarded  # fmt: skip
    else:
        assert forwarded == {} and "X-Real-IP" not in seen["headers"], seen["headers"]


@STATES
def test_behind_caddy_keyless_floods_reach_nothing(
    attacked: Callable[..., Attacked], state: str
) -> None:
    """300 requests without the key (none, wrong, the right one twice), 16 at a time: all 401,
    none held, none woken for, none at the replica; a keyed one after them is answered."""
    a = attacked(state)
    assert keyless_flood(a.cf.url) == {401}
    assert a.github.dispatches == [] and a.front.state()["held_total"] == 0 and a.reached() == []
    assert a.keyed().status_code == 200


def test_behind_caddy_a_chunked_keyed_request_is_held_and_answered(
    attacked: Callable[..., Attacked],
) -> None:
    """A keyed body without a length, while the set sleeps: held (not bounced with 411), the
    set woken once, the whole body sent on to the replica once it joins."""
    a = attacked("asleep")
    body = json.dumps(CHAT).encode()
    answer = post_body(a.cf.url, body, chunked=True)
    assert answer.status_code == 200, answer.text
    assert [(s["path"], s["body"]) for s in a.reached()] == [("/v1/chat/completions", len(body))]
    assert a.github.dispatches == [DISPATCH]


def test_behind_caddy_a_set_that_dies_awake_is_held_for_again(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    """Awake, Caddy sends keyed requests to the replica; the replica dies (autodown deleted
    it; its member file stays): the waker's next look raises the hold file, and the next keyed
    request is held through Caddy, wakes the set once and is answered by the new replica."""
    github = FakeGitHub()
    front = front_factory(github)
    cf = caddy_front(front)
    front.start_replica()
    cf.reload()
    front.wait_mode("awake")
    assert requests.post(f"{cf.url}/v1/chat/completions", json=CHAT, headers=KEYED,
                         timeout=10).status_code == 200  # fmt: skip
    github.on_dispatch = later(1.0, lambda: (front.start_replica("r1"), cf.reload()))
    front.stop_replicas()
    end = time.monotonic() + 10
    while not front.hold_file.exists():
        assert time.monotonic() < end, front.state()
        time.sleep(0.05)
    answer = requests.post(f"{cf.url}/v1/chat/completions", json=CHAT, headers=KEYED, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    assert github.dispatches == [DISPATCH] and front.state()["held_total"] == 1


FIRST_CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "nemotron",
               "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}  # fmt: skip


class CutMidAnswer(BaseHTTPRequestHandler):
    """A replica ready by its /health that starts each answer (a streamed one's first chunk,
    part of a JSON one) and dies in the middle of it."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        loopback.reply(self, 200, b"{}", "application/json")

    def do_POST(self) -> None:
        stream = json.loads(read_body(self) or b"{}").get("stream") is True
        self.send_response(200)
        if stream:
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            event = b"data: " + json.dumps(FIRST_CHUNK).encode() + b"\n\n"
            self.wfile.write(hex(len(event))[2:].encode() + b"\r\n" + event + b"\r\n")
        else:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"id": "c1", "choices": [')
        self.wfile.flush()
        time.sleep(0.3)
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, *_: Any) -> None:
        pass


def test_behind_caddy_a_replica_cut_mid_answer_ends_the_held_request_with_an_error(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront]
) -> None:
    """Two requests held while the set wakes, relayed by the waker to the replica that joined,
    which dies mid-answer: the stream gets the first chunk, then an SSE error event naming the
    cut (and [DONE]), which the official client raises; the JSON answer is cut as the replica
    cut it (a connection error the client may retry), never a whole-looking 200."""
    github = FakeGitHub()
    front = front_factory(github)
    cf = caddy_front(front)
    cut = loopback.serve(CutMidAnswer)
    port = int(loopback.url(cut).rsplit(":", 1)[1])
    client = openai.OpenAI(base_url=f"{cf.url}/v1", api_key=API_KEY, max_retries=0)

    def streamed() -> tuple[list[str | None], str]:
        stream = client.chat.completions.create(model="nemotron", messages=CHAT["messages"],
                                                max_tokens=4, stream=True)  # fmt: skip
        got = []
        with pytest.raises(openai.APIError) as raised:
            for chunk in stream:
                got.append(chunk.choices[0].delta.content)
        return got, str(raised.value)

    def whole() -> str:
        with pytest.raises(openai.APIConnectionError) as raised:
            client.chat.completions.create(model="nemotron", messages=CHAT["messages"],
                                           max_tokens=4)  # fmt: skip
        return type(raised.value).__name__

    try:
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(streamed), pool.submit(whole)]
            front.wait_held(2)
            front.join("r0", port)
            cf.reload()
            got, error = held[0].result(timeout=30)
            assert got == ["Hel"] and "the replica stopped mid-answer" in error, (got, error)
            assert held[1].result(timeout=30) == "APIConnectionError"
        assert front.state()["held_total"] == 2
    finally:
        loopback.stop(cut)


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_behind_caddy_a_waker_restarted_while_waking_keeps_holding(
    front_factory: Callable[..., Front], caddy_front: Callable[..., CaddyFront], how: str
) -> None:
    """The waker stops while the set wakes: stopped (systemd's restart, SIGTERM) it answers
    what it held with a reason and `x-should-retry: true`; crashed (SIGKILL) it cannot. Either
    way the hold file stays (systemd keeps its folder through a restart), so a keyed request
    sent while no waker listens is retried by Caddy until the next one does (RestartSec, 1 s),
    which takes up the wake under way: held, no second dispatch, answered once the replica
    joins. Before, the file went with the waker and such a request got Caddy's bare 503."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_EXPECTED_SECONDS="60")
    cf = caddy_front(front)

    def keyed() -> requests.Response:
        return requests.post(f"{cf.url}/v1/chat/completions", json=CHAT, headers=KEYED,
                             timeout=60)  # fmt: skip

    first = in_background(keyed)
    github.wait_dispatches(1)
    front.wait_held(1)
    front.proc.send_signal(signal.SIGTERM if how == "restart" else signal.SIGKILL)
    front.proc.wait(timeout=30)
    assert front.hold_file.exists(), "the hold file stays through a restart"
    if how == "restart":
        end = time.monotonic() + 10
        while not first:
            assert time.monotonic() < end
            time.sleep(0.05)
        assert first[0].status_code == 503 and first[0].headers["x-should-retry"] == "true"
        assert first[0].json()["error"]["code"] == "waker_restarting"
    during = in_background(keyed)
    time.sleep(1.0)
    again = front_factory(like=front)
    assert again.wait_held(1)["mode"] == "waking" and len(github.dispatches) == 1
    front.start_replica()
    cf.reload()
    end = time.monotonic() + 30
    while not during:
        assert time.monotonic() < end, again.state()
        time.sleep(0.05)
    assert during[0].status_code == 200, during[0].text
    assert len(github.dispatches) == 1, "the next waker took up the wake under way"


def test_a_waker_killed_while_github_takes_its_dispatch_does_not_dispatch_again(
    front_factory: Callable[..., Front],
) -> None:
    """Killed (SIGKILL, an OOM kill) after GitHub queued the run but before its answer came
    back, the waker never saved the run's id. The next one resumes the wake under way (the
    dispatch was said before it was sent), follows the run by its title, and answers once the
    replica joins: no second run of the deploy."""
    github = FakeGitHub(dispatch_delay=3.0)
    front = front_factory(github, WAKE_EXPECTED_SECONDS="60")
    first = in_background(lambda: front.send(CHAT))
    github.wait_dispatches(1)
    front.proc.send_signal(signal.SIGKILL)
    front.proc.wait(timeout=30)
    saved = json.loads(Path(front.env["WAKE_STATE_FILE"]).read_text())["timeline"]
    assert "dispatching" in saved and "pipeline_started" not in saved, saved
    github.dispatch_delay = 0.0
    again = front_factory(like=front)
    end = time.monotonic() + 10
    while again.state()["last_wake"].get("run_id") is None:
        assert time.monotonic() < end, again.state()
        time.sleep(0.05)
    assert again.state()["mode"] == "waking" and len(github.dispatches) == 1
    assert again.state()["last_wake"]["run_id"] == github.runs[0]["id"], "found by its title"
    again.start_replica()
    assert again.send(CHAT).status_code == 200
    assert len(github.dispatches) == 1, "the next waker took up the wake under way"
    del first


# ---- the front's measurements (tests/support/front_bench.py; the numbers are in its output) ----


def test_the_front_bench_reads_an_injected_delay(tmp_path: Path) -> None:
    """front_bench.compare against two fake vLLMs, one 50 ms slower to answer: what the second
    adds is read as about 50 ms, so its figure for the front means what it says."""
    with front_bench.processes(tmp_path) as p:
        fast, slow = p.fake_vllm(), p.fake_vllm(ttft=0.05)
        result = front_bench.compare(f"http://127.0.0.1:{fast}", f"http://127.0.0.1:{slow}", 40)
    assert 45 <= result["added"]["p50_ms"] <= 90, result
    assert result["direct"]["p50_ms"] < 45, result


def test_500_held_requests_stay_within_the_fronts_memory_budget(tmp_path: Path) -> None:
    """500 keyed requests with 8 KB bodies held at once through the front's Caddy by the waker
    (its rendered settings, a webhook that brings no replica): measured on the project's
    machine, the waker adds about 12.6 MB and Caddy about 36 MB, the same on each run; the budget
    here is about five times that, so a leak or a copy per request shows, not a slow machine."""
    result = front_bench.measure_memory(500, 8000, tmp_path)
    added = result["rss_kib_added"]
    assert added["waker"] < 64 * 1024 and added["caddy"] < 192 * 1024, result
    print(json.dumps(result))


# ---- a wake with many held requests, and a replica busy under load (issue 42) ------------------


def states_while(front: Front, load: Callable[[], bool]) -> list[tuple[str, Any]]:
    """The waker's mode and its count of busy replicas, read every 50 ms while `load()`."""
    seen: list[tuple[str, Any]] = []
    while load():
        state = front.state()
        seen.append((state["mode"], state.get("replicas_busy")))
        time.sleep(0.05)
    return seen


def test_more_than_100_held_slow_generations_are_relayed_at_once_and_the_front_stays_awake(
    front_factory: Callable[..., Front],
) -> None:
    """150 held requests whose answers take 4 s, through the real waker. One client pool
    (aiohttp's default: 100 connections) carried the relays and the looks: 100 were relayed
    and 50 waited for a connection (answered 4 s later), and the looks, queued behind them,
    timed out, so the front called its serving replica unready (the hold file back, /health
    503) until the relays ended. The relays' pool is what the front promises to hold, and the
    looks have their own: all 150 are answered in one wave and the mode never leaves awake."""
    generation = 4.0
    held = 150
    front = front_factory(WAKE_EXPECTED_SECONDS="60")
    with ThreadPoolExecutor(held) as pool:

        def one() -> tuple[int, float]:
            answer = front.send(CHAT, timeout=60)
            return answer.status_code, time.monotonic()

        answers = [pool.submit(one) for _ in range(held)]
        front.wait_held(held, seconds=30)
        front.start_replica("r0", "--ttft", str(generation))
        front.wait_mode("awake")
        ready = time.monotonic()
        states = states_while(front, lambda: not all(a.done() for a in answers))
        got = [a.result() for a in answers]
    assert [status for status, _ in got] == [200] * held
    last = max(at for _, at in got) - ready
    modes = [mode for mode, _ in states]
    print(f"{held} held, {generation:g} s answers: the last {last:.1f} s after ready; "
          f"{modes.count('unready')} of {len(modes)} reads of the mode unready")  # fmt: skip
    assert set(modes) == {"awake"}, f"the mode left awake while the relays ran: {modes}"
    assert last < generation + 2, f"the last answer came {last:.1f} s after ready: a second wave"
    assert not front.hold_file.exists()


def test_a_replica_too_busy_to_answer_its_health_in_time_stays_ready_and_the_front_awake(
    front_factory: Callable[..., Front],
) -> None:
    """A saturated vLLM answers its /health late, past the look's 2 s budget, while it serves
    (the fake answers /health 3 s late while a chat request runs). It accepts connections: it
    is busy, not gone and not unready. It was ready at its last answer, so it stays ready: the
    front stays awake (no hold file: Caddy keeps proxying to it) and /health says 200. Once
    stopped (connections refused) it is gone, and the set is asleep."""
    front = front_factory()
    fake = fake_openai.start("--ttft", "4", "--busy-answer-delay", "3", key=API_KEY)
    front.replicas.append(fake.proc)
    front.join("r0", fake.port)
    front.wait_mode("awake")
    with ThreadPoolExecutor(8) as pool:
        load = [pool.submit(requests.post, f"{fake.url}/v1/chat/completions", json=CHAT,
                            headers=KEYED, timeout=30) for _ in range(8)]  # fmt: skip
        states = states_while(front, lambda: front.state()["replicas_busy"] == 0
                              and not all(a.done() for a in load))  # fmt: skip
        shown = wake_tool(front).stdout
        states += states_while(front, lambda: not all(a.done() for a in load))
    assert [a.result().status_code for a in load] == [200] * 8
    assert "(1 replica(s) answering; 1 busy: no /health answer in time, counted as before)" \
        in shown, shown  # fmt: skip
    modes = [mode for mode, _ in states]
    assert set(modes) == {"awake"}, f"a busy replica was called unready: {modes}"
    assert 1 in [busy for _, busy in states], "the looks found it busy while it served"
    assert requests.get(f"{front.url}/health", timeout=5).status_code == 200
    assert not front.hold_file.exists()
    front.stop_replicas()
    front.wait_mode("asleep")


def test_a_replica_that_accepts_no_connection_is_gone_not_busy(
    front_factory: Callable[..., Front],
) -> None:
    """Busy needs a connection accepted: an address whose connections are never accepted (a
    listening socket whose backlog is full: Linux drops the SYNs, as for a Droplet that is no
    more) is unreachable, gone like a refused one. The set is asleep and a keyed request wakes
    it."""
    github = FakeGitHub()
    front = front_factory(github)
    full = socket.create_server(("127.0.0.1", 0), backlog=0)
    filling: list[socket.socket] = []
    try:
        for _ in range(4):  # the backlog's one place and more, none accepted
            client = socket.socket()
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                client.connect(full.getsockname())
            filling.append(client)
        front.join("r0", full.getsockname()[1])
        front.wait_mode("asleep", seconds=20)
        assert front.state()["replicas_busy"] == 0
        front.wake_in_background()
        github.wait_dispatches(1)
    finally:
        for client in filling:
            client.close()
        full.close()


def test_a_replica_that_stops_answering_is_counted_ready_no_longer_than_caddy_waits(
    front_factory: Callable[..., Front],
) -> None:
    """A replica that served, then hangs: it accepts connections (the kernel completes them for
    a stopped or wedged process) and answers nothing. Busy kept it ready for ever: the front
    said awake (no hold file) while Caddy's own checks, which fail a look past 15 s, had taken
    it out, so keyed requests met Caddy's bare 503 and no wake or hold ever came. A look that
    gets no answer within WAKE_BUSY_SECONDS counts it as existing, not ready: the front is
    unready (the hold file back, /health 503) until it answers again."""
    front = front_factory(WAKE_BUSY_SECONDS="3")
    fake = fake_openai.start("--ttft", "60", "--busy-answer-delay", "60", key=API_KEY)
    front.replicas.append(fake.proc)
    front.join("r0", fake.port)
    front.wait_mode("awake")
    in_background(lambda: requests.post(f"{fake.url}/v1/chat/completions", json=CHAT,
                                        headers=KEYED, timeout=90))  # fmt: skip
    front.wait_mode("unready", seconds=10)
    state = front.state()
    assert state["replicas_healthy"] == 0, state
    assert front.hold_file.exists()
    assert requests.get(f"{front.url}/health", timeout=5).status_code == 503
    front.stop_replicas()
    front.wait_mode("asleep")


def test_a_replica_that_answers_late_for_longer_than_the_bound_stays_ready(
    front_factory: Callable[..., Front],
) -> None:
    """The bound is on one look's answer, not on a run of looks past LOOK_TIMEOUT: a replica
    that answers every /health 3 s late (saturated, but serving) through a load that lasts
    longer than WAKE_BUSY_SECONDS is heard each time (the next look waits on the late one), so
    it stays ready and the front awake, as Caddy (15 s per check) keeps it."""
    front = front_factory(WAKE_BUSY_SECONDS="5")
    fake = fake_openai.start("--ttft", "10", "--busy-answer-delay", "3", key=API_KEY)
    front.replicas.append(fake.proc)
    front.join("r0", fake.port)
    front.wait_mode("awake")
    with ThreadPoolExecutor(4) as pool:
        load = [pool.submit(requests.post, f"{fake.url}/v1/chat/completions", json=CHAT,
                            headers=KEYED, timeout=30) for _ in range(4)]  # fmt: skip
        states = states_while(front, lambda: not all(a.done() for a in load))
    assert [a.result().status_code for a in load] == [200] * 4
    modes = [mode for mode, _ in states]
    assert set(modes) == {"awake"}, f"a replica answering late was called unready: {modes}"
    busy = [count for _, count in states]
    assert 1 in busy, "the looks found it busy while it served"
    # Busy while it answers late, not busy and ready by turns (a journal line each time).
    flips = sum(1 for a, b in itertools.pairwise(busy) if a != b)
    assert flips <= 2, f"the busy count flickered: {busy}"
    assert not front.hold_file.exists()
