"""The run, once a minute (the timer's unit runs `python3 -m autodown`): read the settings and
the state, finish a delete that began, else read the set's metrics, decide, and delete or keep;
save the state. See __init__.py for the rule as a whole."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from . import metrics, remove, state
from .rule import decide
from .run import Clock, Deadline, Sleep, log
from .settings import ENV_FILE, Settings, read


def main(argv: list[str] | None = None, now: Clock = time.time, sleep: Sleep = time.sleep) -> int:
    parser = argparse.ArgumentParser(
        prog="autodown", description="Delete this Droplet when idle or up too long."
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="log what would happen; delete nothing"
    )
    args = parser.parse_args(argv)
    try:
        s = read(os.environ, args.dry_run)
    except ValueError as err:
        log(f"bad setting: {err}; fix {ENV_FILE} (pulumi up rewrites it)")
        return 2
    start = now()
    deadline = Deadline(now, start + s.run_seconds)
    current, note = state.load(s.state, start)
    if note:
        log(note)
    if current["deleted"]:
        log("the delete was accepted earlier; waiting for the Droplet to go")
        return 0
    if current["deleting"] and not s.dry_run:
        reason = "finishing the delete that began earlier"
        outcome = remove.remove(s, current, reason, deadline, sleep)
    else:
        outcome = minute(s, current, start, deadline, sleep)
    state.save(s.state, current)
    return outcome


def minute(
    s: Settings, current: dict[str, Any], start: float, deadline: Deadline, sleep: Sleep
) -> int:
    """This minute's reading and decision, and the delete when it is due (the state updated).
    start: when this run began."""
    reading = metrics.read_set(
        s.metrics_url,
        s.peer_metrics_urls,
        s.peer_metrics_key,
        deadline,
        current,
        s.unreadable_minutes,
    )
    started = state.first_bootstrap(s.first_bootstrap, current, start)
    due, reason = decide(current, reading, deadline.clock(), started, s.rule)
    if not due:
        log(f"keep: {reason}")
        return 0
    if s.dry_run:
        peers = s.peer_droplet_ids.split()
        what = f"replicas {' '.join(peers)}, then this Droplet" if peers else "this Droplet"
        log(f"dry run: would delete {what}: {reason}")
        return 0
    current["deleting"] = True
    return remove.remove(s, current, reason, deadline, sleep)


if __name__ == "__main__":
    sys.exit(main())
