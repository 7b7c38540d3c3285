"""Prompts sized in the server's tokens (nemodrop/bench_sizing.py): by its /tokenize, by the usage
when asked, as words without either (and said so), and a tokenize asked where it cannot be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_tools import (
    KEY,
    fake_server,
    run_tool,
    stats,
)


def sized_bench(base: str, tmp_path: Path, *flags: str) -> tuple[dict[str, Any], str]:
    """bench.py with 300-token prompts at concurrency 2: its one level and its stdout."""
    out = tmp_path / "sized.json"
    proc = run_tool(
        "bench", "--endpoint", base, "--api-key", KEY, "--model", "nemotron", "--no-progress",
        "--concurrency", "2", "--requests", "4", "--max-tokens", "4", "--input-tokens", "300",
        "--json", str(out), *flags,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [level] = json.loads(out.read_text())["levels"]
    return level, proc.stdout


# A tokenizer unlike bench's one-token-a-word (two characters a token: "the" is 2), and a chat
# template of 5 tokens, as the GPU kit's byte-level tokenizer made 1024 words about 2,820 tokens.
UNLIKE_WORDS = ("--chars-per-token", "2", "--template-tokens", "5", "--ttft", "0.01")


def test_bench_sizes_prompts_in_the_servers_tokens_by_its_tokenize(tmp_path: Path) -> None:
    with fake_server(*UNLIKE_WORDS, "--tokenize") as base:
        level, stdout = sized_bench(base, tmp_path)
        asked = stats(base)["tokenize_requests"]
    sizing = level["prompt_sizing"]
    assert sizing["method"] == "tokenize" and asked >= 3
    assert 0.4 < sizing["words_per_token"] < 0.8, sizing
    # The server counted 300 tokens of content and its template's 5: within 3%, as each prompt
    # is its own random words at the words a token of the samples (their mean ratio).
    assert level["mean_prompt_tokens"] == pytest.approx(305, rel=0.03), level["mean_prompt_tokens"]
    assert all(abs(c["tokens"] - 300) <= 3 for c in sizing["checked"]), sizing
    assert "prompts: 300 tokens each by the server's /tokenize" in stdout, stdout


def test_bench_without_a_tokenize_says_its_prompts_are_words(tmp_path: Path) -> None:
    """Behind the gateway (only /v1/* passes) there is no /tokenize: the prompts stay words
    and the report says so, beside the server's own count of what was sent."""
    with fake_server(*UNLIKE_WORDS) as base:
        level, stdout = sized_bench(base, tmp_path)
    assert level["prompt_sizing"]["method"] == "words"
    assert level["mean_prompt_tokens"] > 400, "300 words of this tokenizer are more tokens"
    assert "prompts: 300 words each, not measured in tokens (no /tokenize here" in stdout, stdout


def test_bench_sizes_prompts_by_the_usage_when_asked(tmp_path: Path) -> None:
    with fake_server(*UNLIKE_WORDS) as base:
        level, stdout = sized_bench(base, tmp_path, "--prompt-sizing", "usage")
    assert level["prompt_sizing"]["method"] == "usage"
    assert level["mean_prompt_tokens"] == pytest.approx(305, rel=0.03), level["mean_prompt_tokens"]
    assert "prompts: 300 tokens each by the server's usage" in stdout, stdout


def test_bench_asked_to_tokenize_where_it_cannot_stops_and_says_so(tmp_path: Path) -> None:
    with fake_server(*UNLIKE_WORDS) as base:
        proc = run_tool(
            "bench", "--endpoint", base, "--api-key", KEY, "--model", "nemotron",
            "--no-progress", "--requests", "2", "--prompt-sizing", "tokenize",
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--prompt-sizing tokenize: the server gave no token count" in proc.stderr
