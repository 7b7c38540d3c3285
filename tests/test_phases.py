"""The phase table (components/host/phases.py) against the scripts it runs: each script's
`# Settings:` header names exactly the settings its row's function gives it, for a lone
Droplet, a replica and the Caddy balancer; and each input a row names is one its settings
function reads."""

from __future__ import annotations

import dataclasses
import re

import pytest
from pulumi_harness import stack_config

from components.host import phases
from components.host.phase_settings import PHASES_DIR, Inputs
from components.spec import config


def header_keys(script: str) -> set[str]:
    """The settings a script's `# Settings:` header lists (its continuation lines included)."""
    keys: set[str] = set()
    inside = False
    for line in (PHASES_DIR / f"{script}.sh").read_text().splitlines():
        if line.startswith("# Settings:"):
            inside = True
        elif not (inside and re.match(r"#\s+NEMO_", line)):
            if inside:
                break
            continue
        keys |= set(re.findall(r"\bNEMO_[A-Z0-9_]+", line))
    return keys


def configs() -> dict[str, config.StackConfig]:
    dev = stack_config("dev")
    return {
        "lone": config.parse(dev, "dev"),
        # Two replicas, the router and the waker on: every input a row names is read (the
        # replicas' render_client among them).
        "caddy": config.parse(
            {
                **dev,
                "replicas": 2,
                "balancer": {"routing": "cache-aware"},
                "wake": {"enabled": True, "githubRepo": "me/llm", "token": "github_pat_x"},
            },
            "dev",
            frozenset({"wake"}),
        ),
    }


ROWS = [("bootstrap", p) for p in phases.BOOTSTRAP] + [("balancer", p) for p in phases.BALANCER]


@pytest.mark.parametrize(("table", "phase"), ROWS, ids=[f"{t}-{p.name}" for t, p in ROWS])
def test_each_scripts_settings_header_is_what_its_row_gives_it(
    table: str, phase: phases.Phase
) -> None:
    cfgs = configs()
    shapes = [cfgs["caddy"]] if table == "balancer" else list(cfgs.values())
    header = header_keys(phase.name)
    assert header, f"scripts/phases/{phase.name}.sh has no # Settings: header"
    for cfg in shapes:
        replica = 0 if cfg.pooled else None
        given = set(phase.settings(cfg, Inputs(replica=replica)))
        assert given == header, (
            f"{phase.name}.sh ({table}): in the header only {sorted(header - given)}, "
            f"given only {sorted(given - header)}"
        )


@pytest.mark.parametrize(("table", "phase"), ROWS, ids=[f"{t}-{p.name}" for t, p in ROWS])
def test_each_input_a_row_names_changes_what_its_phase_is_given(
    table: str, phase: phases.Phase
) -> None:
    """An input named for nothing would make a phase wait on (and re-run for) a value it
    never reads."""
    shapes = [configs()["caddy"]] if table == "balancer" else list(configs().values())
    for cfg in shapes:
        reads_what_it_names(phase, table, cfg)


def reads_what_it_names(phase: phases.Phase, table: str, cfg: config.StackConfig) -> None:
    names = phases.wanted(phase, 0 if cfg.pooled and table == "bootstrap" else None)
    probes: dict[str, object] = {
        "hf_token": "hf_probe",
        "reboot_result": {"rebooting": True, "boot_id": "probe"},
        "api_key": "probe-key",
        "host": "probe.example.com",
        "dns_record": "example.com 4242",
        "cache_device": "/dev/disk/by-id/probe",
        "replica": 3,
        "private_ip": "10.110.0.42",
        "peers": [["4243", "10.110.0.43"]],
        "metrics_reader": "10.110.0.44",
        "render_client": "10.110.0.45",
        "droplet_id": "4245",
        "price_hourly": 3.39,
    }
    replica = 0 if cfg.pooled and table == "bootstrap" else None
    shape = "a replica" if replica is not None else "a lone Droplet"
    if phase.leaves:
        replica, shape = 3, "the balancer, replica 3's member"
    full = Inputs(**{n: probes[n] for n in names}, replica=replica)
    given = phase.settings(cfg, full)
    for name in names:
        default = getattr(Inputs(), name)
        without = phase.settings(cfg, dataclasses.replace(full, **{name: default}))
        assert without != given, f"{phase.name} ({table}, {shape}) names {name} but never reads it"
