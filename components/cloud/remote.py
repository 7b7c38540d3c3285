"""How a phase runs on a host, built in one place for the GPU Droplets and the balancer alike.

The contract (every fix to it is made here, once):
- the remote command is fixed text, `timeout --kill-after=60 <bound> bash -s`: no setting and no
  secret is ever on a command line or in the provider's error text;
- the script travels on stdin: the phase's settings (shell-quoted), scripts/phases/lib.sh, the
  phase's own script (phases.render: host text, no Pulumi);
- the phase bounds itself on the host, and the Command's custom timeouts (which bound only the
  SSH dial: docs/facts.md, pulumi-command) outlast that bound by DIAL_MARGIN_MINUTES, so the phase's
  own message is the one seen;
- the connection pins the host key the program made, and dials until SSH answers where a phase
  follows a boot;
- the provider never sends the previous stdout as an SSH env request (stock sshd refuses it:
  AcceptEnv LANG LC_*, with a warning on every update).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from ..host.phases import runner
from ..spec import catalog

# custom_timeouts (the SSH dial) outlast the phase's own bound by this much.
DIAL_MARGIN_MINUTES = 5


@dataclass(frozen=True)
class Target:
    """The host a phase runs on: its address, the stack's login key, its pinned host key."""

    host: pulumi.Input[str]
    private_key: pulumi.Input[str]
    host_key: pulumi.Input[str]


def connection(target: Target, wait: bool) -> command.remote.ConnectionArgs:
    """How a phase reaches its host: the stack's key, exactly this host key, and (`wait`)
    dialling until SSH answers, bounded by the command's custom timeout."""
    return command.remote.ConnectionArgs(
        host=target.host,
        user=catalog.SSH_USER,
        private_key=target.private_key,
        host_key=target.host_key,
        # -1: dial until SSH answers, bounded by the command's custom timeout.
        dial_error_limit=-1 if wait else 10,
        per_dial_timeout=15,
    )


def phase_command(
    name: str,
    target: Target,
    *,
    minutes: int,
    stdin: pulumi.Input[str],
    triggers: Sequence[pulumi.Input[str]],
    after: Sequence[pulumi.Resource],
    parent: pulumi.Resource,
    wait: bool = False,
    delete_minutes: int = 0,
    leaves: bool = False,
) -> command.remote.Command:
    """One phase as a remote Command: `stdin` (a rendered script) run under its bound of
    `minutes`, after `after`, again whenever one of `triggers` changes. `delete_minutes`
    bounds what its delete may take; `leaves`: its delete runs the same script (its stored
    stdin) told to leave (NEMO_ACTION is no secret and no setting)."""
    dial = minutes + DIAL_MARGIN_MINUTES
    return command.remote.Command(
        name,
        connection=connection(target, wait),
        create=runner(minutes),
        delete=f"NEMO_ACTION=leave {runner(delete_minutes)}" if leaves else None,
        stdin=stdin,
        triggers=list(triggers),
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(after),
            custom_timeouts=pulumi.CustomTimeouts(
                create=f"{dial}m",
                update=f"{dial}m",
                delete=f"{delete_minutes + DIAL_MARGIN_MINUTES}m",
            ),
        ),
    )
