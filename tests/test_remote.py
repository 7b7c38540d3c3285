"""How a phase runs on a host (components/cloud/remote.py), for every Command of a GPU Droplet's
bootstrap under Pulumi's mocks: fixed text `timeout --kill-after=60 <bound> bash -s` with the
script and its settings on stdin and no environment, a dial bound past the phase's own, dialling
until SSH answers only where a phase follows a boot, no previous output sent as an SSH
environment variable, and the pinned host key on every connection. The Commands are
test_bootstrap.py's."""

from __future__ import annotations

from pulumi_harness import FAKE_HOST_PUBLIC_KEY, run_program, stack_config
from test_bootstrap import commands

from components.host import phases


def test_no_previous_output_is_sent_as_an_ssh_environment_variable() -> None:
    run = run_program(stack_config("dev"))
    for name, reg in commands(run).items():
        assert reg.inputs["addPreviousOutputInEnv"] is False, name


def test_fixed_runner_script_on_stdin_no_environment_and_bounded_time() -> None:
    run = run_program(stack_config("dev"))
    for name, reg in commands(run).items():
        minutes = (
            30 if name == "ready" else next(p.minutes for p in phases.BOOTSTRAP if p.name == name)
        )
        # The phase bounds itself on the Droplet: custom timeouts only bound the SSH dial.
        assert (
            reg.inputs["create"]
            == f"timeout --kill-after=60 {minutes * 60 + (300 if name == 'ready' else 0)} bash -s"
        )
        assert "environment" not in reg.inputs
        assert reg.inputs["stdin"].startswith(
            "#!/usr/bin/env bash\n# nemotron-droplet bootstrap, phase"
        )
        assert f"PHASE={name}\n" in reg.inputs["stdin"]
        dial = minutes + 5 + (5 if name == "ready" else 0)
        assert reg.custom_timeouts["create"] == f"{dial}m", name
        wait = reg.inputs["connection"]["dialErrorLimit"]
        assert wait == (-1 if name in ("preflight", "reboot-wait") else 10), name


def test_every_remote_connection_pins_the_host_key() -> None:
    run = run_program(stack_config("dev"))
    remote = [r for r in run.registrations if r.type.startswith("command:remote:")]
    assert len(remote) == len(phases.BOOTSTRAP) + 1  # the phases and the lock copy
    for reg in remote:
        assert reg.inputs["connection"]["hostKey"] == FAKE_HOST_PUBLIC_KEY, reg.name
