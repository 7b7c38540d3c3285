"""nemotron-droplet: a private OpenAI-compatible Nemotron endpoint on a DigitalOcean GPU Droplet.

Thin wiring only: validate the config (nothing is declared if it is wrong), place the size,
build the components, export what a user needs.
"""

import asyncio
from typing import Any, cast

import pulumi
import pulumi_random as random

from components import cache, catalog, config, dns, entry, gateway, pool, region
from components.bootstrap import Bootstrap, BootstrapArgs
from components.droplet import REPLACEMENT_NOTE, GpuDroplet, GpuDropletArgs, ssh_command

cfg = config.load()
dns.check_zone(cfg)
# An existing Droplet stays where it is; availability only places a new one, where the cache
# Volume is if it can.
existing = region.find_existing(cfg.droplet_name, cfg.stack_tag)
replicas_existing = [existing] + [
    region.find_existing(cfg.replica_name(i), cfg.stack_tag) for i in range(1, cfg.replicas)
]
if existing is None:  # replica 0 gone (deleted by hand): the set stays where the others are
    existing = next((e for e in replicas_existing if e is not None), None)
found_cache = cache.find(cfg, existing.region if existing else None)
placement = region.choose(
    cfg.droplet.size,
    cfg.droplet.regions,
    region.lookup(cfg.droplet.size),
    existing,
    cache_region=found_cache.region if found_cache else None,
)
cache_plan = cache.plan(
    cfg,
    placement.region,
    found_cache,
    cfg.cache.enabled and cache.region_offers_volumes(placement.region),
    existing.id if existing else None,
)
if cache_plan.state in ("moved", "unavailable"):
    pulumi.log.warn(f"cache: {cache_plan.note}")

# The Caddy balancer's size must be sold where the replicas are (checked before anything).
use_caddy = cfg.pooled and cfg.balancer_kind == "caddy"
caddy_price = entry.caddy_price(cfg, placement.region) if use_caddy else 0.0

# The key every request needs: given as a secret, or made once per stack.
api_key: pulumi.Output[str] = pulumi.Output.secret(
    config.api_key() or random.RandomPassword("api-key", length=48, special=False).result
)

# The entry in front of several replicas: DigitalOcean's Load Balancer or the Caddy Droplet.
managed: entry.ManagedEntry | None = None
caddy: entry.CaddyEntry | None = None
if cfg.pooled and cfg.balancer_kind == "managed":
    managed = entry.ManagedEntry("lb", cfg, placement.region)

gpus: list[GpuDroplet] = []
bootstraps: list[Bootstrap] = []


def rolling_gate(index: int) -> list[pulumi.Resource]:
    """What the next replica's restarts wait for: replica `index` ready and back in the pool."""
    gate: list[pulumi.Resource] = [bootstraps[index].commands["ready"]]
    if caddy is not None:
        gate.append(caddy.joins[index])
    return gate


# Replica 0's autodown watches the others, whose addresses exist only once they are declared.
peer_addresses: asyncio.Future[list[pulumi.Output[str]]] = asyncio.Future()
peers: pulumi.Output[list[str]] = pulumi.Output.from_input(cast(Any, peer_addresses)).apply(
    lambda ips: cast(Any, pulumi.Output.all(*ips))
)

