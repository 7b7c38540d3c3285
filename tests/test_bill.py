"""What a stack costs per hour, and the sentence said when nothing stops that bill
(components/spec/bill.py): `pulumi up` says it with the hourly price when autodown is off or only
logs, and not when a rule with a token deletes the Droplet."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from pulumi_harness import (
    run_program,
    stack_config,
)


@pytest.mark.parametrize(
    ("autodown", "secrets", "expected"),
    [
        ({}, {}, "autodown is off"),
        ({"idleMinutes": 30}, {}, "autodown only logs"),
        (None, {"autodown": json.dumps({"idleMinutes": 30, "token": "dop_v1_" + "a" * 64})}, None),
    ],
)
def test_pulumi_up_says_when_nothing_will_stop_the_bill(
    autodown: dict[str, Any] | None,
    secrets: dict[str, str],
    expected: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = {k: v for k, v in stack_config("dev").items() if k != "autodown"}
    if autodown is not None:
        config["autodown"] = autodown
    caplog.set_level(logging.WARNING)
    run = run_program(config, secrets=secrets)
    assert run.error is None, run.error
    said = [r.message for r in caplog.records if "nothing will stop the bill" in r.message]
    if expected is None:
        assert said == [], "a rule with a token deletes the Droplet"
    else:
        (line,) = said
        assert expected in line and "$0.76/hour until `pulumi destroy`" in line, line
