"""`cleanup`: `pulumi destroy` and `pulumi stack rm`, whatever came before; a stack whose
destroy fails is kept (its state is what knows what still bills), never forced.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .runner import Ran, github_output, last_line, run_bounded


@dataclass
class Cleanup:
    stack: str
    found: bool = False
    destroyed: bool = False
    removed: bool = False
    ended: int | None = None  # when the stack's resources were gone (epoch seconds)
    message: str = ""


def find_stack(listing: str, stack: str) -> dict[str, Any] | None:
    """`pulumi stack ls --json`'s entry for `stack` (a backend may qualify the name)."""
    entries = json.loads(listing or "[]")
    for entry in entries if isinstance(entries, list) else []:
        name = str(entry.get("name") or "") if isinstance(entry, dict) else ""
        if name == stack or name.endswith(f"/{stack}"):
            return dict(entry)
    return None


def by_hand(stack: str) -> str:
    return (
        f"by hand, with the same backend and secrets: `pulumi destroy --stack {stack}` then "
        f"`pulumi stack rm {stack}`; until then autodown (maxHours) and the lease workflow are "
        "what deletes the Droplet"
    )


def destroy(pulumi: str, result: Cleanup, remaining: Callable[[], float]) -> bool:
    """Destroy; if that fails, refresh (the Droplet may have deleted itself) and try again."""
    stack = result.stack
    attempts = (
        [[pulumi, "destroy", "--yes", "--skip-preview", "--stack", stack]],
        [
            [pulumi, "refresh", "--yes", "--skip-preview", "--stack", stack],
            [pulumi, "destroy", "--yes", "--skip-preview", "--stack", stack],
        ],
    )
    for attempt in attempts:
        ran = Ran(1, "", "")
        for argv in attempt:
            if remaining() <= 0:
                result.message = f"no time left for `{' '.join(argv[1:3])}`; " + by_hand(stack)
                return False
            ran = run_bounded(argv, remaining())
        if ran.returncode == 0 and not ran.stopped:
            return True
    result.message = "pulumi destroy failed twice (above); the stack is kept: its state is " + (
        "what knows what is left. " + by_hand(stack)
    )
    return False


def listed_entry(pulumi: str, stack: str, seconds: float) -> tuple[dict[str, Any] | None, str]:
    """The stack's entry in `pulumi stack ls --json` (None: not there), or why it is unknown."""
    listed = run_bounded([pulumi, "stack", "ls", "--json"], seconds, capture=True)
    if listed.returncode != 0:
        return None, f"cannot list the stacks ({last_line(listed.stderr)})"
    try:
        return find_stack(listed.stdout, stack), ""
    except ValueError:
        return None, "cannot list the stacks (pulumi stack ls --json printed no JSON)"


def cleanup(stack: str, minutes: float) -> tuple[int, Cleanup]:
    """Destroy the stack and remove it. Nothing to do when it was never made; when destroy
    fails the stack is kept (`stack rm` would drop the state of what still bills), never
    forced."""
    deadline = time.monotonic() + max(minutes - 1, 0.5) * 60  # done before the step's timeout

    def remaining() -> float:
        return deadline - time.monotonic()

    result = Cleanup(stack)
    pulumi = shutil.which("pulumi")
    if not stack or pulumi is None:
        result.message = (
            "no stack name: the plan did not run, so nothing was created"
            if not stack
            else "no Pulumi CLI: it is installed before the stack is created, so nothing was; "
            "if that is wrong, " + by_hand(stack)
        )
        return (0 if not stack else 1), result
    entry, problem = listed_entry(pulumi, stack, remaining())
    if problem:
        result.message = f"{problem}; " + by_hand(stack)
        return 1, result
    if entry is None:
        result.message = f"nothing to destroy: stack {stack} was never created"
        result.ended = int(time.time())
        return 0, result
    result.found = True
    if not destroy(pulumi, result, remaining):
        return 1, result
    result.destroyed, result.ended = True, int(time.time())
    removed = run_bounded([pulumi, "stack", "rm", "--yes", "--stack", stack], max(remaining(), 1))
    if removed.returncode != 0:
        result.message = (
            f"destroyed (nothing bills), but `pulumi stack rm {stack}` failed (above): run it "
            "by hand to remove the empty stack"
        )
        return 1, result
    result.removed = True
    result.message = f"destroyed and removed stack {stack}"
    return 0, result


def cmd_cleanup(args: argparse.Namespace) -> int:
    code, result = cleanup(args.stack or "", args.minutes)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cleanup.json").write_text(json.dumps(asdict(result), indent=2))
    print(f"cleanup: {result.message}", file=sys.stderr if code else sys.stdout)
    if result.ended is not None:
        github_output({"ended": str(result.ended)})
    return code
