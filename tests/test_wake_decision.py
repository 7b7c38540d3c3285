"""scripts/phases/wake/decision.py, the wake decision, as the pure table it is: every mode
against each event (a request, a look that finds a ready replica, one that exists, none), the
cooldown after a failure, the per-day cap, the deadline, a pipeline that refuses its token, and
what a held request is told."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest
import script_module
from test_wake_settings import rendered

WAKER = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "wake"
package: Any = script_module.load_package(WAKER, "wake_decision_test", "decision", "settings")
decision, state = package.decision, package.state
Mode, Ledger, Timeline = state.Mode, state.Ledger, state.Timeline
S = package.settings.Settings.from_env({**rendered(), "WAKE_TOKEN_FILE": ""})
NOW = 1_800_000_000.0
COOL = S.cooldown_minutes * 60  # 600 s as rendered
DAY = 86400.0
READY = decision.Seen(ready=1, listed=1, gone_looks=0, gone_since=None)
THERE = decision.Seen(ready=0, listed=1, gone_looks=0, gone_since=None)
# None answered for WAKE_ASLEEP_LOOKS looks over WAKE_ASLEEP_SECONDS: no replica exists.
GONE = decision.Seen(ready=0, listed=1, gone_looks=S.asleep_looks,
                     gone_since=NOW - S.asleep_seconds)  # fmt: skip
NONE = decision.Seen(ready=0, listed=0, gone_looks=1, gone_since=NOW)


def failed(ago: float, reason: str = "GitHub refused the wake (HTTP 401)") -> Any:
    return Ledger(wakes=[NOW - ago - 60], failed_at=NOW - ago, reason=reason)


# A request (or the control's POST) in each mode: start a wake, nothing, or a refusal.
ADMIT = [
    (Mode.AWAKE, Ledger(), None),
    (Mode.UNREADY, Ledger(), None),
    (Mode.WAKING, Ledger(wakes=[NOW - 5]), None),
    (Mode.ASLEEP, Ledger(), "start"),
    (Mode.FAILED, failed(COOL - 1), "wake_failed"),
    (Mode.FAILED, failed(COOL + 1), "start"),
    (Mode.ASLEEP, failed(COOL - 1), "wake_failed"),  # a failure's cooldown holds whatever the mode
]


@pytest.mark.parametrize(("mode", "ledger", "want"), ADMIT)
def test_a_request_in_each_mode(mode: Any, ledger: Any, want: str | None) -> None:
    got = decision.admit(mode, ledger, S, NOW)
    if want is None:
        assert got is None
    elif want == "start":
        assert isinstance(got, decision.Start) and got.wakes[-1] == NOW
    else:
        assert isinstance(got, decision.Refusal) and got.code == want and not got.retry


# A look in each mode: (mode, what it saw, failed how long ago, woken how long ago) -> the mode.
LOOKS = [
    *[(mode, READY, Mode.AWAKE) for mode in Mode],  # a ready replica: awake, whatever came before
    (Mode.AWAKE, THERE, Mode.UNREADY),
    (Mode.AWAKE, GONE, Mode.ASLEEP),
    (Mode.AWAKE, NONE, Mode.ASLEEP),
    (Mode.UNREADY, THERE, Mode.UNREADY),
    (Mode.UNREADY, GONE, Mode.ASLEEP),
    (Mode.ASLEEP, THERE, Mode.UNREADY),  # a replica joined: it exists
    (Mode.ASLEEP, GONE, Mode.ASLEEP),
    (Mode.WAKING, THERE, None),  # a wake goes on until its deadline
    (Mode.WAKING, GONE, None),
    (Mode.WAKING, NONE, None),
    (Mode.FAILED, THERE, None),  # a failure holds for its cooldown
    (Mode.FAILED, GONE, None),
]


@pytest.mark.parametrize(("mode", "seen", "want"), LOOKS)
def test_a_look_in_each_mode(mode: Any, seen: Any, want: Any) -> None:
    got = decision.after_look(mode, NOW - 60, NOW - 60, seen, S, NOW)
    assert got == want


def test_a_failure_past_its_cooldown_follows_the_replicas_again() -> None:
    assert decision.after_look(Mode.FAILED, NOW, NOW - COOL, GONE, S, NOW) == Mode.ASLEEP
    assert decision.after_look(Mode.FAILED, NOW, NOW - COOL, THERE, S, NOW) == Mode.UNREADY
    assert decision.after_look(Mode.FAILED, NOW, NOW - COOL + 1, THERE, S, NOW) is None


def test_a_wake_past_its_deadline_fails_naming_the_setting() -> None:
    deadline = S.deadline_minutes * 60
    assert decision.after_look(Mode.WAKING, NOW - deadline, None, THERE, S, NOW) is None
    got = decision.after_look(Mode.WAKING, NOW - deadline - 1, None, GONE, S, NOW)
    assert got == decision.Fail("no replica answered within 45 minutes (wake.deadlineMinutes)")
    assert decision.after_look(Mode.WAKING, NOW - deadline - 1, None, READY, S, NOW) == Mode.AWAKE


def test_asleep_only_after_enough_looks_over_enough_time() -> None:
    assert decision.asleep(NONE, S, NOW), "no upstream file: no replica"
    few = decision.Seen(0, 1, S.asleep_looks - 1, NOW - 60)
    brief = decision.Seen(0, 1, S.asleep_looks, NOW - S.asleep_seconds + 1)
    assert not decision.asleep(few, S, NOW) and not decision.asleep(brief, S, NOW)
    assert decision.asleep(GONE, S, NOW)


def test_the_per_day_cap_counts_the_last_24_hours() -> None:
    assert S.max_per_day == 6
    wakes = [NOW - DAY + 100, *(NOW - 3600 * h for h in range(1, 6))]
    spent = decision.admit(Mode.ASLEEP, Ledger(wakes=wakes), S, NOW)
    assert isinstance(spent, decision.Refusal) and spent.code == "wake_budget_spent"
    assert spent.retry_after == 101, "the oldest leaves the day in 100 s"
    assert "6 of wake.maxPerDay (6)" in spent.message
    older = [NOW - DAY - 1, *wakes[1:]]
    started = decision.admit(Mode.ASLEEP, Ledger(wakes=older), S, NOW)
    assert isinstance(started, decision.Start)
    assert started.wakes == (*sorted(wakes[1:]), NOW), "the day's wakes, the old one gone"


def test_the_cooldown_refusal_says_why_and_when() -> None:
    got = decision.admit(Mode.FAILED, failed(100.0), S, NOW)
    assert got == decision.Refusal(
        "the wake failed: GitHub refused the wake (HTTP 401); the next may start in 501 s "
        "(wake.cooldownMinutes: 10)",
        501,
        "wake_failed",
    )


def test_an_expired_pipeline_token_fails_the_wake_under_way_and_only_it() -> None:
    """GitHub refuses an expired token (401): the dispatch's PipelineError fails a wake under
    way, and the next request is told why until the cooldown ends."""
    assert decision.fails(Mode.WAKING)
    assert not any(decision.fails(mode) for mode in Mode if mode != Mode.WAKING)
    refusal = decision.admit(Mode.FAILED, failed(0.0), S, NOW)
    assert refusal.code == "wake_failed" and "HTTP 401" in refusal.message
    assert refusal.retry_after == int(COOL) + 1


def test_what_a_held_request_is_told() -> None:
    ledger = failed(10.0)
    stop = decision.held_refusal(Mode.WAKING, True, ledger, S, 3, NOW - 10, "", NOW)
    assert (stop.code, stop.retry, stop.retry_after) == ("waker_restarting", True, 1)
    fail = decision.held_refusal(Mode.FAILED, False, ledger, S, 3, NOW - 10, "", NOW)
    assert fail == decision.cooldown_refusal(ledger, S, NOW)
    wait = decision.held_refusal(Mode.WAKING, False, Ledger(), S, 540, NOW - 100, "", NOW)
    assert (wait.code, wait.retry, wait.retry_after) == ("waking", True, 1)
    assert "still waking after 540 s (wake.holdSeconds: 540); about 800 s more" in wait.message
    late = decision.held_refusal(Mode.UNREADY, False, Ledger(), S, 540, NOW - 5000, "", NOW)
    assert "not ready (starting or draining)" in late.message and "about 30 s more" in late.message
    ask = decision.held_refusal(Mode.WAKING, False, Ledger(), S, 5, NOW, "its run waits", NOW)
    assert "still waking (its run waits) after 5 s" in ask.message


def test_a_wake_under_way_when_the_waker_stopped_is_taken_up_until_its_deadline() -> None:
    def ledger(**steps: Any) -> Any:
        return Ledger(wakes=[NOW - 60], timeline=Timeline(request_in="t", **steps))

    assert decision.resumes(ledger(dispatching="t"), S, NOW), "said, maybe sent: follow it"
    assert decision.resumes(ledger(pipeline_started="t", run_id=1), S, NOW)
    assert not decision.resumes(ledger(), S, NOW), "never dispatched: nothing to follow"
    assert not decision.resumes(ledger(dispatching="t", ready="t"), S, NOW)
    assert not decision.resumes(ledger(dispatching="t", failed="t"), S, NOW)
    late = Ledger(wakes=[NOW - S.deadline_minutes * 60], timeline=Timeline(dispatching="t"))
    assert not decision.resumes(late, S, NOW)


def test_a_run_waiting_for_a_reviewer_is_said_while_it_waits() -> None:
    url = "https://github.com/me/llm/actions/runs/9"
    waiting = Ledger(timeline=Timeline(run_waiting="t", run_url=url))
    said = decision.awaiting_approval(Mode.WAKING, waiting, "dev")
    assert said == f"its deploy run waits for a reviewer to approve the dev environment's " \
                   f"deployment: {url}"  # fmt: skip
    approved = Ledger(timeline=Timeline(run_waiting="t", run_url=url, run_approved="t"))
    assert decision.awaiting_approval(Mode.WAKING, approved, "dev") == ""
    assert decision.awaiting_approval(Mode.FAILED, waiting, "dev") == ""


def imported(path: Path) -> set[str]:
    """The modules a file imports: top-level names, and '.name' for the package's own."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = (node.module or "").split(".")[0]
            if node.level:
                names |= {f".{base}"} if base else {f".{a.name}" for a in node.names}
            else:
                names.add(base)
    return names


def test_the_decision_is_pure_and_the_waker_needs_the_standard_library_and_aiohttp_alone() -> None:
    """decision.py reads its inputs and returns what to do: no I/O, no event loop, no clock.
    The package runs on the front's Ubuntu python3 with python3-aiohttp and nothing else but
    the clients shipped beside it (scripts/clients/, the standard library alone: test_layout)."""
    assert imported(WAKER / "decision.py") == {"__future__", "dataclasses", ".settings", ".state"}
    for path in WAKER.glob("*.py"):
        outside = {
            name
            for name in imported(path)
            if not name.startswith(".") and name not in sys.stdlib_module_names
        }
        assert outside <= {"aiohttp", "clients"}, (path.name, outside)
