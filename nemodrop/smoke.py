"""Check in one command that an endpoint works: models, a chat, a stream, that auth holds, and
Nemotron 3's own features: reasoning on and off per request, and tool calls (plain and streamed).

    nemodrop smoke --stack dev
    OPENAI_BASE_URL=https://.../v1 OPENAI_API_KEY=$(cat KEYFILE) nemodrop smoke

Each check prints one line with its time: PASS, FAIL with the reason, or OFF when the server
does not offer the feature (no reasoning parser, no auto tool choice), which fails only with
--strict. Exit 0 unless a check failed, else 1. An endpoint that gives no answer, refuses the
key or is not serving yet (502, 503) is one line that names the cause, and exit 1 (reach.py).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from nemodrop import cli
from nemodrop import target as target_mod

# The tools' requirements: a Python without them still lists the subcommand; running it says
# in one line what is missing and the command that installs it (run()).
missing: ModuleNotFoundError | None = None
try:
    import requests

    from nemodrop import reach
except ModuleNotFoundError as err:
    missing = err

PROMPT = "Reply with one short sentence about GPUs."
# Nemotron 3 turns its reasoning on and off per request through its chat template
# (vllm-project/recipes, Nemotron-3-Nano-Omni: chat_template_kwargs enable_thinking).
THINK_TAGS = ("<think>", "</think>")
# The tool the tool-call checks offer, and the call the prompt asks for.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
TOOL_PROMPT = "Use the get_weather tool to look up the weather in Paris"
# What the model's tool-call markup looks like when no parser turned it into tool_calls.
TOOL_MARKUP = ("<tool_call>", "<function=")


class CheckError(Exception):
    pass


class NotEnabledError(Exception):
    """The server does not offer this feature."""


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    detail: str
    status: str = ""

    def __post_init__(self) -> None:
        self.status = self.status or ("PASS" if self.ok else "FAIL")


def _reasoning(message: dict[str, Any]) -> str:
    # vLLM's field since PR #27752 (`reasoning_content` before, removed by #33402).
    return str(message.get("reasoning") or message.get("reasoning_content") or "")


def _tool_refusal(response: requests.Response) -> str | None:
    """vLLM's answer to `tool_choice: auto` without --enable-auto-tool-choice."""
    if response.status_code == 400 and "enable-auto-tool-choice" in response.text:
        return (
            "not enabled on this server: vLLM runs without --enable-auto-tool-choice and "
            "--tool-call-parser"
        )
    return None


def _sse_events(response: requests.Response) -> Iterator[dict[str, Any]]:
    for raw in response.iter_lines(decode_unicode=True):
        if not raw or not raw.startswith("data:"):
            continue
        data = raw[len("data:") :].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