for index in range(cfg.replicas):
    # Replica 0 keeps the names a lone Droplet has, so a stack grows without replacing it.
    suffix = "" if index == 0 else f"-{index}"
    live = replicas_existing[index]
    # Only a live set rolls (a new one starts all at once): this replica's Droplet is
    # re-created, and its vLLM restarted, once the replica before it is back in the pool.
    previous_live = index > 0 and replicas_existing[index - 1] is not None
    rolls = live is not None and previous_live
    gpu = GpuDroplet(
        f"gpu{suffix}",
        GpuDropletArgs(
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
            private_from_tags=[cfg.balancer_tag] if use_caddy else [],
            private_from_droplets=[gpus[0].droplet_id.apply(int)] if index > 0 else [],
            private_from_load_balancers=[managed.load_balancer_id] if managed else [],
            after=rolling_gate(index - 1)
            if rolls and live is not None and region.will_replace(live, cfg)
            else [],
            key_from=gpus[0] if index > 0 else None,
        ),
    )
    gpus.append(gpu)
    if index == 0:
        if use_caddy:
            # The balancer Droplet opens with replica 0's login key, like every replica.
            caddy = entry.CaddyEntry(
                "balancer", entry.CaddyEntryArgs(cfg, placement.region, api_key, key_from=gpu)
            )
        cache_volume = (
            cache.CacheVolume("cache", cfg, cache_plan, gpu.droplet_id)
            if cache_plan.create
            else None
        )
        # With a DigitalOcean DNS zone the name comes from its record, so the gateway (whose
        # certificate the CA checks against that name) waits until the record exists. With
        # replicas the name is the entry's.
        public_ipv4 = managed.ipv4 if managed else caddy.ipv4 if caddy else gpu.ipv4
        record = dns.endpoint_record(cfg, public_ipv4, parent=managed or caddy or gpu)
        if record is not None:
            hostname = record.fqdn.apply(lambda _: gateway.hostname(cfg, ""))
        elif caddy is not None:
            hostname = caddy.hostname
        else:
            hostname = gpu.ipv4.apply(lambda ip: gateway.hostname(cfg, ip))
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
            cache_device=cache.device_path(cfg) if cache_volume is not None else "",
            cache_attachment=cache_volume.attachment if cache_volume is not None else None,
            prefix=f"bootstrap{suffix}",
            replica=pool.Replica(index, cfg.replicas) if cfg.pooled else None,
            private_ip=gpu.ipv4_private if cfg.pooled else "",
            peers=peers if cfg.pooled and index == 0 else None,
            after_previous=rolling_gate(index - 1) if rolls else None,
        ),
    )
    bootstraps.append(bootstrap)
    if caddy is not None:
        caddy.join(index, gpu.ipv4_private, bootstrap.commands["ready"])
peer_addresses.set_result([g.ipv4_private for g in gpus[1:]])
if caddy is not None:
    caddy.ready(after=[caddy.joins[0]])

first = gpus[0]
pulumi.export("endpoint", hostname.apply(lambda host: gateway.endpoint(cfg, host)))
pulumi.export("endpointTls", cfg.access.https)
pulumi.export("certificate", hostname.apply(lambda host: entry.certificate(cfg, host)))
pulumi.export("apiKey", api_key)
pulumi.export("servedModelName", cfg.model.served_name)
pulumi.export("ipv4", first.ipv4)
pulumi.export("region", placement.region)
pulumi.export("size", cfg.droplet.size)
pulumi.export("placement", placement.reason)
pulumi.export("hourlyPriceUsd", entry.set_hourly_price(cfg, placement.price_hourly, caddy_price))
pulumi.export("dropletReplacement", entry.replacement_note(cfg, REPLACEMENT_NOTE))
pulumi.export(
    "cache",
    cache_volume.volume.id.apply(lambda volume_id: cache.output(cfg, cache_plan, volume_id))
    if cache_volume is not None
    else cache.output(cfg, cache_plan),
)
pulumi.export("cacheMonthlyPriceUsd", cache_plan.monthly_price_usd)
pulumi.export(
    "sshCommand",
    pulumi.Output.all(first.ipv4, first.host_public_key).apply(
        lambda v: ssh_command(cfg.stack, v[0], v[1])
    ),
)
pulumi.export("sshHostPublicKey", first.host_public_key)
pulumi.export("sshPrivateKey", first.private_key_openssh)
pulumi.export("bootstrapSeconds", bootstraps[0].seconds)
pulumi.export("bootstrapTimeline", bootstraps[0].timeline)
pulumi.export(
    "autodown",
    {
        "mode": cfg.autodown.mode,
        "idleMinutes": cfg.autodown.idle_minutes,
        "maxHours": cfg.autodown.max_hours,
    },
)
if cfg.pooled:

    def replica_output(index: int) -> pulumi.Output[dict[str, object]]:
        g, b = gpus[index], bootstraps[index]
        return pulumi.Output.all(g.ipv4, g.ipv4_private, g.host_public_key, b.seconds).apply(
            lambda v: entry.replica_output(cfg, index, v[0], v[1], v[2], v[3])
        )

    pulumi.export("replicas", [replica_output(i) for i in range(cfg.replicas)])
    pulumi.export(
        "balancer",
        entry.balancer_output(cfg, caddy_price)
        if caddy is None
        else pulumi.Output.all(caddy.host.ipv4, caddy.host.host_public_key).apply(
            lambda v: entry.balancer_output(cfg, caddy_price, v[0], v[1])
        ),
    )
if cfg.autodown.enabled and cfg.autodown.token is None:
    pulumi.log.warn(
        "autodown runs as a dry run (logs only) until it has a token that may delete Droplets: "
        "pulumi config set --secret --path autodown.token dop_v1_..."
    )
