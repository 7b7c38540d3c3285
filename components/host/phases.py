"""The phase table: each phase a row, its script, what it runs after, its bound, its settings
function and the deploy-time inputs it reads. The GPU Droplets' bootstrap (`BOOTSTRAP`) and
the Caddy balancer's Droplet (`BALANCER`) are rows of the same kind, built into Commands by the
one remote.phase_command; render.py and the tests read the same rows. `render` is the text a
phase runs (its settings, lib.sh, its script), sent on stdin to `runner`'s fixed command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..spec.schema import StackConfig
from . import phase_settings as ps
from . import pool, router
from .phase_settings import Inputs, Setting

SettingsFn = Callable[[StackConfig, Inputs], dict[str, Setting]]

RUNNER = "bash -s"
# After the bound, `timeout` sends TERM to the phase's whole process group (lib.sh names the
# step it stopped in); whatever ignores TERM is killed this many seconds later.
KILL_AFTER_SECONDS = 60


def shell_value(value: Setting) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return shlex.quote(value)
    return "(" + " ".join(shlex.quote(v) for v in value) + ")"


def setting_lines(key: str, value: Setting) -> list[str]:
    """A setting's line; a text that is itself a script (the router's start script, a shipped
    package's modules, a unit's comments) is data here, its `$` and backticks expanded only
    where it runs, if ever: shellcheck (SC2016 reads either in single quotes as a mistake) is
    told so for that line alone."""
    line = f"{key}={shell_value(value)}"
    if isinstance(value, str) and re.search(r"\$[{A-Za-z_(#]|`", value):
        return ["# shellcheck disable=SC2016  # a script's text, expanded where it runs", line]
    return [line]


def runner(minutes: int) -> str:
    """The remote command of a phase. A Command's custom timeout bounds only its SSH dial, not
    a command already running (docs/facts.md), so the phase bounds itself on the Droplet.
    Fixed text: no setting and no secret is ever on this command line."""
    return f"timeout --kill-after={KILL_AFTER_SECONDS} {minutes * 60} {RUNNER}"


def render(phase: str, settings: Mapping[str, Setting], minutes: int = 0) -> str:
    """The exact text sent on stdin to `bash -s` for a phase (`minutes`: its bound, for the
    message when it is stopped)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# nemotron-droplet bootstrap, phase {phase}: sent on stdin to `{runner(minutes)}`.",
        f"PHASE={shlex.quote(phase)}",
        f"PHASE_MINUTES={minutes}",
        *(line for key, value in settings.items() for line in setting_lines(key, value)),
        "",
        ps.shipped("lib.sh"),
        ps.shipped(f"{phase}.sh"),
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Phase:
    # Its script: scripts/phases/<name>.sh.
    name: str
    # The phases (or "lock", the vLLM lock's copy; "volume", the cache Volume) it runs after.
    after: tuple[str, ...]
    # Bound on the whole command (custom_timeouts) and on its long steps (remote `timeout`):
    # the phase's own work; `minutes()` adds what else it may contain (a replica's drain).
    # 0: the ready phase's, bootstrap.readyTimeoutMinutes + 5.
    minutes: int
    # Its NEMO_* settings (phase_settings.py): the keys its script's `# Settings:` header lists.
    settings: SettingsFn
    # The Inputs fields its settings read: a lone Droplet's (and the balancer's), and a
    # replica's where they differ (None: the same).
    inputs: tuple[str, ...] = ()
    replica_inputs: tuple[str, ...] | None = None
    # Dial until SSH answers (first boot, reboot), bounded by its minutes.
    wait_for_ssh: bool = False
    # A replica drains before this phase restarts what serves (lib.sh drain).
    drains: bool = False
    # The balancer's member: its delete runs the script told to leave, within `delete_minutes`.
    leaves: bool = False
    delete_minutes: int = 0


BOOTSTRAP: tuple[Phase, ...] = (
    Phase("preflight", (), 30, ps.preflight, wait_for_ssh=True),
    # The downloads go beside the driver install: nothing in them needs the new driver.
    Phase("driver", ("preflight",), 45, ps.driver),
    Phase("cgroup", ("driver",), 15, ps.cgroup),
    # The cache Volume (when there is one) is mounted before anything is put where it binds.
    # Its bound leaves room to copy a live Droplet's weights in (the cache turned on later).
    Phase("cache", ("preflight", "volume"), 60, ps.cache, inputs=("cache_device",)),
    Phase("conda", ("cache",), 30, ps.conda),
    Phase("vllm", ("conda", "lock"), 90, ps.vllm),
    Phase("model", ("conda",), 150, ps.model, inputs=("hf_token",)),
    # The one reboot (when a phase asked for it) never interrupts a download: it waits for all.
    Phase("reboot", ("cgroup", "vllm", "model"), 5, ps.reboot, drains=True),
    Phase(
        "reboot-wait", ("reboot",), 20, ps.reboot_wait, inputs=("reboot_result",), wait_for_ssh=True
    ),
    # The gateway (and its certificate) comes up while vLLM loads the model; ready needs both.
    Phase(
        "service", ("reboot-wait",), 15, ps.service, inputs=("cache_device", "api_key"), drains=True
    ),
    Phase(
        "gateway",
        ("reboot-wait",),
        20,
        ps.gateway_phase,
        inputs=("api_key", "host"),
        replica_inputs=("api_key", "private_ip", "metrics_reader", "render_client"),
    ),
    # Right after preflight (which records when the first bootstrap began), before anything
    # that can fail for long: a Droplet whose driver, download or vLLM fails is still bounded by
    # the rule's bootstrap deadline (issue 42; docs/stop-paying.md).
    Phase(
        "autodown",
        ("preflight",),
        10,
        ps.autodown_phase,
        inputs=("dns_record",),
        replica_inputs=("api_key", "peers"),
    ),
    Phase(
        "ready",
        ("service", "gateway"),
        0,
        ps.ready,
        inputs=("host",),
        replica_inputs=("private_ip",),
    ),
)

