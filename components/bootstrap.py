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

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command

from . import autodown, catalog, gateway, vllm_service
from .schema import StackConfig

PHASES_DIR = Path(__file__).resolve().parent.parent / "scripts" / "phases"
RUNNER = "bash -s"
# After the bound, `timeout` sends TERM to the phase's whole process group (lib.sh names the
# step it stopped in); whatever ignores TERM is killed this many seconds later.
KILL_AFTER_SECONDS = 60
# custom_timeouts (the SSH dial) outlast the phase's own bound by this much.
DIAL_MARGIN_MINUTES = 5
SECRET_PLACEHOLDER = "<secret: set at deploy time>"  # noqa: S105 (a placeholder)

Setting = str | int | bool | Sequence[str]


@dataclass(frozen=True)
class Phase:
    name: str
    after: tuple[str, ...]
    # Bound on the whole command (custom_timeouts) and on its long steps (remote `timeout`).
    minutes: int
    # Dial until SSH answers (first boot, reboot), bounded by `minutes`.
    wait_for_ssh: bool = False


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
    Phase("reboot", ("cgroup", "vllm", "model"), 5),
    Phase("reboot-wait", ("reboot",), 20, wait_for_ssh=True),
    # The gateway (and its certificate) comes up while vLLM loads the model; ready needs both.
    Phase("service", ("reboot-wait",), 15),
    Phase("gateway", ("reboot-wait",), 20),
    Phase("autodown", ("service",), 10),
    Phase("ready", ("service", "gateway"), 0),  # its minutes: bootstrap.readyTimeoutMinutes
)
PHASE_NAMES = tuple(p.name for p in PHASES)
SOURCE_BUILD_MINUTES = 300


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


def lock_sha256(cfg: StackConfig) -> str:
    return hashlib.sha256(cfg.lock_file.read_bytes()).hexdigest()


def remote_lock_path(cfg: StackConfig) -> str:
    return f"{catalog.LOCKS_DIR}/{cfg.lock_file.name}"


