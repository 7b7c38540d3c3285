"""nemotron-droplet: a private OpenAI-compatible Nemotron endpoint on a DigitalOcean GPU Droplet.

Thin wiring only: validate the config (nothing is declared if it is wrong), place the size,
build the components, export what a user needs.
"""

import pulumi
import pulumi_random as random

from components import cache, config, dns, endpoint, entry, gateway, region
from components.droplet import REPLACEMENT_NOTE, ssh_command

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
    replicas_existing[0].id if replicas_existing[0] else None,
)
# Each replica has a cache of its own (a Volume attaches to one Droplet), in the set's region.
offers_volumes = cfg.cache.enabled and cache.region_offers_volumes(placement.region)
cache_plans = [cache_plan] + [
    cache.plan(
        cfg,
        placement.region,
        cache.find(cfg, placement.region, replica=i),
        offers_volumes,
        live.id if (live := replicas_existing[i]) else None,
        replica=i,
    )
    for i in range(1, cfg.replicas)
]
for i, each in enumerate(cache_plans):
    if each.state in ("moved", "unavailable"):
        pulumi.log.warn(f"cache{f' of replica {i}' if i else ''}: {each.note}")

# The Caddy balancer's size must be sold where the replicas are (checked before anything).
caddy_price = (
    entry.caddy_price(cfg, placement.region) if cfg.pooled and cfg.balancer_kind == "caddy" else 0.0
)
# The managed Load Balancer's node count must be one DigitalOcean takes in that region.
if cfg.pooled and cfg.balancer_kind == "managed":
    entry.lb_size(cfg, placement.region)

# The key every request needs: given as a secret, or made once per stack.
api_key: pulumi.Output[str] = pulumi.Output.secret(
    config.api_key() or random.RandomPassword("api-key", length=48, special=False).result
)

built = endpoint.build(cfg, placement, cache_plans, replicas_existing, api_key)
gpus, bootstraps, hostname = built.gpus, built.bootstraps, built.hostname

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
pulumi.export("cache", endpoint.cache_output(cfg, cache_plans, built, 0))
pulumi.export("cacheMonthlyPriceUsd", round(sum(p.monthly_price_usd for p in cache_plans), 2))
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
    pulumi.export("replicas", endpoint.replica_outputs(cfg, cache_plans, built))
    pulumi.export("balancer", endpoint.balancer_output(cfg, built, caddy_price))
if cfg.autodown.enabled and cfg.autodown.token is None:
    pulumi.log.warn(
        "autodown runs as a dry run (logs only) until it has a token that may delete Droplets: "
        "pulumi config set --secret --path autodown.token dop_v1_..."
    )
