"""scripts/clients/github.py: GitHub's headers and the token on every call, a refused token and
a missing scope named, a rate limit waited out; against the strict fake GitHub
(tests/support/stack/github_api.py) and a recorder on loopback (support/recorder.py). What
transport.py under it rules (no redirect followed, HTTPS only, bounded answers):
test_clients_transport.py. The one call site that followed redirects with the token
(scripts/ci/tested.py) follows none: test_tested.py."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import stop, url
from recorder import Recorder
from stack import github_api

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))

from clients import github, transport  # noqa: E402

TOKEN = "ghs_CLIENTtestTOKEN000000000000000000000"
AGENT = "nemotron-droplet-test"


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
