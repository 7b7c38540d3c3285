"""scripts/clients/github.py (and transport.py under it): GitHub's headers on every call, the
token kept from a redirect and from plain HTTP, bounded answers, the retry rules; against the
strict fake GitHub (tests/support/stack/github_api.py) and recorders on loopback. And the one
call site that followed redirects with the token (scripts/ci/tested.py) follows none."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import script_module
from loopback import reply, serve, stop, url
from stack import github_api

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))

from clients import github, transport  # noqa: E402

TOKEN = "ghs_CLIENTtestTOKEN000000000000000000000"
AGENT = "nemotron-droplet-test"


class Recorder(BaseHTTPRequestHandler):
    """Answers 200 with a JSON body and keeps each request's headers (class-wide list)."""

    seen: list[dict[str, str]] = []  # noqa: RUF012 (reset by the fixture)
    body = b'{"ok": true}'

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        reply(self, 200, type(self).body, "application/json")

    do_PUT = do_POST = do_GET  # noqa: N815


@pytest.fixture
def recorder() -> Iterator[str]:
    Recorder.seen, Recorder.body = [], b'{"ok": true}'
    server = serve(Recorder)
    try:
        yield url(server)
    finally:
        stop(server)


@pytest.fixture
def redirect_to(recorder: str) -> Iterator[str]:
    """A server that answers every GET with a 302 to the recorder (another host, as far as a
    token is concerned)."""

    class Redirector(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"{recorder}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = serve(Redirector)
    try:
        yield url(server)
    finally:
        stop(server)


def test_every_call_sends_githubs_headers_and_the_token(recorder: str) -> None:
    answer = github.get(f"{recorder}/repos/me/llm", TOKEN, AGENT, 5)
    assert answer.status_code == 200 and answer.json() == {"ok": True}
    api = github.api(recorder + "/", TOKEN, AGENT, sleep=lambda _: None)
    assert (
        api.call("PUT", "/repos/me/llm/actions/workflows/lease.yml/enable", "x").status_code == 200
    )
    for sent in Recorder.seen:
        assert sent["accept"] == "application/vnd.github+json"
        assert sent["x-github-api-version"] == "2022-11-28"
        assert sent["user-agent"] == AGENT
        assert sent["authorization"] == f"Bearer {TOKEN}"
    assert len(Recorder.seen) == 2


def test_a_redirect_is_an_answer_and_the_token_stays_home(redirect_to: str) -> None:
    answer = github.get(f"{redirect_to}/repos/old/name", TOKEN, AGENT, 5)
    assert answer.status_code == 302
    assert Recorder.seen == [], "nothing reached the redirect's target"


def test_tested_py_follows_no_redirect_with_the_token(
    redirect_to: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """deploy.yml's `tested` job used urllib's urlopen, which follows a 302 and sends the
    Authorization header on to wherever it points. Now the redirect is an answer: the commit
    counts as not tested (the suite runs) and the token went nowhere else."""
    tested = script_module.load(ROOT / "scripts" / "ci" / "tested.py", "tested_redirect")
    env = {"GITHUB_API_URL": redirect_to, "GITHUB_REPOSITORY": "me/llm",
           "GITHUB_SHA": "0" * 40, "GITHUB_TOKEN": TOKEN}  # fmt: skip
    args = tested.argparse.Namespace(command="up", workflow="deploy.yml", job="test")
    run_tests, why = tested.decide(args, env)
    assert run_tests and "HTTP 302" in why
    assert Recorder.seen == [], "the token followed the redirect"
    assert TOKEN not in capsys.readouterr().out + why


@pytest.mark.parametrize("where", ["http://localhost:1", "http://127.0.0.1:1@example.com",
                                   "http://api.github.com"])  # fmt: skip
def test_the_token_goes_over_https_or_to_127_0_0_1_only(where: str) -> None:
    with pytest.raises(ValueError, match="HTTPS only"):
        github.get(f"{where}/repos/me/llm", TOKEN, AGENT, 5)


def test_an_answer_is_read_to_a_bound(recorder: str) -> None:
    Recorder.body = b"[" + b"0," * 600 + b"0]"
    with pytest.raises(transport.FailedError, match="over 1000 bytes"):
        transport.request("GET", f"{recorder}/big", {}, 5, limit=1000)
    assert transport.request("GET", f"{recorder}/big", {}, 5, limit=5000).json() == [0] * 601


@pytest.fixture
def fake_github() -> Iterator[tuple[github_api.GitHub, str]]:
    fake = github_api.GitHub(repo="me/llm", workflow="deploy.yml", token=TOKEN)
    server = github_api.serve(fake, socket.create_server(("127.0.0.1", 0)), None)
    try:
        yield fake, url(server)
    finally:
        stop(server)


def test_the_strict_fake_github_answers_the_client(
    fake_github: tuple[github_api.GitHub, str],
) -> None:
    _, api_url = fake_github
    ref = github.get(f"{api_url}/repos/me/llm/git/ref/heads/main", TOKEN, AGENT, 5)
    assert ref.status_code == 200 and ref.json()["ref"] == "refs/heads/main"
    wrong = github.get(f"{api_url}/repos/me/llm/git/ref/heads/main", "nope", AGENT, 5)
    assert wrong.status_code == 401


def test_a_refused_token_is_named_and_a_rate_limit_waited_out(
    fake_github: tuple[github_api.GitHub, str],
) -> None:
    fake, api_url = fake_github
    with pytest.raises(
        transport.RefusedError, match=r"GITHUB_TOKEN: GitHub refused it \(HTTP 401\)"
    ):
        github.api(api_url, "nope", AGENT).call("GET", "/repos/me/llm", "metadata: read")
    fake.secondary_limited = True  # 403 with Retry-After: 60, x-ratelimit-remaining not 0
    with pytest.raises(transport.RefusedError, match="needs the scope actions: read"):
        github.api(api_url, TOKEN, AGENT).call("GET", "/repos/me/llm", "actions: read")
    fake.secondary_limited, fake.rate_limited = False, True  # 403, x-ratelimit-remaining: 0
    slept: list[float] = []
    api = github.api(api_url, TOKEN, AGENT, sleep=slept.append)
    with pytest.raises(transport.FailedError, match="rate limited"):
        api.call("GET", "/repos/me/llm", "actions: read")
    assert slept == [60.0, 60.0, 60.0], "Retry-After missing: 60 s each, 180 s in all"


def test_a_post_sends_githubs_headers_the_token_and_its_json(recorder: str) -> None:
    """github.post (a workflow_dispatch): GitHub's headers, the token and a JSON body. (A POST
    answered with a redirect: tests/test_wake_pipeline.py, its one caller.)"""
    answer = github.post(f"{recorder}/x", TOKEN, AGENT, 5, {"ref": "main"})
    assert answer.status_code == 200
    sent = Recorder.seen[-1]
    assert sent["content-type"] == "application/json" and sent["content-length"] == "15"
    assert sent["authorization"] == f"Bearer {TOKEN}" and sent["x-github-api-version"]


def test_a_job_log_is_fetched_from_its_redirect_without_the_token(
    recorder: str, redirect_to: str
) -> None:
    """GitHub answers a job log's download with a 302 to a signed storage URL: that URL gets
    the User-Agent alone, never the token; a log longer than its bound comes back cut, not
    refused (its beginning is worth reading); an answer that is no log is None."""
    Recorder.body = b"line one\nline two\n"
    assert (
        github.job_log(f"{redirect_to}/logs", TOKEN, AGENT, 5, 1000, 10) == Recorder.body.decode()
    )
    assert Recorder.seen[-1]["user-agent"] == AGENT and "authorization" not in Recorder.seen[-1]
    assert github.job_log(f"{redirect_to}/logs", TOKEN, AGENT, 5, 8, 10) == "line one"
    assert github.job_log(f"{recorder}/logs", TOKEN, AGENT, 5, 1000, 10) == Recorder.body.decode()


class Trickle(BaseHTTPRequestHandler):
    """An answer whose body comes a byte every 0.1 s, for 1.5 s."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "15")
        self.end_headers()
        for _ in range(15):
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(0.1)


def test_an_answer_that_trickles_is_bounded_in_time() -> None:
    """A socket timeout bounds one read, so an answer that trickles would never time out:
    `within` bounds the whole read (FailedError), and request_cut keeps what came by then."""
    server = serve(Trickle)
    try:
        started = time.monotonic()
        with pytest.raises(transport.FailedError, match=r"still coming after 0\.5 s"):
            transport.request("GET", f"{url(server)}/t", {}, 5, within=0.5)
        cut = transport.request_cut("GET", f"{url(server)}/t", {}, 5, 1000, 0.5)
        assert time.monotonic() - started < 2.5
        assert not cut.complete and 0 < len(cut.body) < 15
    finally:
        stop(server)
