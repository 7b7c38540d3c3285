"""A fake OpenAI-compatible server (the part of vLLM's API the tools use), with controlled timing.

Run it as a process of its own so that it does not share a GIL with the client under test:

    python tests/fake_openai.py --ttft 0.2 --itl 0.03 --tokens 32 --api-key KEY

It prints `listening on http://127.0.0.1:PORT` once ready. Streams send one token per chunk:
the first after `--ttft` seconds, the next ones `--itl` apart, then a usage chunk and [DONE],
like vLLM with `stream_options.include_usage`. Faults for the tests: `--fail-every N` answers
every Nth chat request with HTTP 500, `--stall-every N` never answers it, `--slow-every N` gives
every Nth a TTFT of `--slow-ttft`, `--mode empty-deltas` streams empty content, `--mode no-auth`
accepts any key, `--mode one-chunk` streams the whole answer in one chunk, `--mode reasoning`
streams the first half of the tokens as `reasoning_content` (as vLLM's reasoning parser does),
`--mode tool-call` streams only tool-call deltas, `--mode no-usage` never sends the usage chunk.
`--capacity N` serves at most N requests at once (the rest wait, as in a full engine).
`GET /_stats` reports requests seen, the most streams in flight at once, and when each chat
request arrived (seconds, monotonic) with its messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web


class FakeServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.chat_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrivals: list[float] = []
        self.conversations: list[list[dict[str, Any]]] = []
        self.slots = asyncio.Semaphore(args.capacity) if args.capacity else None

    # ---- helpers ----------------------------------------------------------------------------
    def authorized(self, request: web.Request) -> bool:
        if self.args.mode == "no-auth":
            return True
        return request.headers.get("Authorization") == f"Bearer {self.args.api_key}"

    @staticmethod
    def unauthorized() -> web.Response:
        return web.json_response({"error": "Unauthorized"}, status=401)

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        return max(words, 1)

    def completion_tokens(self, body: dict[str, Any]) -> int:
        return min(int(body.get("max_tokens") or self.args.tokens), self.args.tokens)

    # ---- routes ------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self.unauthorized()
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.args.model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "vllm",
                        "root": self.args.model,
                        "max_model_len": 32768,
                    }
                ],
            }
        )

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "chat_requests": self.chat_requests,
                "max_in_flight": self.max_in_flight,
                "arrivals": self.arrivals,
                "conversations": self.conversations,
            }
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        if not self.authorized(request):
            return self.unauthorized()
        body = await request.json()
        if body.get("model") != self.args.model:
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "code": 404,
                    }
                },
                status=404,
            )
        self.chat_requests += 1
        self.arrivals.append(arrived)
        self.conversations.append(body.get("messages") or [])
        number = self.chat_requests
        if self.args.fail_every and number % self.args.fail_every == 0:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        if self.args.stall_every and number % self.args.stall_every == 0:
            await asyncio.sleep(3600)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            slow = bool(self.args.slow_every and number % self.args.slow_every == 0)
            ttft = self.args.slow_ttft if slow else self.args.ttft
            if body.get("stream") and self.slots is not None:
                async with self.slots:
                    return await self.stream(request, body, ttft)
            if body.get("stream"):
                return await self.stream(request, body, ttft)
            return await self.complete(body)
        finally:
            self.in_flight -= 1

    async def complete(self, body: dict[str, Any]) -> web.Response:
        n = self.completion_tokens(body)
        await asyncio.sleep(self.args.ttft + self.args.itl * (n - 1))
        prompt = self.prompt_tokens(body)
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.args.model,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {"role": "assistant", "content": " tok" * n},
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": n,
                    "total_tokens": prompt + n,
                },
            }
        )

    def delta(self, i: int, n: int) -> dict[str, Any]:
        """What the i-th of n streamed tokens looks like in this mode."""
        mode = self.args.mode
        if mode == "empty-deltas":
            return {"content": ""}
        if mode == "reasoning" and i < n // 2:
            return {"reasoning_content": " think"}
        if mode == "tool-call":
            call: dict[str, Any] = {"index": 0, "function": {"arguments": '"x"'}}
            if i == 0:
                call = {
                    "index": 0,
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": "{"},
                }
            return {"tool_calls": [call]}
        return {"content": " tok"}

    async def stream(
        self, request: web.Request, body: dict[str, Any], ttft: float
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(
            delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None
        ) -> bytes:
            payload: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.args.model,
                "choices": []
                if usage
                else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }
            if usage:
                payload["usage"] = usage
            return f"data: {json.dumps(payload)}\n\n".encode()

        n = self.completion_tokens(body)
        await response.write(chunk({"role": "assistant", "content": ""}))
        await asyncio.sleep(ttft)
        if self.args.mode == "one-chunk":
            await response.write(chunk({"content": " tok" * n}, finish="length"))
        else:
            for i in range(n):
                if i:
                    await asyncio.sleep(self.args.itl)
                await response.write(
                    chunk(self.delta(i, n), finish="length" if i == n - 1 else None)
                )
        wants_usage = (body.get("stream_options") or {}).get("include_usage")
        if wants_usage and self.args.mode != "no-usage":
            prompt = self.prompt_tokens(body)
            await response.write(
                chunk(
                    {},
                    usage={
                        "prompt_tokens": prompt,
                        "completion_tokens": n,
                        "total_tokens": prompt + n,
                    },
                )
            )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def build_app(args: argparse.Namespace) -> web.Application:
    server = FakeServer(args)
    app = web.Application()
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_get("/health", server.health)
    app.router.add_get("/_stats", server.stats)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", default="nemotron")
    p.add_argument("--api-key", default="test-key")
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--stall-every", type=int, default=0)
    p.add_argument("--slow-every", type=int, default=0)
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--slow-ttft", type=float, default=1.0)
    p.add_argument(
        "--mode",
        choices=[
            "healthy",
            "empty-deltas",
            "no-auth",
            "one-chunk",
            "reasoning",
            "tool-call",
            "no-usage",
        ],
        default="healthy",
    )
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(build_app(args), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(parse_args()))
