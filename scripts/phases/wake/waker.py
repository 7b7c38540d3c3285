"""The waker: the set's mode and the wake under way, acted on. Each look's result and each
request go to decision.py, which says what to do; this module does it (the mode and the hold
file, the ledger saved, the pipeline started and followed) and tells the held requests. One
event loop: no locks; `changed` wakes every held request."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession

from . import decision, looks
from .decision import Fail, Refusal, Seen, Start
from .log import iso, log
from .looks import GONE, READY, Replicas, Upstream
from .pipeline import Pipeline, PipelineError
from .settings import Settings
from .state import DAY, Ledger, Mode, Timeline

# What tests/test_wake.py reaches through this module: the waker, its settings and two looks.
__all__ = ["GONE", "READY", "Settings", "Waker"]

# The pipeline looked at on start and every PIPELINE_CHECK_SECONDS (a fine-grained token expires,
# 30 days by default; a public repository's workflow is disabled after 60 days without activity):
# a problem is said long before the wake that would meet it.
PIPELINE_CHECK_SECONDS = 6 * 3600


@dataclass
class Waker:
    """The set's state and what changes it."""

    s: Settings
    clock: Callable[[], float] = time.time
    mode: Mode = Mode.UNREADY
    since: float = field(default_factory=time.time)
    healthy: list[Upstream] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    replicas: Replicas = field(default_factory=Replicas)
    checked_at: float = 0.0  # when the last look began
    held: int = 0
    reading: int = 0  # requests whose bodies are still arriving (counted in held_bytes)
    held_bytes: int = 0
    held_total: int = 0  # since this service started
    turn: int = 0  # round robin over the ready replicas
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    looking: asyncio.Lock = field(default_factory=asyncio.Lock)
    stopping: bool = False  # SIGTERM: held requests are answered, none is woken for
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    # The last look at the pipeline (Pipeline.check_pipeline): can a wake start, until when.
    pipeline: dict[str, Any] = field(default_factory=dict)
    checking: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.client = Pipeline(self.s, self.clock)

    # ---- state ---------------------------------------------------------------------------------

    def load(self) -> None:
        """The ledger as the last waker left it, and the wake it had under way, taken up."""
        now = self.clock()
        self.ledger = Ledger.load(self.s.state_file, now, decision.cooldown(self.s))
        if decision.resumes(self.ledger, self.s, now):
            self.mode, self.since = Mode.WAKING, self.ledger.wakes[-1]
            log("wake_resumed", run=self.ledger.timeline.run_id)

    def save(self) -> None:
        self.ledger.save(self.s.state_file)

    def snapshot(self) -> dict[str, Any]:
        now, ledger = self.clock(), self.ledger
        return {
            "mode": self.mode,
            "since": iso(self.since),
            "replicas_healthy": len(self.healthy),
            "replicas_busy": len(self.replicas.busy),
            "trigger": self.s.trigger,
            "wakes_last_day": len([t for t in ledger.wakes if now - t < DAY]),
            "max_per_day": self.s.max_per_day,
            "hold_seconds": self.s.hold_seconds,
            "expected_seconds": self.s.expected_seconds,
            "held": self.held,
            "reading": self.reading,
            "held_total": self.held_total,
            "held_bytes": self.held_bytes,
            "last_failure": ledger.reason or None,
            "last_wake": ledger.timeline.to_json() or None,
            "pipeline": self.pipeline or None,
        }

    def set_mode(self, mode: Mode, **fields: Any) -> None:
        """A new mode, logged, the hold file set to match, and told to every held request."""
        if mode != self.mode:
            self.mode, self.since = mode, self.clock()
            log("mode", mode=mode, **fields)
        self.route_file()
        self.notify()

    def notify(self) -> None:
        """Every held request looks again. A fresh event each time: one left set would make
        every later wait return at once (the held requests would spin)."""
        self.changed.set()
        self.changed = asyncio.Event()

    def route_file(self) -> None:
        """Caddy sends keyed requests here while this file exists: whenever no replica is
        ready. Awake, it is gone and Caddy proxies to the replicas itself."""
        if self.mode == Mode.AWAKE:
            self.s.hold_file.unlink(missing_ok=True)
        elif not self.s.hold_file.exists():
            self.s.hold_file.parent.mkdir(parents=True, exist_ok=True)
            self.s.hold_file.write_text("hold\n")

    # ---- a wake ----------------------------------------------------------------------------------

    def admit(self) -> Refusal | None:
        """Start a wake if decision.admit says so; its refusal when it refuses."""
        now = self.clock()
        verdict = decision.admit(self.mode, self.ledger, self.s, now)
        if not isinstance(verdict, Start):
            return verdict
        self.ledger.wakes = list(verdict.wakes)
        self.ledger.failed_at, self.ledger.reason = None, ""
        self.ledger.timeline = Timeline(request_in=iso(now))
        self.set_mode(Mode.WAKING, trigger=self.s.trigger)
        self.save()
        self.spawn(self.start_pipeline(now))
        return None

    def cooldown_refusal(self) -> Refusal:
        return decision.cooldown_refusal(self.ledger, self.s, self.clock())

    def fail(self, reason: str) -> None:
        """The wake failed; held requests are answered, no retry by itself."""
        if not decision.fails(self.mode):
            return
        self.ledger.reason, self.ledger.failed_at = reason, self.clock()
        self.ledger.timeline.failed = iso(self.ledger.failed_at)
        self.ledger.timeline.reason = reason
        self.set_mode(Mode.FAILED, reason=reason)
        self.save()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def start_pipeline(self, started: float) -> None:
        # Said before the call: a waker stopped between GitHub's accepting the dispatch and the
        # save below (a SIGKILL, an OOM kill) must not dispatch it again when it starts; it
        # follows the run by its title instead (decision.resumes, Pipeline.find_run).
        timeline = self.ledger.timeline
        timeline.dispatching = iso(self.clock())
        self.save()
        try:
            if self.s.trigger == "github":
                run_id = await asyncio.to_thread(self.client.dispatch_github)
            else:
                await asyncio.to_thread(self.client.call_webhook)
                run_id = None
        except PipelineError as err:
            self.fail(str(err))
            return
        if self.mode != Mode.WAKING:
            return
        timeline.pipeline_started = iso(self.clock())
        if run_id is not None:
            timeline.run_id = run_id
        log("pipeline_started", trigger=self.s.trigger, stack=self.s.stack, run=run_id)
        self.save()
        if self.s.trigger == "github":
            await self.watch_github_run(started, run_id)

    async def watch_github_run(self, started: float, run_id: int | None) -> None:
        """Follow the run the wake's dispatch queued: one that ends other than in success fails
        the wake with its link; a success leaves the wake to the replicas (their readiness ends
        it, or the deadline)."""

        def found(run_id: int) -> None:
            self.ledger.timeline.run_id = run_id  # found by its title: kept from now
            self.save()

        ended = await self.client.follow_run(
            started, run_id, lambda: self.mode == Mode.WAKING, found, self.note_approval
        )
        if ended is None:
            return
        if ended[0]:
            self.ledger.timeline.run_succeeded = iso(self.clock())
        else:
            self.fail(ended[1])

    def note_approval(self, run: dict[str, Any]) -> None:
        """A run that waits for a reviewer (status `waiting`: the deploy job's environment has
        required reviewers) waits on a person, not on the cloud: the timeline and the held
        requests say so, with the run's link, until it runs."""
        t = self.ledger.timeline
        waiting = run.get("status") == "waiting"
        if waiting and t.run_waiting is None:
            t.run_waiting = iso(self.clock())
            t.run_url = str(run.get("html_url") or "")
            log("run_waiting", run=run.get("id"))
            self.save()
        elif not waiting and t.run_waiting is not None and t.run_approved is None:
            t.run_approved = iso(self.clock())
            log("run_approved", run=run.get("id"))
            self.save()

    def awaiting_approval(self) -> str:
        return decision.awaiting_approval(self.mode, self.ledger, self.s.stack)

    async def pipeline_checks(self) -> None:
        """check_pipeline on start and every PIPELINE_CHECK_SECONDS; each result logged."""
        while True:
            await self.look_at_pipeline()
            await asyncio.sleep(PIPELINE_CHECK_SECONDS)

    async def look_at_pipeline(self) -> dict[str, Any]:
        """One check_pipeline, kept and logged; one at a time (the phase may ask for one while
        the periodic one runs: it gets that one's answer)."""
        async with self.checking:
            try:
                self.pipeline = await asyncio.to_thread(self.client.check_pipeline)
            except Exception as err:  # noqa: BLE001 (the next check must still come)
                self.pipeline = {
                    "checked_at": iso(self.clock()),
                    "problem": None,
                    "warning": f"the check failed ({type(err).__name__})",
                }
            log("pipeline_check", **self.pipeline)
            return self.pipeline

    # ---- the replicas ----------------------------------------------------------------------------

    async def look(self, session: ClientSession) -> None:
        """One look at every replica and the mode that follows. `checked_at` is when it began
        (when it read the upstream files): fresh_look trusts no look that began before it was
        asked, as one that read the files before a member phase wrote one."""
        began = self.clock()
        ups, routed = looks.upstreams(self.s.upstreams_dir)
        seen = await asyncio.gather(*(self.look_one(session, u) for u in ups))
        found = self.replicas.heard(ups, list(seen))
        now = self.clock()
        self.checked_at = began
        # Ready is what answers /health and what Caddy routes to (its join is marked): a
        # replica whose file is written but whose reload is still under way answers, yet a
        # request Caddy proxied to the replicas now would get Caddy's 503 "no upstreams".
        # Until then it exists (never asleep) and the waker holds.
        self.healthy = [u for u, f in zip(ups, found, strict=True) if f == READY and u in routed]
        for u, f in zip(ups, found, strict=True):
            unrouted = f == READY and u not in routed
            self.replicas.once(
                f"unrouted {u[0]}:{u[1]}",
                "unrouted" if unrouted else "",
                "replica_not_routed_yet",
                replica=f"{u[0]}:{u[1]}",
            )
        self.replicas.count(ups, found, now)
        timeline = self.ledger.timeline
        joined = looks.joined_since(self.s.upstreams_dir, self.since)
        if self.mode == Mode.WAKING and joined and timeline.replica_joined is None:
            timeline.replica_joined = iso(now)
            log("replica_joined")
        r = self.replicas
        self.follow(now, Seen(len(self.healthy), len(ups), r.gone_looks, r.gone_since))
        if self.mode == Mode.ASLEEP and self.held:
            # Requests held while it was not yet known that no replica exists: wake for them
            # (a refusal reaches them through the mode's notice).
            self.admit()
            self.notify()

    async def look_one(self, session: ClientSession, upstream: Upstream) -> str:
        return await self.replicas.look_one(session, upstream, self.s.busy_seconds)

    def follow(self, now: float, seen: Seen) -> None:
        """What decision.after_look says, done: a ready replica ends a wake (its time kept)."""
        verdict = decision.after_look(
            self.mode, self.since, self.ledger.failed_at, seen, self.s, now
        )
        if isinstance(verdict, Fail):
            self.fail(verdict.reason)
        elif verdict is not None:
            if verdict == Mode.AWAKE and self.mode == Mode.WAKING:
                self.ledger.timeline.ready = iso(now)
                self.save()
            fields = {"replicas": len(self.healthy)} if verdict == Mode.AWAKE else {}
            self.set_mode(verdict, **fields)

    async def fresh_look(self, session: ClientSession) -> None:
        """A look that begins after this call, one at a time: a caller that finds one under way
        takes the result of the next."""
        asked = self.clock()
        async with self.looking:
            if self.checked_at > asked:
                return
            await self.look(session)

    async def monitor(self, session: ClientSession) -> None:
        """Every WAKE_HEALTH_SECONDS, a look at the replicas."""
        while True:
            try:
                await self.fresh_look(session)
            except Exception as err:  # noqa: BLE001 (the monitor must outlive any one look)
                log("look_failed", error=type(err).__name__)
            await asyncio.sleep(self.s.health_seconds)

    async def wait(self, deadline: float, tick: float) -> None:
        """Until the mode changes, the deadline, or the next tick."""
        left = min(deadline - self.clock(), tick)
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    def serving(self) -> bool:
        """A ready replica to relay to."""
        return self.mode == Mode.AWAKE and bool(self.healthy)

    def first_token(self) -> None:
        """A relayed answer's first bytes after a wake: its first token, noted once."""
        timeline = self.ledger.timeline
        if timeline.first_token is None and timeline.ready is not None:
            timeline.first_token = iso(self.clock())
            log("first_token")
            self.save()

    def next_replica(self) -> list[Upstream]:
        """The ready replicas, starting with the next in turn."""
        ready = list(self.healthy)
        if not ready:
            return []
        self.turn = (self.turn + 1) % len(ready)
        return ready[self.turn :] + ready[: self.turn]
