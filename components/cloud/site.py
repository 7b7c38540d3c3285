"""Where the endpoint goes and what it keeps, decided before anything is declared: the region
(an existing set stays where it is; a set whose GPU Droplets are gone stays where its Caddy front
is, or is refused; a new one goes where the size is offered, and where its cache Volume is if it
can), each replica's cache plan, and the entry's price and size checks. Every refusal here comes
before anything is created or billed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from ..spec import volume
from ..spec.schema import StackConfig
from . import cache, entry, region


@dataclass(frozen=True)
class Site:
    placement: region.Placement
    # Replica i's Droplet as DigitalOcean lists it now (None: not made yet, or deleted).
    live: list[region.Existing | None]
    # Replica i's cache Volume plan (a Volume attaches to one Droplet: one each).
    cache_plans: list[cache.Plan]
    # The Caddy balancer Droplet's hourly price (0: no Caddy entry).
    caddy_price: float


def plan_site(cfg: StackConfig) -> Site:
    """Place the set and plan its caches; refuse an entry the region cannot have."""
    live = [region.find_existing(cfg.replica_name(i), cfg.stack_tag) for i in range(cfg.replicas)]
    # Replica 0's region, or, with replica 0 gone (deleted by hand), where the others are.
    existing = next((e for e in live if e is not None), None)
    # The Caddy front this up keeps (a pooled stack behind Caddy), if it lives: its Droplet and
    # the Reserved IP assigned to it were made in the set's region, and region replaces both (a
    # new address, a new certificate, and a woken front's held requests cut). So while it lives
    # the set comes back in its region or not at all (after autodown or a scale to zero).
    caddy = cfg.pooled and cfg.balancer_kind == "caddy"
    front = entry.find_front(cfg) if caddy else None
    where = existing.region if existing else front.region if front else None
    found_cache = cache.find(cfg, where)
    # The cache Volumes beside a live front pin with it (named in a refusal). A kept Volume
    # with no front is a preference only (region.choose: its region first when it offers the
    # size): nothing else holds the address then, and a cold cache elsewhere (state `moved`)
    # beats no endpoint at all.
    beside = {0: found_cache}
    if front is not None:
        beside |= {i: cache.find(cfg, front.region, replica=i) for i in range(1, cfg.replicas)}
    pin = None
    if front is not None:
        volumes = [f"Volume {volume.volume_name(cfg, i)}" for i, found in beside.items()
                   if found is not None and found.region == front.region]  # fmt: skip
        holders = [f"front Droplet {front.id} ({cfg.balancer_name})", "its Reserved IP", *volumes]
        pin = region.Pin(front.region, f"{', '.join(holders[:-1])} and {holders[-1]}")
    placement = region.choose(
        cfg.droplet.size,
        cfg.droplet.regions,
        region.lookup(cfg.droplet.size),
        existing,
        cache_region=found_cache.region if found_cache else None,
        pin=pin,
    )

    def found_for(i: int) -> cache.Found | None:
        if i == 0 or (front is not None and placement.region == front.region):
            return beside[i]
        return cache.find(cfg, placement.region, replica=i)

    offers_volumes = cfg.cache.enabled and cache.region_offers_volumes(placement.region)
    cache_plans = [
        cache.plan(
            cfg,
            placement.region,
            found_for(i),
            offers_volumes,
            this.id if (this := live[i]) else None,
            replica=i,
        )
        for i in range(cfg.replicas)
    ]
    for i, each in enumerate(cache_plans):
        if each.state in ("moved", "unavailable"):
            pulumi.log.warn(f"cache{f' of replica {i}' if i else ''}: {each.note}")
    # The Caddy balancer's size must be sold where the replicas are.
    caddy_price = entry.caddy_price(cfg, placement.region) if caddy else 0.0
    # The managed Load Balancer's node count must be one DigitalOcean takes in that region.
    if cfg.pooled and cfg.balancer_kind == "managed":
        entry.lb_size(cfg, placement.region)
    return Site(placement, live, cache_plans, caddy_price)
