"""The hold and relay: the waker's HTTP side, on aiohttp (a production HTTP/1.1 server: its
parser frames every body by its length or its chunks, so a body is never read as a request, and
it serves many held requests from one thread).

Held requests: a streamed one ('"stream": true') gets its 200 and a first SSE comment at once
(': waking ...', then every WAKE_COMMENT_SECONDS), then the replica's stream, or an SSE error
event and [DONE] if the replica fails it; any other request waits silently. Past
WAKE_HOLD_SECONDS the answer is 503 with `x-should-retry: true` and a short Retry-After (the
OpenAI clients retry it, each try held again); when the wake failed or cannot start, 503 with
`x-should-retry: false` and the real Retry-After, and an OpenAI-style error saying why.
openai-python `_base_client.py` `_should_retry`: `x-should-retry` decides unless Retry-After
exceeds 120 s. At most WAKE_MAX_HELD requests and WAKE_MAX_HELD_BYTES of their bodies are held,
and as many can be relayed at once (sessions()).

State for people and tools: GET /nemotron/wake (JSON: mode, since, the last wake's timeline),
POST /nemotron/wake (wake now, the same guards), GET|HEAD /health (200 while awake, else 503
with the mode)."""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web, web_server

from . import decision
from .decision import Refusal
from .log import iso, log
from .settings import Settings
from .state import Mode
from .waker import Waker

# The keyed control path the gate sends here as it came: components/host/wake.py's value
# (tests/test_wake.py holds them equal).
CONTROL_PATH = "/nemotron/wake"
MAX_BODY = 16_000_000  # the gate's own limit: nothing larger gets this far
FORWARD_TIMEOUT = 3600.0  # a held request, once sent, may generate for long
# Headers a held request keeps when it is sent on to a replica (the gate already checked the key).
FORWARDED = (
    "authorization",
    "content-type",
    "accept",
    "user-agent",
    "openai-organization",
    "openai-project",
    "idempotency-key",
)
# What a replica's answer does not pass on: hop-by-hop, and what aiohttp writes itself.
HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "content-length",
    "server",
    "date",
    "content-encoding",
}


def error_body(refusal: Refusal) -> bytes:
    """OpenAI's error shape, so clients print the message."""
    return json.dumps(
        {
            "error": {
                "message": refusal.message,
                "type": "service_unavailable",
                "code": refusal.code,
                "param": None,
            }
        }
    ).encode()


def refusal_response(refusal: Refusal) -> web.Response:
    """503 with the reason. `x-should-retry` tells OpenAI's clients whether their own retry
    helps (openai-python _base_client.py _should_retry reads it first, unless Retry-After is
    over 120 s)."""
    headers = {
        "Retry-After": str(refusal.retry_after),
        "x-should-retry": "true" if refusal.retry else "false",
    }
    return web.Response(
        status=503, body=error_body(refusal), headers=headers, content_type="application/json"
    )


def _is_stream(body: bytes) -> bool:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("stream") is True


SSE_REPLICA_FAILED = {
    "error": {
        "message": "no replica answered the held request",
        "type": "service_unavailable",
        "code": "replica_failed",
        "param": None,
    }
}
SSE_REPLICA_CUT = {
    "error": {
        "message": "the replica stopped mid-answer",
        "type": "service_unavailable",
        "code": "replica_failed",
        "param": None,
    }
}


async def sse_error(out: web.StreamResponse, error: bytes) -> None:
    """End a stream whose 200 is out with an error event (the OpenAI clients raise on an SSE
    event whose data holds `error`) and [DONE]."""
    try:
        data = json.loads(error)
    except ValueError:
        data = None
    if not (isinstance(data, dict) and "error" in data):
        data = {
            "error": {
                "message": error.decode(errors="replace")[:500],
                "type": "service_unavailable",
                "code": None,
                "param": None,
            }
        }
    await out.write(b"data: " + json.dumps(data).encode() + b"\n\ndata: [DONE]\n\n")
    await out.write_eof()


@dataclass
class Place:
    """One held request's bytes in the hold's count (Waker.held_bytes), which never passes
    WAKE_MAX_HELD_BYTES: grown before the bytes are taken, given back when the request ends."""

    waker: Waker
    size: int = 0

    def grow(self, to: int) -> bool:
        """Count `to` bytes for this request, if the hold has room for the difference."""
        more = to - self.size
        if more <= 0:
            return True
        if self.waker.held_bytes + more > self.waker.s.max_held_bytes:
            return False
        self.waker.held_bytes += more
        self.size = to
        return True

    def full(self) -> str:
        bound = self.waker.s.max_held_bytes
        return f"the bodies held may not pass {bound} bytes (WAKE_MAX_HELD_BYTES)"

    def release(self) -> None:
        self.waker.held_bytes -= self.size
        self.size = 0


