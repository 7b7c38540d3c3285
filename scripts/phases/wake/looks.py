"""The replicas as the front sees them: the upstream files Caddy reads, their join marks, and
each replica's /health. Observations only: what the set's mode becomes is decision.py's.

Ready means a replica answers its /health 200 and Caddy routes to it: the member phase
(scripts/phases/member.sh) writes a replica's upstream file, reloads Caddy (and, with the
front's router, has the router take it), and only then writes the file's join mark
(JOINED_SUFFIX); until the mark, a keyed request Caddy proxied to the replicas would get Caddy's
503 "no upstreams", so the waker keeps holding (the replica exists: nothing is woken).

A replica that answers anything, a 503 while it drains for a `pulumi up`, exists. One that
accepts the connection but does not answer within LOOK_TIMEOUT is busy (a saturated vLLM answers
late), never gone: it stays what its last answer said, so a ready replica under load keeps the
front awake, for WAKE_BUSY_SECONDS at most (a look waits that long for its answer, as Caddy's
own health checks do): one whose look gets no answer in that time is hung, there but not
ready."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout

from .log import log

# One upstream per file, as the balancer phase writes them ('to 10.110.0.2:8080').
UPSTREAM = re.compile(r"^\s*to\s+([0-9A-Za-z.\-\[\]:]+):([0-9]{1,5})\s*$", re.M)
# A file's join mark: `<file><JOINED_SUFFIX>`, written by the member phase once Caddy routes to
# its replica (components/spec/catalog.py BALANCER_JOINED_SUFFIX: tests/test_wake.py holds them
# equal).
JOINED_SUFFIX = ".joined"
# A look at one replica's /health has LOOK_TIMEOUT to answer. One that did not is asked for a
# bare connection (connects, the same budget): accepted, the replica is busy, not gone (a
# saturated vLLM answers its /health late:
# docs/facts.md, "A busy vLLM answers its health check late"); refused, or not accepted in
# time, it is gone.
LOOK_TIMEOUT = 2.0

Upstream = tuple[str, int]


class Found(StrEnum):
    """What one look at one replica found: ready (/health 200), there (any other answer: it
    exists), busy (no answer within LOOK_TIMEOUT, but it accepts connections: it exists, and
    it stays what its last answer said: Replicas.heard), or gone (the connection refused or
    unreachable)."""

    READY = "ready"
    THERE = "there"
    BUSY = "busy"
    GONE = "gone"


READY, THERE, BUSY, GONE = Found.READY, Found.THERE, Found.BUSY, Found.GONE


def upstreams(folder: Path) -> tuple[list[Upstream], set[Upstream]]:
    """The replicas in the upstream files, and those of them Caddy routes to: a file whose
    join mark (routed()) is as new as it is."""
    found: list[Upstream] = []
    routed: set[Upstream] = set()
    for path in sorted(folder.glob("*.caddy")):
        try:
            listed = [
                (host.strip("[]"), int(port)) for host, port in UPSTREAM.findall(path.read_text())
            ]
        except OSError:
            continue
        found += listed
        if routed_file(path):
            routed.update(listed)
    # An address in two files (one left behind, an address reused) is one replica, looked at
    # once.
    return list(dict.fromkeys(found)), routed


def joined_since(folder: Path, since: float) -> bool:
    """A member file newer than `since`: the deploy made a replica and it joined the front (the
    balancer's member phase writes the file once it is ready)."""
    return any(_mtime(p) > since for p in folder.glob("*.caddy"))


@dataclass
class Replicas:
    """What the looks remember between them: the replicas listed last, what each last answered,
    the busy ones and their looks still waiting, and the looks in a row that found none."""

    listed: set[Upstream] = field(default_factory=set)
    # What each replica's last answer said (READY or THERE), which a busy look keeps; the
    # replicas the last look found busy.
    answered: dict[Upstream, str] = field(default_factory=dict)
    busy: list[Upstream] = field(default_factory=list)
    # The /health look still waiting on each busy replica (look_one): up to WAKE_BUSY_SECONDS.
    late_looks: dict[Upstream, asyncio.Future[str]] = field(default_factory=dict)
    answered_late: set[Upstream] = field(default_factory=set)
    gone_looks: int = 0
    gone_since: float | None = None
    # What was last logged per subject (once: each said once per change).
    said: dict[str, str] = field(default_factory=dict)

    async def look_one(self, session: ClientSession, upstream: Upstream, busy: float) -> str:
        """One replica's /health, READY or THERE as it answers, GONE when it cannot be reached.
        One that has not answered within LOOK_TIMEOUT but accepts a bare connection is BUSY, and
        its look goes on: the next look waits on it rather than asking again, so a replica that
        answers late (a saturated vLLM, 3 s, 10 s) is heard, however long its load lasts. A
        look that gets no answer within `busy` seconds ends as THERE: hung, not ready."""
        late = self.late_looks.pop(upstream, None)
        task = late or asyncio.ensure_future(look_at(session, upstream, busy))
        done, _ = await asyncio.wait({task}, timeout=LOOK_TIMEOUT)
        if done:
            if late is not None:
                self.answered_late.add(upstream)  # still busy: its answer came late
            return task.result()
        if await connects(*upstream):
            self.late_looks[upstream] = task
            return BUSY
        task.cancel()
        return GONE

    def heard(self, ups: list[Upstream], looks: list[str]) -> list[str]:
        """Each replica's state after a look. A busy one is what its last answer said: a ready
        replica too loaded to answer in time stays ready (the front stays awake and Caddy keeps
        proxying to it), one never heard from is there (it exists: never gone). For
        WAKE_BUSY_SECONDS at most: one whose look got no answer at all in that time is there,
        not ready (look_one), as Caddy's own checks (a look past
        catalog.REPLICA_LOOK_TIMEOUT_SECONDS fails) have taken it out by then: a hung replica
        (a wedged process: the kernel still accepts its connections) must not keep the front
        awake for ever. Each replica turning busy is logged once."""
        found = []
        late, self.answered_late = self.answered_late, set()
        busy = [u for u, seen in zip(ups, looks, strict=True) if seen == BUSY or u in late]
        for upstream, seen in zip(ups, looks, strict=True):
            name = f"{upstream[0]}:{upstream[1]}"
            counted = self.answered.get(upstream, THERE)
            self.once(
                f"busy {name}",
                "busy" if upstream in busy else "",
                "replica_busy",
                replica=name,
                counted_as=counted,
                budget_seconds=LOOK_TIMEOUT,
            )
            if seen == BUSY:
                found.append(counted)
                continue
            found.append(seen)
            if seen == GONE:
                self.answered.pop(upstream, None)
            else:
                self.answered[upstream] = seen
        self.answered = {u: seen for u, seen in self.answered.items() if u in ups}
        for upstream in set(self.late_looks) - set(ups):
            self.late_looks.pop(upstream).cancel()
        self.busy = busy
        listed = {f"{what} {host}:{port}" for host, port in ups for what in ("busy", "unrouted")}
        self.said = {
            k: v
            for k, v in self.said.items()
            if not k.startswith(("busy ", "unrouted ")) or k in listed
        }
        return found

    def count(self, ups: list[Upstream], found: list[str], now: float) -> None:
        """The looks in a row that found no replica answering at all. A replica that joined
        since the last look (its member phase wrote its file): the looks that found none
        before it say nothing of it; its own count starts now."""
        if set(ups) - self.listed:
            self.gone_looks, self.gone_since = 0, None
        self.listed = set(ups)
        if all(f == GONE for f in found):  # none answered at all (or there are none)
            self.gone_looks += 1
            self.gone_since = self.gone_since or now
        else:
            self.gone_looks, self.gone_since = 0, None

    def once(self, subject: str, value: str, event: str = "", **fields: Any) -> None:
        """Log `event` when `subject` says something new (a replica turning busy): once per
        change, not every look. An empty value only forgets."""
        if self.said.get(subject) != value:
            self.said[subject] = value
            if value and event:
                log(event, **fields)


async def look_at(session: ClientSession, upstream: Upstream, seconds: float) -> str:
    """A replica's /health given `seconds` to answer: READY (200), THERE (any other answer, or
    none in time: it accepted the connection, look_one asked, so it is hung, not gone), GONE
    (refused, unreachable). aiohttp's total timeout does not say which part ran out (3.8's
    timeout errors have no subclass for it): look_one's bare connect at LOOK_TIMEOUT does."""
    host, port = upstream
    try:
        async with session.get(
            f"http://{host}:{port}/health", timeout=ClientTimeout(total=seconds)
        ) as resp:
            return READY if resp.status == 200 else THERE
    except TimeoutError:
        return THERE
    except (ClientError, OSError, RuntimeError):  # RuntimeError: the session closed (a stop)
        return GONE


async def connects(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), LOOK_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def routed_file(path: Path) -> bool:
    """Caddy routes to the replica of upstream file `path`: its member phase (member.sh) wrote
    the file's join mark (the file's name and JOINED_SUFFIX, which Caddy's import glob and the
    router's start script do not match) after Caddy's reload and the router's add_worker, and
    not before the file (a join that rewrote the file starts over: its mark comes after)."""
    try:
        return (path.parent / (path.name + JOINED_SUFFIX)).stat().st_mtime_ns >= (
            path.stat().st_mtime_ns
        )
    except OSError:
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
