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
from dataclasses import dataclass, field
from typing import Any, cast

import pulumi
import pulumi_digitalocean as digitalocean

from ..host import gateway
from ..spec import catalog
from ..spec.schema import StackConfig
from ..spec.volume import device_path
from . import cache, dns, entry, region, stack_config
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
    """Declare the Droplet (or the replicas and their entry) and bootstrap each, replica by
    replica: its Droplet, its cache Volume, (replica 0) the entry and the endpoint's name, its
    bootstrap, its place in the Caddy pool."""
    use_caddy = cfg.pooled and cfg.balancer_kind == "caddy"
    # Replica 0's autodown watches the others and deletes them by id: both exist once they are
    # declared. Each peer is [droplet id, private address] (autodown.Peer).
    peer_list: asyncio.Future[list[pulumi.Output[list[str]]]] = asyncio.Future()
    peers: pulumi.Output[list[list[str]]] = pulumi.Output.from_input(cast(Any, peer_list)).apply(
        lambda each: cast(Any, pulumi.Output.all(*each))
    )
    built = _Set(
        cfg,
        placement,
        api_key,
        peers,
        managed=entry.ManagedEntry("lb", cfg, placement.region)
        if cfg.pooled and not use_caddy
        else None,
        # The replicas admit their gateway port from the balancer Droplet's tag: a resource,
        # so the firewalls that name it come after it exists.
        balancer_tag=entry.adopted_tag("balancer-tag", cfg.balancer_tag) if use_caddy else None,
    )
    for index in range(cfg.replicas):
        this = live[index]
        # Only a live set rolls: this replica waits for the one before when both exist.
        rolls = this is not None and index > 0 and live[index - 1] is not None
        replaced = rolls and this is not None and region.will_replace(this, cfg)
        gpu = built.droplet(index, after=built.rolling_gate(index - 1) if replaced else [])
        plan = cache_plans[index]
        volume = (
            cache.CacheVolume(f"cache{_suffix(index)}", cfg, plan, gpu.droplet_id, replica=index)
            if plan.create
            else None
        )
        built.cache_volumes.append(volume)
        if index == 0:
            built.name_the_endpoint(gpu, use_caddy)
        bootstrap = built.bootstrap(index, gpu, volume, rolls)
        if built.caddy is not None:
            built.caddy.join(index, gpu.ipv4_private, gpu.droplet_id, bootstrap.commands["ready"])
    peer_list.set_result([pulumi.Output.all(g.droplet_id, g.ipv4_private) for g in built.gpus[1:]])
    if built.caddy is not None:
        built.caddy.ready(after=[built.caddy.joins[0]])
    assert built.hostname is not None
    return Endpoint(built.gpus, built.bootstraps, built.hostname, built.cache_volumes,
                    built.caddy, built.managed)  # fmt: skip


def _suffix(index: int) -> str:
    """Replica 0 keeps a lone Droplet's names (gpu, cache, bootstrap): growing replaces none."""
    return "" if index == 0 else f"-{index}"


