"""What reaches vLLM through the real Caddy: the gateway decides on the exact request target it
forwards. A recording upstream counts every request that got past it, so a trick that the
gateway answered 404 but still proxied would show."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import loopback
import pytest
from sandbox import free_port
from test_balancer import needs_router, routed_cfg, running_router
from test_gateway import KEY, Gateway, run_caddy, start_gateway

from components.host import gateway


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """A request's body framed as HTTP/1.1 frames it: its chunks (RFC 9112 7.1) or its length."""
    if "chunked" not in handler.headers.get("Transfer-Encoding", "").lower():
        length = int(handler.headers.get("Content-Length") or 0)
        return handler.rfile.read(length) if length else b""
    body = b""
    while size := int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16):
        body += handler.rfile.read(size)
        handler.rfile.readline()
    while handler.rfile.readline().strip():  # the trailer section, to its empty line
        pass
    return body


class Upstream:
    """Answers 200 to anything and records the raw request target, the Authorization values,
    the headers and the body length of every request that reached it. It keeps
    connections alive and frames each body by its length or its chunks, as a real server does,
    so bytes smuggled past the gateway on one connection would show as a request of their own."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        # Behind the front awake, Caddy's own health checks (GET /health without a key) are not
        # requests that got past the gate: not recorded.
        self.probes_only = False
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle(self) -> None:
                # The gateway may close a kept-alive connection at any time: not an error.
                with contextlib.suppress(ConnectionError):
                    super().handle()

            def _any(self) -> None:
                body = read_body(self)
                checker = self.path == "/health" and "Authorization" not in self.headers
                if upstream.probes_only and checker and "X-Forwarded-For" not in self.headers:
                    data = b"{}"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                upstream.seen.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "auth": self.headers.get_all("Authorization") or [],
                        "body": len(body),
                        "headers": dict(self.headers.items()),
                    }
                )
                data = b'{"object":"list","data":[]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_HEAD = do_DELETE = _any  # noqa: N815

            def log_message(self, *_: Any) -> None:
                pass

        self.server = loopback.serve(Handler)
        # Its kept-alive connections end with the gateway's: close() does not wait for them.
        self.server.block_on_close = False

    @property
    def url(self) -> str:
        return loopback.url(self.server)

    def close(self) -> None:
        loopback.stop(self.server)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.close()


@pytest.fixture(
    params=[
        (True, None),
        (False, None),
        (False, "asleep"),
        (False, "awake"),
        pytest.param((False, "router"), marks=needs_router),
        (True, "kube-edge"),
    ],
    ids=["https", "http", "front-asleep", "front-awake", "front-router", "kube-edge"],
)
def gw(request: pytest.FixtureRequest, tmp_path: Path, upstream: Upstream) -> Iterator[Gateway]:
    """A lone Droplet's gateway (HTTPS and plain), the Kubernetes platform's edge (HTTPS, its
    Service the recording upstream), the wake front in both its states, and the front with its
    router (balancer.routing cache-aware: Caddy, then the real vllm-router, then
    the replica): the recording upstream is what the gate lets through to, the waker asleep,
    the replica awake or behind the router."""
    https, front = request.param
    if front == "router":
        upstream.probes_only = True  # the router's own health checks of the replica
        yield from router_front(tmp_path, upstream)
        return
    edge = front == "kube-edge"
    front = None if edge else front
    for started in start_gateway(tmp_path, upstream.url, https=https, front=front, edge=edge):
        upstream.probes_only = front == "awake"
        upstream.seen.clear()  # start_gateway's own readiness probes
        yield started


def router_front(tmp_path: Path, upstream: Upstream) -> Iterator[Gateway]:
    """The front's Caddyfile for a cache-aware set, its router on loopback (router.py's flags)
    with the recording upstream as its one replica, and the upstream's file (the public
    /health goes straight to it)."""
    cfg = routed_cfg("cache-aware", replicas=2)
    with running_router(tmp_path / "router", [upstream.url]) as r:
        folder = tmp_path / "upstreams"
        folder.mkdir()
        (folder / "replica-0.caddy").write_text(f"to {upstream.url.removeprefix('http://')}\n")
        http_port = free_port()
        listen = gateway.Listen(http_port=http_port, upstreams=f"{folder}/*.caddy",
                                admin_socket=None, router=r.url.removeprefix("http://"))  # fmt: skip
        base = f"http://127.0.0.1:{http_port}"
        text = gateway.balancer_site(cfg, "127.0.0.1", listen)
        for _ in run_caddy(tmp_path / "front", text, f"{base}/health"):
            upstream.seen.clear()
            yield Gateway(base + "/v1", base, None, tmp_path / "front" / "caddy.log")


def raw(
    gw: Gateway, method: str, target: str, headers: list[tuple[str, str]], body: bytes = b""
) -> tuple[int, bytes]:
    """Send `target` byte for byte (no client-side cleaning), with these header lines."""
    url = urlsplit(gw.url)
    conn: http.client.HTTPConnection
    if gw.ca:
        context = ssl.create_default_context(cafile=str(gw.ca))
        conn = http.client.HTTPSConnection(
            url.hostname or "", url.port, context=context, timeout=10
        )
    else:
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    conn.putrequest(method, target, skip_accept_encoding=True)
    for name, value in headers:
        conn.putheader(name, value)
    if body:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body or None)
    response = conn.getresponse()
    status, data = response.status, response.read()
    conn.close()
    return status, data


AUTH = [("Authorization", f"Bearer {KEY}")]
TRICKS = [
    "/metrics/../health",  # matched /health once cleaned; vLLM serves metrics at /metrics*
    "/health/../metrics",
    "/v1/../metrics",
    "/v1/models/../../metrics",
    "/v1/chat/completions/../../../invocations",
    "/v1/./models",
    "//v1/models",
    "/v1//models",
    "/v1/models/",
    "/v1/%6dodels",
    "/v1/models%2f..%2f..%2fmetrics",
    "/v1/%2e%2e/metrics",
    "/v1/%2E%2E/pause",
    "/%76%31/models",
    "/V1/models",
    "/v1/Models",
    "/v1/models.",
    "/v1/models%20",
    "/HEALTH",
    "/health.",
    "/health/",
    "/health?x=1",
    "/metrics",
    "/invocations",
    # What vLLM's --enable-scale-out opens (the replicas' vLLM with the router runs it), and
    # the front's router's own admin routes.
    "/inference/v1/generate",
    "/inference/v1/abort_requests",
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/add_worker?url=http://203.0.113.9",
    "/remove_worker?url=http://127.0.0.1:1",
    "/list_workers",
    "/workers",
    "/flush_cache",
    "/get_loads",
    "/scheduling/diagnostics",
]


@pytest.mark.parametrize("target", TRICKS)
def test_a_path_trick_never_reaches_vllm_with_or_without_the_key(
    gw: Gateway, upstream: Upstream, target: str
) -> None:
    for headers in ([], AUTH):
        for method in ("GET", "POST"):
            status, _ = raw(gw, method, target, headers, b"{}" if method == "POST" else b"")
            assert status in (400, 404), (method, target, status)
    assert upstream.seen == [], f"{target} reached the upstream: {upstream.seen}"


EXACT = (
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/v1/models?limit=5"),
    ("GET", "/v1/responses/resp_0123abc"),
)


def test_exact_paths_reach_vllm_as_sent(
    gw: Gateway, upstream: Upstream, request: pytest.FixtureRequest
) -> None:
    if "front-router" in request.node.callspec.id:
        pytest.skip(
            "the router re-serializes bodies and renders each prompt first: what passes both "
            "hops is test_balancer.py's test_the_router_path_keeps_the_gate_at_both_hops"
        )
    for method, target in EXACT:
        status, _ = raw(gw, method, target, AUTH, b"{}" if method == "POST" else b"")
        assert status == 200, (method, target, status)
    assert [(s["method"], s["path"]) for s in upstream.seen] == list(EXACT)


@pytest.mark.parametrize(
    "headers",
    [
        [("Authorization", f"Bearer {KEY}"), ("Authorization", "Bearer wrong")],
        [("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {KEY}")],
        [("Authorization", f"Bearer {KEY}"), ("Authorization", f"Bearer {KEY}")],
        [("Authorization", f"Bearer {KEY}, Bearer other")],
        [("Authorization", f"bearer {KEY}")],
        [("Authorization", f"Bearer  {KEY}")],
        [("Authorization", f"Bearer {KEY[:-1]}*")],
        [("Authorization", f"Bearer {KEY}x")],
    ],
    ids=[
        "right-then-wrong",
        "wrong-then-right",
        "right-twice",
        "joined",
        "case",
        "space",
        "wildcard",
        "longer",
    ],
)
def test_anything_but_one_exact_authorization_header_is_refused(
    gw: Gateway, upstream: Upstream, headers: list[tuple[str, str]]
) -> None:
    status, _ = raw(gw, "GET", "/v1/models", headers)
    assert status == 401
    assert upstream.seen == []


@pytest.fixture
def small_limit_gw(tmp_path: Path, upstream: Upstream) -> Iterator[Gateway]:
    for started in start_gateway(tmp_path, upstream.url, https=False, max_body_mb=1):
        upstream.seen.clear()
        yield started


def test_one_unit_for_the_body_limit(small_limit_gw: Gateway, upstream: Upstream) -> None:
    """1 MB is 1,000,000 bytes for the up-front check and the cut-off alike: a body between
    1 MB and 1 MiB is refused before it is read, not read and then cut."""
    gw = small_limit_gw
    status, _ = raw(gw, "POST", "/v1/chat/completions", AUTH, b"x" * 1_000_000)
    assert status == 200
    assert upstream.seen[-1]["body"] == 1_000_000
    for size in (1_000_001, 1_040_000, 1_048_577):
        status, data = raw(gw, "POST", "/v1/chat/completions", AUTH, b"x" * size)
        assert status == 413, (size, status)
        assert b"request body over 1 MB (1000000 bytes)" in data
    assert len(upstream.seen) == 1


def trust_store() -> dict[str, float]:
    """Every file of the system trust store, with its modification time."""
    roots = (Path("/usr/local/share/ca-certificates"), Path("/etc/ssl/certs"))
    return {str(p): p.stat().st_mtime for d in roots if d.exists() for p in d.rglob("*")}


def test_the_gateway_leaves_the_trust_store_alone(tmp_path: Path, upstream: Upstream) -> None:
    """Caddy with its local CA (https on localhost, as these tests run it) installs that root in
    the system trust store unless told not to: the rendered config tells it."""
    before = trust_store()
    for started in start_gateway(tmp_path, upstream.url, https=True):
        assert started.ca and started.ca.exists()
        assert "skip_install_trust" in (tmp_path / "Caddyfile").read_text()
    assert trust_store() == before


@needs_router
def test_through_the_router_front_a_smuggled_request_reaches_nothing(
    tmp_path: Path, upstream: Upstream
) -> None:
    """CL.TE, TE.CL, a body on /health and pipelining (test_wake.py's), and a slow header
    block, at the front with its router: what follows /health on the connection is a keyless
    request of its own, Caddy's 401; the replica behind the router sees the /health requests
    alone (they go straight to it, not through the router), and the router nothing."""
    from test_wake import SMUGGLING, raw_exchange, statuses  # noqa: PLC0415 (it imports this file)

    upstream.probes_only = True
    for gw in router_front(tmp_path, upstream):
        for name, attack in SMUGGLING.items():
            got = statuses(raw_exchange(gw.url, attack, 2))
            first = 404 if name == "cl-te" else 200
            assert got[0] == first and set(got[1:]) <= {401}, (name, got)
        # A header block trickled in: Caddy's read_header timeout ends it, nothing is proxied.
        url = urlsplit(gw.url)
        with socket.create_connection((url.hostname, url.port), timeout=40) as slow:
            slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            time.sleep(1)
            slow.sendall(b"Authorization: Bearer ")
    assert {(s["method"], s["path"]) for s in upstream.seen} <= {("GET", "/health")}, upstream.seen
