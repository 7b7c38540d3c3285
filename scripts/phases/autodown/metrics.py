"""This minute's reading of the set: vLLM's /metrics of this replica and of each peer, read
with the one Prometheus parser (clients.prometheus) and summed.

A page is read whole or not at all (clients/prometheus.py: a bad line anywhere, or a series
given twice, refuses it); a page that is refused, lacks a metric this rule needs, or holds a
value that is not a finite, non-negative number is no reading: unreadable, which counts as busy
within AUTODOWN_UNREADABLE_MINUTES (read_set)."""

from __future__ import annotations

import math
from typing import Any

from clients import prometheus, transport

from .run import Deadline, log

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
FINISHED = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"
PROMPTED = "vllm:prompt_tokens_total"
GAUGES = (RUNNING, WAITING)
# Progress counters: any change since the last reading means the engine did work. The first
# three must be present for a reading to count; prompt tokens are used when vLLM exports them.
COUNTERS = (FINISHED, GENERATED, PROMPTED)
REQUIRED = (RUNNING, WAITING, FINISHED, GENERATED)
MAX_METRICS_BYTES = 4 * 1024 * 1024
TIMEOUT = 10.0  # one page; the run's deadline lowers it as it nears


def reading(text: str) -> dict[str, float] | None:
    """The sums per watched metric of a page; None unless the page is read whole and every
    required metric is on it with a finite, non-negative value."""
    try:
        sums = prometheus.totals(text, (*GAUGES, *COUNTERS))
    except prometheus.ParseError:
        return None
    if any(name not in sums for name in REQUIRED):
        return None
    if not all(math.isfinite(v) and v >= 0 for v in sums.values()):
        return None
    return sums


def read(url: str, deadline: Deadline, key: str = "") -> dict[str, float] | None:
    """This minute's reading at `url`, or None when it cannot be read or answers anything odd (a
    redirect is such an answer: never followed with the key). key: the API key a replica's
    gateway asks for (never logged)."""
    timeout = deadline.timeout(TIMEOUT)
    if timeout is None:
        return None
    try:
        answer = transport.private_get(url, key, timeout, MAX_METRICS_BYTES)
        if answer.status_code != 200:
            return None
        return reading(answer.body.decode("utf-8"))
    except Exception:  # noqa: BLE001 (any failure to read is "unreadable", never a crash)
        return None


def unreadable_for(state: dict[str, Any], url: str, readable: bool, now: float) -> float:
    """Minutes this source has been unreadable in a row (0 once it answers); saved per URL."""
    since: dict[str, float] = state["unreadable_since"]
    if readable:
        since.pop(url, None)
        return 0.0
    since.setdefault(url, now)
    return (now - since[url]) / 60


def read_set(
    own_url: str,
    peer_urls: list[str],
    key: str,
    deadline: Deadline,
    state: dict[str, Any],
    bound: float | None,
) -> dict[str, float] | None:
    """This replica's reading plus every peer's, summed; None (busy) while any one cannot be
    read, for at most `bound` minutes in a row each (None: no bound). Past the bound a source
    counts as idle: a reading of zeros in its place. This replica's own bound starts once it
    served (before, the bootstrap deadline governs it)."""
    now = deadline.clock()
    total: dict[str, float] = {name: 0.0 for name in REQUIRED}
    busy = False
    for url in [own_url, *peer_urls]:
        own = url == own_url
        got = read(url, deadline, "" if own else key)
        if own and got is not None:
            state["served"] = True
        if own and not state["served"]:
            busy = busy or got is None  # bootstrapping: not counted against the bound
            continue
        minutes = unreadable_for(state, url, got is not None, now)
        if got is not None:
            for name, value in got.items():
                total[name] = total.get(name, 0.0) + value
        elif bound is None or minutes < bound:
            if not own:
                log(f"replica metrics unreadable at {url}: the set counts as busy")
            busy = True
        else:
            log(f"metrics unreadable at {url} for {minutes:.0f} min, past "
                f"{bound:g} (AUTODOWN_UNREADABLE_MINUTES): counted as idle")  # fmt: skip
    return None if busy else total