def settings(
    cfg: StackConfig,
    phase: str,
    *,
    hf_token: str = "",
    reboot_result: Mapping[str, Any] | None = None,
    api_key: str = "",
    host: str = "",
    dns_record: str = "",
    cache_device: str = "",
) -> dict[str, Setting]:
    """The NEMO_* settings each phase script reads (see the header of each script)."""
    min_branch = catalog.min_driver_branch(cfg.vllm.version)
    cuda = catalog.wheel_cuda(cfg.vllm.version)
    common: dict[str, dict[str, Setting]] = {
        "preflight": {
            "NEMO_OS_RELEASES": " ".join(catalog.OS_RELEASES),
            "NEMO_DISK_NEED_GB": catalog.VLLM_ENV_DISK_GB + preflight_model_disk_gb(cfg),
            "NEMO_GPU_COUNT": cfg.size.gpu_count,
            "NEMO_WAIT_SECONDS": 600,
            "NEMO_FIRST_BOOTSTRAP_FILE": catalog.FIRST_BOOTSTRAP_FILE,
        },
        "driver": {
            "NEMO_DRIVER_MODE": cfg.bootstrap.driver.mode,
            "NEMO_DRIVER_BRANCH": cfg.bootstrap.driver.branch,
            "NEMO_MIN_DRIVER_BRANCH": min_branch,
            "NEMO_CUDA": cuda,
            # Ada and Hopper run NVIDIA's open kernel modules (the default since R560).
            "NEMO_DRIVER_OPEN": True,
            "NEMO_RUNFILE_URL": cfg.bootstrap.driver.runfile_url or "",
            "NEMO_RUNFILE_SHA256": cfg.bootstrap.driver.runfile_sha256 or "",
            # NVSwitch systems: CUDA starts only with Fabric Manager of the driver's version.
            "NEMO_FABRIC_MANAGER": cfg.size.nvswitch,
        },
        "cgroup": {"NEMO_CGROUP_MODE": cfg.bootstrap.cgroup.mode},
        "cache": {
            "NEMO_CACHE_DEVICE": cache_device,
            "NEMO_CACHE_MOUNT": catalog.CACHE_MOUNT,
            "NEMO_CACHE_LABEL": catalog.CACHE_LABEL,
            "NEMO_CACHE_BINDS": [f"{folder}:{path}" for folder, path in catalog.CACHE_BINDS],
            # DigitalOcean attaches in seconds; the device link follows once udev has seen it.
            "NEMO_CACHE_WAIT_SECONDS": 300,
            "NEMO_VLLM_UNIT": catalog.VLLM_UNIT,
        },
        "reboot": {"NEMO_REBOOT_DELAY": 5},
        "reboot-wait": {
            "NEMO_REBOOTING": bool((reboot_result or {}).get("rebooting", False)),
            "NEMO_PREVIOUS_BOOT_ID": str((reboot_result or {}).get("boot_id", "")),
            "NEMO_MIN_DRIVER_BRANCH": min_branch,
            "NEMO_CUDA": cuda,
            "NEMO_CGROUP_MODE": cfg.bootstrap.cgroup.mode,
            "NEMO_FABRIC_MANAGER": cfg.size.nvswitch,
        },
        "conda": {
            "NEMO_CONDA_PREFIX": catalog.CONDA_PREFIX,
            "NEMO_MINIFORGE_URL": catalog.MINIFORGE_URL,
            "NEMO_MINIFORGE_SHA256": catalog.MINIFORGE_SHA256,
            "NEMO_PYTHON": cfg.bootstrap.python,
            "NEMO_VLLM_ENV": catalog.VLLM_ENV,
            "NEMO_HF_ENV": catalog.HF_ENV,
        },
        "vllm": {
            "NEMO_VLLM_INSTALL": cfg.vllm.install,
            "NEMO_VLLM_VERSION": cfg.vllm.version,
            "NEMO_VLLM_ENV": catalog.VLLM_ENV,
            "NEMO_VLLM_MARKER": catalog.VLLM_MARKER,
            "NEMO_LOCK_FILE": remote_lock_path(cfg),
            "NEMO_LOCK_SHA256": lock_sha256(cfg),
            "NEMO_VLLM_GIT_URL": catalog.VLLM_GIT_URL,
            "NEMO_VLLM_GIT_REF": cfg.vllm_git_ref,
            "NEMO_CUDA": cuda,
            "NEMO_CUDA_KEYRING_URL": catalog.CUDA_KEYRING_URL.format(distro="ubuntu2404"),
            "NEMO_CUDA_KEYRING_SHA256": "",
            "NEMO_RUNTIME_PACKAGES": " ".join(catalog.VLLM_RUNTIME_PACKAGES),
        },
        "model": {
            "NEMO_MODEL_ID": cfg.model.id,
            "NEMO_MODEL_REVISION": cfg.model.revision,
            "NEMO_MODEL_DISK_GB": cfg.model_disk_gb,
            "NEMO_MODEL_MARKER": catalog.MODEL_MARKER,
            "NEMO_DRAFT_ID": draft_id(cfg),
            "NEMO_DRAFT_DISK_GB": draft_disk_gb(cfg),
            "NEMO_HF_ENV": catalog.HF_ENV,
            "NEMO_HF_HOME": catalog.HF_HOME,
            "NEMO_HF_ENDPOINT": "",
            "NEMO_HF_TOKEN": hf_token,
        },
        "service": {
            "NEMO_VLLM_USER": catalog.VLLM_USER,
            "NEMO_HF_HOME": catalog.HF_HOME,
            "NEMO_ENV_FILE": catalog.VLLM_ENV_FILE,
            "NEMO_UNIT": catalog.VLLM_UNIT,
            "NEMO_UNIT_TEXT": vllm_service.unit_text(cfg, cached=bool(cache_device)),
            "NEMO_ENV_TEXT": vllm_service.env_text(api_key, cfg),
            # What the running service was started from: a change to any of them restarts it.
            "NEMO_RUNS_FROM": f"{catalog.VLLM_MARKER} {catalog.MODEL_MARKER}",
        },
        "gateway": {
            "NEMO_HOST": host,
            "NEMO_CADDYFILE": gateway.caddyfile(cfg, host),
            "NEMO_CADDY_UNIT_TEXT": gateway.caddy_unit(),
            "NEMO_GATEWAY_ENV_FILE": gateway.GATEWAY_ENV_FILE,
            "NEMO_GATEWAY_ENV_TEXT": f"{gateway.API_KEY_ENV}={api_key}",
            "NEMO_CADDY_VERSION": catalog.CADDY_VERSION,
            "NEMO_CADDY_URL": catalog.CADDY_URL,
            "NEMO_CADDY_SHA256": catalog.CADDY_SHA256,
            "NEMO_CADDY_BIN": catalog.CADDY_BIN,
            "NEMO_CADDY_USER": catalog.CADDY_USER,
            "NEMO_CADDY_HOME": catalog.CADDY_HOME,
        },
        "autodown": {
            "NEMO_AUTODOWN_MODE": cfg.autodown.mode,
            "NEMO_AUTODOWN_ENV_TEXT": autodown.env_text(cfg, dns_record),
            "NEMO_AUTODOWN_ENV_FILE": autodown.ENV_FILE,
            "NEMO_AUTODOWN_SCRIPT": autodown.SCRIPT_PATH,
            "NEMO_AUTODOWN_SERVICE_TEXT": autodown.service_text(),
            "NEMO_AUTODOWN_TIMER_TEXT": autodown.timer_text(),
            "NEMO_AUTODOWN_PY": (PHASES_DIR / "autodown.py").read_text(),
        },
        "ready": {
            # Through the gateway, on the Droplet: its real TLS and routes, no DNS needed.
            "NEMO_PROBE_URL": f"{gateway.endpoint(cfg, host)}/chat/completions",
            "NEMO_PROBE_RESOLVE": f"{host}:{gateway.api_port(cfg)}:127.0.0.1",
            "NEMO_PROBE_CA": "",
            "NEMO_SERVED_NAME": cfg.model.served_name,
            "NEMO_UNIT": catalog.VLLM_UNIT,
            "NEMO_ENV_FILE": catalog.VLLM_ENV_FILE,
            "NEMO_READY_TIMEOUT": cfg.bootstrap.ready_timeout_minutes * 60,
            # The gateway's certificate: a refusal that will not pass (a rate limit, a CAA
            # record) ends the wait at once; one Caddy may still get past (the CA unreachable,
            # a challenge that failed while DNS catches up) after this long.
            "NEMO_GATEWAY_UNIT": catalog.CADDY_UNIT,
            "NEMO_HOST": host,
            "NEMO_ACME_PATIENCE": ACME_PATIENCE_SECONDS if cfg.access.https else 0,
        },
    }
    return common[phase]


