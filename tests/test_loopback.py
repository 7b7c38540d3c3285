"""tests/support/loopback.py, the HTTP(S) server every fake serves with (the stack emulation's
outside services too): what they rely on it for."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback
import pytest
from stack.pki import Authority


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        loopback.reply(self, 200, b"hello")

    def log_message(self, *_: Any) -> None:
        pass


def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context for 127.0.0.1 and a client context that trusts only its root."""
    ca = Authority("Loopback test")
    chain, key = ca.issue(["127.0.0.1"])
    (tmp_path / "chain.pem").write_text(chain)
    (tmp_path / "key.pem").write_bytes(key)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "chain.pem", tmp_path / "key.pem")
    return server, ssl.create_default_context(cadata=ca.root_pem)


def test_a_silent_client_holds_no_other_over_https(tmp_path: Path) -> None:
    """The handshake is made in the connection's own thread: a client that connects and never
    speaks (nor a client that does not trust the server) keeps the next one waiting."""
    context, trust = tls(tmp_path)
    server = loopback.serve(Hello, tls=context)
    url = f"https://127.0.0.1:{server.server_address[1]}/"
    silent = socket.create_connection(("127.0.0.1", server.server_address[1]))
    try:
        untrusting = ssl.create_default_context()  # the system's roots, not this one
        with pytest.raises(urllib.error.URLError) as refused:
            urllib.request.urlopen(url, context=untrusting, timeout=5)
        assert isinstance(refused.value.reason, ssl.SSLCertVerificationError), refused.value
        with urllib.request.urlopen(url, context=trust, timeout=5) as answer:
            assert answer.read() == b"hello"
    finally:
        silent.close()
        loopback.stop(server)


def backlog(port: int) -> int:
    """A listening socket's backlog: what ss(8) shows as its Send-Q."""
    shown = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                           check=True).stdout.split()  # fmt: skip
    return int(shown[2])


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_listening_socket_keeps_its_backlog_and_a_bound_one_listens() -> None:
    """A caller's listen(64) (the emulation's GitHub and DigitalOcean APIs) is not cut to
    socketserver's 5; a socket only bound is listened on with socketserver's."""
    listening = loopback.bound()
    listening.listen(64)
    for sock, expected in ((listening, 64), (loopback.bound(), 5)):
        server = loopback.serve(Hello, sock)
        try:
            assert backlog(server.server_address[1]) == expected
            with urllib.request.urlopen(loopback.url(server), timeout=5) as answer:  # noqa: S310
                assert answer.read() == b"hello"
        finally:
            loopback.stop(server)
