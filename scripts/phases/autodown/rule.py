"""The decision, pure: is the set busy this minute, and is a limit past (idle, max hours, the
bootstrap deadline)? It reads the state and this minute's reading and updates the state; it
does no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .metrics import COUNTERS, FINISHED, GENERATED, RUNNING, WAITING


@dataclass(frozen=True)
class Rule:
    """The limits in force (None: that rule is off)."""

    idle_minutes: float | None
    max_hours: float | None
    bootstrap_minutes: float | None = None


def busy_now(state: dict[str, Any], metrics: dict[str, float] | None) -> tuple[bool, str]:
    """Is the engine making progress? Updates the saved counters; returns (busy, the reading)."""
    if metrics is None:
        return True, "metrics unreadable, counted as busy"
    previous = state["counters"]
    counters = {name: metrics[name] for name in COUNTERS if name in metrics}
    state["counters"] = counters
    gauges = metrics[RUNNING] > 0 or metrics[WAITING] > 0
    reading = (
        f"running={metrics[RUNNING]:g} waiting={metrics[WAITING]:g} "
        f"finished={metrics[FINISHED]:g} generated={metrics[GENERATED]:g}"
    )
    if previous is None:
        # No reading to compare with (first run, or a reset state): trust the gauges this once.
        return gauges, f"{'busy' if gauges else 'idle'} ({reading})"
    if any(previous.get(name) != value for name, value in counters.items()):
        # Moved on (or went back: vLLM restarted, which is work too).
        return True, f"busy ({reading})"
    if gauges:
        return False, f"idle: no progress though the gauges say requests are in flight ({reading})"
    return False, f"idle ({reading})"


def bootstrap_clock(
    state: dict[str, Any], started: tuple[float, str], minutes: float | None
) -> tuple[float, str]:
    """When the bootstrap deadline counts from: the first bootstrap, as a rule installed right
    after preflight sees it. A rule whose own state began with that deadline already past (turned
    on for a Droplet that serves, or its state file lost) cannot know that the Droplet served,
    and its vLLM may be restarting for the same `pulumi up` or too busy to answer this minute:
    it gives the Droplet a window of its own, from its first run, still bounded."""
    if minutes is not None and state["started_at"] - started[0] >= minutes * 60:
        return float(state["started_at"]), "this rule's first run"
    return started


def decide(
    state: dict[str, Any],
    metrics: dict[str, float] | None,
    now: float,
    started: tuple[float, str],
    rule: Rule,
) -> tuple[bool, str]:
    """Update the state from this minute's metrics; return (delete?, the reason line)."""
    busy, what = busy_now(state, metrics)
    if not state["served"]:
        busy, what = True, "bootstrapping: this replica has not served yet"
    if busy:
        state["last_activity"] = now
    idle = (now - state["last_activity"]) / 60
    up = (now - started[0]) / 3600
    booting = bootstrap_clock(state, started, rule.bootstrap_minutes)
    booted = (now - booting[0]) / 60
    limits = []
    if not state["served"] and rule.bootstrap_minutes is not None:
        limits.append(f"bootstrap {booted:.0f}/{rule.bootstrap_minutes:g} min since {booting[1]}")
    if rule.idle_minutes is not None:
        limits.append(f"idle {idle:.0f}/{rule.idle_minutes:g} min")
    if rule.max_hours is not None:
        limits.append(f"up {up:.2f}/{rule.max_hours:g} h since {started[1]}")
    reason = f"{what}; {', '.join(limits)}"
    if rule.max_hours is not None and up >= rule.max_hours:
        return True, f"{reason}: past max hours"
    late = rule.bootstrap_minutes is not None and booted >= rule.bootstrap_minutes
    if not state["served"] and late:
        return True, f"{reason}: not serving by its bootstrap deadline"
    if rule.idle_minutes is not None and idle >= rule.idle_minutes:
        return True, f"{reason}: idle too long"
    return False, reason
