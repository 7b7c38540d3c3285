"""scripts/phases/wake.py, the front's waker, for real on loopback: a fake GitHub API that checks
the token and the inputs, a fake pipeline that brings a replica (tests/support/fake_openai.py)
up behind the upstream files Caddy reads, and clients that ask as Caddy's forward_auth does
(GET /route) and then send the held request."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback
import openai
import pytest
import requests
from pulumi_harness import stack_config
from sandbox import CADDY, free_port
from stack import github_api
from stack.github_api import GitHub
from test_gateway import KEY, run_caddy

from components import config, gateway, wake

ROOT = Path(__file__).resolve().parent.parent
WAKE = ROOT / "scripts" / "phases" / "wake.py"
FAKE = ROOT / "tests" / "support" / "fake_openai.py"
TOKEN = "github_pat_WAKEtestTOKEN000000000000000000000000"
API_KEY = KEY  # the gateway's test key (test_gateway.spawn_caddy gives Caddy this one)
CHAT = {"model": "nemotron", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@dataclass
class FakeGitHub(GitHub):
    """The shared fake GitHub (tests/support/stack/github_api.py: the token, the workflow's path
    and its declared inputs checked, answered 401, 404 or 422 otherwise), for the repository and
    workflow the waker is set up with here; `refuse` answers a dispatch it recorded with that
    status instead, and `on_dispatch` is the pipeline an accepted one starts."""

    repo: str = "me/llm"
    workflow: str = "deploy.yml"
    token: str = TOKEN
    refuse: int | None = None
    on_dispatch: Callable[[], None] | None = None

    def answer(self, method: str, path: str, auth: str, body: bytes) -> tuple[int, Any]:
        status, reply = super().answer(method, path, auth, body)
        if status == 204 and self.refuse:
            return self.refuse, {"message": "refused"}
        if status == 204 and self.on_dispatch:
            threading.Thread(target=self.on_dispatch, daemon=True).start()
        return status, reply

    def wait_dispatches(self, count: int, seconds: float = 10) -> None:
        """The waker dispatches from a thread of its own: a test that has seen the wake begin
        waits for its POST to arrive before counting it (then it must be exactly `count`)."""
        end = time.monotonic() + seconds
        while len(self.dispatches) < count and time.monotonic() < end:
            time.sleep(0.05)
        assert len(self.dispatches) == count, self.dispatches


@dataclass
class Front:
    """The waker on loopback, its upstream folder and the fakes around it."""

    url: str
    upstreams: Path
    github: FakeGitHub
    proc: subprocess.Popen[str]
    replicas: list[subprocess.Popen[str]] = field(default_factory=list)

    def start_replica(self, name: str = "r0") -> None:
        """What the deploy does in the end: a replica answers and joins the balancer."""
        proc = subprocess.Popen([sys.executable, str(FAKE), "--api-key", API_KEY, "--tokens",
                                 "4", "--itl", "0.01"], stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = line.split()[-1].rsplit(":", 1)[1]
        self.replicas.append(proc)
        (self.upstreams / f"{name}.caddy").write_text(f"to 127.0.0.1:{port}\n")

    def stop_replicas(self) -> None:
        for proc in self.replicas:
            proc.kill()
            proc.wait()
        self.replicas.clear()

    def route(
        self, at: str = wake.ROUTE_URI, uri: str = "/v1/chat/completions"
    ) -> requests.Response:
        """forward_auth's question, at the path the gateway asks it (wake.ROUTE_URI for a keyed
        request, wake.PROBE_URI for /health), with the request's path as Caddy forwards it."""
        return requests.get(f"{self.url}{at}", headers={"X-Forwarded-Uri": uri}, timeout=10)

    def send(self, body: dict[str, Any], stream: bool = False) -> requests.Response:
        """The held request, as Caddy sends it on after a `hold` route."""
        return requests.post(f"{self.url}/v1/chat/completions", json=body, stream=stream,
                             headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)  # fmt: skip

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = requests.get(f"{self.url}{wake.CONTROL_PATH}", timeout=5).json()
        return data

    def wait_mode(self, mode: str, seconds: float = 10) -> None:
        end = time.monotonic() + seconds
        while self.state()["mode"] != mode:
            assert time.monotonic() < end, f"not {mode}: {self.state()}"
            time.sleep(0.05)


