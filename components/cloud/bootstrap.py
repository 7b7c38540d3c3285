"""The bootstrap: one remote Command per phase turns the Droplet into a running vLLM service.

Each phase is a script under scripts/phases/. What runs is `bash -s` (fixed, so no secret and no
setting ever shows in a command line or in the provider's error text); the script travels on
stdin as: the phase's settings (shell-quoted), scripts/phases/lib.sh, the phase's own script.
phases.render() builds that text, and `python -m components.render` writes it out for review.

Re-runs follow the data: a phase's inputs are its own script and settings plus the results of
the phases it builds on (their stdout, unique per run), so a changed input re-runs that phase and
the ones after it, and no earlier one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_command as command

from ..host import phases
from ..host.phase_settings import Inputs, lock_sha256, remote_lock_path
from ..host.phases import BOOTSTRAP, PHASE_NAMES, ROLLING_PHASES, Phase
from ..spec import catalog
from ..spec.schema import StackConfig
from . import remote


def parse_result(stdout: str) -> dict[str, Any]:
    """The JSON line a phase prints last."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result
    raise ValueError(f"no JSON result line in: {stdout[-500:]!r}")


def timeline(stdouts: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Each phase's start and end (epoch seconds, as the Droplet's clock read them), its seconds
    and the phases it waited for: what nemodrop/timeline.py draws. A phase that did not run on
    this `pulumi up` keeps the times of the run that last ran it."""
    out: dict[str, dict[str, Any]] = {}
    for phase in BOOTSTRAP:
        result = parse_result(stdouts[phase.name])
        out[phase.name] = {
            "start": result.get("started_at"),  # absent from results of earlier versions
            "end": result.get("ended_at"),
            "seconds": float(result["seconds"]),
            "after": [a for a in phase.after if a in PHASE_NAMES],
        }
        # What a phase moved, where it says (the model phase: bytes over the network).
        out[phase.name].update({k: result[k] for k in MOVED if k in result})
    return out


# The result members timeline() keeps beside the times (nemodrop/timeline.py reads them): what
# the model phase moved, and the disks preflight saw (where a size's scratch disk appears).
MOVED = ("download_bytes", "download_seconds", "disks")


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
    # The Caddy front's private address with its router (balancer.routing cache-aware): the
    # only source a replica's gateway lets render a prompt.
    render_client: pulumi.Input[str] = ""
    peers: pulumi.Input[list[list[str]]] | None = None
    after_previous: list[pulumi.Resource] | None = None


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
        target = remote.Target(args.ipv4, args.private_key, args.host_public_key)
        for phase in BOOTSTRAP:
            if phase.name == "conda":
                # The lock file goes over SFTP once preflight saw the host ready; the vllm
                # phase checks its hash, and a new lock re-runs it. An update copies again only
                # when the file or the remote path changed, never for a new host: the Droplet's
                # id in the triggers makes a new Droplet a new copy (pulumi-command
                # copyController.go Update; >= 1.2.1 creates the parent folders, #1161).
                self.lock = command.remote.CopyToRemote(
                    f"{args.prefix}-lock",
                    connection=remote.connection(target, wait=False),
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
            minutes = phases.minutes(cfg, phase)
            # Upstream results are unique per run: when one re-ran, this one re-runs too. The
            # first phase has no upstream: the Droplet's id starts the cascade on a new one.
            triggers = [*results, *triggers] if results else [args.droplet_id]
            self.commands[phase.name] = remote.phase_command(
                f"{args.prefix}-{phase.name}",
                target,
                minutes=minutes,
                stdin=self._stdin(cfg, phase, minutes, args),
                triggers=triggers,
                after=upstream,
                parent=self,
                wait=phase.wait_for_ssh,
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
        self, cfg: StackConfig, phase: Phase, minutes: int, args: BootstrapArgs
    ) -> pulumi.Input[str]:
        """The phase's script with its settings, from the inputs its row names (secrets stay
        secret: an Output built from a secret is a secret)."""
        available: dict[str, pulumi.Input[Any]] = {
            "hf_token": args.hf_token if args.hf_token is not None else "",
            "api_key": args.api_key,
            "host": args.hostname,
            "dns_record": args.dns_record,
            "cache_device": args.cache_device,
            "private_ip": args.private_ip,
            "metrics_reader": args.metrics_reader,
            "render_client": args.render_client,
            "peers": args.peers if args.peers is not None else [],
        }
        if phase.name == "reboot-wait":
            available["reboot_result"] = self.commands["reboot"].stdout.apply(parse_result)
        needed = {name: available[name] for name in phases.wanted(phase, args.replica)}
        replica = args.replica

        def script(values: dict[str, Any]) -> str:
            settings = phase.settings(cfg, Inputs(**values, replica=replica))
            return phases.render(phase.name, settings, minutes)

        if phase.name == "autodown" and cfg.autodown.token is not None:
            # The token is in the config model, not an Output: mark the script secret here.
            return pulumi.Output.secret(pulumi.Output.all(**needed).apply(script))
        if not any(isinstance(v, pulumi.Output) for v in needed.values()):
            return script(dict(needed))
        return pulumi.Output.all(**needed).apply(script)
