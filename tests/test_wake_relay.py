"""scripts/phases/wake/relay.py, the waker's hold and relay, on its own (in one process, on
loopback through aiohttp's test server): what a held request takes to the replica and what of
the replica's answer comes back (no hop-by-hop header either way), the SSE error a stream whose
200 is out ends with, the OpenAI-shaped refusal, and the bounds on what is held (its count, its
bytes, the API's paths alone). tests/test_wake.py runs it through the whole daemon and Caddy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import front_bench
import pytest
import script_module
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from test_wake import rendered_env

WAKER = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "wake"
package: Any = script_module.load_package(WAKER, "wake_relay_test", "relay", "waker")
relay, waker_mod = package.relay, package.waker
CHAT = {"model": "nemotron", "messages": [{"role": "user", "content": "hi"}]}
Scene = Callable[[TestClient, Any, list[dict[str, str]]], Awaitable[Any]]


def held_through(tmp_path: Path, scene: Scene, awake: bool = True, **env: str) -> Any:
    """`scene(client, waker, seen)` against the waker's HTTP side, with one replica (ready
    when `awake`) that records each request's headers in `seen` and answers with hop-by-hop
    headers of its own beside one of the replica's."""
    seen: list[dict[str, str]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        await request.read()
        answer = web.StreamResponse(headers={
            "Content-Type": "application/json", "X-Request-Id": "r-1",
            "Keep-Alive": "timeout=5", "Proxy-Authenticate": "Basic", "Trailer": "X-Sum",
            "Upgrade": "h2c",
        })  # fmt: skip
        await answer.prepare(request)
        await answer.write(b'{"id": "c1"}')
        await answer.write_eof()
        return answer

    async def run() -> Any:
        replica = web.Application()
        replica.router.add_post("/v1/chat/completions", chat)
        async with TestServer(replica) as upstream:
            values = {**rendered_env(), "WAKE_HOLD_FILE": str(tmp_path / "hold"),
                      "WAKE_UPSTREAMS_DIR": str(tmp_path), "WAKE_STATE_FILE": "", **env}  # fmt: skip
            w = waker_mod.Waker(waker_mod.Settings.from_env(values))
            if awake:
                w.mode, w.healthy = waker_mod.Mode.AWAKE, [("127.0.0.1", upstream.port)]
            relays, looks = relay.sessions(w.s)
            front = relay.Front(w, relays, looks)
            try:
                async with TestClient(TestServer(front.app())) as client:
                    return await scene(client, w, seen)
            finally:
                await relays.close()
                await looks.close()

    return front_bench.run(run())


def test_a_held_request_reaches_the_replica_and_back_without_hop_by_hop_headers(
    tmp_path: Path,
) -> None:
    """The request keeps only the headers a replica may read (its key among them: the gate
    checked it); the answer passes the replica's own headers and none of the hop-by-hop ones
    (RFC 9110 7.6.1, and Proxy-Authenticate, which is a proxy's)."""

    async def scene(client: TestClient, _: Any, seen: list[dict[str, str]]) -> Any:
        got = await client.post("/v1/chat/completions?x=1", json=CHAT, headers={
            "Authorization": "Bearer k", "OpenAI-Project": "p", "Cookie": "c=1",
            "X-Forwarded-For": "203.0.113.9", "Proxy-Authorization": "Basic eA==",
        })  # fmt: skip
        answered = {k.lower(): v for k, v in got.headers.items()}
        return got.status, answered, await got.read(), [{k.lower(): v for k, v in h.items()}
                                                        for h in seen]  # fmt: skip

    status, headers, body, seen = held_through(tmp_path, scene)
    assert (status, body) == (200, b'{"id": "c1"}')
    assert headers["x-request-id"] == "r-1" and headers["content-type"] == "application/json"
    hop = {"keep-alive", "proxy-authenticate", "trailer", "upgrade"}
    assert not hop & set(headers), headers
    [sent] = seen
    assert sent["authorization"] == "Bearer k" and sent["openai-project"] == "p"
    assert not {"cookie", "x-forwarded-for", "proxy-authorization"} & set(sent), sent


async def sse_of(answer: ClientResponse) -> list[Any]:
    """The data of each SSE event of an answer ([DONE] as itself), its comments left out."""
    text = (await answer.read()).decode()
    events = [block for block in text.split("\n\n") if block.startswith("data: ")]
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in events]


