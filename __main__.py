"""nemotron-droplet: a private OpenAI-compatible Nemotron endpoint on a DigitalOcean GPU Droplet.

Thin wiring only: validate the config (nothing is declared if it is wrong), place the size,
build the components, export what a user needs.
"""

import pulumi
import pulumi_random as random

from components import cache, config, dns, gateway, region
from components.bootstrap import Bootstrap, BootstrapArgs
from components.droplet import REPLACEMENT_NOTE, GpuDroplet, GpuDropletArgs, ssh_command

cfg = config.load()
dns.check_zone(cfg)
# An existing Droplet stays where it is; availability only places a new one, where the cache
# Volume is if it can.
existing = region.find_existing(cfg.droplet_name, cfg.stack_tag)
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

gpu = GpuDroplet(
    "gpu",
    GpuDropletArgs(
        name=cfg.droplet_name,
        size=cfg.droplet.size,
        region=placement.region,
        image=cfg.image,
        tags=cfg.tags,
        monitoring=cfg.droplet.monitoring,
        ssh_cidrs=cfg.access.ssh_cidrs,
        api_cidrs=cfg.access.api_cidrs,
        api_port=gateway.api_port(cfg),
        acme_port=gateway.HTTP_PORT if cfg.access.https else None,
        extra_ssh_keys=cfg.access.ssh_key_fingerprints,
    ),
)

cache_volume = (
    cache.CacheVolume("cache", cfg, cache_plan, gpu.droplet_id) if cache_plan.create else None
)

# The key every request needs: given as a secret, or made once per stack.
api_key: pulumi.Output[str] = pulumi.Output.secret(
    config.api_key() or random.RandomPassword("api-key", length=48, special=False).result
)
# With a DigitalOcean DNS zone the name comes from its record, so the gateway (whose certificate
# the CA checks against that name) waits until the record exists.
record = dns.endpoint_record(cfg, gpu.ipv4, parent=gpu)
hostname = (
    record.fqdn.apply(lambda _: gateway.hostname(cfg, ""))
    if record is not None
    else gpu.ipv4.apply(lambda ip: gateway.hostname(cfg, ip))
)

bootstrap = Bootstrap(
    "bootstrap",
    BootstrapArgs(
        config=cfg,
        ipv4=gpu.ipv4,
        private_key=gpu.private_key_openssh,
        host_public_key=gpu.host_public_key,
        droplet_id=gpu.droplet_id,
        api_key=api_key,
        hostname=hostname,
        hf_token=config.hf_token(),
        dns_record=(
            pulumi.Output.concat(record.domain, " ", record.id) if record is not None else ""
        ),
        cache_device=cache.device_path(cfg) if cache_volume is not None else "",
        cache_attachment=cache_volume.attachment if cache_volume is not None else None,
    ),
)

pulumi.export("endpoint", hostname.apply(lambda host: gateway.endpoint(cfg, host)))
pulumi.export("endpointTls", cfg.access.https)
pulumi.export("certificate", hostname.apply(lambda host: gateway.certificate(cfg, host)))
pulumi.export("apiKey", api_key)
pulumi.export("servedModelName", cfg.model.served_name)
pulumi.export("ipv4", gpu.ipv4)
pulumi.export("region", placement.region)
pulumi.export("size", cfg.droplet.size)
pulumi.export("placement", placement.reason)
pulumi.export("hourlyPriceUsd", placement.price_hourly)
pulumi.export("dropletReplacement", REPLACEMENT_NOTE)
pulumi.export(
    "cache",
    cache_volume.volume.id.apply(lambda volume_id: cache.output(cfg, cache_plan, volume_id))
    if cache_volume is not None
    else cache.output(cfg, cache_plan),
)
pulumi.export("cacheMonthlyPriceUsd", cache_plan.monthly_price_usd)
pulumi.export(
    "sshCommand",
    pulumi.Output.all(gpu.ipv4, gpu.host_public_key).apply(
        lambda v: ssh_command(cfg.stack, v[0], v[1])
    ),
)
pulumi.export("sshHostPublicKey", gpu.host_public_key)
pulumi.export("sshPrivateKey", gpu.private_key_openssh)
pulumi.export("bootstrapSeconds", bootstrap.seconds)
pulumi.export("bootstrapTimeline", bootstrap.timeline)
pulumi.export(
    "autodown",
    {
        "mode": cfg.autodown.mode,
        "idleMinutes": cfg.autodown.idle_minutes,
        "maxHours": cfg.autodown.max_hours,
    },
)
if cfg.autodown.enabled and cfg.autodown.token is None:
    pulumi.log.warn(
        "autodown runs as a dry run (logs only) until it has a token that may delete Droplets: "
        "pulumi config set --secret --path autodown.token dop_v1_..."
    )
