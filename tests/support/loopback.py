"""HTTP(S) servers in a thread of their own, for the tests' fakes: on loopback (the metrics and
DigitalOcean API autodown reads, the gateway's upstream, the downloads), or on a socket the
caller made, one inside a network namespace say (the stack emulation's outside services: the ACME
CA, DigitalOcean's and GitHub's APIs, the download hosts, the metadata service)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer on a bound socket made elsewhere (a socket keeps the network namespace
    it was made in, network_namespaces(7)). With `tls`, each connection's TLS handshake is made
    in its request's own thread: a handshake in accept() would let one silent client stall every
    other. `tls_timeout` is then the connection's socket timeout, its handshake's and each read
    and write after it."""

    def __init__(
        self,
        sock: socket.socket,
        handler: Callable[..., BaseHTTPRequestHandler] | type[Any],
        tls: ssl.SSLContext | None = None,
        tls_timeout: float = 30,
    ) -> None:
        try:
            super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
            self.socket.close()
            self.socket, self.tls, self.tls_timeout = sock, tls, tls_timeout
            # What HTTPServer.server_bind sets, without its getfqdn(): a reverse lookup of the
            # address (a documentation one, in the emulation) would ask this machine's resolver.
            self.server_address = sock.getsockname()
            self.server_name = str(self.server_address[0])
            self.server_port = self.server_address[1]
            # A socket already listening keeps its backlog (a caller's listen(64), say).
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                self.server_activate()
        except BaseException:
            sock.close()  # the server's now, whatever happened
            raise

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            request.settimeout(self.tls_timeout)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return  # a client that did not trust us, or went away: nothing to answer
        super().finish_request(request, client_address)


def bound(
    host: str = "127.0.0.1", port: int = 0, sock: socket.socket | None = None
) -> socket.socket:
    """`sock` (a new TCP socket made in a namespace, say; else one of `host`'s family here) bound
    to host:port with SO_REUSEADDR, as HTTPServer binds; closed if that fails."""
    if sock is None:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def serve(
    handler: Callable[..., BaseHTTPRequestHandler] | type[Any],
    sock: socket.socket | None = None,
    *,
    tls: ssl.SSLContext | None = None,
    tls_timeout: float = 30,
) -> Server:
    """Serve `handler` on `sock` (bound, listening or not; it is the server's from now on) or on
    a free loopback port; HTTPS when `tls` (see Server). Stop it with stop(). A short poll, so
    that stop() returns within it (the default, 0.5 s, cost every test that used one half a
    second at teardown)."""
    server = Server(bound() if sock is None else sock, handler, tls, tls_timeout)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server


def url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


def reply(
    handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "text/plain"
) -> None:
    """Answer a request of a fake's handler: the status, its type and length, the body."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def stop_group(proc: subprocess.Popen[Any], seconds: float = 10, settle: float = 0.0) -> None:
    """A server a test started in a session of its own (start_new_session=True): TERM to its
    group, KILL if it has not gone within `seconds`, then, `settle` seconds later, KILL to what
    the group left behind (a child it started in the background)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(settle)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def reset(handler: BaseHTTPRequestHandler) -> None:
    """What a process killed mid-request does to its connection: a TCP reset (SO_LINGER 0), no
    answer and no clean close."""
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.close_connection = True
    handler.connection.close()