# How long ready lets Caddy retry an ACME failure that may pass (certmagic retries after 1, 2, 2,
# 5 minutes...): three tries, time for a DNS record to reach the CA's resolvers.
ACME_PATIENCE_SECONDS = 600


def draft_id(cfg: StackConfig) -> str:
    """The speculative-decoding draft the model phase downloads ("": none)."""
    spec = cfg.vllm.speculative
    return spec.model if spec is not None and spec.model is not None else ""


def draft_disk_gb(cfg: StackConfig) -> int:
    """Disk for the draft: the catalog's figure, or a generous default for one it lacks."""
    if not draft_id(cfg):
        return 0
    known = cfg.catalog_model
    drafts = {d.repo_id: d.disk_gb for d in (known.drafts if known else ())}
    return drafts.get(draft_id(cfg), catalog.Draft("", "dflash").disk_gb)


def preflight_model_disk_gb(cfg: StackConfig) -> int:
    """Disk preflight reserves for weights: the largest catalog model this size can serve (or
    the configured one, if larger). Sized by the droplet, not the model id, so that changing the
    model re-runs model, service and ready only; the model phase checks its own need again."""
    fitting = [
        m.disk_gb
        for m in catalog.MODELS.values()
        if m.vram_gb <= cfg.size.total_vram_gb and not m.blackwell_only
    ]
    return max([*fitting, cfg.model_disk_gb])


def phase_minutes(cfg: StackConfig, phase: Phase) -> int:
    if phase.name == "ready":
        return cfg.bootstrap.ready_timeout_minutes + 5
    if phase.name == "vllm" and cfg.vllm.install == "source":
        return SOURCE_BUILD_MINUTES
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
    # The cache Volume's device on the Droplet ("": no cache) and its attachment, which the
    # cache phase waits for; a new attachment (a new Droplet or Volume) runs it again.
    cache_device: str = ""
    cache_attachment: pulumi.CustomResource | None = None
    prefix: str = "bootstrap"


# The values only known at deploy time that each phase's settings need.
RUNTIME_INPUTS = {
    "model": ("hf_token",),
    "reboot-wait": ("reboot_result",),
    "service": ("api_key",),
    "gateway": ("api_key", "host"),
    "ready": ("host",),
    "autodown": ("dns_record",),
}


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
                    connection=self._connection(args, wait=False),
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
                    if args.cache_attachment is not None:
                        upstream.append(args.cache_attachment)
                        triggers.append(args.cache_attachment.id)
                else:
                    upstream.append(self.commands[name_])
                    results.append(self.commands[name_].stdout)
            minutes = phase_minutes(cfg, phase)
            stdin = self._stdin(cfg, phase.name, minutes, args)
            # Upstream results are unique per run: when one re-ran, this one re-runs too. The
            # first phase has no upstream: the Droplet's id starts the cascade on a new one.
            triggers = [*results, *triggers] if results else [args.droplet_id]
            self.commands[phase.name] = command.remote.Command(
                f"{args.prefix}-{phase.name}",
                connection=self._connection(args, wait=phase.wait_for_ssh),
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
        }
        if phase == "reboot-wait":
            available["reboot_result"] = self.commands["reboot"].stdout.apply(parse_result)
        needed = {name: available[name] for name in RUNTIME_INPUTS.get(phase, ())}
        cache_device = args.cache_device if phase in STATIC_INPUTS else ""
        if phase == "autodown" and cfg.autodown.token is not None:
            # The token is in the config model, not an Output: mark the script secret here.
            return pulumi.Output.secret(
                pulumi.Output.all(**needed).apply(
                    lambda values: render(phase, settings(cfg, phase, **values), minutes)
                )
            )
        if not needed:
            return render(phase, settings(cfg, phase, cache_device=cache_device), minutes)
        # Secrets stay secret: an Output built from a secret is a secret.
        return pulumi.Output.all(**needed).apply(
            lambda values: render(
                phase, settings(cfg, phase, **values, cache_device=cache_device), minutes
            )
        )

    @staticmethod
    def _connection(args: BootstrapArgs, wait: bool) -> command.remote.ConnectionArgs:
        return command.remote.ConnectionArgs(
            host=args.ipv4,
            user=catalog.SSH_USER,
            private_key=args.private_key,
            host_key=args.host_public_key,
            # -1: dial until SSH answers, bounded by the command's custom timeout.
            dial_error_limit=-1 if wait else 10,
            per_dial_timeout=15,
        )
