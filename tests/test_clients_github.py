"""scripts/clients/github.py (and transport.py under it): GitHub's headers on every call, the
token kept from a redirect and from plain HTTP, bounded answers, the retry rules; against the
strict fake GitHub (tests/support/stack/github_api.py) and recorders on loopback
(support/recorder.py). The one call site that followed redirects with the token
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


def test_a_redirect_is_an_answer_and_the_token_stays_home(redirect_to: str) -> None:
    answer = github.get(f"{redirect_to}/repos/old/name", TOKEN, AGENT, 5)
    assert answer.status_code == 302
    assert Recorder.seen == [], "nothing reached the redirect's target"


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
