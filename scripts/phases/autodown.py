#!/usr/bin/env python3
"""autodown: delete this Droplet when nobody uses it, or when it has been up too long.

Runs every minute from a systemd timer (the autodown phase installs it). Reads vLLM's
Prometheus /metrics on loopback. The Droplet is busy while the engine makes progress: tokens
generated or prompts read, requests finished. The running/waiting gauges alone do not count
once there is a reading to compare with, because vLLM can leave them non-zero after aborted
requests (vllm-project/vllm#22545): a "running" request that produces nothing for
AUTODOWN_IDLE_MINUTES is idle. AUTODOWN_MAX_HOURS counts from this Droplet's first bootstrap
(the file AUTODOWN_FIRST_BOOTSTRAP, written once by the preflight phase), busy or not.

Installed by the first phase after preflight, before the driver, the downloads and vLLM: a
bootstrap that fails there (a driver that does not build, a download that never ends, vLLM out
of memory at its start) leaves this rule running. AUTODOWN_BOOTSTRAP_MINUTES (empty: no such
rule) is the deadline of a Droplet that never served: until this replica's own metrics have been
read once, it is bootstrapping (busy), and that many minutes after its first bootstrap it is
deleted, whatever else the rule says.

Nothing here may crash into "never": metrics that cannot be read or parsed count as busy (a
broken vLLM never gets a working one killed), but only for AUTODOWN_UNREADABLE_MINUTES in a row
per source (this replica once it served, each peer; empty: no bound): past that the source
counts as idle, so a dead replica cannot keep a set "busy" for ever, and the idle rule takes the
set down. Max hours still fires whatever the metrics say; a state file of any
shape is reset; the run keeps its own deadline (AUTODOWN_RUN_SECONDS) so a hung service cannot
hold the next minute's run. The Droplet is deleted through the DigitalOcean API (its id from the
metadata service, which must be a number) exactly once. Every decision is one log line (the
journal); the token is never printed. Standard library only.

Settings come from the environment (a root-only EnvironmentFile): AUTODOWN_TOKEN,
AUTODOWN_IDLE_MINUTES, AUTODOWN_MAX_HOURS (empty: no such rule), AUTODOWN_DRY_RUN,
AUTODOWN_METRICS_URL, AUTODOWN_METADATA_URL, AUTODOWN_API_URL, AUTODOWN_STATE,
AUTODOWN_FIRST_BOOTSTRAP, AUTODOWN_RUN_SECONDS, AUTODOWN_DNS_RECORD ("<zone> <record id>" of the
endpoint's A record, deleted first), AUTODOWN_BOOTSTRAP_MINUTES, AUTODOWN_UNREADABLE_MINUTES.

With replicas it runs on replica 0 for the whole set: AUTODOWN_PEER_METRICS_URLS are the other
replicas' /metrics through their private gateways (AUTODOWN_PEER_METRICS_KEY is the API key
they ask for); the set is busy when any replica is (the readings are summed, and one that
cannot be read counts as busy, like this replica's own, within AUTODOWN_UNREADABLE_MINUTES).
AUTODOWN_PEER_DROPLET_IDS are the other replicas' Droplet ids: each is deleted by its id, and
this one last, once every other is gone, so that a failed delete leaves the rule running on a
Droplet that can try again. Never by tag:
DELETE /v2/droplets?tag_name= needs tag:read besides droplet:delete, and whether it reaches
GPU Droplets is not documented (docs/facts.md; DigitalOcean OpenAPI droplets_destroy_byTag.yml).

Token scopes (DigitalOcean OpenAPI, specification/resources): DELETE /v2/droplets/{id} needs
droplet:delete (droplets/droplets_destroy.yml); DELETE /v2/domains/{zone}/records/{id} needs
domain:delete (domains/domains_delete_record.yml). A 401/403 says which one is missing.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
FINISHED = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"
PROMPTED = "vllm:prompt_tokens_total"
GAUGES = (RUNNING, WAITING)
# Progress counters: any change since the last reading means the engine did work. The first
# three must be present for a reading to count; prompt tokens are used when vLLM exports them.
COUNTERS = (FINISHED, GENERATED, PROMPTED)
REQUIRED = (RUNNING, WAITING, FINISHED, GENERATED)
# A sample line: name, optional labels (quoted values may hold '}' or escaped quotes), value.
_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?[ \t]+(\S+)(?:[ \t]+\S+)?$'
)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
MAX_METRICS_BYTES = 4 * 1024 * 1024
DROPLET_ID = re.compile(r"[0-9]{1,20}")
# The scopes each call needs (DigitalOcean OpenAPI, see above): what a 401/403 names.
DROPLET_SCOPE = "droplet:delete"
RECORD_SCOPE = "domain:delete"
ZONE = re.compile(r"([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
# Per-request ceilings; the run's deadline lowers them as it nears.
METRICS_TIMEOUT = 10.0
METADATA_TIMEOUT = 10.0
METADATA_PAUSE = 1.0  # between two looks at the metadata service, within one run
API_TIMEOUT = 30.0
RUN_SECONDS = 45.0
# A first-bootstrap time further ahead than this is a broken clock or file, not a time.
CLOCK_SKEW = 300.0

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, never followed: urllib sends the request's headers on to the
    Location, Authorization included (CPython Lib/urllib/request.py redirect_request), so a
    replica's gateway answering its /metrics with a redirect would carry the API key elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def log(message: str) -> None:
    print(f"autodown: {message}", flush=True)


def env_number(name: str) -> float | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number")
    return number


@dataclass
class Deadline:
    """The end of this run: every wait and request timeout fits inside it."""

    clock: Clock
    end: float

    def left(self) -> float:
        return self.end - self.clock()

    def timeout(self, ceiling: float) -> float | None:
        """A request timeout within the deadline; None when too little time is left to try."""
        left = self.left()
        return min(ceiling, left) if left >= 1 else None


def parse_metrics(text: str) -> dict[str, float] | None:
    """Sums per metric name of the samples we watch; None unless every required one is present
    with a finite, non-negative value (a truncated or garbled page is not a reading)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match is None:
            head = _NAME.match(line.strip())
            if head and head.group(0) in (*GAUGES, *COUNTERS):
                return None  # one of ours, garbled
            continue
        name = match.group(1)
        if name not in (*GAUGES, *COUNTERS):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            return None
        if not math.isfinite(value) or value < 0:
            return None
        sums[name] = sums.get(name, 0.0) + value
    if any(name not in sums for name in REQUIRED):
        return None
    return sums


