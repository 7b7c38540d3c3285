"""Where the Droplet lives: kept where it is once it exists, chosen from live availability only
when one is created. One sizes-API lookup and one droplets lookup per deploy.

GPU availability is per size and changes from day to day, and a size can be listed as available
with no region at all (docs/facts.md), so a new Droplet's region is chosen at deploy time from the
user's preference list. But a region change forces a replacement in the provider: choosing again
on every `pulumi up` would move (delete and re-create) a live GPU Droplet the day its region
sells out, and a size offered nowhere would block every update. So the program first asks
DigitalOcean whether this stack's Droplet exists (its name and stack tag, among GPU Droplets),
and if it does with the configured size, keeps its region and takes its price.

A set whose GPU Droplets are all gone (autodown, scale to zero) is still pinned when its Caddy
front lives (site.py: the front Droplet, the Reserved IP assigned to it and the cache Volumes
share its region, and region forces a new one of each): it comes back there or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_digitalocean as digitalocean

from ..spec.schema import StackConfig
from .stack_config import StackConfigError


@dataclass(frozen=True)
class Offer:
    """What the sizes API says about one size."""

    slug: str
    available: bool
    regions: tuple[str, ...]
    price_hourly: float


@dataclass(frozen=True)
class Existing:
    """This stack's Droplet as DigitalOcean lists it."""

    id: str
    region: str
    size: str
    price_hourly: float
    image: str = ""


def will_replace(existing: Existing, cfg: StackConfig) -> bool:
    """Whether this `pulumi up` re-creates the Droplet: a new image (the provider forces a new
    one) or a new size (replace_on_changes, droplet.py: the provider would resize it in place);
    with replicas such a change rolls, one Droplet at a time."""
    return existing.size != cfg.droplet.size or bool(existing.image and existing.image != cfg.image)


@dataclass(frozen=True)
class Pin:
    """What holds a live set's region while no GPU replica is kept: the front and its address
    (and the cache Volumes beside them). Placing the set elsewhere would replace them all."""

    region: str
    # What pins it, for the placement reason and the refusal: "front Droplet 123
    # (nemotron-dev-lb), its Reserved IP, Volume nemotron-dev-cache".
    holders: str


@dataclass(frozen=True)
class Placement:
    region: str
    price_hourly: float
    # One line for the `placement` output: kept or chosen, and why.
    reason: str


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


def find_existing(name: str, stack_tag: str, *, gpus: bool = True) -> Existing | None:
    """This stack's Droplet, if it exists: named `name` and tagged `stack_tag`. GPU Droplets are
    hidden from a plain list, hence `gpus=True` (docs/facts.md: DO OpenAPI droplets_list); a CPU
    Droplet (the Caddy front) is in the plain list only, hence `gpus=False` for it."""
    kind = "GPU Droplets" if gpus else "Droplets"
    result = digitalocean.get_droplets(
        gpus=gpus,
        filters=[
            {"key": "name", "values": [name]},
            {"key": "tags", "values": [stack_tag]},
        ],
    )
    found = [d for d in result.droplets if d.name == name and stack_tag in (d.tags or [])]
    if len(found) > 1:
        pulumi.log.warn(
            f"{len(found)} {kind} are named {name} and tagged {stack_tag}: "
            f"{', '.join(f'{d.id} in {d.region}' for d in found)}; keeping the oldest one's "
            "region. Delete the strays in the control panel: each one is billed."
        )
        found.sort(key=lambda d: d.created_at or "")
    if not found:
        return None
    d = found[0]
    return Existing(
        id=str(d.id),
        region=d.region,
        size=d.size,
        price_hourly=float(d.price_hourly or 0),
        image=str(d.image or ""),
    )


def choose(
    size: str,
    preferred: list[str],
    offer: Offer | None,
    existing: Existing | None = None,
    cache_region: str | None = None,
    pin: Pin | None = None,
) -> Placement:
    """Keep an existing Droplet of this size where it is; else, with a live front (`pin`), its
    region or a refusal; else the first preferred region offering the size now (the existing
    Droplet's region first, if it offers the new size; then the cache Volume's, where a new
    Droplet starts warm), else an error saying where the size is."""
    if existing is not None and existing.size == size:
        if offer is not None and existing.region not in offer.regions:
            pulumi.log.info(
                f"{size} is not offered in {existing.region} for new Droplets today; the "
                f"existing Droplet {existing.id} stays there (a replacement would need a region "
                f"that offers it: {', '.join(sorted(offer.regions)) or 'none right now'})"
            )
        price = existing.price_hourly or (offer.price_hourly if offer else 0.0)
        return Placement(
            region=existing.region,
            price_hourly=price,
            reason=f"kept: Droplet {existing.id} exists in {existing.region}",
        )
    if offer is None:
        raise StackConfigError(
            [
                f"droplet.size: DigitalOcean does not list {size} for this account; GPU "
                "Droplets must be enabled on the account (control panel), or the size was retired"
            ]
        )
    if pin is not None:
        return pinned(size, offer, pin)
    if not offer.available or not offer.regions:
        raise StackConfigError(
            [
                f"droplet.size: {size} is listed but no region can create it right now; try again "
                "later or choose another size"
            ]
        )
    first = [
        r for r in (existing.region if existing else None, cache_region) if r and r in preferred
    ]
    order = list(dict.fromkeys([*first, *preferred]))
    for region in order:
        if region in offer.regions:
            why = f"{region} is the first of droplet.regions that offers {size} now"
            if region == cache_region and region != (existing.region if existing else None):
                why = f"{region} holds the cache Volume and offers {size} now"
            return Placement(
                region=region, price_hourly=offer.price_hourly, reason=f"chosen: {why}"
            )
    raise StackConfigError(
        [
            f"droplet.regions: {size} is not offered in {', '.join(preferred)}; it is offered in: "
            f"{', '.join(sorted(offer.regions))}. Add one of these to droplet.regions"
        ]
    )


def pinned(size: str, offer: Offer, pin: Pin) -> Placement:
    """The pinned region when it offers `size` today, whatever droplet.regions prefers; else a
    refusal before anything is created, one line (it is what the failed `pulumi up`, and so a
    woken front's held requests, show)."""
    offered = sorted(offer.regions) if offer.available else []
    if pin.region in offered:
        return Placement(
            region=pin.region,
            price_hourly=offer.price_hourly,
            reason=f"kept: {pin.holders} stay in {pin.region}, which offers {size} now",
        )
    raise StackConfigError(
        [
            f"droplet.size: {size} is not offered in {pin.region} today, where this stack's "
            f"{pin.holders} stay (offered in: {', '.join(offered) or 'none right now'}); wait "
            "and wake or up again, or `pulumi destroy` and up elsewhere (a new address)"
        ]
    )