@dataclass
class _Set:
    """The set as build() declares it, replica by replica: what each next one reads."""

    cfg: StackConfig
    placement: region.Placement
    api_key: pulumi.Output[str]
    peers: pulumi.Output[list[list[str]]]
    managed: entry.ManagedEntry | None
    balancer_tag: digitalocean.Tag | None
    caddy: entry.CaddyEntry | None = None
    gpus: list[StackDroplet] = field(default_factory=list)
    bootstraps: list[Bootstrap] = field(default_factory=list)
    cache_volumes: list[cache.CacheVolume | None] = field(default_factory=list)
    record: digitalocean.DnsRecord | None = None
    hostname: pulumi.Output[str] | None = None

    def rolling_gate(self, index: int) -> list[pulumi.Resource]:
        """What the next replica waits for: replica `index` ready and back in the pool."""
        gate: list[pulumi.Resource] = [self.bootstraps[index].commands["ready"]]
        if self.caddy is not None:
            gate.append(self.caddy.joins[index])
        return gate

    def droplet(self, index: int, after: list[pulumi.Resource]) -> StackDroplet:
        """Replica `index`'s Droplet, its firewall open to what reaches it and nothing else."""
        cfg, first = self.cfg, self.gpus[0] if self.gpus else None
        gpu = StackDroplet(
            f"gpu{_suffix(index)}",
            StackDropletArgs(
                name=cfg.replica_name(index),
                size=cfg.droplet.size,
                region=self.placement.region,
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
                private_from_tags=[self.balancer_tag.name] if self.balancer_tag else [],
                private_from_droplets=[first.droplet_id.apply(int)] if first else [],
                private_from_load_balancers=[self.managed.load_balancer_id] if self.managed else [],
                after=after,
                key_from=first,
            ),
        )
        self.gpus.append(gpu)
        return gpu

    def name_the_endpoint(self, gpu: StackDroplet, use_caddy: bool) -> None:
        """Replica 0's: the Caddy entry (it opens with replica 0's login key, like every
        replica), the DNS record and the name the endpoint serves."""
        cfg = self.cfg
        if use_caddy:
            self.caddy = entry.CaddyEntry(
                "balancer",
                entry.CaddyEntryArgs(
                    cfg,
                    self.placement.region,
                    self.api_key,
                    key_from=gpu,
                ),
            )
        # With a DigitalOcean DNS zone the name comes from its record, so the gateway (whose
        # certificate the CA checks against that name) waits until the record exists. With
        # replicas the name is the entry's.
        caddy, managed = self.caddy, self.managed
        public_ipv4 = managed.ipv4 if managed else caddy.ipv4 if caddy else gpu.ipv4
        self.record = dns.endpoint_record(cfg, public_ipv4, parent=managed or caddy or gpu)
        if self.record is not None:
            self.hostname = self.record.fqdn.apply(lambda _: gateway.hostname(cfg, ""))
        elif caddy is not None:
            self.hostname = caddy.hostname
        else:
            self.hostname = gpu.ipv4.apply(lambda ip: gateway.hostname(cfg, ip))
        if caddy is not None:
            caddy.serve(self.hostname)

    def bootstrap(
        self, index: int, gpu: StackDroplet, volume: cache.CacheVolume | None, rolls: bool
    ) -> Bootstrap:
        """Replica `index`'s phases as Commands, after the one before when the set rolls."""
        cfg, record = self.cfg, self.record
        assert self.hostname is not None
        bootstrap = Bootstrap(
            f"bootstrap{_suffix(index)}",
            BootstrapArgs(
                config=cfg,
                ipv4=gpu.ipv4,
                private_key=gpu.private_key_openssh,
                host_public_key=gpu.host_public_key,
                droplet_id=gpu.droplet_id,
                api_key=self.api_key,
                hostname=self.hostname,
                hf_token=stack_config.hf_token(),
                # With replicas the name is the entry's, which autodown leaves in place.
                dns_record=(
                    pulumi.Output.concat(record.domain, " ", record.id)
                    if record is not None and not cfg.pooled
                    else ""
                ),
                cache_device=device_path(cfg, index) if volume is not None else "",
                cache_attachment=volume.attachment if volume is not None else None,
                cache_volume=volume.volume if volume is not None else None,
                cache_volume_size=volume.volume.size if volume is not None else None,
                prefix=f"bootstrap{_suffix(index)}",
                replica=index if cfg.pooled else None,
                private_ip=gpu.ipv4_private if cfg.pooled else "",
                # Replica 0's autodown reads each replica's /metrics (with the key); only it may.
                metrics_reader=self.gpus[0].ipv4_private if cfg.pooled else "",
                # The front's router renders each prompt on every replica; only it may.
                render_client=(
                    self.caddy.host.ipv4_private
                    if self.caddy is not None and cfg.routing == "cache-aware"
                    else ""
                ),
                peers=self.peers if cfg.pooled and index == 0 else None,
                after_previous=self.rolling_gate(index - 1) if rolls else None,
            ),
        )
        self.bootstraps.append(bootstrap)
        return bootstrap