def read_metrics(url: str, deadline: Deadline, key: str = "") -> dict[str, float] | None:
    """This minute's reading, or None when vLLM cannot be read or answers anything odd. key:
    the API key a replica's gateway asks for (never logged)."""
    timeout = deadline.timeout(METRICS_TIMEOUT)
    if timeout is None:
        return None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (URLs from config)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            if response.status != 200:
                return None
            body: bytes = response.read(MAX_METRICS_BYTES + 1)
        if len(body) > MAX_METRICS_BYTES:
            return None
        return parse_metrics(body.decode("utf-8"))
    except Exception:  # noqa: BLE001 (any failure to read is "unreadable", never a crash)
        return None


def unreadable_for(state: dict[str, Any], url: str, readable: bool, now: float) -> float:
    """Minutes this source has been unreadable in a row (0 once it answers); saved per URL."""
    since: dict[str, float] = state["unreadable_since"]
    if readable:
        since.pop(url, None)
        return 0.0
    since.setdefault(url, now)
    return (now - since[url]) / 60


def read_set_metrics(
    own_url: str,
    peer_urls: list[str],
    key: str,
    deadline: Deadline,
    state: dict[str, Any],
    bound: float | None,
) -> dict[str, float] | None:
    """This replica's reading plus every peer's, summed; None (busy) while any one cannot be
    read, for at most `bound` minutes in a row each (None: no bound). Past the bound a source
    counts as idle: a reading of zeros in its place. This replica's own bound starts once it
    served (before, the bootstrap deadline governs it)."""
    now = deadline.clock()
    total: dict[str, float] = {name: 0.0 for name in REQUIRED}
    busy = False
    for url in [own_url, *peer_urls]:
        own = url == own_url
        reading = read_metrics(url, deadline, "" if own else key)
        if own and reading is not None:
            state["served"] = True
        if own and not state["served"]:
            busy = busy or reading is None  # bootstrapping: not counted against the bound
            continue
        minutes = unreadable_for(state, url, reading is not None, now)
        if reading is not None:
            for name, value in reading.items():
                total[name] = total.get(name, 0.0) + value
        elif bound is None or minutes < bound:
            if not own:
                log(f"replica metrics unreadable at {url}: the set counts as busy")
            busy = True
        else:
            log(f"metrics unreadable at {url} for {minutes:.0f} min, past "
                f"{bound:g} (AUTODOWN_UNREADABLE_MINUTES): counted as idle")  # fmt: skip
    return None if busy else total


