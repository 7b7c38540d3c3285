"""A fake OpenAI-compatible server (the part of vLLM's API the tools use), with controlled timing.

Run it as a process of its own so that it does not share a GIL with the client under test:

    python tests/support/fake_openai.py --ttft 0.2 --itl 0.03 --tokens 32 --api-key KEY

It prints `listening on http://127.0.0.1:PORT` once ready. Streams send one token per chunk:
the first after `--ttft` seconds, the next ones `--itl` apart, then a usage chunk and [DONE],
like vLLM with `stream_options.include_usage`. Faults for the tests: `--fail-every N` answers
every Nth chat request with HTTP 500, `--stall-every N` never answers it, `--slow-every N` gives
every Nth a TTFT of `--slow-ttft`, `--busy-answer-delay S` answers /health and /metrics
after S seconds while a chat request is in flight (a saturated vLLM), `--mode empty-deltas`
streams empty content, `--mode no-auth`
accepts any key, `--mode one-chunk` streams the whole answer in one chunk, `--mode reasoning`
streams the first half of the tokens as `reasoning` (as vLLM's reasoning parser does since PR
#27752), `--mode reasoning-content` as `reasoning_content` (vLLM before it, other servers),
`--mode tool-call` streams only tool-call deltas, `--mode no-usage` never sends the usage chunk.
`--busy-answer-delay S` answers /health and /metrics S seconds late while a chat request is
in flight (a saturated vLLM's API server).
`--prefix-cache-blocks N` models vLLM's automatic prefix caching (PrefixCache): the time to the
first token grows by `--prefill-per-token` for each prompt token not in this replica's cache,
and the usage says `prompt_tokens_details.cached_tokens`, as vLLM does with
`--enable-prompt-tokens-details` (vllm/entrypoints/openai/chat_completion/serving.py
`_make_prompt_tokens_details`). `--prefill-slots N` lets at most N prompts prefill at once
on this replica (the others wait their turn): a GPU's prefill throughput is shared, so N = 1
makes the uncached tokens of every request queue through one compute budget of
1 / `--prefill-per-token` tokens a second, as a busy replica's do.
`--decode-slowdown-per-stream F` (default 0: off) makes decode share the replica as a GPU's
batch does: each gap between two tokens of a stream is `--itl` * (1 + F * (D - 1)), D the
streams of this replica past their first token at that moment (itself included), so with F =
0.02 a stream alone gets a token every `--itl`, one among 51 every 2 * `--itl`.
`POST /v1/chat/completions/render` is vLLM's render endpoint (vllm/entrypoints/scale_out/
render/api_router.py): the prompt's token ids, one per word as the prefix-cache model counts
them (the same id for the same word on every replica), as vLLM's GenerateRequest. vLLM 0.33
answers it 403 unless `vllm serve --enable-scale-out` (scale_out/factories.py
register_scale_out_api_routers); so does this fake unless `--scale-out`. vllm-router's
cache_aware policy keys its prefix tree on these ids.
`--capacity N` serves at most N streams at once (the rest wait, as in a full engine), and the
running gauge counts the waiting ones too (the fake as it was before a queue was modelled).
`--max-num-seqs N` (vLLM's `--max-num-seqs`; default 0: no limit) is vLLM's scheduler queue: at
most N requests, streamed or not, run at once, the others wait in arrival order (FIFO, as
vLLM's default scheduling policy); `vllm:num_requests_running` then counts the running ones,
`vllm:num_requests_waiting` the waiting ones, and a request's wait is part of its time to the
first token (nothing is sent before it runs). `vllm:kv_cache_usage_perc` (a fraction, 0 to 1,
as vLLM 0.33's) is the share of a `--kv-cache-tokens` budget the running requests hold: each its
prompt's tokens from when it starts to run, and one more per token generated, until it ends
(default 0: no budget, the gauge reads 0.0).
`--stuck-requests N` adds N to the running gauge for good, as vLLM's gauges can stay up after
requests are aborted (vllm-project/vllm#22545); the token counters move only with real work
(generation per streamed token, prompt tokens when a request's first token comes out, as vLLM
0.33 counts them).
What vLLM's parsers make of a Nemotron 3 answer: `--thinking parsed` thinks unless the request's
`chat_template_kwargs.enable_thinking` is false and returns the thinking in `reasoning` (the
field vLLM uses since PR #27752; #33402 removed `reasoning_content`), `--thinking raw` leaves it
in `content` between think tags (no reasoning parser); `--tools parsed` answers a request with
tools with a parsed `tool_calls` entry (streamed as vLLM streams one: id and name first, then the
arguments in pieces), `--tools raw` with the model's tool-call markup as text (the wrong tool-call
parser), `--tools off` refuses `tool_choice: auto` with vLLM's own message.
The other routes the gate admits answer at once, with the key: `POST /v1/completions`,
`/v1/embeddings`, `/v1/responses` (non-streamed), and a stored response's `GET
/v1/responses/{id}` and `POST .../cancel` (404: vLLM keeps no responses by default).
`GET /_stats` reports requests seen, the most streams in flight at once, when each chat
request arrived (seconds, monotonic) with its messages, and each call to those other routes.

The tests start it with `running(*args, key=...)` (or `start` and `stop`): one process, the key
in its environment, ready when it has printed its line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

# What it prints, then its URL, once it listens (./try and `start` wait for the line).
READY = "listening on "


class PrefixCache:
    """vLLM's automatic prefix caching, as a model with no GPU: a prompt (its words, one token
    each) is cut into blocks of `block_tokens`; a block is known by its words and all the
    blocks before it (a chain, as vLLM's block hashes are), so only a prompt's leading blocks
    can be reused; the cached part of a prompt is its longest run of leading blocks held; the
    cache holds `blocks` of them, the least recently used leaving first. A partial last block
    is never cached (vLLM caches full blocks only)."""

    def __init__(self, blocks: int, block_tokens: int) -> None:
        self.blocks, self.block_tokens = blocks, block_tokens
        self.held: collections.OrderedDict[int, None] = collections.OrderedDict()

    def serve(self, words: list[str]) -> int:
        """Prefill `words`: how many of them were cached; their full blocks are cached after."""
        keys, chain = [], 0
        for start in range(0, len(words) - self.block_tokens + 1, self.block_tokens):
            chain = hash((chain, tuple(words[start : start + self.block_tokens])))
            keys.append(chain)
        hit = 0
        while hit < len(keys) and keys[hit] in self.held:
            hit += 1
        for key in keys:
            self.held[key] = None
            self.held.move_to_end(key)
        while len(self.held) > self.blocks:
            self.held.popitem(last=False)
        return hit * self.block_tokens


class SeqGate:
    """vLLM's scheduler admitting requests (`--max-num-seqs`): at most `limit` run at once, the
    others wait in arrival order; a slot that frees goes to the oldest waiting request. A
    request whose client went away while it waited leaves the queue (vLLM aborts it: aiohttp
    does not cancel a handler whose client hung up, so `gone` is asked every 50 ms); one
    cancelled just after it was handed a slot gives the slot on."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self.queue: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self.queue)

    async def acquire(self, gone: Callable[[], bool]) -> bool:
        """Wait for a slot: True once it runs, False if `gone` said its client left first."""
        if self.running < self.limit and not self.queue:
            self.running += 1
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queue.append(turn)
        try:
            while not turn.done():
                await asyncio.wait([turn], timeout=0.05)
                if not turn.done() and gone():
                    self.queue.remove(turn)
                    turn.cancel()
                    return False
            return True
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed a slot it will not use
            else:
                with contextlib.suppress(ValueError):
                    self.queue.remove(turn)
            raise

    def release(self) -> None:
        """A running request ended: its slot goes to the oldest waiting one, else is free."""
        while self.queue:
            turn = self.queue.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot changes hands: `running` stays
                return
        self.running -= 1


class FakeServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        blocks = args.prefix_cache_blocks
        self.cache = PrefixCache(blocks, args.block_tokens) if blocks else None
        self.cached_total = 0
        self.prompt_total = 0
        self.chat_requests = 0
        self.finished = 0
        self.generated = 0
        self.prompted = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.decoding = 0  # streams past their first token (--decode-slowdown-per-stream)
        self.arrivals: list[float] = []
        self.conversations: list[list[dict[str, Any]]] = []
        self.slots = asyncio.Semaphore(args.capacity) if args.capacity else None
        self.prefill_slots = asyncio.Semaphore(args.prefill_slots) if args.prefill_slots else None
        self.renders = 0
        self.render_auth: list[str | None] = []
        # Each request to the other OpenAI routes (api_route): method, path, whether its key
        # was right.
        self.api_calls: list[tuple[str, str, bool]] = []
        self.seqs = SeqGate(args.max_num_seqs) if args.max_num_seqs else None
        self.kv_used = 0  # tokens the running requests hold (--kv-cache-tokens)
        self.tokenize_requests = 0  # POST /tokenize (--tokenize)

    # ---- helpers ----------------------------------------------------------------------------
    def authorized(self, request: web.Request) -> bool:
        if self.args.mode == "no-auth":
            return True
        return request.headers.get("Authorization") == f"Bearer {self.args.api_key}"

    @staticmethod
    def unauthorized() -> web.Response:
        return web.json_response({"error": "Unauthorized"}, status=401)

    @staticmethod
    def error(message: str, kind: str, code: int) -> web.Response:
        """An error as vLLM's OpenAI server answers one (ErrorResponse)."""
        return web.json_response(
            {"error": {"message": message, "type": kind, "code": code}}, status=code
        )

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        if not self.args.chars_per_token:
            return max(len(self.prompt_words(body)), 1)
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        return self.text_tokens(text) + self.args.template_tokens

    def text_tokens(self, text: str) -> int:
        """`--chars-per-token C`: a tokenizer whose tokens are C characters of a word (a word
        of 5 letters is 3 tokens at C = 2), unlike bench's one token a word; 0: one a word."""
        c = self.args.chars_per_token
        words = text.split()
        return sum(-(-len(w) // c) for w in words) if c else len(words)

    async def tokenize(self, request: web.Request) -> web.Response:
        """`--tokenize`: vLLM's POST /tokenize (entrypoints/serve/tokenize/api_router.py) for a
        `prompt`: its count, without special tokens as asked (`add_special_tokens: false`)."""
        if not self.authorized(request):
            return self.unauthorized()
        body = await request.json()
        self.tokenize_requests += 1
        count = self.text_tokens(str(body.get("prompt", "")))
        return web.json_response({"count": count, "max_model_len": 131072, "tokens": [0] * count})

    @staticmethod
    def prompt_words(body: dict[str, Any]) -> list[str]:
        return [w for m in body.get("messages", []) for w in str(m.get("content", "")).split()]

    def prefill(self, body: dict[str, Any]) -> float:
        """With the prefix-cache model: look the prompt up (its cached tokens kept in the body
        for the usage) and the time its uncached tokens add to the first token."""
        if self.cache is None:
            return 0.0
        words = self.prompt_words(body)
        cached = self.cache.serve(words)
        body["_cached_tokens"] = cached
        self.cached_total += cached
        self.prompt_total += len(words)
        body["_prefill_s"] = (len(words) - cached) * self.args.prefill_per_token
        return float(body["_prefill_s"])

    async def first_token(self, body: dict[str, Any], ttft: float) -> None:
        """Wait for the first token: with `--prefill-slots`, the prefill part of `ttft` waits
        for a free slot of this replica's prefill first."""
        prefill = float(body.get("_prefill_s", 0.0))
        if self.prefill_slots is None or not prefill:
            await asyncio.sleep(ttft)
            return
        await asyncio.sleep(ttft - prefill)
        async with self.prefill_slots:
            await asyncio.sleep(prefill)

    def usage(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        """The usage block: counts, and with the prefix-cache model what was cached."""
        prompt = self.prompt_tokens(body)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": n,
            "total_tokens": prompt + n,
        }
        if "_cached_tokens" in body:
            usage["prompt_tokens_details"] = {"cached_tokens": body["_cached_tokens"]}
        return usage

    def itl(self) -> float:
        """The gap before a stream's next token: `--itl`, longer with more streams decoding
        on this replica (`--decode-slowdown-per-stream`)."""
        extra = self.args.decode_slowdown_per_stream * max(self.decoding - 1, 0)
        return float(self.args.itl * (1 + extra))

    def hold(self, body: dict[str, Any], tokens: int) -> None:
        """A running request holds `tokens` more of the KV cache (--kv-cache-tokens)."""
        body["_kv"] = body.get("_kv", 0) + tokens
        self.kv_used += tokens

    def free(self, body: dict[str, Any]) -> None:
        """A request ended: what it held of the KV cache is free again."""
        self.kv_used -= body.pop("_kv", 0)

    def kv_usage(self) -> float:
        """vLLM's vllm:kv_cache_usage_perc: a fraction, 0 to 1."""
        budget = self.args.kv_cache_tokens
        return min(self.kv_used / budget, 1.0) if budget else 0.0

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

    async def busy(self) -> None:
        """`--busy-answer-delay`: while a chat request is in flight, /health and /metrics answer
        that many seconds late (a saturated vLLM answers them late: docs/facts.md, "A busy vLLM
        answers its health check late"); the connection is accepted at once, as the replica's
        gateway accepts it."""
        if self.args.busy_answer_delay and self.in_flight:
            await asyncio.sleep(self.args.busy_answer_delay)

    async def health(self, _: web.Request) -> web.Response:
        await self.busy()
        return web.Response(status=200)

    async def metrics(self, _: web.Request) -> web.Response:
        """vLLM's Prometheus page, the samples autodown and a drain read (open, as vLLM's is)."""
        await self.busy()
        labels = f'engine="0",model_name="{self.args.model}"'
        running = self.in_flight if self.seqs is None else self.seqs.running
        waiting = 0 if self.seqs is None else self.seqs.waiting
        return web.Response(
            text=(
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{{labels}}} "
                f"{float(running + self.args.stuck_requests)}\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}\n"
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                f"vllm:kv_cache_usage_perc{{{labels}}} {self.kv_usage()}\n"
                "# TYPE vllm:request_success_total counter\n"
                f'vllm:request_success_total{{{labels},finished_reason="stop"}} '
                f"{float(self.finished)}\n"
                "# TYPE vllm:generation_tokens_total counter\n"
                f"vllm:generation_tokens_total{{{labels}}} {float(self.generated)}\n"
                "# TYPE vllm:prompt_tokens_total counter\n"
                f"vllm:prompt_tokens_total{{{labels}}} {float(self.prompted)}\n"
            ),
            content_type="text/plain",
        )

    async def render(self, request: web.Request) -> web.Response:
        """vLLM's POST /v1/chat/completions/render: forbidden without `--scale-out` (vLLM's
        own message), else the prompt as token ids (a stable id per word, as prompt_words
        splits it), changing nothing (the cache is not touched)."""
        self.renders += 1
        self.render_auth.append(request.headers.get("Authorization"))
        if not self.authorized(request):
            return self.unauthorized()
        if not self.args.scale_out:
            message = (
                "Scale-out endpoints are disabled. Restart vllm serve with "
                "--enable-scale-out to enable them."
            )
            return self.error(message, "PermissionDeniedError", 403)
        body = await request.json()
        ids = [zlib.crc32(w.encode()) & 0x7FFFFFFF for w in self.prompt_words(body)] or [0]
        return web.json_response(
            {
                "request_id": f"render-{uuid.uuid4().hex}",
                "token_ids": ids,
                "model": body.get("model"),
                "stream": bool(body.get("stream")),
            }
        )

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "chat_requests": self.chat_requests,
                "max_in_flight": self.max_in_flight,
                "arrivals": self.arrivals,
                "conversations": self.conversations,
                "prompt_tokens": self.prompt_total,  # with the prefix-cache model
                "cached_tokens": self.cached_total,
                # POST /v1/chat/completions/render: how many, and the Authorization of each.
                "renders": self.renders,
                "render_auth": self.render_auth,
                "tokenize_requests": self.tokenize_requests,
                "api_calls": self.api_calls,
            }
        )

    async def api_route(self, request: web.Request) -> web.Response:
        """The rest of what the gate admits, answered at once as vLLM 0.33 answers it: a
        completion, an embedding, a Responses API answer, and a stored response looked up or
        cancelled: 404, as vLLM stores none unless VLLM_ENABLE_RESPONSES_API_STORE is set
        (entrypoints/openai/responses/serving.py: store off by default, _make_not_found_error)."""
        ok = self.authorized(request)
        self.api_calls.append((request.method, request.path, ok))
        if not ok:
            return self.unauthorized()
        if "id" in request.match_info:
            message = f"Response with id '{request.match_info['id']}' not found."
            return self.error(message, "invalid_request_error", 404)
        body = await request.json()
        if body.get("model") != self.args.model:
            return self.error(
                f"The model `{body.get('model')}` does not exist.", "NotFoundError", 404
            )
        text = " tok" * self.args.tokens
        kind = request.path.removeprefix("/v1/")
        answers: dict[str, dict[str, Any]] = {
            "completions": {"object": "text_completion",
                            "choices": [{"index": 0, "text": text, "finish_reason": "length"}]},
            "embeddings": {"object": "list",
                           "data": [{"object": "embedding", "index": 0, "embedding": [0.0] * 8}]},
            "responses": {"object": "response", "status": "completed",
                          "output": [{"type": "message", "role": "assistant",
                                      "content": [{"type": "output_text", "text": text}]}]},
        }  # fmt: skip
        answer = {"id": f"{kind[:4]}-{uuid.uuid4().hex}", "model": self.args.model, **answers[kind]}
        return web.json_response(answer, headers=self.name_header())

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        if not self.authorized(request):
            return self.unauthorized()
        body = await request.json()
        refused = self.refusal(body)
        if refused is not None:
            return refused
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
        admitted = False
        try:
            if self.seqs is not None:
                # Waits its turn: part of its time to the first token.
                admitted = await self.seqs.acquire(
                    lambda: request.transport is None or request.transport.is_closing()
                )
                if not admitted:
                    return web.Response(status=499)  # nobody is listening any more
            self.hold(body, self.prompt_tokens(body))
            slow = bool(self.args.slow_every and number % self.args.slow_every == 0)
            ttft = (self.args.slow_ttft if slow else self.args.ttft) + self.prefill(body)
            if body.get("stream") and self.slots is not None:
                async with self.slots:
                    return await self.stream(request, body, ttft)
            if body.get("stream"):
                answer: web.StreamResponse = await self.stream(request, body, ttft)
            else:
                answer = await self.complete(body, ttft)
                self.prompted += self.prompt_tokens(body)
                self.generated += self.completion_tokens(body)
            self.finished += 1
            return answer
        finally:
            self.in_flight -= 1
            self.free(body)
            if admitted:
                assert self.seqs is not None
                self.seqs.release()

    # ---- what the parsers make of the model's text ------------------------------------------
    def thinks(self, body: dict[str, Any]) -> bool:
        kwargs = body.get("chat_template_kwargs") or {}
        return self.args.thinking != "off" and kwargs.get("enable_thinking", True) is not False

    def tool_call(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """The call the fake model makes: the first tool offered, its first string parameter
        filled with the last word of the user's message."""
        tools = body.get("tools") or []
        if not tools or body.get("tool_choice") == "none":
            return None
        function = tools[0].get("function") or {}
        params = list((function.get("parameters") or {}).get("properties") or {})
        words = str((body.get("messages") or [{}])[-1].get("content", "")).split()
        value = words[-1].strip(".?!") if words else "x"
        return function.get("name", "f"), ({params[0]: value} if params else {})

    @staticmethod
    def tool_markup(name: str, arguments: dict[str, Any]) -> str:
        """Nemotron 3's tool-call text (the qwen3_coder/qwen3_xml format) before any parser."""
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    def refusal(self, body: dict[str, Any]) -> web.Response | None:
        """What vLLM answers before running a request it cannot serve."""
        if body.get("model") != self.args.model:
            return self.error(
                f"The model `{body.get('model')}` does not exist.", "NotFoundError", 404
            )
        if (
            body.get("tools")
            and body.get("tool_choice", "auto") == "auto"
            and self.args.tools == "off"
        ):
            # vllm/entrypoints/openai/serving_chat.py, without --enable-auto-tool-choice.
            message = (
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set"
            )
            return self.error(message, "BadRequestError", 400)
        return None

    def answer(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        """The whole message, as vLLM returns it when not streaming."""
        call = self.tool_call(body) if self.args.tools != "off" else None
        thinking = " think" * (n // 2) if self.thinks(body) else ""
        text = " tok" * (n - n // 2 if thinking else n)
        if call is not None and self.args.tools == "parsed":
            tool_call = {
                "id": "chatcmpl-tool-0",
                "type": "function",
                "function": {"name": call[0], "arguments": json.dumps(call[1])},
            }
            return {
                "role": "assistant",
                "content": None,
                "reasoning": thinking or None,
                "tool_calls": [tool_call],
            }
        if call is not None:
            text = self.tool_markup(*call)
        if thinking and self.args.thinking == "raw":
            return {"role": "assistant", "content": f"<think>{thinking}</think>{text}"}
        return {"role": "assistant", "content": text, "reasoning": thinking or None}

    async def complete(self, body: dict[str, Any], ttft: float) -> web.Response:
        n = self.completion_tokens(body)
        await self.first_token(body, ttft)
        self.hold(body, 1)
        self.decoding += 1
        try:
            if self.args.decode_slowdown_per_stream or self.args.kv_cache_tokens:
                for _ in range(n - 1):
                    await asyncio.sleep(self.itl())
                    self.hold(body, 1)
            else:
                await asyncio.sleep(self.args.itl * (n - 1))
        finally:
            self.decoding -= 1
        message = {"role": "assistant", "content": " tok" * n}
        if self.parsing():
            message = self.answer(body, n)
        finish = "tool_calls" if message.get("tool_calls") else "length"
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.args.model,
                "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                "usage": self.usage(body, n),
            },
            headers=self.name_header(),
        )

    def name_header(self) -> dict[str, str]:
        return {"X-Upstream": self.args.name} if self.args.name else {}

    def parsing(self) -> bool:
        return self.args.thinking != "off" or self.args.tools != "off"

    def parsed_deltas(self, body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """The streamed form of `answer`: reasoning first, then text or a tool call (its id,
        type and name in the first delta, its arguments in pieces after)."""
        message = self.answer(body, n)
        deltas: list[dict[str, Any]] = []
        reasoning = message.get("reasoning") or ""
        deltas += [{"reasoning": " think"} for _ in range(reasoning.count(" think"))]
        for call in message.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            head = {"index": 0, "id": call["id"], "type": "function"}
            deltas.append(
                {
                    "tool_calls": [
                        {**head, "function": {"name": call["function"]["name"], "arguments": ""}}
                    ]
                }
            )
            pieces = [arguments[i : i + 8] for i in range(0, len(arguments), 8)]
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces]
        content = message.get("content") or ""
        words = content.split(" ")
        deltas += [{"content": (" " if i else "") + w} for i, w in enumerate(words) if content]
        return deltas

    def delta(self, i: int, n: int) -> dict[str, Any]:
        """What the i-th of n streamed tokens looks like in this mode."""
        mode = self.args.mode
        if mode == "empty-deltas":
            return {"content": ""}
        if mode == "reasoning" and i < n // 2:
            return {"reasoning": " think"}
        if mode == "reasoning-content" and i < n // 2:
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
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **self.name_header(),
            }
        )
        await response.prepare(request)
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(
            delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None
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
        await self.first_token(body, ttft)
        self.prompted += self.prompt_tokens(body)
        self.decoding += 1
        try:
            await self.tokens(response, body, chunk, n)
        finally:
            self.decoding -= 1
        wants_usage = (body.get("stream_options") or {}).get("include_usage")
        if wants_usage and self.args.mode != "no-usage":
            await response.write(chunk({}, usage=self.usage(body, n)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def tokens(
        self,
        response: web.StreamResponse,
        body: dict[str, Any],
        chunk: Callable[..., bytes],
        n: int,
    ) -> None:
        """The answer's chunks, one token each (or all at once in `one-chunk` mode)."""
        if self.parsing():
            deltas = self.parsed_deltas(body, n)
            finish = "tool_calls" if any("tool_calls" in d for d in deltas) else "length"
            for i, d in enumerate(deltas):
                if i:
                    await asyncio.sleep(self.itl())
                self.generated += 1
                self.hold(body, 1)
                await response.write(chunk(d, finish=finish if i == len(deltas) - 1 else None))
        elif self.args.mode == "one-chunk":
            self.generated += n
            self.hold(body, n)
            await response.write(chunk({"content": " tok" * n}, finish="length"))
        else:
            for i in range(n):
                if i:
                    await asyncio.sleep(self.itl())
                self.generated += 1
                self.hold(body, 1)
                await response.write(
                    chunk(self.delta(i, n), finish="length" if i == n - 1 else None)
                )


def build_app(args: argparse.Namespace) -> web.Application:
    server = FakeServer(args)
    # vLLM's API server sets no body limit (the gate's 16 MB is the only one): aiohttp's 1 MB
    # default would refuse a large prompt that vLLM takes.
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_post("/v1/chat/completions/render", server.render)
    for path in ("/v1/completions", "/v1/embeddings", "/v1/responses",
                 "/v1/responses/{id}/cancel"):  # fmt: skip
        app.router.add_post(path, server.api_route)
    app.router.add_get("/v1/responses/{id}", server.api_route)
    app.router.add_get("/health", server.health)
    app.router.add_get("/_stats", server.stats)
    app.router.add_get("/metrics", server.metrics)
    if args.tokenize:
        app.router.add_post("/tokenize", server.tokenize)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", default="nemotron")
    # The key it asks for; FAKE_OPENAI_API_KEY gives it without a command line (./try).
    p.add_argument("--api-key", default=os.environ.get("FAKE_OPENAI_API_KEY", "test-key"))
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--stall-every", type=int, default=0)
    p.add_argument("--slow-every", type=int, default=0)
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--stuck-requests", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=0,
                   help="requests that run at once, the others waiting in order (0: no limit)")  # fmt: skip
    p.add_argument("--kv-cache-tokens", type=int, default=0,
                   help="the KV cache's size in tokens, for vllm:kv_cache_usage_perc (0: reads 0)")  # fmt: skip
    p.add_argument("--slow-ttft", type=float, default=1.0)
    p.add_argument("--chars-per-token", type=int, default=0,
                   help="count prompt tokens as this many characters of a word (0: one a word)")  # fmt: skip
    p.add_argument("--template-tokens", type=int, default=0,
                   help="tokens the chat template adds to every prompt's usage")  # fmt: skip
    p.add_argument("--tokenize", action="store_true", help="serve vLLM's POST /tokenize")
    p.add_argument("--busy-answer-delay", type=float, default=0.0,
                   help="seconds /health and /metrics take while a chat request is in flight")  # fmt: skip
    p.add_argument("--thinking", choices=["off", "parsed", "raw"], default="off")
    # Sent back as X-Upstream on every chat answer: which replica served it (balancer tests).
    p.add_argument("--name", default="")
    p.add_argument("--prefix-cache-blocks", type=int, default=0,
                   help="model vLLM's prefix cache with this many blocks (0: off)")  # fmt: skip
    p.add_argument("--block-tokens", type=int, default=16, help="tokens a cache block holds")
    p.add_argument("--prefill-per-token", type=float, default=0.0,
                   help="seconds each uncached prompt token adds to the first token")  # fmt: skip
    p.add_argument("--prefill-slots", type=int, default=0,
                   help="prompts that prefill at once, the others waiting (0: no limit)")  # fmt: skip
    p.add_argument("--decode-slowdown-per-stream", type=float, default=0.0,
                   help="each token's gap grows by this share of --itl per other stream "
                   "decoding on this replica (0: off)")  # fmt: skip
    p.add_argument("--scale-out", action="store_true",
                   help="serve /v1/chat/completions/render (vllm serve --enable-scale-out)")  # fmt: skip
    p.add_argument("--tools", choices=["off", "parsed", "raw"], default="off")
    p.add_argument(
        "--mode",
        choices=[
            "healthy",
            "empty-deltas",
            "no-auth",
            "one-chunk",
            "reasoning",
            "reasoning-content",
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
    print(f"{READY}http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


# ---- for the tests: the fake in a process of its own ------------------------------------------


@dataclass
class Running:
    """A started fake: its process and the port it answers on (127.0.0.1)."""

    proc: subprocess.Popen[str]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start(*args: str, key: str, seconds: float = 30) -> Running:
    """This fake in a process of its own with `args`, asking for `key` (given in its environment,
    FAKE_OPENAI_API_KEY, not on its command line; `--api-key` in `args` wins). Returns once it
    has printed its line, which it does once it listens: it answers from then on. Its stderr is
    the caller's, so a fake that fails to start says why in the test's output."""
    proc = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_OPENAI_API_KEY": key},
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith(READY):
        stop(proc, exited=True)
        said = f"printed {line!r}" if ready else f"printed nothing in {seconds}s"
        raise AssertionError(
            f"fake_openai {args} {said}, exit {proc.returncode} (its stderr: in the test's output)"
        )
    return Running(proc, int(line.rsplit(":", 1)[1]))


def stop(proc: subprocess.Popen[str], *, exited: bool = False) -> None:
    """Kill the fake and wait until it is gone. It must have been serving until a SIGKILL (this
    one, or the test's: a replica that crashes) unless `exited`: a fake that died on its own is
    the test's failure, not that of what it tested."""
    proc.kill()
    code = proc.wait(timeout=10)
    assert exited or code == -signal.SIGKILL, f"fake_openai exited by itself ({code})"


@contextlib.contextmanager
def running(*args: str, key: str) -> Iterator[Running]:
    """`start`, then `stop` when the block ends (a test may kill the process before: a replica
    that crashes)."""
    fake = start(*args, key=key)
    try:
        yield fake
    finally:
        stop(fake.proc)


if __name__ == "__main__":
    asyncio.run(serve(parse_args()))
