"""The running stack's config read from the engine (components/cloud/stack_config.py): every refusal
reaches `pulumi up` as its RunError (the message alone, no traceback), before anything is
declared."""

from __future__ import annotations

import pulumi
from pulumi_harness import (
    run_program,
)
from test_droplet import dev

from components.spec.config import ConfigError


def test_every_refusal_reaches_the_engine_as_its_run_error() -> None:
    """spec's ConfigError knows no Pulumi; the cloud raises it as a pulumi.RunError, which
    `pulumi up` prints as its message alone, no traceback: a config refused by its checks, a
    stack with no keys of ours, a size the account does not list."""
    for run in (
        run_program(dev(access={"domain": "llm.example.com"})),
        run_program({}),
        run_program(dev(), offers={}),
    ):
        assert isinstance(run.error, ConfigError), run.error
        assert isinstance(run.error, pulumi.RunError), run.error
        assert str(run.error).startswith("the stack configuration has 1 problem(s)"), run.error
        assert run.registrations == []