def droplet_id(
    metadata_url: str, deadline: Deadline, sleep: Sleep, attempts: int = 4
) -> str | None:
    """The Droplet's id from the metadata service; None unless it is a plain number (an empty
    or odd answer must never turn into DELETE /v2/droplets/). A service that did not answer
    (refused, reset, timed out, a 5xx) is asked again within the run's deadline, a second
    apart: one miss must not cost a run that decided to delete. A 4xx or an odd answer is an
    answer, not asked again. Each miss is logged with its reason."""
    for attempt in range(1, attempts + 1):
        timeout = deadline.timeout(METADATA_TIMEOUT)
        if timeout is None:
            log("metadata service: no time left in this run to ask it")
            return None
        try:
            with _OPENER.open(metadata_url, timeout=timeout) as response:
                body: bytes = response.read(64)
            text = body.decode("ascii", "replace").strip()
        except urllib.error.HTTPError as err:
            why, again = f"HTTP {err.code}", err.code >= 500
        except Exception as err:  # noqa: BLE001 (no answer of any kind: ask again)
            why, again = type(err).__name__, True
        else:
            if DROPLET_ID.fullmatch(text):
                return text
            why, again = f"answered {text[:20]!r}, not a Droplet id", False
        again = again and attempt < attempts and deadline.left() > METADATA_PAUSE + 1
        tail = "; asking again" if again else ""
        log(f"metadata service, attempt {attempt}/{attempts}: {why}{tail}")
        if not again:
            return None
        sleep(METADATA_PAUSE)
    return None


def retry_after(header: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not header:
        return None
    header = header.strip()
    if header.isdigit():
        return float(header)
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def delete(
    api_url: str,
    token: str,
    path: str,
    scope: tuple[str, str],
    deadline: Deadline,
    sleep: Sleep,
    attempts: int = 4,
) -> str:
    """DELETE an API object, retrying transient failures within the run's deadline; returns
    'deleted', 'gone' or an error for the log (the next minute's run tries again). scope:
    what is deleted and the token scope that call needs, named when DigitalOcean refuses."""
    request = urllib.request.Request(  # noqa: S310 (the DigitalOcean API from config)
        f"{api_url.rstrip('/')}{path}",
        method="DELETE",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    delay = float(os.environ.get("AUTODOWN_RETRY_DELAY", "2"))
    result = "error: no time left in this run"
    for attempt in range(1, attempts + 1):
        timeout = deadline.timeout(API_TIMEOUT)
        if timeout is None:
            return f"{result}; the next run tries again"
        wait = delay
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                if response.status in (200, 202, 204):
                    return "deleted"
                result = f"error: HTTP {response.status}"
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return "gone"
            if err.code in (401, 403):
                return refused(err.code, scope)
            result = f"error: HTTP {err.code}"
            asked = retry_after(err.headers.get("Retry-After"), deadline.clock())
            if asked is not None:
                wait = asked
                result += f" (retry after {asked:g}s)"
        except Exception as err:  # noqa: BLE001 (network trouble of any kind: try again)
            result = f"error: {type(err).__name__}"
        if attempt == attempts:
            break
        if wait > deadline.left() - 1:
            return f"{result}; waiting {wait:g}s would pass this run's deadline: next run"
        log(f"delete attempt {attempt}/{attempts} failed ({result}); retrying in {wait:g}s")
        sleep(wait)
        delay *= 2
    return result


def refused(code: int, scope: tuple[str, str]) -> str:
    """What a 401 (the token itself) or a 403 (a scope it lacks) means, for the journal."""
    if code == 401:
        return (
            "error: HTTP 401: DigitalOcean does not accept the token (expired or revoked?): "
            "make a new one, set autodown.token and pulumi up"
        )
    what, needs = scope
    return (
        f"error: HTTP 403: the token may not delete {what}: it needs the scope {needs} "
        "(DigitalOcean > API > Tokens; then set autodown.token and pulumi up)"
    )


def delete_droplet(api_url: str, token: str, droplet: str, deadline: Deadline, sleep: Sleep) -> str:
    # The plain DELETE: the Droplet's associated resources, the cache Volume among them, stay
    # (only /destroy_with_associated_resources/* removes those; DigitalOcean API reference and
    # changelog "Destroy a Droplet with associated resources"), so the next Droplet starts warm.
    return delete(
        api_url, token, f"/v2/droplets/{droplet}", ("Droplets", DROPLET_SCOPE), deadline, sleep
    )


def peer_ids(setting: str) -> list[str] | None:
    """The other replicas' Droplet ids; None when any is not a plain number (never DELETE a
    path built from an odd value)."""
    ids = setting.split()
    return ids if all(DROPLET_ID.fullmatch(i) for i in ids) else None


def dns_record(setting: str) -> tuple[str, str] | None:
    """The endpoint's A record, "<zone> <record id>", when the program keeps one. Anything else
    is no record: never DELETE a path built from an empty or odd value."""
    parts = setting.split()
    if len(parts) != 2 or not ZONE.fullmatch(parts[0]) or not DROPLET_ID.fullmatch(parts[1]):
        if setting.strip():
            log("AUTODOWN_DNS_RECORD is not '<zone> <record id>'; no record to delete")
        return None
    return parts[0], parts[1]


def fresh_state(now: float) -> dict[str, Any]:
    return {
        "started_at": now,
        "last_activity": now,
        "counters": None,
        "deleted": False,
        # A delete began (the rule decided it, not a dry run): later runs finish it whatever the
        # metrics say (a deleted peer's metrics can no longer be read, which counts as busy).
        "deleting": False,
        "record_deleted": False,
        # The other replicas this rule has deleted (by id): a later run deletes only the rest.
        "peers_deleted": [],
        # This replica's own metrics were read once: its bootstrap is over.
        "served": False,
        # Per metrics URL, when it began to be unreadable (cleared when it answers).
        "unreadable_since": {},
    }


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _flag(value: object) -> bool:
    return isinstance(value, bool)


def _ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, str) and DROPLET_ID.fullmatch(i) for i in value
    )


