"""What a given API key must look like (components/spec/apikey.py): long and plain, each refusal
naming the rule without echoing the key, before anything is declared."""

from __future__ import annotations

import pytest
from pulumi_harness import (
    run_program,
    stack_config,
)

from components.spec.config import ConfigError


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("short-key-0123", "apiKey: 14 characters; accepted: at least 32"),
        ("k" * 40 + "*", "apiKey: holds other characters than letters, digits"),
        ("{env.HOME}" + "k" * 30, "apiKey: holds other characters than letters, digits"),
        ("k" * 20 + " " + "k" * 20, "apiKey: holds other characters than letters, digits"),
        ("k" * 20 + "$" + "k" * 20, "apiKey: holds other characters than letters, digits"),
    ],
    ids=["short", "wildcard", "placeholder", "space", "dollar"],
)
def test_a_given_api_key_must_be_long_and_plain(key: str, message: str) -> None:
    run = run_program(stack_config("dev"), secrets={"apiKey": key})
    assert isinstance(run.error, ConfigError), run.error
    assert any(p.startswith(message) for p in run.error.problems), run.error.problems
    assert key not in str(run.error) and key[:8] not in str(run.error)
    assert run.registrations == []
