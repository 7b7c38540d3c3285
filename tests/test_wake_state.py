"""scripts/phases/wake/state.py: the waker's ledger round-trips through its state file; the file
the single-file waker wrote loads (a front upgraded mid-wake takes the wake up, its run
followed, never dispatched again); a file or a field that does not parse is lost alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import script_module
from test_wake_settings import rendered

WAKER = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "wake"
package: Any = script_module.load_package(WAKER, "wake_state_test", "state", "waker")
state, waker_mod = package.state, package.waker
NOW = 1_800_000_000.0
COOLDOWN = 600.0
# As scripts/phases/wake.py (the single file, before the package) saved a wake under way: its
# dispatch said, the run's id kept, then the waker stopped (the deploy's `pulumi up` installing
# the package).
OLD_FILE = {
    "wakes": [NOW - 3 * 86400, NOW - 300.0],
    "timeline": {
        "request_in": "2027-01-15T08:15:00Z",
        "dispatching": "2027-01-15T08:15:00Z",
        "pipeline_started": "2027-01-15T08:15:01Z",
        "run_id": 4242,
    },
    "failed_at": None,
    "reason": "",
}


def test_a_ledger_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    timeline = state.Timeline(request_in="a", dispatching="b", run_id=7, run_waiting="c",
                              run_url="https://github.com/me/llm/actions/runs/7",
                              failed="d", reason="the deploy run ended failure")  # fmt: skip
    ledger = state.Ledger([NOW - 100.0, NOW - 10.0], timeline, NOW - 5.0, "why")
    ledger.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"], "no temp file left"
    assert state.Ledger.load(path, NOW, COOLDOWN) == ledger
    # The steps in the order they come, the ones not reached left out.
    assert list(json.loads(path.read_text())["timeline"]) == [
        "request_in", "dispatching", "run_id", "run_waiting", "run_url", "failed", "reason"
    ]  # fmt: skip


def test_the_single_file_wakers_state_loads_and_its_wake_is_taken_up(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(OLD_FILE))
    ledger = state.Ledger.load(path, NOW, COOLDOWN)
    assert ledger.wakes == [NOW - 300.0], "a wake more than a day old no longer counts"
    assert ledger.timeline.run_id == 4242 and ledger.timeline.pipeline_started is not None
    assert ledger.timeline.to_json() == OLD_FILE["timeline"]
    env = {**rendered(), "WAKE_TOKEN_FILE": "", "WAKE_STATE_FILE": str(path)}
    settings = waker_mod.Settings.from_env(env)
    waker = waker_mod.Waker(settings, clock=lambda: NOW)
    waker.load()
    assert waker.mode == state.Mode.WAKING and waker.since == NOW - 300.0
    assert waker.snapshot()["last_wake"]["run_id"] == 4242


def test_a_failure_within_its_cooldown_is_kept_and_an_older_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({**OLD_FILE, "failed_at": NOW - 60.0, "reason": "HTTP 401"}))
    assert state.Ledger.load(path, NOW, COOLDOWN).reason == "HTTP 401"
    path.write_text(json.dumps({**OLD_FILE, "failed_at": NOW - 601.0, "reason": "HTTP 401"}))
    later = state.Ledger.load(path, NOW, COOLDOWN)
    assert (later.failed_at, later.reason) == (None, "")


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null", "[" * 100_000])
def test_a_file_that_does_not_parse_is_a_fresh_ledger(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    assert state.Ledger.load(path, NOW, COOLDOWN) == state.Ledger()
    assert '"event": "state_reset"' in capsys.readouterr().out


def test_a_field_that_does_not_parse_is_lost_alone(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    wakes = [NOW - 10.0, "soon", None, float("nan"), [1], NOW - 20.0]
    timeline = {"request_in": 5, "dispatching": "x", "run_id": "42", "unknown": "y"}
    path.write_text(json.dumps({"wakes": wakes, "timeline": timeline, "failed_at": "never"}))
    ledger = state.Ledger.load(path, NOW, COOLDOWN)
    assert ledger.wakes == [NOW - 10.0, NOW - 20.0]
    assert ledger.timeline == state.Timeline(dispatching="x")
    assert ledger.failed_at is None
    path.write_text(json.dumps({"wakes": "many", "timeline": [], "failed_at": NOW - 1}))
    ledger = state.Ledger.load(path, NOW, COOLDOWN)
    assert ledger.wakes == [] and ledger.timeline == state.Timeline()
    assert ledger.failed_at == NOW - 1


def test_no_state_file_keeps_nothing(tmp_path: Path) -> None:
    state.Ledger([NOW], state.Timeline(), None, "").save(None)
    assert state.Ledger.load(None, NOW, COOLDOWN) == state.Ledger()
    assert state.Ledger.load(tmp_path / "none.json", NOW, COOLDOWN) == state.Ledger()
