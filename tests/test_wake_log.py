"""scripts/phases/wake/log.py, the waker's journal: one JSON line per event on stdout (the event, its
time to the millisecond and its fields, keys sorted), and times as people read them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import script_module

WAKER = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "wake"
log: Any = script_module.load_package(WAKER, "wake_log_test", "log").log


def test_each_event_is_one_json_line_with_its_time(capsys: pytest.CaptureFixture[str]) -> None:
    before = time.time()
    log.log("mode", mode="waking", reason="a line\nbreak")
    log.log("first_token")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, "a newline in a field stays inside its JSON string"
    first, second = (json.loads(line) for line in lines)
    assert first.keys() == {"event", "at", "mode", "reason"} and first["event"] == "mode"
    assert before - 0.001 <= first["at"] <= time.time() + 0.001  # to the millisecond
    assert round(first["at"], 3) == first["at"]
    assert first["reason"] == "a line\nbreak" and second == {"event": "first_token",
                                                              "at": second["at"]}  # fmt: skip
    assert lines[0] == json.dumps(first, sort_keys=True)


def test_times_are_utc_to_the_second() -> None:
    assert log.iso(1_800_000_000.7) == "2027-01-15T08:00:00Z"
    assert log.iso(0.0) == "1970-01-01T00:00:00Z"
    assert log.iso(None) is None
