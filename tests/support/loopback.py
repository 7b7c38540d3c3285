"""An HTTP server on loopback in a thread of its own, for the tests' fakes (the metrics and
DigitalOcean API autodown reads, the ACME CA, the gateway's upstream, the downloads)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def serve(handler: Callable[..., BaseHTTPRequestHandler] | type[Any]) -> ThreadingHTTPServer:
    """Start `handler` on a free loopback port. A short poll, so that stop() returns within it
    (the default, 0.5 s, cost every test that used one half a second at teardown)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
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
