"""The endpoint's name in DigitalOcean DNS: with `access.dnsZone`, the program keeps the A record
of `access.domain` pointing at the Droplet, so a re-created Droplet keeps its name.

The record follows the Droplet's address: a replacement updates it in place (TTL 60 s, so
clients and the CA see the new address within a minute); the gateway phase waits for it,
because the CA checks the name right after Caddy starts. Without `dnsZone` the user points the
name; nothing here runs.
"""

from __future__ import annotations

import pulumi
import pulumi_digitalocean as digitalocean

from ..spec.schema import StackConfig
from .stack_config import StackConfigError

# Short, so that a re-created Droplet's address reaches resolvers (and the CA) quickly;
# DigitalOcean accepts 30 s and up.
RECORD_TTL = 60


def record_name(domain: str, zone: str) -> str:
    """The record's name inside its zone: `@` for the zone's apex."""
    return "@" if domain == zone else domain.removesuffix(f".{zone}")


def check_zone(cfg: StackConfig) -> None:
    """Fail before anything is created when the zone is not in this DigitalOcean account."""
    zone = cfg.access.dns_zone
    if zone is None:
        return
    try:
        digitalocean.get_domain(name=zone)
    except Exception as err:  # the provider fails the invoke for a domain not in the account
        raise StackConfigError(
            [
                f"access.dnsZone: {zone} is not a domain of this DigitalOcean account ({err}); add "
                "it under Networking > Domains (and delegate it to ns1.digitalocean.com), or unset "
                "access.dnsZone and point the A record yourself"
            ]
        ) from err


def endpoint_record(
    cfg: StackConfig, ipv4: pulumi.Input[str], parent: pulumi.Resource
) -> digitalocean.DnsRecord | None:
    """The A record of access.domain in access.dnsZone, pointing at the Droplet."""
    zone, domain = cfg.access.dns_zone, cfg.access.domain
    if zone is None or domain is None:
        return None
    return digitalocean.DnsRecord(
        "endpoint-record",
        domain=zone,
        type="A",
        name=record_name(domain, zone),
        value=ipv4,
        ttl=RECORD_TTL,
        opts=pulumi.ResourceOptions(parent=parent),
    )
