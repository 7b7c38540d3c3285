"""The cache Volume: block storage that outlives the Droplet, so a re-created one serves in minutes.

It holds what every new Droplet would otherwise download or build again: the weights (the HF
cache), the conda envs (vLLM's keyed by its lock) and vLLM's compile caches. The bootstrap's
cache phase formats it only when it is new and binds its folders where the phases already look;
the vllm and model phases then find their work done and say so.

Its life is the user's to decide and see: autodown deletes the Droplet and never the Volume (a
plain Droplet delete detaches it); `pulumi destroy` deletes it unless `cache.keepOnDestroy`, and
then the next `pulumi up` of the stack finds it by name and adopts it (Pulumi imports only when
the resource is not in the state already: pkg/resource/deploy/step_generator.go, isImport). A
Volume lives in one region and attaches only there: a Droplet that must go elsewhere (its size
sold out where the cache is) gets a new, cold cache there, and the `cache` output says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_digitalocean as digitalocean

from ..spec import catalog
from ..spec.schema import StackConfig
from ..spec.volume import volume_name
from .stack_config import StackConfigError

DESCRIPTION = f"{catalog.PROJECT} cache: weights, conda envs, vLLM compile caches"


@dataclass(frozen=True)
class Found:
    """This stack's cache Volume as DigitalOcean lists it."""

    id: str
    region: str
    size_gb: int
    droplet_ids: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """What this `pulumi up` does with the cache, decided before anything is created."""

    # Make (or keep) a Volume in `region`; False: no cache on this Droplet.
    create: bool
    region: str
    size_gb: int
    # The id of a Volume to adopt (kept by an earlier destroy); None: make a new one.
    adopt: str | None
    # new | kept | moved | unavailable | off: the `cache` output's `state`.
    state: str
    # One or two sentences for the output and the log: what happens and why.
    note: str

    @property
    def monthly_price_usd(self) -> float:
        return round(self.size_gb * catalog.VOLUME_PRICE_GIB_MONTH, 2) if self.create else 0.0


def _lookup(name: str, region: str | None) -> Found | None:
    kwargs: dict[str, Any] = {"name": name}
    if region is not None:
        kwargs["region"] = region
    try:
        v = digitalocean.get_volume(**kwargs)
    except Exception as err:  # the data source fails when no Volume (or several) has the name
        if "no volumes found" in str(err):
            return None
        raise
    return Found(
        id=v.id,
        region=v.region or region or "",
        size_gb=int(v.size),
        droplet_ids=tuple(int(d) for d in v.droplet_ids or ()),
    )


def find(cfg: StackConfig, preferred_region: str | None = None, replica: int = 0) -> Found | None:
    """This stack's cache Volume (replica `replica`'s: each replica has its own), if
    DigitalOcean has one: the one Pulumi manages, or one an earlier `pulumi destroy` kept.
    Volume names are unique per region only: with one in several regions (a move kept the old
    one), the one in `preferred_region`, else the first of droplet.regions that has one."""
    if not cfg.cache.enabled:
        return None
    name = volume_name(cfg, replica)
    try:
        return _lookup(name, None)
    except Exception as err:
        if "too many volumes found" not in str(err):
            raise
    regions = [r for r in [preferred_region, *cfg.droplet.regions] if r]
    for region in dict.fromkeys(regions):
        found = _lookup(name, region)
        if found is not None:
            return found
    return None


def region_offers_volumes(region: str) -> bool:
    """Whether DigitalOcean sells Volumes in `region` (its features list "storage")."""
    return catalog.VOLUME_REGION_FEATURE in (digitalocean.get_region(slug=region).features or [])