@dataclass
class Front:
    """The waker's HTTP side: /health, the control path, and the held requests. Two client
    sessions, each with its own pool (sessions()): `relays` carries the held requests to a
    replica, `looks` the replicas' /health."""

    waker: Waker
    relays: ClientSession
    looks: ClientSession

    def app(self) -> web.Application:
        application = web.Application(client_max_size=MAX_BODY)
        application.router.add_get("/health", self.health)  # HEAD too (aiohttp's allow_head)
        application.router.add_route("GET", CONTROL_PATH, self.control)
        application.router.add_route("POST", CONTROL_PATH, self.control)
        application.router.add_route("*", "/{tail:.*}", self.hold)
        return application

    async def health(self, _: web.Request) -> web.Response:
        w = self.waker
        return web.json_response(
            {"status": w.mode, "since": iso(w.since), "expected_seconds": w.s.expected_seconds},
            status=200 if w.mode == Mode.AWAKE else 503,
        )

    async def control(self, request: web.Request) -> web.Response:
        """GET: the state. POST: wake now, within the same guards as a request."""
        w = self.waker
        if request.method == "POST":
            if w.mode == Mode.UNREADY:
                why = "no wake: a replica exists but is not ready yet (starting or draining)"
                return refusal_response(Refusal(why, 30))
            refusal = w.admit()
            if refusal:
                return refusal_response(refusal)
            return web.json_response(w.snapshot(), status=202)
        if request.query.get("pipeline") == "check":
            # The wake phase's fresh look (Caddy's gate passes this path without a query, so
            # only the front itself asks): after a fix that changed nothing on the front (a
            # workflow enabled, a token given more permissions) the old answer must not stand.
            await w.look_at_pipeline()
        return web.json_response(w.snapshot())

    async def hold(self, request: web.Request) -> web.StreamResponse:
        """A keyed request Caddy sent while no replica was ready: counted, held, relayed. Its
        place counts the bytes it declared before a byte is read, then those that arrive as
        they arrive (a chunked body declares none), so the bodies held never pass
        WAKE_MAX_HELD_BYTES, however many come at once."""
        w, s = self.waker, self.waker.s
        if not request.path.startswith("/v1/"):
            # The gate sends only the API's routes here: anything else wakes nothing.
            return web.Response(status=404, text="not found")
        place = Place(w)
        if w.held + w.reading >= s.max_held:
            return self.busy(f"at most {s.max_held} are held (WAKE_MAX_HELD)")
        if not place.grow(request.content_length or 0):
            return self.busy(place.full())
        try:
            # Held (and woken for) once its body is in: a body that never ends wakes nothing.
            w.reading += 1
            try:
                body = await self.read_body(request, place)
            finally:
                w.reading -= 1
            if isinstance(body, web.Response):
                return body
            w.held += 1
            w.held_total += 1
            try:
                return await self.held_request(request, body)
            finally:
                w.held -= 1
        finally:
            place.release()

    async def read_body(self, request: web.Request, place: Place) -> bytes | web.Response:
        """The body as it arrives, each piece counted in `place` before it is kept: the busy
        answer the moment the held bodies would pass WAKE_MAX_HELD_BYTES."""
        pieces: list[bytes] = []
        got = 0
        async for piece in request.content.iter_any():
            got += len(piece)
            if got > MAX_BODY:
                return web.Response(status=413, text=f"request body over {MAX_BODY} bytes")
            if not place.grow(got):
                return self.busy(place.full())
            pieces.append(piece)
        return b"".join(pieces)

    def busy(self, why: str) -> web.Response:
        """503, retry shortly: the hold is full (its count or its bytes), and which."""
        w = self.waker
        log("held_full", held=w.held, held_bytes=w.held_bytes)
        return refusal_response(
            Refusal(
                f"the front holds {w.held} requests ({w.held_bytes} bytes of bodies) already while "
                f"the GPU set wakes: {why}; retry shortly",
                5,
                "front_busy",
                retry=True,
            )
        )

    async def held_request(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Wait for a ready replica (progress comments on a stream), or answer why not."""
        w, s = self.waker, self.waker.s
        started = time.monotonic()
        deadline = w.clock() + s.hold_seconds
        stream = _is_stream(body)
        sse: web.StreamResponse | None = None
        while True:
            if w.serving():
                return await self.forward(request, body, sse)
            if w.mode == Mode.ASLEEP:
                # Look again before a wake: a replica that joined since the last look (the
                # deploy's own ready probe comes a moment after) must not wake the set.
                await w.fresh_look(self.looks)
                if w.serving():
                    continue
            now = w.clock()
            refusal = w.admit() if w.mode == Mode.ASLEEP and not w.stopping else None
            if refusal is None and (w.stopping or w.mode == Mode.FAILED or now >= deadline):
                refusal = self.held_refusal(int(time.monotonic() - started), now)
            if refusal is not None:
                log("held_answered", outcome=refusal.code, waited=int(time.monotonic() - started))
                if sse is None:
                    return refusal_response(refusal)
                await sse_error(sse, error_body(refusal))
                return sse
            if stream and sse is None:
                sse = web.StreamResponse(
                    status=200,
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                )
                await sse.prepare(request)
            if sse is not None:
                said = w.awaiting_approval() or (
                    f"the GPU set is starting ({int(now - w.since)} s so far, about "
                    f"{int(s.expected_seconds)} s expected)"
                )
                await sse.write(f": {w.mode}: {said}\n\n".encode())
            await w.wait(deadline, s.comment_seconds)

    def held_refusal(self, waited: int, now: float) -> Refusal:
        w = self.waker
        return decision.held_refusal(
            w.mode, w.stopping, w.ledger, w.s, waited, w.since, w.awaiting_approval(), now
        )

    async def forward(
        self, request: web.Request, body: bytes, sse: web.StreamResponse | None
    ) -> web.StreamResponse:
        """Send the held request to a ready replica and relay its answer. A replica that
        cannot be reached before it answers is skipped for the next (a chat completion has no
        side effect until it answers); after progress comments, a failure is an SSE error."""
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        for host, port in self.waker.next_replica():
            try:
                async with self.relays.request(
                    request.method,
                    f"http://{host}:{port}{request.raw_path}",
                    data=body or None,
                    headers=headers,
                    timeout=ClientTimeout(total=FORWARD_TIMEOUT, sock_connect=5),
                    allow_redirects=False,
                ) as resp:
                    return await self.relay(request, resp, sse)
            except (ClientError, OSError, TimeoutError) as err:
                log("forward_failed", error=type(err).__name__)
        failed = json.dumps(SSE_REPLICA_FAILED).encode()
        if sse is not None:
            await sse_error(sse, failed)
            return sse
        return web.Response(
            status=502,
            body=failed,
            content_type="application/json",
            headers={"x-should-retry": "true"},
        )

    async def relay(
        self, request: web.Request, resp: Any, sse: web.StreamResponse | None
    ) -> web.StreamResponse:
        """The replica's answer as it comes; the wake's first token noted."""
        w = self.waker
        if sse is not None and resp.status != 200:
            # The stream's 200 is out: the replica's error goes as the SSE error event.
            await sse_error(sse, await resp.read())
            return sse
        out = sse
        if out is None:
            out = web.StreamResponse(status=resp.status, reason=resp.reason)
            for k, v in resp.headers.items():
                if k.lower() not in HOP:
                    out.headers.add(k, v)
            await out.prepare(request)
        try:
            async for chunk in resp.content.iter_any():
                w.first_token()
                await out.write(chunk)
        except (ClientError, OSError, TimeoutError) as err:
            log("forward_cut", error=type(err).__name__)
            if sse is not None or "text/event-stream" in resp.headers.get("Content-Type", ""):
                await sse_error(out, json.dumps(SSE_REPLICA_CUT).encode())
            elif request.transport is not None:
                # Any other answer is cut as the replica cut it: ended cleanly, its half would
                # pass for a whole one (a 200 whose JSON does not parse, not retried); cut, the
                # client sees a connection error, which the OpenAI clients retry.
                request.transport.close()
            return out
        await out.write_eof()
        return out


def cancel_on_disconnect() -> dict[str, Any]:
    """A held request whose client went away is let go at once (its place and its body's
    bytes freed): aiohttp 3.9+ does so with `web_server.Server`'s `handler_cancellation`, off
    by default (the front's Ubuntu 24.04 has python3-aiohttp 3.9.1). 3.8 refuses the keyword,
    so it is passed only where the server takes it; there (Debian 12's 3.8.4, which the
    emulation's front runs) a gone client keeps its place until its hold ends, since 3.8.2
    no longer cancels (aio-libs/aiohttp#6727)."""
    accepted = inspect.signature(web_server.Server.__init__).parameters
    return {"handler_cancellation": True} if "handler_cancellation" in accepted else {}


def sessions(settings: Settings) -> tuple[ClientSession, ClientSession]:
    """The relays' client session and the looks'. One session shared them (aiohttp's default
    pool: 100 connections, aiohttp connector.py TCPConnector `limit=100`): past 100 held
    requests whose answers took a while, the rest waited for a connection, and so did the
    looks, which then timed out and called a serving replica unready (issue 42). The relays'
    pool is what the front promises to hold, WAKE_MAX_HELD (a held request is relayed once,
    on one connection, while it counts in `held`), so none waits for another; the looks' pool
    is their own, unbounded (a look per replica at most), so none waits
    behind a relay."""
    relays = ClientSession(auto_decompress=False, connector=TCPConnector(limit=settings.max_held))
    looks = ClientSession(auto_decompress=False, connector=TCPConnector(limit=0))
    return relays, looks
