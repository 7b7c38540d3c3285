"""Where the size can be created right now, and what it costs: one sizes-API lookup per deploy.

GPU availability is per size and changes from day to day, and a size can be listed as available
with no region at all (FACTS.md), so the region is chosen at deploy time from the user's
preference list instead of being fixed in the stack file.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi_digitalocean as digitalocean

from .config import ConfigError


@dataclass(frozen=True)
class Offer:
    """What the sizes API says about one size."""

    slug: str
    available: bool
    regions: tuple[str, ...]
    price_hourly: float


@dataclass(frozen=True)
class Placement:
    region: str
    offer: Offer


def lookup(size: str) -> Offer | None:
    """Ask DigitalOcean about `size`: an invoke, so it runs in preview too, before any billing."""
    result = digitalocean.get_sizes(filters=[{"key": "slug", "values": [size]}])
    for s in result.sizes:
        if s.slug == size:
            return Offer(
                slug=s.slug,
                available=s.available,
                regions=tuple(s.regions),
                price_hourly=float(s.price_hourly),
            )
    return None


def choose(size: str, preferred: list[str], offer: Offer | None) -> Placement:
    """The first preferred region offering the size, else an error saying where it is."""
    if offer is None:
        raise ConfigError(
            [
                f"droplet.size: DigitalOcean does not list {size} for this account; GPU "
                "Droplets must be enabled on the account (control panel), or the size was retired"
            ]
        )
    if not offer.available or not offer.regions:
        raise ConfigError(
            [
                f"droplet.size: {size} is listed but no region can create it right now; try again "
                "later or choose another size"
            ]
        )
    for region in preferred:
        if region in offer.regions:
            return Placement(region=region, offer=offer)
    raise ConfigError(
        [
            f"droplet.regions: {size} is not offered in {', '.join(preferred)}; it is offered in: "
            f"{', '.join(sorted(offer.regions))}. Add one of these to droplet.regions"
        ]
    )
