"""The bootstrap: one remote Command per phase turns the Droplet into a running vLLM service.

Each phase is a script under scripts/phases/. What runs is `bash -s` (fixed, so no secret and no
setting ever shows in a command line or in the provider's error text); the script travels on
stdin as: the phase's settings (shell-quoted), scripts/phases/lib.sh, the phase's own script.
`render()` builds that text, and `python -m components.render` writes it out for review.

Re-runs follow the data: a phase's inputs are its own script and settings plus the results of
the phases it builds on (their stdout, unique per run), so a changed input re-runs that phase and
the ones after it, and no earlier one.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_command as command

from . import catalog, pool
from .phase_settings import PHASES_DIR, Setting, lock_sha256, remote_lock_path, settings
from .schema import StackConfig

RUNNER = "bash -s"
# After the bound, `timeout` sends TERM to the phase's whole process group (lib.sh names the
# step it stopped in); whatever ignores TERM is killed this many seconds later.
KILL_AFTER_SECONDS = 60
# custom_timeouts (the SSH dial) outlast the phase's own bound by this much.
DIAL_MARGIN_MINUTES = 5


@dataclass(frozen=True)
class Phase:
    name: str
    after: tuple[str, ...]
    # Bound on the whole command (custom_timeouts) and on its long steps (remote `timeout`):
    # the phase's own work; phase_minutes adds what else it may contain (a replica's drain).
    minutes: int
    # Dial until SSH answers (first boot, reboot), bounded by `minutes`.
    wait_for_ssh: bool = False
    # A replica drains before this phase restarts what serves (lib.sh drain).
    drains: bool = False


PHASES: tuple[Phase, ...] = (
    Phase("preflight", (), 30, wait_for_ssh=True),
    # The downloads go beside the driver install: nothing in them needs the new driver.
    Phase("driver", ("preflight",), 45),
    Phase("cgroup", ("driver",), 15),
    # The cache Volume (when there is one) is mounted before anything is put where it binds.
    # Its bound leaves room to copy a live Droplet's weights in (the cache turned on later).
    Phase("cache", ("preflight", "volume"), 60),
    Phase("conda", ("cache",), 30),
    Phase("vllm", ("conda", "lock"), 90),
    Phase("model", ("conda",), 150),
    # The one reboot (when a phase asked for it) never interrupts a download: it waits for all.
    Phase("reboot", ("cgroup", "vllm", "model"), 5, drains=True),
    Phase("reboot-wait", ("reboot",), 20, wait_for_ssh=True),
    # The gateway (and its certificate) comes up while vLLM loads the model; ready needs both.
    Phase("service", ("reboot-wait",), 15, drains=True),
    Phase("gateway", ("reboot-wait",), 20),
    Phase("autodown", ("service",), 10),
    Phase("ready", ("service", "gateway"), 0),  # its minutes: bootstrap.readyTimeoutMinutes
)
PHASE_NAMES = tuple(p.name for p in PHASES)
SOURCE_BUILD_MINUTES = 300
# Room past a drain's own longest wait (pool.drain_bound_seconds) for the phase to say why it
# went on and to start the restart or the reboot.
DRAIN_MARGIN_MINUTES = 2


def shell_value(value: Setting) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return shlex.quote(value)
    return "(" + " ".join(shlex.quote(v) for v in value) + ")"


def runner(minutes: int) -> str:
    """The remote command of a phase. A Command's custom timeout bounds only its SSH dial, not
    a command already running (FACTS.md), so the phase bounds itself on the Droplet. Fixed text:
    no setting and no secret is ever on this command line."""
    return f"timeout --kill-after={KILL_AFTER_SECONDS} {minutes * 60} {RUNNER}"


def connection(
    host: pulumi.Input[str],
    private_key: pulumi.Input[str],
    host_key: pulumi.Input[str],
    wait: bool,
) -> command.remote.ConnectionArgs:
    """How a phase reaches its Droplet: the stack's key, exactly this host key, and (`wait`)
    dialling until SSH answers, bounded by the command's custom timeout."""
    return command.remote.ConnectionArgs(
        host=host,
        user=catalog.SSH_USER,
        private_key=private_key,
        host_key=host_key,
        # -1: dial until SSH answers, bounded by the command's custom timeout.
        dial_error_limit=-1 if wait else 10,
        per_dial_timeout=15,
    )


def render(phase: str, settings: Mapping[str, Setting], minutes: int = 0) -> str:
    """The exact text sent on stdin to `bash -s` for a phase (`minutes`: its bound, for the
    message when it is stopped)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# nemotron-droplet bootstrap, phase {phase}: sent on stdin to `{runner(minutes)}`.",
        f"PHASE={shlex.quote(phase)}",
        f"PHASE_MINUTES={minutes}",
        *(f"{key}={shell_value(value)}" for key, value in settings.items()),
        "",
        (PHASES_DIR / "lib.sh").read_text(),
        (PHASES_DIR / f"{phase}.sh").read_text(),
    ]
    return "\n".join(lines)


def phase_minutes(cfg: StackConfig, phase: Phase) -> int:
    """A phase's bound: all it may wait for, so that the bound never stops a wait that would
    have ended by itself (a drain stopped at the bound would leave it to repeat on every run)."""
    if phase.name == "ready":
        return cfg.bootstrap.ready_timeout_minutes + 5
    if phase.name == "vllm" and cfg.vllm.install == "source":
        return SOURCE_BUILD_MINUTES
    if phase.drains and cfg.pooled:
        drain = -(-pool.drain_bound_seconds(cfg) // 60)
        return phase.minutes + drain + DRAIN_MARGIN_MINUTES
    return phase.minutes


def parse_result(stdout: str) -> dict[str, Any]:
    """The JSON line a phase prints last."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    raise ValueError(f"no JSON result line in: {stdout[-500:]!r}")


