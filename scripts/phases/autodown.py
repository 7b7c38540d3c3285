#!/usr/bin/env python3
"""autodown: delete this Droplet when nobody uses it, or when it has been up too long.

Runs every minute from a systemd timer (the autodown phase installs it). Reads vLLM's
Prometheus /metrics on loopback: the Droplet is busy while a request runs, waits or finishes.
After AUTODOWN_IDLE_MINUTES without that, or AUTODOWN_MAX_HOURS after the bootstrap first ran
(busy or not), it deletes its own Droplet through the DigitalOcean API (its id from the metadata
service) exactly once. Metrics that cannot be read count as busy: a broken vLLM never gets a
working one killed mid-request, and the max-hours ceiling still ends it. Every decision is one
log line (the journal); the token is never printed. Standard library only.

Settings come from the environment (a root-only EnvironmentFile): AUTODOWN_TOKEN,
AUTODOWN_IDLE_MINUTES, AUTODOWN_MAX_HOURS (empty: no such rule), AUTODOWN_DRY_RUN,
AUTODOWN_METRICS_URL, AUTODOWN_METADATA_URL, AUTODOWN_API_URL, AUTODOWN_STATE.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
FINISHED = "vllm:request_success_total"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def log(message: str) -> None:
    print(f"autodown: {message}", flush=True)


def env_number(name: str) -> float | None:
    value = os.environ.get(name, "").strip()
    return float(value) if value else None


def read_metrics(url: str) -> dict[str, float] | None:
    """Sums per metric name of the samples we watch; None when unreadable."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (loopback URL from config)
            text = response.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    sums = {RUNNING: 0.0, WAITING: 0.0, FINISHED: 0.0}
    seen = False
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in sums:
            sums[match.group(1)] += float(match.group(3))
            seen = True
    return sums if seen else None


def droplet_id(metadata_url: str) -> str:
    with urllib.request.urlopen(metadata_url, timeout=10) as response:  # noqa: S310 (link-local metadata service)
        text: str = response.read().decode().strip()
    return text


def delete_droplet(api_url: str, token: str, droplet: str, attempts: int = 4) -> str:
    """DELETE the Droplet, retrying transient failures; returns 'deleted', 'gone' or an error."""
    request = urllib.request.Request(  # noqa: S310 (the DigitalOcean API from config)
        f"{api_url.rstrip('/')}/v2/droplets/{droplet}",
        method="DELETE",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    delay = float(os.environ.get("AUTODOWN_RETRY_DELAY", "2"))
    result = "error: no attempt made"
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                if response.status in (200, 202, 204):
                    return "deleted"
                result = f"error: HTTP {response.status}"
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return "gone"
            if err.code in (401, 403):
                return f"error: HTTP {err.code}: the token may not delete Droplets (droplet:delete)"
            result = f"error: HTTP {err.code}"
        except (urllib.error.URLError, OSError) as err:
            result = f"error: {type(err).__name__}"
        if attempt < attempts:
            log(f"delete attempt {attempt}/{attempts} failed ({result}); retrying in {delay:g}s")
            time.sleep(delay)
            delay *= 2
    return result


def load_state(path: Path, now: float) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        state = {}
    state.setdefault("installed_at", now)
    state.setdefault("last_activity", now)
    state.setdefault("finished", None)
    state.setdefault("deleted", False)
    return state


def decide(
    state: dict[str, Any],
    metrics: dict[str, float] | None,
    now: float,
    idle_minutes: float | None,
    max_hours: float | None,
) -> tuple[bool, str]:
    """Update the state from this minute's metrics; return (delete?, the reason line)."""
    if metrics is None:
        busy, what = True, "metrics unreadable, counted as busy"
    else:
        finished_changed = state["finished"] is not None and metrics[FINISHED] != state["finished"]
        busy = metrics[RUNNING] > 0 or metrics[WAITING] > 0 or finished_changed
        state["finished"] = metrics[FINISHED]
        what = (
            f"{'busy' if busy else 'idle'} (running={metrics[RUNNING]:g} "
            f"waiting={metrics[WAITING]:g} finished={metrics[FINISHED]:g})"
        )
    if busy:
        state["last_activity"] = now
    idle = (now - state["last_activity"]) / 60
    up = (now - state["installed_at"]) / 3600
    limits = []
    if idle_minutes is not None:
        limits.append(f"idle {idle:.0f}/{idle_minutes:g} min")
    if max_hours is not None:
        limits.append(f"up {up:.2f}/{max_hours:g} h")
    reason = f"{what}; {', '.join(limits)}"
    if max_hours is not None and up >= max_hours:
        return True, f"{reason}: past max hours"
    if idle_minutes is not None and idle >= idle_minutes:
        return True, f"{reason}: idle too long"
    return False, reason


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="log what would happen; delete nothing"
    )
    args = parser.parse_args(argv)
    dry_run = args.dry_run or os.environ.get("AUTODOWN_DRY_RUN", "false") == "true"
    token = os.environ.get("AUTODOWN_TOKEN", "")
    if not token:
        dry_run = True
    idle_minutes = env_number("AUTODOWN_IDLE_MINUTES")
    max_hours = env_number("AUTODOWN_MAX_HOURS")
    state_path = Path(os.environ.get("AUTODOWN_STATE", "/var/lib/nemotron/autodown.json"))
    now = time.time()

    state = load_state(state_path, now)
    if state["deleted"]:
        log("the delete was accepted earlier; waiting for the Droplet to go")
        return 0
    metrics = read_metrics(os.environ.get("AUTODOWN_METRICS_URL", "http://127.0.0.1:8000/metrics"))
    delete, reason = decide(state, metrics, now, idle_minutes, max_hours)
    outcome = 0
    if not delete:
        log(f"keep: {reason}")
    elif dry_run:
        log(f"dry run: would delete this Droplet: {reason}")
    else:
        droplet = droplet_id(
            os.environ.get("AUTODOWN_METADATA_URL", "http://169.254.169.254/metadata/v1/id")
        )
        result = delete_droplet(
            os.environ.get("AUTODOWN_API_URL", "https://api.digitalocean.com"), token, droplet
        )
        log(f"delete droplet {droplet}: {reason}: {result}")
        if result in ("deleted", "gone"):
            state["deleted"] = True
        else:
            outcome = 1
    state_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(state_path)
    return outcome


if __name__ == "__main__":
    sys.exit(main())
