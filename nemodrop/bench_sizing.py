"""Synthetic prompts sized in the server's tokens, so that `bench.py --input-tokens N` sends N
prompt tokens on any model, as `vllm bench serve --random-input-len N` does.

bench_workload's synthetic prompts are short common words, one token each for the usual BPE
vocabularies; another tokenizer counts them otherwise (on the GPU kit's byte-level tokenizer,
`--input-tokens 1024` came out at about 2,820 tokens: ../shared/gpu/README.md). Before the first
level bench.py measures how many of those words make a token on this server and scales every
synthetic prompt (and a trace's lengths) by that ratio:

- `tokenize`: vLLM's `POST /tokenize` at the server's root, beside `/v1` (entrypoints/serve/
  tokenize/api_router.py; `add_special_tokens: false`, so the count is the text's own). The
  Droplet's gateway lets only `/v1/*` and `/health` through, so this answers on a tunnel to
  vLLM or on vLLM itself, not on the public endpoint.
- `usage`: a chat request of one token per sample (not part of any level), read from the
  usage's `prompt_tokens`, less that of an empty message (the chat template's own tokens), so
  any OpenAI-compatible server that reports usage will do.
- `words`: no measurement; one word is taken as one token (what bench.py did before).

`auto` (the default) takes `tokenize` where it answers, else `words`, and the report says which
(`usage` sends its requests only when asked for). The chat template's tokens come on top of N,
as with `vllm bench serve --backend openai-chat`; the server's usage (mean_prompt_tokens) shows
the whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from nemodrop import target as target_mod
from nemodrop.bench_workload import synthetic_prompt

# The samples measured: indices no level uses (levels use 0 and up, warm-up requests -1, -2...).
SAMPLES = (-1_000_001, -1_000_002, -1_000_003)

Count = Callable[[str], Awaitable[int | None]]


@dataclass(frozen=True)
class Sizing:
    method: str  # "tokenize", "usage" or "words"
    words_per_token: float
    target_tokens: int
    # Each sample at the length it was scaled to: (words, the server's tokens).
    checked: tuple[tuple[int, int], ...] = ()
    note: str = ""  # why a method was passed over

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "words_per_token": self.words_per_token,
            "target_tokens": self.target_tokens,
            "checked": [{"words": w, "tokens": t} for w, t in self.checked],
            "note": self.note or None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sizing:
        checked = tuple((int(c["words"]), int(c["tokens"])) for c in d.get("checked") or [])
        return cls(
            d["method"], float(d["words_per_token"]), int(d["target_tokens"]), checked,
            d.get("note") or "",
        )  # fmt: skip

    def line(self) -> str:
        """What the report says about the prompts."""
        if self.method == "words":
            return f"prompts: {self.target_tokens} words each, not measured in tokens ({self.note})"
        how = {"tokenize": "the server's /tokenize", "usage": "the server's usage"}[self.method]
        tokens = ", ".join(str(t) for _, t in self.checked)
        return (
            f"prompts: {self.target_tokens} tokens each by {how} "
            f"({self.words_per_token:.3f} words a token; samples came to {tokens} tokens)"
        )


def root_url(target: target_mod.Target) -> str:
    """The server's root: the endpoint without its /v1."""
    base = target.endpoint.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def tokenize_counter(
    session: aiohttp.ClientSession, target: target_mod.Target, model: str
) -> Count:
    async def count(text: str) -> int | None:
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        try:
            async with session.post(
                f"{root_url(target)}/tokenize",
                json=body,
                headers=target.headers,
                timeout=aiohttp.ClientTimeout(total=60),
            ) as response:
                if response.status != 200:
                    await response.read()
                    return None
                answer = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        found = answer.get("count") if isinstance(answer, dict) else None
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    return count


def usage_counter(ask: Callable[[str], Awaitable[int | None]]) -> Count:
    """`ask(text)`: the usage's prompt_tokens for a one-token chat request with that content.
    The count is what the content adds to an empty message's."""
    empty: list[int] = []

    async def count(text: str) -> int | None:
        if not empty:
            base = await ask("")
            if base is None:
                return None
            empty.append(base)
        whole = await ask(text)
        return None if whole is None else whole - empty[0]

    return count


async def measure(
    count: Count, tokens: int, seed: int
) -> tuple[float, tuple[tuple[int, int], ...]]:
    """Words a token: each sample counted at `tokens` words, then again at the length that
    ratio gives (a prompt's ratio moves a little with its length); the mean of the second."""
    checked: list[tuple[int, int]] = []
    for index in SAMPLES:
        words = tokens
        for _ in range(2):
            counted = await count(synthetic_prompt(index, words, seed))
            if not counted or counted < 1:
                raise LookupError("no count")
            ratio = words / counted
            scaled = max(1, round(tokens * ratio))
            if scaled == words:
                break
            words = scaled
        counted = await count(synthetic_prompt(index, words, seed))
        if not counted:
            raise LookupError("no count")
        checked.append((words, counted))
    ratio = sum(w for w, _ in checked) / sum(t for _, t in checked)
    return ratio, tuple(checked)


async def size(method: str, tokens: int, seed: int, tokenize: Count, usage: Count) -> Sizing:
    """The sizing `method` asks for, measured on the server. auto: `tokenize` where the server
    answers it, else words (never `usage` unasked: its requests reach the server's chat route
    before the levels, and count in what it says it served)."""
    if method == "words":
        return Sizing("words", 1.0, tokens, (), "--prompt-sizing words")
    name = "usage" if method == "usage" else "tokenize"
    try:
        ratio, checked = await measure(usage if name == "usage" else tokenize, tokens, seed)
    except LookupError:
        if method != "auto":
            raise SizingError(f"--prompt-sizing {name}: the server gave no token count") from None
        note = "no /tokenize here (behind the gateway?); --prompt-sizing usage measures instead"
        return Sizing("words", 1.0, tokens, (), note)
    return Sizing(name, ratio, tokens, checked)


class SizingError(RuntimeError):
    """The sizing asked for cannot be measured on this server."""