def timeline(stdouts: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Each phase's start and end (epoch seconds, as the Droplet's clock read them), its seconds
    and the phases it waited for: what scripts/timeline.py draws. A phase that did not run on
    this `pulumi up` keeps the times of the run that last ran it."""
    out: dict[str, dict[str, Any]] = {}
    for phase in PHASES:
        result = parse_result(stdouts[phase.name])
        out[phase.name] = {
            "start": result.get("started_at"),  # absent from results of earlier versions
            "end": result.get("ended_at"),
            "seconds": float(result["seconds"]),
            "after": [a for a in phase.after if a in PHASE_NAMES],
        }
    return out


@dataclass(frozen=True)
class BootstrapArgs:
    config: StackConfig
    ipv4: pulumi.Input[str]
    private_key: pulumi.Input[str]
    # Every connection requires exactly this host key (installed at first boot).
    host_public_key: pulumi.Input[str]
    api_key: pulumi.Output[str]
    # The name the gateway serves and holds a certificate for.
    hostname: pulumi.Input[str]
    # The Droplet the phases run on: a new one (a replacement) re-copies and re-runs everything,
    # even should it come back with the same address.
    droplet_id: pulumi.Input[str] = ""
    hf_token: pulumi.Output[str] | None = None
    # "<zone> <record id>" of the endpoint's A record when the program keeps one: autodown
    # deletes it before the Droplet, so the name never points at an address someone else gets.
    dns_record: pulumi.Input[str] = ""
    # The cache Volume's device on the Droplet ("": no cache), its attachment and the Volume
    # itself, which the cache phase waits for (an attach, a resize); a new attachment (a new
    # Droplet or Volume) or a new size runs it again.
    cache_device: str = ""
    cache_attachment: pulumi.CustomResource | None = None
    cache_volume: pulumi.CustomResource | None = None
    cache_volume_size: pulumi.Output[int] | None = None
    prefix: str = "bootstrap"
    # With replicas: which one this is, its private address (its gateway listens there for the
    # balancer), the other replicas' Droplet ids and private addresses (replica 0's autodown
    # reads their metrics and deletes them: autodown.Peer), and
    # what its restarts wait for: the replica before it back in the pool (a rolling update).
    replica: int | None = None
    private_ip: pulumi.Input[str] = ""
    # Replica 0's private address: the only source a replica's gateway lets read vLLM's
    # /metrics (replica 0's autodown reads every replica's).
    metrics_reader: pulumi.Input[str] = ""
    peers: pulumi.Input[list[list[str]]] | None = None
    after_previous: list[pulumi.Resource] | None = None


# The values only known at deploy time that each phase's settings need.
RUNTIME_INPUTS = {
    "model": ("hf_token",),
    "reboot-wait": ("reboot_result",),
    "service": ("api_key",),
    "gateway": ("api_key", "host"),
    "ready": ("host",),
    "autodown": ("dns_record",),
}


# What a replica's phases need besides: its private address, the set's addresses and the key
# (replica 0's autodown reads the others' metrics through their gateways).
POOL_INPUTS = {
    "gateway": ("private_ip", "metrics_reader"),
    "ready": ("private_ip",),
    "autodown": ("api_key", "peers"),
}
# The phases that restart what serves (a reboot, vLLM): with replicas, one replica at a time.
ROLLING_PHASES = ("reboot", "service")

# The plain values, known when the program runs, that a phase's settings need.
STATIC_INPUTS = ("cache", "service")


class Bootstrap(pulumi.ComponentResource):
    """The phases as ordered remote Commands on the Droplet."""

    commands: dict[str, command.remote.Command]
    seconds: pulumi.Output[dict[str, float]]
    timeline: pulumi.Output[dict[str, dict[str, Any]]]

    def __init__(
        self, name: str, args: BootstrapArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:index:Bootstrap", name, None, opts)
        cfg = args.config
        self.commands = {}
        for phase in PHASES:
            if phase.name == "conda":
                # The lock file goes over SFTP once preflight saw the host ready; the vllm
                # phase checks its hash, and a new lock re-runs it. An update copies again only
                # when the file or the remote path changed, never for a new host: the Droplet's
                # id in the triggers makes a new Droplet a new copy (pulumi-command
                # copyController.go Update; >= 1.2.1 creates the parent folders, #1161).
                self.lock = command.remote.CopyToRemote(
                    f"{args.prefix}-lock",
                    connection=connection(
                        args.ipv4, args.private_key, args.host_public_key, wait=False
                    ),
                    source=pulumi.FileAsset(str(cfg.lock_file)),
                    remote_path=remote_lock_path(cfg),
                    triggers=[lock_sha256(cfg), args.droplet_id],
                    opts=pulumi.ResourceOptions(
                        parent=self, depends_on=[self.commands["preflight"]]
                    ),
                )
            upstream: list[pulumi.Resource] = []
            results: list[pulumi.Output[str]] = []
            triggers: list[pulumi.Input[str]] = []
            for name_ in phase.after:
                if name_ == "lock":
                    upstream.append(self.lock)
                elif name_ == "volume":
                    # The Volume too, not only its attachment: a resize (cache.sizeGb grew)
                    # updates the Volume alone, and the phase must run after it to grow the
                    # filesystem. Its size is a trigger as well as a setting: the plan may
                    # hold a size back for a run (an adopted Volume grows the next time).
                    if args.cache_volume is not None:
                        upstream.append(args.cache_volume)
                    if args.cache_volume_size is not None:
                        triggers.append(args.cache_volume_size.apply(str))
                    if args.cache_attachment is not None:
                        upstream.append(args.cache_attachment)
                        triggers.append(args.cache_attachment.id)
                else:
                    upstream.append(self.commands[name_])
                    results.append(self.commands[name_].stdout)
            if phase.name in ROLLING_PHASES and args.after_previous:
                # Ordering only: the previous replica's ready (and its return to the pool) is
                # no input of this phase, so it never re-runs it.
                upstream.extend(args.after_previous)
            minutes = phase_minutes(cfg, phase)
            stdin = self._stdin(cfg, phase.name, minutes, args)
            # Upstream results are unique per run: when one re-ran, this one re-runs too. The
            # first phase has no upstream: the Droplet's id starts the cascade on a new one.
            triggers = [*results, *triggers] if results else [args.droplet_id]
            self.commands[phase.name] = command.remote.Command(
                f"{args.prefix}-{phase.name}",
                connection=connection(
                    args.ipv4, args.private_key, args.host_public_key, wait=phase.wait_for_ssh
                ),
                create=runner(minutes),
                stdin=stdin,
                triggers=triggers,
                # The provider would send the previous stdout as an SSH env request, which
                # stock sshd refuses (AcceptEnv LANG LC_*), with a warning on every update.
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=upstream,
                    # These bound the SSH dial (FACTS.md); the phase bounds itself on the
                    # Droplet (runner), a little sooner, so that its message is the one seen.
                    custom_timeouts=pulumi.CustomTimeouts(
                        create=f"{minutes + DIAL_MARGIN_MINUTES}m",
                        update=f"{minutes + DIAL_MARGIN_MINUTES}m",
                        delete="5m",
                    ),
                ),
            )

        stdouts = [self.commands[p].stdout for p in PHASE_NAMES]
        self.seconds = pulumi.Output.all(*stdouts).apply(
            lambda outs: {
                name: float(parse_result(out)["seconds"])
                for name, out in zip(PHASE_NAMES, outs, strict=True)
            }
        )
        self.timeline = pulumi.Output.all(*stdouts).apply(
            lambda outs: timeline(dict(zip(PHASE_NAMES, outs, strict=True)))
        )
        self.register_outputs(
            {"bootstrapSeconds": self.seconds, "bootstrapTimeline": self.timeline}
        )

    def _stdin(
        self, cfg: StackConfig, phase: str, minutes: int, args: BootstrapArgs
    ) -> pulumi.Input[str]:
        available: dict[str, pulumi.Input[Any]] = {
            "hf_token": args.hf_token if args.hf_token is not None else "",
            "api_key": args.api_key,
            "host": args.hostname,
            "dns_record": args.dns_record,
            "private_ip": args.private_ip,
            "metrics_reader": args.metrics_reader,
            "peers": args.peers if args.peers is not None else [],
        }
        if phase == "reboot-wait":
            available["reboot_result"] = self.commands["reboot"].stdout.apply(parse_result)
        wanted = RUNTIME_INPUTS.get(phase, ())
        if args.replica is not None:
            wanted = tuple(dict.fromkeys([*wanted, *POOL_INPUTS.get(phase, ())]))
        needed = {name: available[name] for name in wanted}
        cache_device = args.cache_device if phase in STATIC_INPUTS else ""
        replica = args.replica
        if phase == "autodown" and cfg.autodown.token is not None:
            # The token is in the config model, not an Output: mark the script secret here.
            return pulumi.Output.secret(
                pulumi.Output.all(**needed).apply(
                    lambda values: render(
                        phase, settings(cfg, phase, **values, replica=replica), minutes
                    )
                )
            )
        if not needed:
            return render(
                phase,
                settings(cfg, phase, cache_device=cache_device, replica=replica),
                minutes,
            )
        # Secrets stay secret: an Output built from a secret is a secret.
        return pulumi.Output.all(**needed).apply(
            lambda values: render(
                phase,
                settings(cfg, phase, **values, cache_device=cache_device, replica=replica),
                minutes,
            )
        )
