"""The waker's state: its mode, and what it keeps across a restart (the ledger: the last day's
wakes, the last wake's timeline, the last failure) in WAKE_STATE_FILE. The file's JSON is the
one the single-file waker wrote (`wakes`, `timeline`, `failed_at`, `reason`), so a front
upgraded in the middle of a wake resumes it (tests/test_wake_state.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from .log import log

DAY = 86400.0


class Mode(StrEnum):
    """The set as the front sees it. StrEnum: it is its name wherever it is shown (the JSON
    state, /health, the log)."""

    AWAKE = "awake"  # a replica is ready: Caddy proxies to the replicas itself
    UNREADY = "unready"  # no replica ready, one may exist (starting, draining, not routed)
    ASLEEP = "asleep"  # no replica exists
    WAKING = "waking"  # a wake's pipeline runs
    FAILED = "failed"  # the last wake failed: none starts before its cooldown ends


@dataclass
class Timeline:
    """The last wake, as it went: each step's time (ISO 8601, UTC), the run that carried it,
    and why it failed. Shown in this order; a step not reached is left out."""

    request_in: str | None = None
    dispatching: str | None = None  # said before the dispatch: never dispatched twice
    pipeline_started: str | None = None
    run_id: int | None = None
    run_waiting: str | None = None  # on a reviewer's approval
    run_url: str | None = None
    run_approved: str | None = None
    replica_joined: str | None = None
    ready: str | None = None
    run_succeeded: str | None = None
    first_token: str | None = None
    failed: str | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @staticmethod
    def from_json(data: Any) -> Timeline:
        """Each known key that holds its kind of value; anything else is left out."""
        if not isinstance(data, dict):
            return Timeline()
        kept: dict[str, Any] = {}
        for f in fields(Timeline):
            value = data.get(f.name)
            if f.name == "run_id":
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, str)
            if ok:
                kept[f.name] = value
        return Timeline(**kept)


@dataclass
class Ledger:
    """What survives a restart: otherwise a crash loop would reset the day's budget."""

    wakes: list[float] = field(default_factory=list)  # start times, the last day's
    timeline: Timeline = field(default_factory=Timeline)
    failed_at: float | None = None
    reason: str = ""  # why the last wake failed

    def to_json(self) -> dict[str, Any]:
        return {
            "wakes": self.wakes,
            "timeline": self.timeline.to_json(),
            "failed_at": self.failed_at,
            "reason": self.reason,
        }

    def save(self, path: Path | None) -> None:
        """Written whole beside it and renamed over it: a stop never leaves half a file."""
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json()))
        tmp.replace(path)

    @staticmethod
    def load(path: Path | None, now: float, cooldown_seconds: float) -> Ledger:
        """The ledger in `path`, field by field: one that does not parse is lost alone (the
        wakes forgotten would reset the day's budget). A failure older than its cooldown is
        no longer one; wakes older than a day no longer count."""
        if path is None or not path.exists():
            return Ledger()
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            log("state_reset", why="the state file did not parse")
            return Ledger()
        wakes = data.get("wakes")
        ledger = Ledger(
            wakes=[
                t
                for t in map(_finite, wakes if isinstance(wakes, list) else [])
                if t is not None and now - t < DAY
            ],
            timeline=Timeline.from_json(data.get("timeline")),
        )
        failed_at = _finite(data.get("failed_at"))
        if failed_at and now - failed_at < cooldown_seconds:
            ledger.failed_at, ledger.reason = failed_at, str(data.get("reason"))
        return ledger


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None
