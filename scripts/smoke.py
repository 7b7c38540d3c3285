#!/usr/bin/env python3
"""Check in one command that an endpoint works: models, a chat, a stream, and that auth holds.

    python scripts/smoke.py --stack dev
    OPENAI_BASE_URL=https://.../v1 OPENAI_API_KEY=... python scripts/smoke.py

Each check prints one line with its time; exit 0 only if all pass, else 1 with the reason for
each failed check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests
import target as target_mod

PROMPT = "Reply with one short sentence about GPUs."


class CheckError(Exception):
    pass


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    detail: str


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

    def _check(self, response: requests.Response, what: str) -> None:
        if response.status_code != 200:
            raise CheckError(f"{what} answered HTTP {response.status_code}: {response.text[:200]}")

    def models(self) -> str:
        r = requests.get(
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
        r = requests.post(
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
        with requests.post(
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

    def wrong_key(self) -> str:
        r = requests.get(
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
        ]


def run(target: target_mod.Target, timeout: float) -> list[Result]:
    smoke = Smoke(target, timeout)
    results = []
    for name, check in smoke.checks():
        start = time.perf_counter()
        try:
            detail, ok = check(), True
        except CheckError as err:
            detail, ok = str(err), False
        except requests.RequestException as err:
            detail, ok = f"{type(err).__name__}: {err}", False
        results.append(Result(name, ok, time.perf_counter() - start, detail))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target_mod.add_arguments(parser)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per request")
    args = parser.parse_args(argv)
    target = target_mod.resolve(args)
    results = run(target, args.timeout)
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'} {r.name:<7} {r.seconds * 1000:8.0f} ms  {r.detail}")
    failed = [r for r in results if not r.ok]
    print(f"{len(failed)} of {len(results)} checks failed" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