def plan(
    cfg: StackConfig,
    region: str,
    found: Found | None,
    offers_volumes: bool,
    droplet_id: str | None = None,
    replica: int = 0,
) -> Plan:
    """Decide the cache for a Droplet placed in `region` (`droplet_id`: this stack's Droplet,
    when it exists; `replica`: which replica's cache)."""
    want = cfg.cache.size_gb
    if want is None:
        return Plan(False, region, 0, None, "off", "no cache: cache.sizeGb is unset")
    name = volume_name(cfg, replica)
    others = [d for d in (found.droplet_ids if found else ()) if str(d) != droplet_id]
    if found is not None and others:
        # A Volume attaches to one Droplet: taking it would fail half-way, after the bill began.
        raise StackConfigError(
            [
                f"cache.sizeGb: the Volume {name} ({found.id}, {found.region}) is attached to "
                f"Droplet {others[0]}, which is not this stack's; detach it in the control "
                "panel (Volumes), or give this stack another droplet.name (the Volume's name "
                "follows it)"
            ]
        )
    if not offers_volumes:
        return Plan(
            False,
            region,
            want,
            None,
            "unavailable",
            f"unusable: DigitalOcean sells no Volumes in {region}, where the Droplet is placed; "
            "it runs without a cache (every re-create downloads again). Put a region with "
            "Volumes first in droplet.regions to have one",
        )
    if found is None:
        return Plan(True, region, want, None, "new", f"new: {name} is made in {region}, empty")
    if found.region != region:
        left = (
            f"the Volume in {found.region} ({found.id}) is kept and still billed: delete it "
            f"with `doctl compute volume delete {found.id}` once it is no longer wanted"
            if cfg.cache.keep_on_destroy
            else f"the Volume in {found.region} is replaced"
        )
        return Plan(
            True,
            region,
            want,
            None,
            "moved",
            f"unusable: the cache {name} is in {found.region}, but the Droplet "
            + (
                f"exists in {region} and stays there"
                if droplet_id
                else f"is placed in {region} ({cfg.droplet.size} is not offered in "
                f"{found.region} now, or droplet.regions no longer lists it)"
            )
            + f"; a Volume attaches only in its own region, so a new, empty one is made in "
            f"{region}, and {left}",
        )
    size = want
    notes = [f"kept: {name} in {region} is reused ({found.size_gb} GiB)"]
    if found.size_gb > want:
        size = found.size_gb
        notes.append(
            f"cache.sizeGb is {want} but a Volume never shrinks: it stays at {found.size_gb} "
            "GiB (to shrink it, unset cache.sizeGb, pulumi up, then set it again: a new, "
            "empty one)"
        )
    elif found.size_gb < want and not found.droplet_ids:
        # A detached Volume may be one this stack's state does not hold (kept by a destroy):
        # adopting it needs its inputs to match what DigitalOcean has; it grows next time.
        size = found.size_gb
        notes.append(
            f"it is attached at its {found.size_gb} GiB first and grows to {want} GiB on the "
            "next pulumi up"
        )
    return Plan(True, region, size, found.id, "kept", "; ".join(notes))


class CacheVolume(pulumi.ComponentResource):
    """The cache Volume in the Droplet's region and its attachment to the Droplet."""

    volume: digitalocean.Volume
    attachment: digitalocean.VolumeAttachment

    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        cache_plan: Plan,
        droplet_id: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
        replica: int = 0,
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:index:CacheVolume", name, None, opts)
        # No initial filesystem: the cache phase formats it only when it finds it empty, and an
        # adopted Volume's inputs must match what DigitalOcean reports (filesystem_type is
        # reported, not set here). Replacing the Droplet leaves this untouched: nothing here
        # depends on it.
        self.volume = digitalocean.Volume(
            name,
            name=volume_name(cfg, replica),
            region=cache_plan.region,
            size=cache_plan.size_gb,
            description=DESCRIPTION,
            tags=[catalog.PROJECT, cfg.stack_tag],
            opts=pulumi.ResourceOptions(
                parent=self,
                retain_on_delete=cfg.cache.keep_on_destroy,
                import_=cache_plan.adopt,
            ),
        )
        # Attached through its own resource, never the Droplet's volume_ids (the two together
        # drift: provider docs, VolumeAttachment). A new Droplet gets a new attachment.
        self.attachment = digitalocean.VolumeAttachment(
            f"{name}-attachment",
            droplet_id=pulumi.Output.from_input(droplet_id).apply(int),
            volume_id=self.volume.id,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"volumeId": self.volume.id})


def output(
    cfg: StackConfig, cache_plan: Plan, volume_id: str = "", replica: int = 0
) -> dict[str, Any]:
    """The `cache` stack output (a replica's, with replicas): what the cache is, what it
    costs, and why."""
    if cache_plan.state == "off":
        return {"state": "off", "monthlyPriceUsd": 0.0, "note": cache_plan.note}
    out: dict[str, Any] = {
        "state": cache_plan.state,
        "volume": volume_name(cfg, replica) if cache_plan.create else None,
        "volumeId": volume_id or None,
        "region": cache_plan.region,
        "sizeGb": cache_plan.size_gb if cache_plan.create else 0,
        "monthlyPriceUsd": cache_plan.monthly_price_usd,
        "keepOnDestroy": cfg.cache.keep_on_destroy,
        "note": cache_plan.note,
    }
    if cache_plan.create and cfg.cache.keep_on_destroy:
        out["deleteCommand"] = f"doctl compute volume delete {volume_id or '<volumeId>'}"
    return out
