"""scripts/clients/transport.py, what every client that carries a token shares: a redirect is an
answer and the token stays home (no request reaches the Location), the token goes over HTTPS
only (plain HTTP to 127.0.0.1 alone), an answer is read to a bound. Against the recorder and the
redirector on loopback (support/recorder.py), through transport.request or GitHub's client, which
is transport.request with GitHub's headers. Each client's own headers, names and retries:
test_clients_github.py, test_clients_digitalocean.py; the waker's and autodown's copies of the
URL and Retry-After rules answer as transport.py does: test_layout.py."""

from __future__ import annotations

import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from loopback import serve, stop, url
from recorder import Recorder
from test_clients_github import AGENT, TOKEN

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))

from clients import github, transport  # noqa: E402


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


@pytest.mark.parametrize("ending", ["\r", "\n", "\r\n", "\0"])
def test_a_token_with_a_line_ending_is_refused_in_words_that_hold_no_token(
    recorder: str, ending: str
) -> None:
    """A token pasted with its line ending (a .env with CRLF): http.client's own error quotes
    the whole header, and the callers print what they catch (nemodrop status did)."""
    secret = "dop_v1_FAKESECRETtoken0123456789"
    with pytest.raises(transport.FailedError) as caught:
        transport.request(
            "GET", f"{recorder}/v2/account", {"Authorization": f"Bearer {secret}{ending}"}, 5
        )
    assert secret not in str(caught.value) and "Authorization header" in str(caught.value)
    assert Recorder.seen == [], "nothing was sent"
