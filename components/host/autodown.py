"""The auto-destroy rule on the Droplet: the settings the autodown package reads, the folder it
is shipped as and the systemd units that run it every minute (scripts/phases/autodown/ decides;
this module renders its setup)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ..spec import catalog
from ..spec.schema import StackConfig
from . import pool


class Peer(NamedTuple):
    """Another replica, as replica 0's rule sees it: its Droplet id (what it deletes) and its
    private address (where it reads that replica's metrics)."""

    droplet_id: str
    private_ip: str


# One run must end before the next minute's: its own deadline, and systemd's beneath it.
RUN_SECONDS = 45
UNIT_TIMEOUT_SECONDS = 55
# What the host runs: one folder (lib.sh install_tree) holding two packages, the rule
# (scripts/phases/autodown/) and the clients it uses (scripts/clients/: the Prometheus parser,
# the transport, DigitalOcean's API), nothing else. The unit runs `python3 -m autodown` with
# the folder as its working directory, which `-m` puts first on sys.path: no -P (Python 3.11+)
# and no PYTHONPATH, as a Droplet on ubuntu-22-04-x64 has Python 3.10 (docs/facts.md).
LIB_DIR = "/usr/local/lib/nemotron"
PACKAGE = "autodown"
TREE_DIR = f"{LIB_DIR}/{PACKAGE}"
# The single file the rule was before it was a package: a host upgraded from it keeps none.
OLD_SCRIPT_PATH = f"{LIB_DIR}/autodown.py"
CLIENTS_DIR = Path(__file__).resolve().parents[2] / "scripts" / "clients"
CLIENTS = ("__init__.py", "digitalocean.py", "prometheus.py", "transport.py")
ENV_FILE = "/etc/nemotron/autodown.env"


def tree_extra() -> dict[str, Path]:
    """The clients the rule imports, at their sub-path of the shipped folder (`clients/`)."""
    return {f"clients/{name}": CLIENTS_DIR / name for name in CLIENTS}


def env_text(
    cfg: StackConfig,
    dns_record: str = "",
    peers: Sequence[Peer] = (),
    peer_key: str = "",
    bootstrap_minutes: int | None = None,
) -> str:
    """The rule's settings (scripts/phases/autodown/settings.py reads them); `dns_record`
    ("<zone> <record id>") is the endpoint's A record, deleted before the Droplet. With
    replicas, the rule runs on replica 0 for the set: idle only when no replica did anything
    (each of the other `peers`' /metrics through its gateway, with the key), and then it
    deletes each of them by its Droplet id, itself last (the balancer and its address stay,
    for the next `pulumi up`). `bootstrap_minutes`: the deadline of a Droplet that never
    served, and how long a replica's unreadable metrics count as busy
    (phases.bootstrap_minutes; None: neither bound)."""
    rule = cfg.autodown
    token = rule.token.get_secret_value() if rule.token is not None else ""
    return "\n".join([
        f"AUTODOWN_TOKEN={token}",
        f"AUTODOWN_IDLE_MINUTES={'' if rule.idle_minutes is None else rule.idle_minutes}",
        f"AUTODOWN_MAX_HOURS={'' if rule.max_hours is None else rule.max_hours}",
        f"AUTODOWN_DRY_RUN={'true' if rule.mode == 'dry-run' else 'false'}",
        f"AUTODOWN_METRICS_URL=http://127.0.0.1:{catalog.VLLM_PORT}/metrics",
        f"AUTODOWN_METADATA_URL={catalog.METADATA_URL}/id",
        f"AUTODOWN_API_URL={catalog.DO_API_URL}",
        f"AUTODOWN_STATE={catalog.STATE_DIR}/autodown.json",
        f"AUTODOWN_FIRST_BOOTSTRAP={catalog.FIRST_BOOTSTRAP_FILE}",
        f"AUTODOWN_RUN_SECONDS={RUN_SECONDS}",
        f"AUTODOWN_DNS_RECORD={dns_record}",
        f"AUTODOWN_PEER_METRICS_URLS={' '.join(pool.metrics_url(p.private_ip) for p in peers)}",
        f"AUTODOWN_PEER_METRICS_KEY={peer_key if peers else ''}",
        f"AUTODOWN_PEER_DROPLET_IDS={' '.join(p.droplet_id for p in peers)}",
        f"AUTODOWN_BOOTSTRAP_MINUTES={bootstrap_minutes or ''}",
        f"AUTODOWN_UNREADABLE_MINUTES={bootstrap_minutes or ''}",
    ])  # fmt: skip


def token_scopes(cfg: StackConfig) -> list[str]:
    """Exactly the scopes the rule's calls need (DigitalOcean OpenAPI: droplets_destroy.yml,
    domains_delete_record.yml): its Droplets by id, and the endpoint's A record first when the
    program keeps one for a lone Droplet (with replicas the name is the entry's and stays)."""
    scopes = ["droplet:delete"]
    if cfg.access.dns_zone and not cfg.pooled:
        scopes.append("domain:delete")
    return scopes


def service_text() -> str:
    return f"""[Unit]
Description=Delete this Droplet when idle or up too long (nemotron-droplet)
After=network-online.target

[Service]
Type=oneshot
EnvironmentFile={ENV_FILE}
# `-m` puts the working directory first on sys.path: the folder holds the package and its
# clients alone, root's. (-P would leave it out, but Python 3.10 has no -P.)
WorkingDirectory={TREE_DIR}
ExecStart=/usr/bin/python3 -m {PACKAGE}
# A run that hangs must not hold the next minute's: the package keeps its own deadline, this
# one is systemd's, beneath the timer's period.
TimeoutStartSec={UNIT_TIMEOUT_SECONDS}"""


def timer_text() -> str:
    return """[Unit]
Description=Run nemotron-autodown every minute

[Timer]
OnBootSec=2min
OnUnitActiveSec=1min
AccuracySec=5s

[Install]
WantedBy=timers.target"""
