"""The endpoint's Droplets: one, or a set of replicas behind an entry, in the order that makes
a live set roll. A plain function, not a component: every resource keeps the name (and URN) a
lone Droplet's stack gave it, so growing a stack replaces nothing.

Only a live set rolls (a new one starts all at once): replica K+1's Droplet is re-created, and
its reboot and vLLM restart run, once replica K is ready and back in the pool. The ordering is
`depends_on`, which the Pulumi SDK resolves by awaiting each dependency's URN, and a custom
resource's URN resolves only when its step is done (pulumi runtime/rpc.py _add_dependency), so a
replacement of K+1 is not even sent to the engine before K is back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import pulumi

from ..host import gateway
from ..spec import catalog, config
from ..spec.schema import StackConfig
from . import cache, dns, entry, region
from .bootstrap import Bootstrap, BootstrapArgs
from .droplet import StackDroplet, StackDropletArgs


@dataclass
class Endpoint:
    """What the outputs read: the Droplets and their bootstraps in replica order, the entry
    (with replicas), the cache Volume and the name the endpoint serves."""

    gpus: list[StackDroplet]
    bootstraps: list[Bootstrap]
    hostname: pulumi.Output[str]
    # Each replica's own cache Volume (a Volume attaches to one Droplet), None without one.
    cache_volumes: list[cache.CacheVolume | None]
    caddy: entry.CaddyEntry | None
    managed: entry.ManagedEntry | None


def build(
    cfg: StackConfig,
    placement: region.Placement,
    cache_plans: list[cache.Plan],
    live: list[region.Existing | None],
    api_key: pulumi.Output[str],
) -> Endpoint:
    """Declare the Droplet (or the replicas and their entry) and bootstrap each."""
    use_caddy = cfg.pooled and cfg.balancer_kind == "caddy"
    managed = (
        entry.ManagedEntry("lb", cfg, placement.region) if cfg.pooled and not use_caddy else None
    )
    caddy: entry.CaddyEntry | None = None
    gpus: list[StackDroplet] = []
    bootstraps: list[Bootstrap] = []
    cache_volumes: list[cache.CacheVolume | None] = []
    record = None
    hostname: pulumi.Output[str] | None = None
    # The replicas admit their gateway port from the balancer Droplet's tag: a resource, so
    # the firewalls that name it come after it exists.
    balancer_tag = entry.adopted_tag("balancer-tag", cfg.balancer_tag) if use_caddy else None

    def rolling_gate(index: int) -> list[pulumi.Resource]:
        """What the next replica waits for: replica `index` ready and back in the pool."""
        gate: list[pulumi.Resource] = [bootstraps[index].commands["ready"]]
        if caddy is not None:
            gate.append(caddy.joins[index])
        return gate

    # Replica 0's autodown watches the others and deletes them by id: both exist once they are
    # declared. Each peer is [droplet id, private address] (autodown.Peer).
    peer_list: asyncio.Future[list[pulumi.Output[list[str]]]] = asyncio.Future()
    peers: pulumi.Output[list[list[str]]] = pulumi.Output.from_input(cast(Any, peer_list)).apply(
        lambda each: cast(Any, pulumi.Output.all(*each))
    )

    for index in range(cfg.replicas):
        suffix = "" if index == 0 else f"-{index}"
        this = live[index]
        rolls = this is not None and index > 0 and live[index - 1] is not None
        gpu = StackDroplet(
            f"gpu{suffix}",
            StackDropletArgs(
                name=cfg.replica_name(index),
                size=cfg.droplet.size,
                region=placement.region,
                image=cfg.image,
                tags=[*cfg.tags, cfg.replica_tag] if cfg.pooled else cfg.tags,
                monitoring=cfg.droplet.monitoring,
                ssh_cidrs=cfg.access.ssh_cidrs,
                # A replica has no public API: only the entry reaches its private gateway.
                api_cidrs=[] if cfg.pooled else cfg.access.api_cidrs,
                api_port=gateway.api_port(cfg),
                acme_port=gateway.HTTP_PORT if cfg.access.https and not cfg.pooled else None,
                extra_ssh_keys=cfg.access.ssh_key_fingerprints,
                private_port=catalog.REPLICA_PORT if cfg.pooled else None,
                private_from_tags=[balancer_tag.name] if balancer_tag else [],
                private_from_droplets=[gpus[0].droplet_id.apply(int)] if index > 0 else [],
                private_from_load_balancers=[managed.load_balancer_id] if managed else [],
                after=rolling_gate(index - 1)
                if rolls and this is not None and region.will_replace(this, cfg)
                else [],
                key_from=gpus[0] if index > 0 else None,
            ),
        )
        gpus.append(gpu)
        plan = cache_plans[index]
        cache_volume = (
            cache.CacheVolume(f"cache{suffix}", cfg, plan, gpu.droplet_id, replica=index)
            if plan.create
            else None
        )
        cache_volumes.append(cache_volume)
        if index == 0:
            if use_caddy:
                # The balancer Droplet opens with replica 0's login key, like every replica.
                caddy = entry.CaddyEntry(
                    "balancer",
                    entry.CaddyEntryArgs(cfg, placement.region, api_key, key_from=gpu),
                )
            # With a DigitalOcean DNS zone the name comes from its record, so the gateway
            # (whose certificate the CA checks against that name) waits until the record
            # exists. With replicas the name is the entry's.
            public_ipv4 = managed.ipv4 if managed else caddy.ipv4 if caddy else gpu.ipv4
            record = dns.endpoint_record(cfg, public_ipv4, parent=managed or caddy or gpu)
            if record is not None:
                hostname = record.fqdn.apply(lambda _: gateway.hostname(cfg, ""))
            elif caddy is not None:
                hostname = caddy.hostname
            else:
                hostname = gpu.ipv4.apply(lambda ip: gateway.hostname(cfg, ip))
            if caddy is not None:
                caddy.serve(hostname)
        assert hostname is not None
        bootstrap = Bootstrap(
            f"bootstrap{suffix}",
            BootstrapArgs(
                config=cfg,
                ipv4=gpu.ipv4,
                private_key=gpu.private_key_openssh,
                host_public_key=gpu.host_public_key,
                droplet_id=gpu.droplet_id,
                api_key=api_key,
                hostname=hostname,
                hf_token=config.hf_token(),
                # With replicas the name is the entry's, which autodown leaves in place.
                dns_record=(
                    pulumi.Output.concat(record.domain, " ", record.id)
                    if record is not None and not cfg.pooled
                    else ""
                ),
                cache_device=cache.device_path(cfg, index) if cache_volume is not None else "",
                cache_attachment=cache_volume.attachment if cache_volume is not None else None,
                cache_volume=cache_volume.volume if cache_volume is not None else None,
                cache_volume_size=cache_volume.volume.size if cache_volume is not None else None,
                prefix=f"bootstrap{suffix}",
                replica=index if cfg.pooled else None,
                private_ip=gpu.ipv4_private if cfg.pooled else "",
                # Replica 0's autodown reads each replica's /metrics; only it may.
                metrics_reader=gpus[0].ipv4_private if cfg.pooled else "",
                peers=peers if cfg.pooled and index == 0 else None,
                after_previous=rolling_gate(index - 1) if rolls else None,
            ),
        )
        bootstraps.append(bootstrap)
        if caddy is not None:
            caddy.join(index, gpu.ipv4_private, gpu.droplet_id, bootstrap.commands["ready"])
    peer_list.set_result([pulumi.Output.all(g.droplet_id, g.ipv4_private) for g in gpus[1:]])
    if caddy is not None:
        caddy.ready(after=[caddy.joins[0]])
    assert hostname is not None
    return Endpoint(gpus, bootstraps, hostname, cache_volumes, caddy, managed)