def _times(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and _number(v) for k, v in value.items()
    )


def load_state(path: Path, now: float) -> tuple[dict[str, Any], str | None]:
    """The saved state, or a fresh one with the reason when the file is missing or odd. Times in
    the future (a clock that jumped back) are clamped to now: they would hold the idle rule off."""
    try:
        raw: object = json.loads(path.read_text())
    except FileNotFoundError:
        return fresh_state(now), None
    except (OSError, ValueError) as err:
        return fresh_state(now), f"state file unreadable ({type(err).__name__}), reset"
    state = fresh_state(now)
    if not isinstance(raw, dict):
        return state, f"state file held {type(raw).__name__}, not an object: reset"
    odd = []
    if "started_at" not in raw and "installed_at" in raw:
        raw["started_at"] = raw["installed_at"]  # written by earlier releases
    for key in ("started_at", "last_activity"):
        if _number(raw.get(key)):
            state[key] = min(float(raw[key]), now)
        else:
            odd.append(key)
    counters = raw.get("counters")
    if isinstance(counters, dict) and all(
        isinstance(k, str) and _number(v) for k, v in counters.items()
    ):
        state["counters"] = {k: float(v) for k, v in counters.items()}
    elif counters is not None:
        odd.append("counters")
    kinds: dict[str, Callable[[object], bool]] = {
        "deleted": _flag,
        "record_deleted": _flag,
        "deleting": _flag,
        "peers_deleted": _ids,
        "served": _flag,
        "unreadable_since": _times,
    }
    for key, valid in kinds.items():
        if key in raw and valid(raw[key]):
            state[key] = raw[key]
        elif key in raw:
            odd.append(key)
    # Clamped like the times above; an earlier release's state with a reading had served.
    state["unreadable_since"] = {k: min(v, now) for k, v in state["unreadable_since"].items()}
    state["served"] = state["served"] or ("served" not in raw and state["counters"] is not None)
    return state, (f"state file had odd {', '.join(odd)}: reset" if odd else None)


def save_state(path: Path, state: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)
    except OSError as err:
        log(f"could not save the state ({type(err).__name__}); the next run starts afresh")


def first_bootstrap(path: Path, state: dict[str, Any], now: float) -> tuple[float, str]:
    """When this Droplet's first bootstrap ran: max hours counts from it. The file survives a
    lost state file; without it, the earliest time this rule has seen."""
    try:
        value = float(path.read_text().strip())
        if math.isfinite(value) and 0 < value <= now + CLOCK_SKEW:
            return min(value, now), "first bootstrap"
    except (OSError, ValueError):
        pass
    return float(state["started_at"]), "first autodown run"


