"""The rule's settings, from the environment (the root-only EnvironmentFile the program renders,
components/host/autodown.py env_text), read once per run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .rule import Rule

RUN_SECONDS = 45.0  # the run's own deadline when AUTODOWN_RUN_SECONDS is empty
ENV_FILE = "/etc/nemotron/autodown.env"  # named in the message of a bad setting


@dataclass(frozen=True)
class Settings:
    token: str
    rule: Rule
    # How long a source's unreadable metrics count as busy (None: no bound).
    unreadable_minutes: float | None
    run_seconds: float
    dry_run: bool
    metrics_url: str
    peer_metrics_urls: list[str]
    peer_metrics_key: str
    metadata_url: str
    api_url: str
    state: Path
    first_bootstrap: Path
    # Checked where they are used (remove.py): an odd value there deletes nothing.
    dns_record: str
    peer_droplet_ids: str
    retry_delay: float


def env_number(env: Mapping[str, str], name: str) -> float | None:
    """A positive number, or None when empty; ValueError naming the setting otherwise."""
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number")
    return number


def read(env: Mapping[str, str], dry_run: bool) -> Settings:
    """The settings in `env`; ValueError naming the first bad number. `dry_run`: asked on the
    command line. Without a token nothing can be deleted: a dry run."""
    token = env.get("AUTODOWN_TOKEN", "")
    return Settings(
        token=token,
        rule=Rule(
            env_number(env, "AUTODOWN_IDLE_MINUTES"),
            env_number(env, "AUTODOWN_MAX_HOURS"),
            env_number(env, "AUTODOWN_BOOTSTRAP_MINUTES"),
        ),
        unreadable_minutes=env_number(env, "AUTODOWN_UNREADABLE_MINUTES"),
        run_seconds=env_number(env, "AUTODOWN_RUN_SECONDS") or RUN_SECONDS,
        dry_run=dry_run or env.get("AUTODOWN_DRY_RUN", "false") == "true" or not token,
        metrics_url=env.get("AUTODOWN_METRICS_URL", "http://127.0.0.1:8000/metrics"),
        peer_metrics_urls=env.get("AUTODOWN_PEER_METRICS_URLS", "").split(),
        peer_metrics_key=env.get("AUTODOWN_PEER_METRICS_KEY", ""),
        metadata_url=env.get("AUTODOWN_METADATA_URL", "http://169.254.169.254/metadata/v1/id"),
        api_url=env.get("AUTODOWN_API_URL", "https://api.digitalocean.com"),
        state=Path(env.get("AUTODOWN_STATE", "/var/lib/nemotron/autodown.json")),
        first_bootstrap=Path(
            env.get("AUTODOWN_FIRST_BOOTSTRAP", "/var/lib/nemotron/first-bootstrap")
        ),
        dns_record=env.get("AUTODOWN_DNS_RECORD", ""),
        peer_droplet_ids=env.get("AUTODOWN_PEER_DROPLET_IDS", ""),
        retry_delay=float(env.get("AUTODOWN_RETRY_DELAY", "2")),
    )