def later(seconds: float, then: Callable[[], None]) -> Callable[[], None]:
    """The fake pipeline: `then` (a replica joins) after `seconds` of deploying."""

    def run() -> None:
        time.sleep(seconds)
        then()

    return run


@pytest.fixture
def front_factory(tmp_path: Path) -> Iterator[Callable[..., Front]]:
    fronts: list[Front] = []
    servers = []

    def make(github: FakeGitHub | None = None, **settings: str) -> Front:
        github = github or FakeGitHub()
        server = github_api.serve(github, socket.create_server(("127.0.0.1", 0)), None)
        servers.append(server)
        upstreams = tmp_path / f"upstreams{len(fronts)}"
        upstreams.mkdir()
        token = tmp_path / "token"
        token.write_text(TOKEN + "\n")
        env = {
            "PATH": os.environ["PATH"], "WAKE_LISTEN": "127.0.0.1:0",
            "WAKE_UPSTREAMS_DIR": str(upstreams), "WAKE_TRIGGER": "github", "WAKE_STACK": "dev",
            "WAKE_TOKEN_FILE": str(token), "WAKE_GITHUB_API": loopback.url(server),
            "WAKE_GITHUB_REPO": "me/llm", "WAKE_GITHUB_WORKFLOW": "deploy.yml",
            "WAKE_HOLD_SECONDS": "30", "WAKE_EXPECTED_SECONDS": "5",
            "WAKE_HEALTH_SECONDS": "0.2", "WAKE_COMMENT_SECONDS": "0.3",
            "WAKE_STATE_FILE": str(tmp_path / f"state{len(fronts)}.json"), **settings,
        }  # fmt: skip
        proc = subprocess.Popen([sys.executable, str(WAKE)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["event"] == "listening", first
        front = Front(f"http://{first['address']}", upstreams, github, proc)
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


def test_a_keyed_request_wakes_the_set_once_and_is_held_until_a_replica_answers(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github)
    github.on_dispatch = later(1.0, front.start_replica)
    assert front.state()["mode"] == "asleep"
    assert front.route().headers["Nemotron-Route"] == "hold"
    answers: list[requests.Response] = []
    held = [threading.Thread(target=lambda: answers.append(front.send(CHAT))) for _ in range(3)]
    for thread in held:
        thread.start()
    # A second keyed request during the wake starts no second one.
    assert front.route().headers["Nemotron-Route"] == "hold"
    for thread in held:
        thread.join(timeout=30)
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert answers[0].json()["choices"][0]["message"]["content"]
    assert github.dispatches == [
        {"ref": "main", "inputs": {"stack": "dev", "command": "up", "refresh": "true"}}
    ]
    front.wait_mode("awake")
    assert front.route().headers["Nemotron-Route"] == "awake"
    last = front.state()["last_wake"]
    assert list(last) == [
        "request_in", "pipeline_started", "replica_joined", "ready", "first_token"
    ]  # fmt: skip


def test_a_streamed_request_sees_it_waking_then_the_stream(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github)
    github.on_dispatch = later(1.0, front.start_replica)
    front.route()
    with front.send({**CHAT, "stream": True}, stream=True) as answer:
        assert answer.status_code == 200
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines(decode_unicode=True) if line]
    comments = [line for line in lines if line.startswith(": waking")]
    data = [line for line in lines if line.startswith("data: ")]
    assert comments and "expected" in comments[0], lines
    assert lines.index(comments[-1]) < lines.index(data[0]), "progress first, then the answer"
    assert data[-1] == "data: [DONE]"
    chunks = [json.loads(d.removeprefix("data: ")) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_a_failing_pipeline_answers_the_held_requests_with_why_and_does_not_retry(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github, WAKE_COOLDOWN_MINUTES="5")

    def failed_run() -> None:
        time.sleep(0.5)
        github.finish_run("failure")

    github.on_dispatch = failed_run
    front.route()
    started = time.monotonic()
    answer = front.send(CHAT)
    assert answer.status_code == 503 and time.monotonic() - started < 20
    error = answer.json()["error"]
    assert error["code"] == "wake_failed"
    assert (
        "the deploy run ended failure: https://github.com/me/llm/actions/runs/1"
        in (error["message"])
    )
    assert int(answer.headers["Retry-After"]) > 0
    time.sleep(1.5)
    assert len(github.dispatches) == 1, "a failed wake is not retried by itself"
    again = front.route()
    assert (
        again.status_code == 503 and "wake.cooldownMinutes: 5" in again.json()["error"]["message"]
    )
    assert len(github.dispatches) == 1


def test_a_refused_token_fails_the_wake_with_githubs_reason(
    front_factory: Callable[..., Front],
) -> None:
    front = front_factory(FakeGitHub(refuse=403))
    front.route()
    answer = front.send(CHAT)
    assert answer.status_code == 503
    assert (
        "GitHub refused the wake (HTTP 403: the token may not run workflows"
        in (answer.json()["error"]["message"])
    )


def test_the_day_budget_refuses_naming_wake_max_per_day(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github, WAKE_MAX_PER_DAY="1")
    github.on_dispatch = front.start_replica
    front.route()
    assert front.send(CHAT).status_code == 200
    front.stop_replicas()  # autodown deleted the set
    front.wait_mode("asleep")
    refused = front.route()
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) > 80000
    error = refused.json()["error"]
    assert error["code"] == "wake_budget_spent" and "wake.maxPerDay (1)" in error["message"]
    assert len(github.dispatches) == 1


def test_a_hold_past_wake_hold_seconds_is_answered_with_retry_after(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()  # the pipeline starts, and takes longer than the hold
    front = front_factory(github, WAKE_HOLD_SECONDS="1.5", WAKE_EXPECTED_SECONDS="120")
    front.route()
    started = time.monotonic()
    answer = front.send(CHAT)
    assert answer.status_code == 503 and 1.4 < time.monotonic() - started < 10
    assert "still waking" in answer.json()["error"]["message"]
    assert "wake.holdSeconds: 1.5" in answer.json()["error"]["message"]
    assert int(answer.headers["Retry-After"]) >= 30
    assert front.state()["mode"] == "waking", "the wake goes on for the next request"


def test_health_says_waking_and_since_when_and_never_wakes(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github)
    assert front.route(wake.PROBE_URI, "/health").headers["Nemotron-Route"] == "hold"
    # The probe's path decides, not the request's: a probe forwarded as any path wakes nothing.
    assert front.route(wake.PROBE_URI).headers["Nemotron-Route"] == "hold"
    health = requests.get(f"{front.url}/health", timeout=5)
    assert health.status_code == 503 and health.json()["status"] == "asleep"
    time.sleep(0.5)  # a dispatch would be on its way from the waker's thread by now
    assert github.dispatches == [], "/health is not a keyed request: it wakes nothing"
    assert front.state()["mode"] == "asleep"
    front.route()
    health = requests.get(f"{front.url}/health", timeout=5).json()
    assert health["status"] == "waking" and health["since"].endswith("Z")
    github.wait_dispatches(1)


def test_the_day_budget_survives_a_restart_of_the_waker(
    front_factory: Callable[..., Front], tmp_path: Path
) -> None:
    github = FakeGitHub()
    front = front_factory(github, WAKE_MAX_PER_DAY="1", WAKE_STATE_FILE=str(tmp_path / "s.json"))
    front.route()
    github.wait_dispatches(1)
    front.proc.kill()
    front.proc.wait()
    again = front_factory(github, WAKE_MAX_PER_DAY="1", WAKE_STATE_FILE=str(tmp_path / "s.json"))
    assert again.route().status_code == 503, "a crash loop must not reset the day's wakes"
    assert len(github.dispatches) == 1


# ---- behind the real Caddy, with the balancer's Caddyfile as the gateway phase renders it -------


def test_behind_caddy_keyless_floods_wake_nothing_and_a_keyed_request_wakes_once(
    front_factory: Callable[..., Front], tmp_path: Path
) -> None:
    github = FakeGitHub()
    front = front_factory(github, WAKE_EXPECTED_SECONDS="60")
    sock_dir = Path(tempfile.mkdtemp(prefix="nemo-admin-"))  # a socket path under 108 bytes
    admin = sock_dir / "admin.sock"
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": False}
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": TOKEN}
    cfg = config.parse(raw, "dev", frozenset({"wake"}))
    listen = gateway.Listen(http_port=free_port(), https_port=free_port(),
                            admin_socket=str(admin), upstreams=f"{front.upstreams}/*.caddy",
                            waker=front.url.removeprefix("http://"))  # fmt: skip
    url = f"http://127.0.0.1:{listen.http_port}"
    chat = f"{url}/v1/chat/completions"
    folder = tmp_path / "caddy"

    def deploy() -> None:
        """The pipeline's end, as on the front: the replica answers, its member phase writes
        its upstream file and reloads Caddy gracefully."""
        time.sleep(1.0)
        front.start_replica()
        subprocess.run(
            [str(CADDY), "reload", "--config", str(folder / "Caddyfile"), "--adapter",
             "caddyfile", "--address", f"unix/{admin}"],
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), gateway.API_KEY_ENV: KEY},
            capture_output=True, check=True, timeout=30,
        )  # fmt: skip

    github.on_dispatch = deploy
    site = gateway.balancer_site(cfg, "front.example", listen)
    try:
        for _ in run_caddy(folder, site, f"{url}/health"):
            # Scans and bots: no key, a wrong key, a doubled header. None reaches the waker.
            def knock(headers: dict[str, str]) -> int:
                return requests.post(chat, json=CHAT, headers=headers, timeout=10).status_code

            bad = [{}, {"Authorization": "Bearer sk-wrong"},
                   {"Authorization": f"Bearer {API_KEY}, Bearer {API_KEY}"}] * 100  # fmt: skip
            with ThreadPoolExecutor(16) as pool:
                codes = list(pool.map(knock, bad))
            assert set(codes) == {401}
            assert github.dispatches == [], "nothing without the key wakes the set"
            health = requests.get(f"{url}/health", timeout=10)
            assert health.status_code == 503 and health.json()["status"] == "asleep"
            assert requests.get(f"{url}/nemotron/wake", timeout=10).status_code == 401
            # The first keyed request wakes the set and is answered once a replica is up.
            keyed = {"Authorization": f"Bearer {API_KEY}"}
            answer = requests.post(chat, json=CHAT, headers=keyed, timeout=60)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"]
            assert len(github.dispatches) == 1
            front.wait_mode("awake")
            # Awake: the front proxies to the replicas as always; nothing more is dispatched.
            for _ in range(5):
                again = requests.post(chat, json=CHAT, headers=keyed, timeout=30)
                assert again.status_code == 200, again.text
            assert len(github.dispatches) == 1
            assert requests.get(f"{url}/health", timeout=10).status_code == 200
            state = requests.get(f"{url}/nemotron/wake", headers=keyed, timeout=10).json()
            assert state["mode"] == "awake" and state["wakes_last_day"] == 1
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def wake_tool(front: Front, *args: str) -> subprocess.CompletedProcess[str]:
    """scripts/wake.py against the front (here the waker itself answers /nemotron/wake)."""
    env = {"PATH": os.environ["PATH"], "OPENAI_API_KEY": API_KEY}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wake.py"), "--endpoint", f"{front.url}/v1",
         *args], env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_wake_tool_shows_the_state_and_wakes_by_hand_within_the_guards(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub()
    front = front_factory(github, WAKE_MAX_PER_DAY="1")
    shown = wake_tool(front)
    assert shown.returncode == 0 and "mode: asleep" in shown.stdout, shown.stderr
    assert "wakes in the last 24 h: 0 of 1" in shown.stdout
    woken = wake_tool(front, "--now")
    assert woken.returncode == 0 and "waking" in woken.stdout, woken.stderr
    github.wait_dispatches(1)
    front.start_replica()
    front.wait_mode("awake")
    front.stop_replicas()
    front.wait_mode("asleep")
    refused = wake_tool(front, "--now")
    assert refused.returncode == 1 and "wake.maxPerDay (1)" in refused.stdout
    assert "retry after" in refused.stdout
    assert API_KEY not in shown.stdout + woken.stdout + refused.stdout + refused.stderr


def test_a_replica_that_just_joined_is_found_before_any_wake(
    front_factory: Callable[..., Front],
) -> None:
    """The deploy's own ready probe comes through the front a moment after the replica joins,
    before the monitor's next look: the front looks again before it wakes anything."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_HEALTH_SECONDS="60")
    front.wait_mode("asleep")
    front.start_replica()
    assert front.route().headers["Nemotron-Route"] == "awake"
    assert github.dispatches == [] and front.state()["mode"] == "awake"


def test_the_openai_client_gets_a_clear_error_when_the_hold_runs_out(
    front_factory: Callable[..., Front],
) -> None:
    """What a user's OpenAI client sees (the official Python client, its retries off so the
    test does not wait out Retry-After): an APIStatusError 503 whose message says why."""
    front = front_factory(FakeGitHub(), WAKE_HOLD_SECONDS="1", WAKE_EXPECTED_SECONDS="300")
    front.route()
    client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="nemotron", messages=CHAT["messages"], max_tokens=4)
    assert raised.value.status_code == 503
    assert "still waking" in str(raised.value) and "wake.holdSeconds: 1" in str(raised.value)
    assert int(raised.value.response.headers["Retry-After"]) >= 30


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
        front.route()
        front.wait_mode("waking")
        end = time.monotonic() + 10
        while not calls:
            assert time.monotonic() < end
            time.sleep(0.05)
        assert calls == [(TOKEN, {"stack": "dev", "event": "wake"})]
        assert front.state()["last_wake"]["pipeline_started"]
        status[0] = 500
        second = front_factory(
            WAKE_TRIGGER="webhook", WAKE_WEBHOOK_URL=f"{loopback.url(hook)}/deploy",
            WAKE_WEBHOOK_HEADER="X-Wake-Token",
        )  # fmt: skip
        second.route()
        answer = second.send(CHAT)
        assert answer.status_code == 503
        assert "the webhook refused the wake (HTTP 500)" in answer.json()["error"]["message"]
    finally:
        loopback.stop(hook)


def test_a_set_deleted_since_the_last_look_is_held_and_woken_not_proxied_to(
    front_factory: Callable[..., Front],
) -> None:
    """Autodown deleted the set moments ago and the monitor has not looked since: a keyed
    request must not be sent to replicas that are gone; the front looks again, holds it and
    wakes the set."""
    github = FakeGitHub()
    front = front_factory(github, WAKE_HEALTH_SECONDS="60")
    front.start_replica()
    assert front.route().headers["Nemotron-Route"] == "awake"
    front.stop_replicas()
    time.sleep(5.5)  # past the freshness of the last look (wake.py FRESH_SECONDS)
    assert front.route().headers["Nemotron-Route"] == "hold"
    github.wait_dispatches(1)


def test_the_control_path_is_one_value_in_its_three_places() -> None:
    """The gate's route to the waker: the program's (components/wake.py), the waker's own (it runs
    on the front with the standard library alone) and the tool's (the tools' venv has no
    pydantic, which the program's module needs): held equal here."""
    found = {
        path: re.search(r'^CONTROL_PATH = "([^"]+)"', (ROOT / path).read_text(), re.M)
        for path in ("components/wake.py", "scripts/phases/wake.py", "scripts/wake.py")
    }
    assert {path: m.group(1) if m else None for path, m in found.items()} == dict.fromkeys(
        found, "/nemotron/wake"
    )
    # forward_auth's paths and its answer's header: the program's and the waker's.
    waker = (ROOT / "scripts" / "phases" / "wake.py").read_text()
    assert f'ROUTE_URI, PROBE_URI = "{wake.ROUTE_URI}", "{wake.PROBE_URI}"' in waker
    assert f'ROUTE_HEADER = "{wake.ROUTE_HEADER}"' in waker
