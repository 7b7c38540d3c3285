"""scripts/phases/autodown/run.py: the run's deadline (what is left, a request timeout within
it, none once less than a second is left) and its log line; and one run as __main__ wires it
around them: read, decide, delete in that order, each within the one deadline of
AUTODOWN_RUN_SECONDS."""

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
def run() -> ModuleType:
    package = script_module.load_package(ROOT / "scripts/phases/autodown", "ad_run", "run")
    module: ModuleType = package.run
    return module


class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        return self.t


def test_the_deadline_is_what_is_left_on_its_clock(run: ModuleType) -> None:
    clock = Clock()
    deadline = run.Deadline(clock, NOW + 45)
    assert deadline.left() == 45
    clock.t += 30
    assert deadline.left() == 15, "read from the clock each time"


@pytest.mark.parametrize(
    ("left", "want"), [(45, 10.0), (10, 10.0), (4.5, 4.5), (1, 1.0), (0.99, None), (0, None),
                       (-30, None)],
)  # fmt: skip
def test_a_request_timeout_fits_inside_the_deadline(
    run: ModuleType, left: float, want: float | None
) -> None:
    """The ceiling while there is time, what is left near the end, and no request at all once
    less than a second is left (or the deadline passed)."""
    assert run.Deadline(Clock(), NOW + left).timeout(10.0) == want


def test_a_log_line_is_one_line_of_the_journal(
    run: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    run.log("keep: busy")
    assert capsys.readouterr() == ("autodown: keep: busy\n", "")


def test_one_run_reads_then_decides_then_deletes_within_its_deadline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One minute's run: the set's metrics read, the decision taken on that reading, and the
    delete when it is due, in that order, all with one deadline AUTODOWN_RUN_SECONDS from the
    run's start; a decision to keep is one log line, and nothing is deleted."""
    main: ModuleType = script_module.load_package(
        ROOT / "scripts/phases/autodown", "ad_run_main", "__main__"
    ).__main__
    env = {"AUTODOWN_TOKEN": "t", "AUTODOWN_RUN_SECONDS": "40",
           "AUTODOWN_STATE": str(tmp_path / "state.json"),
           "AUTODOWN_FIRST_BOOTSTRAP": str(tmp_path / "first-bootstrap")}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    calls: list[tuple[str, Any]] = []
    reading = {"vllm:num_requests_running": 0.0}
    answers = [(True, "idle 31/30 min"), (False, "busy")]

    def read_set(*args: Any) -> dict[str, float]:
        calls.append(("read", args[3]))
        return reading

    def decide(current: Any, got: Any, now: float, *_: Any) -> tuple[bool, str]:
        calls.append(("decide", got))
        return answers.pop(0)

    def remove(s: Any, current: Any, reason: str, deadline: Any, sleep: Any) -> int:
        calls.append(("delete", deadline))
        return 0

    monkeypatch.setattr(main.metrics, "read_set", read_set)
    monkeypatch.setattr(main, "decide", decide)
    monkeypatch.setattr(main.remove, "remove", remove)
    clock = Clock()
    assert main.main([], now=clock, sleep=lambda _: None) == 0
    assert [c[0] for c in calls] == ["read", "decide", "delete"]
    assert calls[1][1] is reading, "the decision is on this minute's reading"
    deadline = calls[0][1]
    assert calls[2][1] is deadline and deadline.end == NOW + 40
    assert capsys.readouterr().out == "", "the delete logs its own lines (remove.py)"
    (tmp_path / "state.json").unlink()  # a delete that began would be finished, not decided
    calls.clear()
    clock.t += 60
    assert main.main([], now=clock, sleep=lambda _: None) == 0
    assert [c[0] for c in calls] == ["read", "decide"]
    assert calls[0][1].end == NOW + 60 + 40, "each run its own deadline"
    assert capsys.readouterr().out == "autodown: keep: busy\n"