def busy_now(state: dict[str, Any], metrics: dict[str, float] | None) -> tuple[bool, str]:
    """Is the engine making progress? Updates the saved counters; returns (busy, the reading)."""
    if metrics is None:
        return True, "metrics unreadable, counted as busy"
    previous = state["counters"]
    counters = {name: metrics[name] for name in COUNTERS if name in metrics}
    state["counters"] = counters
    gauges = metrics[RUNNING] > 0 or metrics[WAITING] > 0
    reading = (
        f"running={metrics[RUNNING]:g} waiting={metrics[WAITING]:g} "
        f"finished={metrics[FINISHED]:g} generated={metrics[GENERATED]:g}"
    )
    if previous is None:
        # No reading to compare with (first run, or a reset state): trust the gauges this once.
        return gauges, f"{'busy' if gauges else 'idle'} ({reading})"
    if any(previous.get(name) != value for name, value in counters.items()):
        # Moved on (or went back: vLLM restarted, which is work too).
        return True, f"busy ({reading})"
    if gauges:
        return False, f"idle: no progress though the gauges say requests are in flight ({reading})"
    return False, f"idle ({reading})"


def bootstrap_clock(
    state: dict[str, Any], started: tuple[float, str], minutes: float | None
) -> tuple[float, str]:
    """When the bootstrap deadline counts from: the first bootstrap, as a rule installed right
    after preflight sees it. A rule whose own state began with that deadline already past (turned
    on for a Droplet that serves, or its state file lost) cannot know that the Droplet served,
    and its vLLM may be restarting for the same `pulumi up` or too busy to answer this minute:
    it gives the Droplet a window of its own, from its first run, still bounded."""
    if minutes is not None and state["started_at"] - started[0] >= minutes * 60:
        return float(state["started_at"]), "this rule's first run"
    return started


@dataclass(frozen=True)
class Rule:
    """The limits in force (None: that rule is off)."""

    idle_minutes: float | None
    max_hours: float | None
    bootstrap_minutes: float | None = None


def decide(
    state: dict[str, Any],
    metrics: dict[str, float] | None,
    now: float,
    started: tuple[float, str],
    rule: Rule,
) -> tuple[bool, str]:
    """Update the state from this minute's metrics; return (delete?, the reason line)."""
    busy, what = busy_now(state, metrics)
    if not state["served"]:
        busy, what = True, "bootstrapping: this replica has not served yet"
    if busy:
        state["last_activity"] = now
    idle = (now - state["last_activity"]) / 60
    up = (now - started[0]) / 3600
    booting = bootstrap_clock(state, started, rule.bootstrap_minutes)
    booted = (now - booting[0]) / 60
    limits = []
    if not state["served"] and rule.bootstrap_minutes is not None:
        limits.append(f"bootstrap {booted:.0f}/{rule.bootstrap_minutes:g} min since {booting[1]}")
    if rule.idle_minutes is not None:
        limits.append(f"idle {idle:.0f}/{rule.idle_minutes:g} min")
    if rule.max_hours is not None:
        limits.append(f"up {up:.2f}/{rule.max_hours:g} h since {started[1]}")
    reason = f"{what}; {', '.join(limits)}"
    if rule.max_hours is not None and up >= rule.max_hours:
        return True, f"{reason}: past max hours"
    late = rule.bootstrap_minutes is not None and booted >= rule.bootstrap_minutes
    if not state["served"] and late:
        return True, f"{reason}: not serving by its bootstrap deadline"
    if rule.idle_minutes is not None and idle >= rule.idle_minutes:
        return True, f"{reason}: idle too long"
    return False, reason


def remove(state: dict[str, Any], reason: str, token: str, deadline: Deadline, sleep: Sleep) -> int:
    """Delete the endpoint's DNS record (if the program keeps one), then the Droplet; 0 once
    DigitalOcean accepted the Droplet's delete."""
    env = os.environ.get
    droplet = droplet_id(
        env("AUTODOWN_METADATA_URL", "http://169.254.169.254/metadata/v1/id"), deadline, sleep
    )
    if droplet is None:
        log(f"{reason}: but the metadata service gave no numeric Droplet id; not deleting")
        return 1
    api = env("AUTODOWN_API_URL", "https://api.digitalocean.com")
    record = dns_record(env("AUTODOWN_DNS_RECORD", ""))
    if record is not None and not state["record_deleted"]:
        # First the name, so it never points at an address DigitalOcean gives to someone else
        # (who could then get a certificate for it).
        zone, rid = record
        path = f"/v2/domains/{zone}/records/{rid}"
        done = delete(api, token, path, ("DNS records", RECORD_SCOPE), deadline, sleep)
        log(f"delete DNS record {rid} in {zone}: {done}")
        if done in ("deleted", "gone"):
            state["record_deleted"] = True
        else:
            log(
                "the endpoint's name still points at this Droplet's address; the Droplet goes "
                "anyway (it bills): run pulumi refresh, then pulumi up or pulumi destroy, to fix "
                "the record"
            )
    if not remove_peers(state, reason, api, token, deadline, sleep):
        return 1
    result = delete_droplet(api, token, droplet, deadline, sleep)
    log(f"delete droplet {droplet}: {reason}: {result}")
    if result not in ("deleted", "gone"):
        return 1
    state["deleted"] = True
    return 0


