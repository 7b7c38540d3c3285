"""scripts/phases/autodown/rule.py: the decision alone, no I/O: busy or idle from two readings,
and which limit is past (max hours, the bootstrap deadline, idle), on plain numbers."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import script_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))  # the clients the package imports
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def rule() -> ModuleType:
    package = script_module.load_package(ROOT / "scripts/phases/autodown", "ad_rule", "rule")
    module: ModuleType = package.rule
    return module


def state(**changes: Any) -> dict[str, Any]:
    """A state that served, its last activity now."""
    return {"started_at": NOW, "last_activity": NOW, "counters": None, "served": True,
            **changes}  # fmt: skip


def reading(
    running: float = 0, waiting: float = 0, finished: float = 0, generated: float = 0
) -> dict[str, float]:
    return {
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": waiting,
        "vllm:request_success_total": finished,
        "vllm:generation_tokens_total": generated,
    }


def test_the_first_reading_trusts_the_gauges_then_only_progress_counts(rule: ModuleType) -> None:
    s = state()
    assert rule.busy_now(s, reading(running=1))[0] is True, "no baseline: the gauges"
    busy, line = rule.busy_now(s, reading(running=1))
    assert busy is False and "no progress though the gauges say" in line
    assert rule.busy_now(s, reading(running=1, generated=5))[0] is True
    assert rule.busy_now(s, reading(generated=0))[0] is True, "counters went back: a restart"
    assert rule.busy_now(s, None) == (True, "metrics unreadable, counted as busy")


def test_each_limit_fires_at_its_bound_and_max_hours_first(rule: ModuleType) -> None:
    limits = rule.Rule(idle_minutes=30, max_hours=8)
    s = state(counters={"vllm:request_success_total": 0.0, "vllm:generation_tokens_total": 0.0},
              last_activity=NOW - 29 * 60)  # fmt: skip
    started = (NOW - 3600, "first bootstrap")
    assert rule.decide(s, reading(), NOW, started, limits)[0] is False
    delete, line = rule.decide(s, reading(), NOW + 60, started, limits)
    assert delete and line.endswith(
        "idle 30/30 min, up 1.02/8 h since first bootstrap: idle too long"
    )
    busy = state(last_activity=NOW)
    delete, line = rule.decide(busy, reading(running=1), NOW, (NOW - 8 * 3600, "x"), limits)
    assert delete and line.endswith("past max hours"), "busy or not"


def test_a_bootstrap_has_its_deadline_and_no_idle_rule(rule: ModuleType) -> None:
    limits = rule.Rule(idle_minutes=30, max_hours=None, bootstrap_minutes=90)
    s = state(served=False, last_activity=NOW - 3600)
    started = (NOW - 89 * 60, "first bootstrap")
    keep, line = rule.decide(s, None, NOW, started, limits)
    assert keep is False and line.startswith("bootstrapping: this replica has not served yet")
    delete, line = rule.decide(s, None, NOW + 60, started, limits)
    assert delete and line.endswith("not serving by its bootstrap deadline")


def test_a_rule_new_to_a_droplet_past_its_deadline_counts_its_own_window(
    rule: ModuleType,
) -> None:
    s = state(served=False, started_at=NOW)
    began = (NOW - 5 * 3600, "first bootstrap")
    assert rule.bootstrap_clock(s, began, 60) == (NOW, "this rule's first run")
    assert rule.bootstrap_clock(state(started_at=NOW - 5 * 3600 + 60), began, 60) == began
    assert rule.bootstrap_clock(s, began, None) == began
