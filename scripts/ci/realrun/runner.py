"""What every step shares with the runner: its step outputs ($GITHUB_OUTPUT), and a command
run within a bound, interrupted the way that lets Pulumi save its state.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass


def github_output(values: dict[str, str]) -> None:
    """Step outputs: `key=value` lines appended to $GITHUB_OUTPUT when set (and printed)."""
    lines = [f"{k}={v}" for k, v in values.items()]
    for line in lines:
        print(f"output: {line}")
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a") as f:
            f.write("".join(f"{line}\n" for line in lines))


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str
    # Why it was interrupted: "" (it was not), "timeout" or "cancelled" (SIGINT or SIGTERM here).
    stopped: str = ""


def run_bounded(
    argv: Sequence[str],
    seconds: float,
    grace_seconds: float = 30.0,
    input_text: str | None = None,
    capture: bool = False,
) -> Ran:
    """Run a command for at most `seconds`; then interrupt it (SIGINT, as Ctrl-C: Pulumi
    finishes what is in flight, saves its state and releases the stack's lock), and kill it only
    if it is still there `grace_seconds` later. An interrupt or SIGTERM of this process (the
    runner cancelling the job) is passed on the same way. The command runs in a session of its
    own, so that it gets that one SIGINT and no second one from a terminal's or a process
    group's Ctrl-C: a second SIGINT makes Pulumi stop at once, without saving."""
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(  # noqa: S603 (argv from this file, no shell)
        list(argv),
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=pipe,
        stderr=pipe,
        text=True,
        start_new_session=True,
    )
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        out, err = proc.communicate(input_text, timeout=seconds)
        return Ran(proc.returncode, out or "", err or "")
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as why:
        stopped = "timeout" if isinstance(why, subprocess.TimeoutExpired) else "cancelled"
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=grace_seconds)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            out, err = proc.communicate()
        return Ran(proc.returncode, out or "", err or "", stopped)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(signum: int, frame: object) -> None:
    """SIGTERM, as the runner sends when it cancels a step: handled as an interrupt."""
    raise KeyboardInterrupt


def pulumi_cli() -> str:
    exe = shutil.which("pulumi")
    if exe is None:
        raise SystemExit(
            "error: no Pulumi CLI on PATH (the workflow installs it with pulumi/actions)"
        )
    return exe


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no message"