# A replica leaving waits for its requests in flight (member.sh, NEMO_ACTION=leave).
LEAVE_MINUTES = 15
# The Caddy balancer's Droplet: its phases run as the set comes up (entry.CaddyEntry wires
# what each runs after; a member is told which replica it is, beside its inputs). The member's
# delete is its leave; the others' delete bound stays the one they were deployed with.
BALANCER: tuple[Phase, ...] = (
    Phase(
        "preflight", (), 20, ps.balancer_preflight, wait_for_ssh=True, delete_minutes=LEAVE_MINUTES
    ),
    # The waker (wake.enabled; else it removes one an earlier run installed): before the
    # gateway, whose Caddyfile then sends it keyed requests while no replica is ready.
    Phase("wake", (), 10, ps.balancer_wake, delete_minutes=LEAVE_MINUTES),
    # The cache-aware router (balancer.routing: cache-aware; else it removes one an earlier run
    # installed): before the gateway, whose Caddyfile then proxies to it. Its bound: uv and the
    # router's wheels from PyPI (a few MB), its start, and a restart's stop, which lets the
    # router finish the streams it holds (router.STOP_SECONDS).
    Phase(
        "router",
        (),
        10 + -(-router.STOP_SECONDS // 60),
        ps.balancer_router,
        delete_minutes=LEAVE_MINUTES,
    ),
    Phase(
        "gateway",
        (),
        20,
        ps.balancer_gateway,
        inputs=("api_key", "host"),
        delete_minutes=LEAVE_MINUTES,
    ),
    Phase(
        "member",
        (),
        15,
        ps.balancer_member,
        inputs=("private_ip", "droplet_id"),
        leaves=True,
        delete_minutes=LEAVE_MINUTES,
    ),
    # It reads the key on its host (the gateway's env file), as a client would have it.
    Phase("ready", (), 0, ps.balancer_ready, inputs=("host",), delete_minutes=LEAVE_MINUTES),
)

PHASE_NAMES = tuple(p.name for p in BOOTSTRAP)
# The phases that restart what serves (a reboot, vLLM): with replicas, one replica at a time.
ROLLING_PHASES = ("reboot", "service")
SOURCE_BUILD_MINUTES = 300
# Room past a drain's own longest wait (pool.drain_bound_seconds) for the phase to say why it
# went on and to start the restart or the reboot.
DRAIN_MARGIN_MINUTES = 2


def row(name: str, table: tuple[Phase, ...] = BOOTSTRAP) -> Phase:
    for phase in table:
        if phase.name == name:
            return phase
    raise ValueError(f"no phase {name!r}; phases: {', '.join(p.name for p in table)}")


def minutes(cfg: StackConfig, phase: Phase) -> int:
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


def bootstrap_minutes(cfg: StackConfig) -> int:
    """autodown's bootstrap deadline: `autodown.bootstrapMinutes`, else the longest path of the
    phases' own bounds from preflight to ready. A deadline shorter than what `pulumi up` itself
    waits for would delete a slow bootstrap that was still going to succeed."""
    if cfg.autodown.bootstrap_minutes is not None:
        return cfg.autodown.bootstrap_minutes
    done: dict[str, int] = {}
    for phase in BOOTSTRAP:  # each row after the rows it names: one pass
        before = max((done.get(name, 0) for name in phase.after), default=0)
        done[phase.name] = before + minutes(cfg, phase)
    return max(done.values())


def wanted(phase: Phase, replica: int | None) -> tuple[str, ...]:
    """The Inputs fields the phase reads (a replica's: its own list, where it has one)."""
    if replica is None or phase.replica_inputs is None:
        return phase.inputs
    return phase.replica_inputs


def settings(
    cfg: StackConfig, name: str, table: tuple[Phase, ...] = BOOTSTRAP, **inputs: Any
) -> dict[str, Setting]:
    """The NEMO_* settings of phase `name` (of `table`) for these inputs (Inputs fields)."""
    return row(name, table).settings(cfg, Inputs(**inputs))


def balancer_settings(cfg: StackConfig, name: str, **inputs: Any) -> dict[str, Setting]:
    """The NEMO_* settings of the Caddy balancer's phase `name`."""
    return settings(cfg, name, BALANCER, **inputs)
