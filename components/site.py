"""Where the endpoint goes and what it keeps, decided before anything is declared: the region
(an existing set stays where it is; a new one goes where the size is offered, and where its
cache Volume is if it can), each replica's cache plan, and the entry's price and size checks.
Every refusal here comes before anything is created or billed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from . import cache, entry, region
from .schema import StackConfig


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
    found_cache = cache.find(cfg, existing.region if existing else None)
    placement = region.choose(
        cfg.droplet.size,
        cfg.droplet.regions,
        region.lookup(cfg.droplet.size),
        existing,
        cache_region=found_cache.region if found_cache else None,
    )
    offers_volumes = cfg.cache.enabled and cache.region_offers_volumes(placement.region)
    cache_plans = [
        cache.plan(
            cfg,
            placement.region,
            found_cache if i == 0 else cache.find(cfg, placement.region, replica=i),
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
    caddy = cfg.pooled and cfg.balancer_kind == "caddy"
    caddy_price = entry.caddy_price(cfg, placement.region) if caddy else 0.0
    # The managed Load Balancer's node count must be one DigitalOcean takes in that region.
    if cfg.pooled and cfg.balancer_kind == "managed":
        entry.lb_size(cfg, placement.region)
    return Site(placement, live, cache_plans, caddy_price)
