"""Where a token must not go, on loopback: a recorder that answers 200 with a JSON body and keeps
each request's headers, and a redirector that answers every GET with a 302 to it (another host,
as far as a token is concerned). conftest.py serves them as the `recorder` and `redirect_to`
fixtures, for the clients' and their call sites' tests (test_clients_github.py,
test_clients_transport.py, test_tested.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from loopback import reply, serve, stop, url


class Recorder(BaseHTTPRequestHandler):
    """Answers 200 with a JSON body and keeps each request's headers (class-wide list)."""

    seen: list[dict[str, str]] = []  # noqa: RUF012 (reset by recording())
    body = b'{"ok": true}'

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        reply(self, 200, type(self).body, "application/json")

    do_PUT = do_POST = do_GET  # noqa: N815


@contextmanager
def recording() -> Iterator[str]:
    """The recorder's URL, its list emptied and its body the default."""
    Recorder.seen, Recorder.body = [], b'{"ok": true}'
    server = serve(Recorder)
    try:
        yield url(server)
    finally:
        stop(server)


@contextmanager
def redirecting(recorder: str) -> Iterator[str]:
    """A server that answers every GET with a 302 to `recorder`."""

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