class Smoke:
    def __init__(self, target: target_mod.Target, timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self.model = target.model
        self.http = requests.Session()
        self.http.verify = target.verify

    def _check(self, response: requests.Response, what: str) -> None:
        if response.status_code != 200:
            raise CheckError(f"{what} answered HTTP {response.status_code}: {response.text[:200]}")

    def models(self) -> str:
        r = self.http.get(
            self.target.url("models"), headers=self.target.headers, timeout=self.timeout
        )
        self._check(r, "GET /v1/models")
        ids = [m.get("id") for m in r.json().get("data", [])]
        if not ids:
            raise CheckError("/v1/models lists no model")
        if self.model is None:
            self.model = ids[0]
        elif self.model not in ids:
            raise CheckError(f"/v1/models lists {ids}, not the served model {self.model!r}")
        return f"lists {self.model}"

    def chat(self) -> str:
        r = self.http.post(
            self.target.url("chat/completions"),
            headers=self.target.headers,
            json=target_mod.chat_body(self._model(), PROMPT, 32, stream=False),
            timeout=self.timeout,
        )
        self._check(r, "POST /v1/chat/completions")
        body = r.json()
        choices = body.get("choices") or []
        text = target_mod.text_of(choices[0].get("message", {})) if choices else ""
        if not text.strip():
            raise CheckError("the chat completion returned no text")
        tokens = (body.get("usage") or {}).get("completion_tokens")
        return f"{tokens} tokens: {text.strip()[:60]!r}"

    def stream(self) -> str:
        with self.http.post(
            self.target.url("chat/completions"),
            headers=self.target.headers,
            json=target_mod.chat_body(self._model(), PROMPT, 32, stream=True),
            timeout=self.timeout,
            stream=True,
        ) as r:
            self._check(r, "streamed POST /v1/chat/completions")
            deltas, usage = 0, None
            for event in _sse_events(r):
                for choice in event.get("choices") or []:
                    if target_mod.text_of(choice.get("delta") or {}):
                        deltas += 1
                usage = event.get("usage") or usage
        if deltas < 2:
            raise CheckError(
                f"the stream carried {deltas} non-empty delta(s); expected more than 1"
            )
        if not usage or not usage.get("completion_tokens"):
            raise CheckError("the stream ended without a usage chunk")
        return f"{deltas} deltas, usage {usage.get('completion_tokens')} tokens"

    def _ask(self, body: dict[str, Any], what: str) -> dict[str, Any]:
        r = self.http.post(
            self.target.url("chat/completions"),
            headers=self.target.headers,
            json=body,
            timeout=self.timeout,
        )
        refusal = _tool_refusal(r) if body.get("tools") else None
        if refusal:
            raise NotEnabledError(refusal)
        self._check(r, what)
        choices = r.json().get("choices") or []
        if not choices:
            raise CheckError(f"{what} returned no choice")
        message: dict[str, Any] = choices[0].get("message") or {}
        return message

    def _thinking_body(self, on: bool) -> dict[str, Any]:
        body = target_mod.chat_body(self._model(), PROMPT, 256, stream=False)
        body["chat_template_kwargs"] = {"enable_thinking": on}
        return body

    def think_on(self) -> str:
        message = self._ask(self._thinking_body(True), "a chat with reasoning on")
        content, reasoning = str(message.get("content") or ""), _reasoning(message)
        if any(tag in content for tag in THINK_TAGS):
            raise CheckError(
                "the reasoning came back inside content, between think tags: the server runs "
                "without a reasoning parser (vLLM --reasoning-parser nemotron_v3)"
            )
        if not reasoning.strip():
            raise NotEnabledError(
                "no reasoning came back: no reasoning parser, or the model does not think"
            )
        return f"{len(reasoning)} characters of reasoning, none in content"

    def think_off(self) -> str:
        message = self._ask(self._thinking_body(False), "a chat with reasoning off")
        content, reasoning = str(message.get("content") or ""), _reasoning(message)
        if reasoning.strip():
            raise CheckError(f"reasoning came back although it was turned off: {reasoning[:60]!r}")
        if any(tag in content for tag in THINK_TAGS):
            raise CheckError("think tags in content although reasoning was turned off")
        if not content.strip():
            raise CheckError("no answer with reasoning off")
        return f"no reasoning; answer {content.strip()[:50]!r}"

    def _tool_body(self, stream: bool) -> dict[str, Any]:
        body = target_mod.chat_body(self._model(), TOOL_PROMPT, 256, stream=stream)
        body.update(tools=[WEATHER_TOOL], tool_choice="auto")
        body["chat_template_kwargs"] = {"enable_thinking": False}
        return body

    @staticmethod
    def _check_call(name: str, arguments: str, content: str) -> str:
        if not name:
            if any(mark in content for mark in TOOL_MARKUP):
                raise CheckError(
                    "the tool call came back as text in content: the tool-call parser does not "
                    "match the model (Nemotron 3 Super: qwen3_xml; Nano and Ultra: qwen3_coder)"
                )
            raise CheckError(f"no tool call; the answer was {content.strip()[:60]!r}")
        if name != "get_weather":
            raise CheckError(f"called {name!r}, not get_weather")
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as err:
            raise CheckError(f"the call's arguments are not JSON: {arguments[:60]!r}") from err
        if not isinstance(args, dict) or "city" not in args:
            raise CheckError(f"the call's arguments lack the city: {arguments[:60]!r}")
        return f"get_weather({json.dumps(args)})"

    def tools(self) -> str:
        message = self._ask(self._tool_body(stream=False), "a chat with a tool")
        calls = message.get("tool_calls") or []
        function = (calls[0].get("function") or {}) if calls else {}
        return self._check_call(
            str(function.get("name") or ""),
            str(function.get("arguments") or ""),
            str(message.get("content") or ""),
        )

    def tools_stream(self) -> str:
        with self.http.post(
            self.target.url("chat/completions"),
            headers=self.target.headers,
            json=self._tool_body(stream=True),
            timeout=self.timeout,
            stream=True,
        ) as r:
            refusal = _tool_refusal(r)
            if refusal:
                raise NotEnabledError(refusal)
            self._check(r, "a streamed chat with a tool")
            name, arguments, content, pieces = "", "", "", 0
            for event in _sse_events(r):
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    content += str(delta.get("content") or "")
                    for call in delta.get("tool_calls") or []:
                        if call.get("index", 0) != 0:
                            continue
                        function = call.get("function") or {}
                        name += str(function.get("name") or "")
                        arguments += str(function.get("arguments") or "")
                        pieces += 1
        return f"{self._check_call(name, arguments, content)} in {pieces} deltas"

    def wrong_key(self) -> str:
        r = self.http.get(
            self.target.url("models"),
            headers={"Authorization": "Bearer wrong-key-from-smoke"},
            timeout=self.timeout,
        )
        if r.status_code not in (401, 403):
            raise CheckError(f"a wrong key got HTTP {r.status_code}, not 401/403")
        return f"refused with HTTP {r.status_code}"

    def _model(self) -> str:
        if self.model is None:
            raise CheckError("no model to ask: the models check failed")
        return self.model

    def checks(self) -> list[tuple[str, Callable[[], str]]]:
        return [
            ("models", self.models),
            ("chat", self.chat),
            ("stream", self.stream),
            ("auth", self.wrong_key),
            ("think-on", self.think_on),
            ("think-off", self.think_off),
            ("tools", self.tools),
            ("tools-stream", self.tools_stream),
        ]


def run_checks(target: target_mod.Target, timeout: float, strict: bool = False) -> list[Result]:
    smoke = Smoke(target, timeout)
    results = []
    for name, check in smoke.checks():
        start = time.perf_counter()
        status = ""
        try:
            detail, ok = check(), True
        except NotEnabledError as err:
            detail, ok, status = str(err), not strict, "OFF"
        except CheckError as err:
            detail, ok = str(err), False
        except requests.RequestException as err:
            detail, ok = reach.describe_failure(err, target, timeout), False
        except ValueError as err:  # a body that is not the JSON it should be
            detail, ok = f"an answer that is not valid JSON: {err}", False
        except (AttributeError, TypeError, KeyError, IndexError) as err:
            # JSON, but not OpenAI's shape (a list, null, a string where an object goes): a
            # proxy's page or another API on the port. The check fails; the others still run.
            detail = f"an answer not in the OpenAI shape ({type(err).__name__}: {err})"
            ok = False
        results.append(Result(name, ok, time.perf_counter() - start, detail, status))
    return results


def add_parser(subparsers: cli.Subparsers) -> None:
    parser = cli.subcommand(subparsers, "smoke", __doc__)
    target_mod.add_arguments(parser)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per request")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="a feature the server does not offer (OFF: reasoning, tool calls) fails the run",
    )


def run(args: argparse.Namespace) -> int:
    if missing is not None:
        target_mod.missing_package(missing)
    target = target_mod.resolve(args)
    # Unreachable, refused, untrusted, the wrong key, not serving yet: one line, not 8 FAILs.
    reach.probe(target, args.timeout)
    results = run_checks(target, args.timeout, args.strict)
    for r in results:
        print(f"{r.status} {r.name:<12} {r.seconds * 1000:8.0f} ms  {r.detail}")
    failed = [r for r in results if not r.ok]
    if failed:
        off = [r.name for r in failed if r.status == "OFF"]
        print(
            f"{len(failed)} of {len(results)} checks failed: {', '.join(r.name for r in failed)}"
            + (f" (not offered by the server, failed by --strict: {', '.join(off)})" if off else "")
        )
    else:
        print("all checks passed")
    return 1 if failed else 0
