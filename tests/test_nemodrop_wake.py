"""nemodrop/wake.py, the waker by hand: the state through the gate (GET /nemotron/wake, keyed), or a
wake now (POST) within the waker's own guards; against the real waker (test_wake.py's fixture,
with a fake GitHub) and against a front on loopback that answers as told. A stack's wake read
with it in the offline `pulumi up` is test_stack_scenarios.py's; a Python without its packages,
test_tools.py's."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import nemodrop_cli
import pytest
from test_wake import API_KEY, FakeGitHub, Front, expires_in, front_factory, pipeline_of, wake_tool

__all__ = ["front_factory"]  # the fixture, used by name

TOOL = nemodrop_cli.argv("wake")


def test_the_wake_tool_shows_the_state_and_wakes_by_hand_within_the_guards(
    front_factory: Callable[..., Front],
) -> None:
    github = FakeGitHub(token_expires=expires_in(5))
    front = front_factory(github, WAKE_MAX_PER_DAY="1")
    pipeline_of(front)
    shown = wake_tool(front)
    assert shown.returncode == 0 and "mode: asleep" in shown.stdout, shown.stderr
    assert "wakes in the last 24 h: 0 of 1" in shown.stdout
    assert "): warning: wake.token expires on " in shown.stdout, shown.stdout
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


@pytest.fixture
def answering() -> Iterator[Callable[..., tuple[str, list[tuple[str, str, str]]]]]:
    """A front on loopback whose /nemotron/wake answers each method as told; it keeps each
    request's method, path and Authorization header."""
    servers: list[ThreadingHTTPServer] = []

    def make(**answers: tuple[int, dict[str, Any], dict[str, str]]) -> tuple[str, list[Any]]:
        seen: list[tuple[str, str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                seen.append((self.command, self.path, self.headers.get("Authorization", "")))
                status, body, headers = answers[self.command]
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {**headers, "Content-Type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.answer()

            def do_POST(self) -> None:
                self.answer()

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/v1", seen

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def tool(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "OPENAI_API_KEY": API_KEY}
    return subprocess.run([*TOOL, "--endpoint", endpoint, *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


STATE = {
    "mode": "failed", "since": "2026-12-06T01:00:00Z", "replicas_healthy": 1, "replicas_busy": 1,
    "wakes_last_day": 2, "max_per_day": 4, "trigger": "github", "hold_seconds": 540,
    "pipeline": {"checked_at": "2026-12-06T00:59:00Z", "problem": "the token was refused"},
    "last_failure": "the deploy run failed: job up, step pulumi up",
    "last_wake": {"asked_at": "2026-12-06T00:40:00Z", "pipeline_started": "00:40:02"},
}  # fmt: skip


def test_the_state_names_busy_replicas_the_pipelines_problem_and_the_last_failure(
    answering: Callable[..., tuple[str, list[tuple[str, str, str]]]],
) -> None:
    """What the front says, line by line; a failed mode exits 1. The key goes as the Bearer
    header to the control path, and nowhere in what the tool prints."""
    endpoint, seen = answering(GET=(200, STATE, {}))
    shown = tool(endpoint)
    assert shown.returncode == 1, shown.stderr
    assert shown.stdout.splitlines() == [
        "mode: failed since 2026-12-06T01:00:00Z (1 replica(s) answering; 1 busy: no /health "
        "answer in time, counted as before)",
        "wakes in the last 24 h: 2 of 4; trigger: github; hold: 540 s",
        "pipeline (2026-12-06T00:59:00Z): PROBLEM: the token was refused",
        "last failure: the deploy run failed: job up, step pulumi up",
        "last wake: asked_at 2026-12-06T00:40:00Z, pipeline_started 00:40:02",
    ]
    assert seen == [("GET", "/nemotron/wake", f"Bearer {API_KEY}")]
    assert API_KEY not in shown.stdout + shown.stderr


def test_a_refused_wake_says_why_and_when_and_a_front_without_a_waker_is_named(
    answering: Callable[..., tuple[str, list[tuple[str, str, str]]]],
) -> None:
    spent = {"error": {"message": "wake.maxPerDay (1) is spent"}}
    endpoint, seen = answering(POST=(429, spent, {"Retry-After": "3600"}))
    refused = tool(endpoint, "--now")
    assert refused.returncode == 1, refused.stderr
    assert refused.stdout == "refused: wake.maxPerDay (1) is spent (retry after 3600 s)\n"
    assert [method for method, _, _ in seen] == ["POST"], "no state asked after a refusal"
    endpoint, _ = answering(POST=(404, {}, {}), GET=(404, {}, {}))
    for args, said in ((("--now",), "no waker here: is wake.enabled set?"),
                       ((), "HTTP 404: is wake.enabled set for this stack?")):  # fmt: skip
        missing = tool(endpoint, *args)
        assert missing.returncode == 2 and said in missing.stderr, (args, missing.stderr)
        assert "Traceback" not in missing.stderr
    endpoint, _ = answering(GET=(401, {}, {}))
    assert "the front refused the key (HTTP 401)" in tool(endpoint).stderr