def remove_peers(
    state: dict[str, Any], reason: str, api: str, token: str, deadline: Deadline, sleep: Sleep
) -> bool:
    """Delete each other replica by its id (with replicas); True once none is left. This
    Droplet runs the rule, so it goes last: while a peer's delete fails it stays, and the next
    run tries that peer again."""
    peers = peer_ids(os.environ.get("AUTODOWN_PEER_DROPLET_IDS", ""))
    if peers is None:
        log("AUTODOWN_PEER_DROPLET_IDS holds a value that is not a Droplet id; deleting nothing")
        return False
    done: list[str] = state["peers_deleted"]
    for peer in peers:
        if peer in done:
            continue
        result = delete_droplet(api, token, peer, deadline, sleep)
        log(f"delete replica droplet {peer}: {reason}: {result}")
        if result in ("deleted", "gone"):
            done.append(peer)
    left = [p for p in peers if p not in done]
    if left:
        waiting = " ".join(left)
        log(f"this Droplet stays until replicas {waiting} are gone; the next run tries again")
    return not left


def main(argv: list[str] | None = None, now: Clock = time.time, sleep: Sleep = time.sleep) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "autodown").splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="log what would happen; delete nothing"
    )
    args = parser.parse_args(argv)
    env = os.environ.get
    try:
        rule = Rule(
            env_number("AUTODOWN_IDLE_MINUTES"),
            env_number("AUTODOWN_MAX_HOURS"),
            env_number("AUTODOWN_BOOTSTRAP_MINUTES"),
        )
        unreadable = env_number("AUTODOWN_UNREADABLE_MINUTES")
        run_seconds = env_number("AUTODOWN_RUN_SECONDS") or RUN_SECONDS
    except ValueError as err:
        log(f"bad setting: {err}; fix /etc/nemotron/autodown.env (pulumi up rewrites it)")
        return 2
    token = env("AUTODOWN_TOKEN", "")
    dry_run = args.dry_run or env("AUTODOWN_DRY_RUN", "false") == "true" or not token
    state_path = Path(env("AUTODOWN_STATE", "/var/lib/nemotron/autodown.json"))
    start = now()
    deadline = Deadline(now, start + run_seconds)

    state, note = load_state(state_path, start)
    if note:
        log(note)
    if state["deleted"]:
        log("the delete was accepted earlier; waiting for the Droplet to go")
        return 0
    if state["deleting"] and not dry_run:
        outcome = remove(state, "finishing the delete that began earlier", token, deadline, sleep)
        save_state(state_path, state)
        return outcome
    metrics = read_set_metrics(
        env("AUTODOWN_METRICS_URL", "http://127.0.0.1:8000/metrics"),
        env("AUTODOWN_PEER_METRICS_URLS", "").split(),
        env("AUTODOWN_PEER_METRICS_KEY", ""),
        deadline,
        state,
        unreadable,
    )
    started = first_bootstrap(
        Path(env("AUTODOWN_FIRST_BOOTSTRAP", "/var/lib/nemotron/first-bootstrap")), state, start
    )
    delete, reason = decide(state, metrics, now(), started, rule)
    outcome = 0
    if not delete:
        log(f"keep: {reason}")
    elif dry_run:
        peers = env("AUTODOWN_PEER_DROPLET_IDS", "").split()
        what = f"replicas {' '.join(peers)}, then this Droplet" if peers else "this Droplet"
        log(f"dry run: would delete {what}: {reason}")
    else:
        state["deleting"] = True
        outcome = remove(state, reason, token, deadline, sleep)
    save_state(state_path, state)
    return outcome


if __name__ == "__main__":
    sys.exit(main())
