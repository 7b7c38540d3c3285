"""The front's waker by hand: see whether the GPU set is awake, asleep or waking, or wake it now.

    nemodrop wake --stack dev            # the state, and the last wake's timeline
    nemodrop wake --stack dev --now      # wake it now (the same guards as a request)
    nemodrop wake --stack dev --now --wait 900   # ... and wait until it answers

It asks the endpoint's front (wake.enabled) through its gate, with the stack's API key, at
`/nemotron/wake`: the front holds the pipeline's token; this tool needs none, and no cloud
access. A refusal (the day's wakes spent, a cooldown after a failed wake) is printed as the
front said it, with when to come back.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from nemodrop import cli
from nemodrop import target as target_mod

# The tools' requirements: a Python without them still lists the subcommand; running it says
# in one line what is missing and the command that installs it (run()).
missing: ModuleNotFoundError | None = None
try:
    import requests
except ModuleNotFoundError as err:
    missing = err

CONTROL_PATH = "/nemotron/wake"  # components/host/wake.py CONTROL_PATH
TIMEOUT_SECONDS = 20


def control_url(endpoint: str) -> str:
    return endpoint.rstrip("/").removesuffix("/v1") + CONTROL_PATH


def describe(state: dict[str, Any]) -> str:
    # A busy replica accepts connections but did not answer /health in time: it counts as its
    # last answer said, for WAKE_BUSY_SECONDS at most (scripts/phases/wake/looks.py heard); past
    # that it is not ready, and the mode says so.
    busy = state.get("replicas_busy")
    busy_said = f"; {busy} busy: no /health answer in time, counted as before" if busy else ""
    lines = [
        f"mode: {state.get('mode')} since {state.get('since')} "
        f"({state.get('replicas_healthy', 0)} replica(s) answering{busy_said})",
        f"wakes in the last 24 h: {state.get('wakes_last_day')} of {state.get('max_per_day')}; "
        f"trigger: {state.get('trigger')}; hold: {state.get('hold_seconds')} s",
    ]
    pipeline = state.get("pipeline") or {}
    if pipeline:
        said = pipeline.get("problem") or pipeline.get("warning")
        verdict = "PROBLEM" if pipeline.get("problem") else "warning" if said else "ok"
        expires = pipeline.get("token_expires") or "never"
        lines.append(f"pipeline ({pipeline.get('checked_at')}): {verdict}"
                     + (f": {said}" if said else f"; the token expires {expires}"))  # fmt: skip
    if state.get("last_failure"):
        lines.append(f"last failure: {state['last_failure']}")
    last = state.get("last_wake") or {}
    if last:
        lines.append("last wake: " + ", ".join(f"{k} {v}" for k, v in last.items()))
    return "\n".join(lines)


def ask(method: str, url: str, target: target_mod.Target) -> tuple[int, dict[str, Any], str]:
    """One call to the front with the target's key; its status, JSON body (or {}) and
    Retry-After."""
    try:
        answer = requests.request(method, url, headers=target.headers,
                                  timeout=TIMEOUT_SECONDS, verify=target.verify)  # fmt: skip
    except requests.RequestException as err:
        raise target_mod.TargetError(
            f"{url}: the front did not answer ({type(err).__name__})"
        ) from None
    try:
        body = answer.json()
    except ValueError:
        body = {}
    return (
        answer.status_code,
        body if isinstance(body, dict) else {},
        answer.headers.get("Retry-After", ""),
    )


def add_parser(subparsers: cli.Subparsers) -> None:
    parser = cli.subcommand(subparsers, "wake", __doc__)
    target_mod.add_arguments(parser)
    parser.add_argument("--now", action="store_true", help="wake the set now")
    parser.add_argument("--wait", type=float, default=0, help="with --now: seconds to wait")


def run(args: argparse.Namespace) -> int:
    if missing is not None:
        target_mod.missing_package(missing)
    target = target_mod.resolve(args)
    url = control_url(target.endpoint)
    if args.now:
        status, body, retry = ask("POST", url, target)
        if status == 401:
            raise target_mod.TargetError(f"{url}: the front refused the key (HTTP 401)")
        if status == 404:
            raise target_mod.TargetError(f"{url}: no waker here: is wake.enabled set?")
        if status >= 400:
            message = (body.get("error") or {}).get("message", f"HTTP {status}")
            print(f"refused: {message}" + (f" (retry after {retry} s)" if retry else ""))
            return 1
        print("waking" if body.get("mode") == "waking" else f"already {body.get('mode')}")
        end = time.monotonic() + args.wait
        while args.wait and time.monotonic() < end:
            _, body, _ = ask("GET", url, target)
            if body.get("mode") in ("awake", "failed"):
                break
            time.sleep(5)
    status, state, _ = ask("GET", url, target)
    if status == 401:
        raise target_mod.TargetError(f"{url}: the front refused the key (HTTP 401)")
    if status != 200:
        raise target_mod.TargetError(f"{url}: HTTP {status}: is wake.enabled set for this stack?")
    print(describe(state))
    return 0 if state.get("mode") != "failed" else 1