class Written:
    """What sse_error writes to a stream whose 200 is out."""

    def __init__(self) -> None:
        self.data, self.ended = b"", False

    async def write(self, data: bytes) -> None:
        self.data += data

    async def write_eof(self) -> None:
        self.ended = True


@pytest.mark.parametrize(
    ("error", "event"),
    [
        (json.dumps(relay.SSE_REPLICA_CUT).encode(), relay.SSE_REPLICA_CUT),
        (b'{"object": "error", "message": "bad"}', None),
        (b"upstream connect error" + b"x" * 600, None),
    ],
)
def test_a_stream_ends_with_an_openai_error_event_and_done(error: bytes, event: Any) -> None:
    """An error that is OpenAI's shape (it has `error`) goes as it is; anything else (vLLM's
    own error JSON, a proxy's text) is wrapped in that shape, its text cut at 500 characters,
    so the OpenAI clients raise with a message; then [DONE], and the stream ends."""
    out = Written()
    front_bench.run(relay.sse_error(out, error))
    assert out.ended and out.data.endswith(b"\n\ndata: [DONE]\n\n")
    [data] = [json.loads(line[6:]) for line in out.data.decode().split("\n\n")[:1]]
    if event is not None:
        assert data == event
    else:
        assert set(data["error"]) == {"message", "type", "code", "param"}
        assert data["error"]["type"] == "service_unavailable"
        assert data["error"]["message"] == error.decode()[:500]


def test_a_refusal_is_openais_error_shape_with_whether_to_retry() -> None:
    refusal = package.decision.Refusal("the wake failed: see the run", 600, "wake_failed")
    answer = relay.refusal_response(refusal)
    assert answer.status == 503 and answer.headers["Retry-After"] == "600"
    assert answer.headers["x-should-retry"] == "false"
    assert json.loads(answer.body) == {"error": {"message": "the wake failed: see the run",
                                                 "type": "service_unavailable",
                                                 "code": "wake_failed", "param": None}}  # fmt: skip


def test_the_held_requests_are_bounded_by_count_and_bytes_and_path(tmp_path: Path) -> None:
    """While the set is not ready: a path outside the API wakes nothing (404); past
    WAKE_MAX_HELD requests, or WAKE_MAX_HELD_BYTES of their bodies, the answer is at once a
    503 that says which and asks for a retry shortly; a held request's place is given back
    when it ends (past WAKE_HOLD_SECONDS here)."""

    async def scene(client: TestClient, w: Any, _: list[dict[str, str]]) -> Any:
        other = await client.get("/metrics")
        held = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
        while w.held < 1:
            await asyncio.sleep(0.01)
        counted = await client.post("/v1/chat/completions", json=CHAT)
        first = await held
        assert (w.held, w.held_bytes) == (0, 0), "the place is given back"
        big = await client.post("/v1/chat/completions", data=b"x" * 300)
        return other.status, counted, await counted.json(), first.status, big, await big.json()

    other, counted, said, first, big, big_said = held_through(
        tmp_path, scene, awake=False, WAKE_MAX_HELD="1", WAKE_MAX_HELD_BYTES="200",
        WAKE_HOLD_SECONDS="1",
    )  # fmt: skip
    assert other == 404
    assert counted.status == 503 and counted.headers["x-should-retry"] == "true"
    assert said["error"]["code"] == "front_busy" and "(WAKE_MAX_HELD)" in said["error"]["message"]
    assert first == 503, "held to its end, then told to retry"
    assert big.status == 503 and "200 bytes (WAKE_MAX_HELD_BYTES)" in big_said["error"]["message"]
