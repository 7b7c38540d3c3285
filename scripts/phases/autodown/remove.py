"""The delete: the Droplet's id from the metadata service, then through DigitalOcean's API
(clients.digitalocean, over the one transport: HTTPS, no redirect followed) the endpoint's DNS
record, each other replica by its id, and this Droplet last. Never by tag: DELETE
/v2/droplets?tag_name= needs tag:read besides droplet:delete, and whether it reaches GPU
Droplets is not documented (docs/facts.md; DigitalOcean OpenAPI droplets_destroy_byTag.yml).

Token scopes (DigitalOcean OpenAPI, specification/resources): DELETE /v2/droplets/{id} needs
droplet:delete (droplets/droplets_destroy.yml); DELETE /v2/domains/{zone}/records/{id} needs
domain:delete (domains/domains_delete_record.yml). A 401/403 says which one is missing."""

from __future__ import annotations

import re
from typing import Any

from clients import digitalocean, transport

from .run import Deadline, Sleep, log
from .settings import Settings
from .state import DROPLET_ID

# The scopes each call needs (DigitalOcean OpenAPI, see above): what a 401/403 names.
DROPLET_SCOPE = "droplet:delete"
RECORD_SCOPE = "domain:delete"
ZONE = re.compile(r"([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
# Per-request ceilings; the run's deadline lowers them as it nears.
METADATA_TIMEOUT = 10.0
METADATA_PAUSE = 1.0  # between two looks at the metadata service, within one run
METADATA_BYTES = 64  # a Droplet id is 20 digits at most: a longer answer is not one
API_TIMEOUT = 30.0
ATTEMPTS = 4


def droplet_id(metadata_url: str, deadline: Deadline, sleep: Sleep) -> str | None:
    """The Droplet's id from the metadata service; None unless it is a plain number (an empty
    or odd answer must never turn into DELETE /v2/droplets/). A service that did not answer
    (refused, reset, timed out, a 5xx) is asked again within the run's deadline, a second
    apart: one miss must not cost a run that decided to delete. A 4xx or an odd answer is an
    answer, not asked again. Each miss is logged with its reason."""
    for attempt in range(1, ATTEMPTS + 1):
        timeout = deadline.timeout(METADATA_TIMEOUT)
        if timeout is None:
            log("metadata service: no time left in this run to ask it")
            return None
        try:
            answer = transport.private_get(metadata_url, "", timeout, METADATA_BYTES)
        except transport.FailedError:
            why, again = f"answered over {METADATA_BYTES} bytes, not a Droplet id", False
        except Exception as err:  # noqa: BLE001 (no answer of any kind: ask again)
            why, again = type(err).__name__, True
        else:
            text = answer.body.decode("ascii", "replace").strip()
            if answer.status_code == 200 and DROPLET_ID.fullmatch(text):
                return text
            why, again = f"HTTP {answer.status_code}", answer.status_code >= 500
            if answer.status_code == 200:
                why = f"answered {text[:20]!r}, not a Droplet id"
        again = again and attempt < ATTEMPTS and deadline.left() > METADATA_PAUSE + 1
        tail = "; asking again" if again else ""
        log(f"metadata service, attempt {attempt}/{ATTEMPTS}: {why}{tail}")
        if not again:
            return None
        sleep(METADATA_PAUSE)
    return None


def delete(s: Settings, path: str, scope: tuple[str, str], deadline: Deadline, sleep: Sleep) -> str:
    """DELETE an API object, retrying transient failures within the run's deadline; returns
    'deleted', 'gone' or an error for the log (the next minute's run tries again). scope:
    what is deleted and the token scope that call needs, named when DigitalOcean refuses."""
    delay = s.retry_delay
    result = "error: no time left in this run"
    for attempt in range(1, ATTEMPTS + 1):
        timeout = deadline.timeout(API_TIMEOUT)
        if timeout is None:
            return f"{result}; the next run tries again"
        wait = delay
        try:
            answer = digitalocean.delete(s.api_url, path, s.token, timeout)
        except Exception as err:  # noqa: BLE001 (network trouble of any kind: try again)
            result = f"error: {type(err).__name__}"
        else:
            status = answer.status_code
            if status in (200, 202, 204):
                return "deleted"
            if status == 404:
                return "gone"
            if status in (401, 403):
                return refused(status, scope)
            # Any other answer, a redirect too (never followed with the token): tried again.
            result = f"error: HTTP {status}"
            now = deadline.clock()
            asked = transport.retry_after_seconds(answer.headers.get("Retry-After"), now)
            if asked is not None:
                wait = asked
                result += f" (retry after {asked:g}s)"
        if attempt == ATTEMPTS:
            break
        if wait > deadline.left() - 1:
            return f"{result}; waiting {wait:g}s would pass this run's deadline: next run"
        log(f"delete attempt {attempt}/{ATTEMPTS} failed ({result}); retrying in {wait:g}s")
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


def delete_droplet(s: Settings, droplet: str, deadline: Deadline, sleep: Sleep) -> str:
    # The plain DELETE: the Droplet's associated resources, the cache Volume among them, stay
    # (only /destroy_with_associated_resources/* removes those; DigitalOcean API reference and
    # changelog "Destroy a Droplet with associated resources"), so the next Droplet starts warm.
    return delete(s, f"/v2/droplets/{droplet}", ("Droplets", DROPLET_SCOPE), deadline, sleep)


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


def remove(
    s: Settings, state: dict[str, Any], reason: str, deadline: Deadline, sleep: Sleep
) -> int:
    """Delete the endpoint's DNS record (if the program keeps one), then the other replicas,
    then this Droplet; 0 once DigitalOcean accepted this Droplet's delete."""
    droplet = droplet_id(s.metadata_url, deadline, sleep)
    if droplet is None:
        log(f"{reason}: but the metadata service gave no numeric Droplet id; not deleting")
        return 1
    remove_record(s, state, deadline, sleep)
    if not remove_peers(s, state, reason, deadline, sleep):
        return 1
    result = delete_droplet(s, droplet, deadline, sleep)
    log(f"delete droplet {droplet}: {reason}: {result}")
    if result not in ("deleted", "gone"):
        return 1
    state["deleted"] = True
    return 0


def remove_record(s: Settings, state: dict[str, Any], deadline: Deadline, sleep: Sleep) -> None:
    """The endpoint's A record first, so the name never points at an address DigitalOcean gives
    to someone else (who could then get a certificate for it). A failure keeps no Droplet."""
    record = dns_record(s.dns_record)
    if record is None or state["record_deleted"]:
        return
    zone, rid = record
    path = f"/v2/domains/{zone}/records/{rid}"
    done = delete(s, path, ("DNS records", RECORD_SCOPE), deadline, sleep)
    log(f"delete DNS record {rid} in {zone}: {done}")
    if done in ("deleted", "gone"):
        state["record_deleted"] = True
    else:
        log(
            "the endpoint's name still points at this Droplet's address; the Droplet goes "
            "anyway (it bills): run pulumi refresh, then pulumi up or pulumi destroy, to fix "
            "the record"
        )


def remove_peers(
    s: Settings, state: dict[str, Any], reason: str, deadline: Deadline, sleep: Sleep
) -> bool:
    """Delete each other replica by its id (with replicas); True once none is left. This
    Droplet runs the rule, so it goes last: while a peer's delete fails it stays, and the next
    run tries that peer again."""
    peers = peer_ids(s.peer_droplet_ids)
    if peers is None:
        log("AUTODOWN_PEER_DROPLET_IDS holds a value that is not a Droplet id; deleting nothing")
        return False
    done: list[str] = state["peers_deleted"]
    for peer in peers:
        if peer in done:
            continue
        result = delete_droplet(s, peer, deadline, sleep)
        log(f"delete replica droplet {peer}: {reason}: {result}")
        if result in ("deleted", "gone"):
            done.append(peer)
    left = [p for p in peers if p not in done]
    if left:
        waiting = " ".join(left)
        log(f"this Droplet stays until replicas {waiting} are gone; the next run tries again")
    return not left
