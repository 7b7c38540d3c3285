"""The wake decision: what the waker does, as pure functions of its state, its settings, the
time and what it saw; no I/O, no event loop (tests/test_wake_decision.py holds the table).

One wake at a time; after one fails, none for WAKE_COOLDOWN_MINUTES; at most WAKE_MAX_PER_DAY
in any 24 hours; a wake whose replica is not ready within WAKE_DEADLINE_MINUTES fails. A
refusal names the setting that refused."""

from __future__ import annotations

from dataclasses import dataclass

from .settings import Settings
from .state import DAY, Ledger, Mode


@dataclass(frozen=True)
class Refusal:
    """Why a keyed request cannot be served now, when to come back, and whether a client's
    own retry may help (`x-should-retry`)."""

    message: str
    retry_after: int
    code: str = "wake_unavailable"
    retry: bool = False


@dataclass(frozen=True)
class Start:
    """Start a wake now; `wakes`: the last day's, this one last."""

    wakes: tuple[float, ...]


@dataclass(frozen=True)
class Fail:
    """The wake under way failed, and why."""

    reason: str


@dataclass(frozen=True)
class Seen:
    """What a look at the replicas found: how many are ready (they answer /health 200 and
    Caddy routes to them), how many the upstream files list, and how many looks in a row, since
    when, found none of them answering at all."""

    ready: int
    listed: int
    gone_looks: int
    gone_since: float | None


def cooldown(s: Settings) -> float:
    return s.cooldown_minutes * 60


def admit(mode: Mode, ledger: Ledger, s: Settings, now: float) -> Start | Refusal | None:
    """A wake for a request (or the control's POST): started if the set is asleep (or its
    failure's cooldown is over) and the guards allow; the refusal when they do not. Awake,
    waking, or a replica that exists but is not ready: nothing to start."""
    if mode in (Mode.AWAKE, Mode.WAKING, Mode.UNREADY):
        return None
    if ledger.failed_at is not None and now - ledger.failed_at < cooldown(s):
        return cooldown_refusal(ledger, s, now)
    recent = sorted(t for t in ledger.wakes if now - t < DAY)
    if len(recent) >= s.max_per_day:
        left = int(recent[0] + DAY - now) + 1
        return Refusal(
            f"the GPU set is asleep and today's wakes are spent: {len(recent)} of "
            f"wake.maxPerDay ({s.max_per_day}); the next may start in {left} s",
            left,
            "wake_budget_spent",
        )
    return Start((*recent, now))


def cooldown_refusal(ledger: Ledger, s: Settings, now: float) -> Refusal:
    """The last wake failed: why, and when the next may start."""
    left = max(1, int((ledger.failed_at or 0) + cooldown(s) - now) + 1)
    return Refusal(
        f"the wake failed: {ledger.reason}; the next may start in {left} s "
        f"(wake.cooldownMinutes: {s.cooldown_minutes:g})",
        left,
        "wake_failed",
    )


def fails(mode: Mode) -> bool:
    """Whether a failure of the pipeline fails the set's wake: only while one is under way."""
    return mode == Mode.WAKING


def asleep(seen: Seen, s: Settings, now: float) -> bool:
    """No replica exists: none listed, or none answered at all for WAKE_ASLEEP_LOOKS looks in
    a row spanning WAKE_ASLEEP_SECONDS (a replica draining for a `pulumi up` answers)."""
    return not seen.listed or (
        seen.gone_looks >= s.asleep_looks and now - (seen.gone_since or now) >= s.asleep_seconds
    )


def after_look(
    mode: Mode, since: float, failed_at: float | None, seen: Seen, s: Settings, now: float
) -> Mode | Fail | None:
    """The mode after a look (None: as it is): awake with a ready replica; a wake goes on
    until its deadline; a failure holds for its cooldown; else asleep when no replica exists,
    unready when one may."""
    if seen.ready:
        return Mode.AWAKE
    if mode == Mode.WAKING:
        if now - since > s.deadline_minutes * 60:
            return Fail(
                f"no replica answered within {s.deadline_minutes:g} minutes (wake.deadlineMinutes)"
            )
        return None
    if mode == Mode.FAILED and now - (failed_at or now) < cooldown(s):
        return None
    return Mode.ASLEEP if asleep(seen, s, now) else Mode.UNREADY


def resumes(ledger: Ledger, s: Settings, now: float) -> bool:
    """A wake whose pipeline had started, or was being started, when the waker stopped (a
    crash; the deploy's own `pulumi up` installing a new waker) goes on as it was, waking since
    its start, never dispatched a second time; once past wake.deadlineMinutes, it is not."""
    t = ledger.timeline
    started = t.pipeline_started is not None or t.dispatching is not None
    if not ledger.wakes or not started or t.ready is not None or t.failed is not None:
        return False
    return now - ledger.wakes[-1] < s.deadline_minutes * 60


def held_refusal(
    mode: Mode,
    stopping: bool,
    ledger: Ledger,
    s: Settings,
    waited: int,
    since: float,
    approval: str,
    now: float,
) -> Refusal:
    """The answer to a request held as long as it may be (or while the waker stops): retry
    now, or why not."""
    if stopping:
        # The client's retry reaches the next waker: through a restart the hold file stays
        # and Caddy retries the connection until it listens (components/host/wake.py).
        return Refusal(
            "the front's waker is restarting (or stopping); retry now",
            1,
            "waker_restarting",
            retry=True,
        )
    if mode == Mode.FAILED:
        return cooldown_refusal(ledger, s, now)
    what = "waking" if mode == Mode.WAKING else "not ready (starting or draining)"
    if approval:
        what = f"waking ({approval})"
    left = max(30, int(s.expected_seconds - (now - since)))
    # Retry at once: the next try is held again (the hold is the wait); a client that
    # honours Retry-After up to 60 s (older openai-python) or 120 s (2.52+) retries it.
    return Refusal(
        f"the GPU set is still {what} after {waited} s (wake.holdSeconds: "
        f"{s.hold_seconds:g}); about {left} s more expected",
        1,
        "waking",
        retry=True,
    )


def awaiting_approval(mode: Mode, ledger: Ledger, stack: str) -> str:
    """While the wake's run waits for a reviewer: what to tell held requests; else ''."""
    t = ledger.timeline
    if mode != Mode.WAKING or t.run_waiting is None or t.run_approved is not None:
        return ""
    return (
        f"its deploy run waits for a reviewer to approve the {stack} "
        f"environment's deployment: {t.run_url or ''}"
    )
