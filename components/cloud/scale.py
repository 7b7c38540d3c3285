"""How many replicas this run declares, with autoscale: where the count lives.

The front's autoscaler (scripts/phases/wake.py) never holds a DigitalOcean token: a step is a
run of your pipeline with the count it wants (deploy.yml's `replicas` input, here
NEMOTRON_REPLICAS). Every other run (a push, a `pulumi up` by hand, a wake) passes none, and
then the count is what the cloud runs now, so no later run undoes a step: the replicas this
stack's Droplets are, counted by their names, kept within `autoscale.min` and `max`, so a step
never outlives a changed bound either. Counted as the highest index alive plus one: a replica
that died among the others is made again, and the highest leave first (their URNs go, the
others' stay).

A set with none alive (autodown deleted it) comes back with max(min, 1), as a stack without
autoscale does: the run is a wake, a push, or you asking for it; autodown's idle rule puts it
back to sleep.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_digitalocean as digitalocean

from ..spec import catalog
from ..spec.schema import AutoscaleConfig, StackConfig
from .stack_config import StackConfigError

# deploy.yml's `replicas` input, as the deploy job hands it to the program.
ENV = "NEMOTRON_REPLICAS"


@dataclass(frozen=True)
class Count:
    """This run's count and where it came from (the `autoscale` output says it)."""

    replicas: int
    # Replicas alive before this run (highest index + 1; 0: none).
    live: int
    source: Literal["asked", "live", "floor"]
    note: str


def decide(scale: AutoscaleConfig, live: int, asked: str | None) -> Count:
    """The count: the one a step asked for, else the live one, within [max(min, 1), max]."""
    assert scale.max is not None, "only with autoscale on"
    floor, ceiling = max(scale.min, 1), scale.max
    if asked is not None and asked.strip():
        text = asked.strip()
        if not re.fullmatch(r"[0-9]{1,3}", text):
            raise StackConfigError(
                [
                    f"{ENV} (deploy.yml's `replicas` input): {text[:20]!r}: accepted: a whole "
                    f"number of replicas, {floor} to {ceiling} (autoscale.min and max), or empty "
                    "to keep the live count"
                ]
            )
        wanted = int(text)
        kept, note = _within(
            wanted, floor, ceiling, f"asked for {wanted}", "autoscale.min (at least 1)"
        )
        return Count(kept, live, "asked", note)
    if live == 0:
        return Count(floor, 0, "floor", f"none alive: max(autoscale.min, 1) = {floor}")
    kept, note = _within(live, floor, ceiling, f"{live} alive", "autoscale.min")
    return Count(kept, live, "live", note)


def _within(count: int, floor: int, ceiling: int, note: str, floor_name: str) -> tuple[int, str]:
    """`count` moved inside [floor, ceiling], and the note saying so when it moved."""
    kept = min(max(count, floor), ceiling)
    if kept != count:
        note += f", kept within {'autoscale.max' if count > ceiling else floor_name}: {kept}"
    return kept, note


def live_count(cfg: StackConfig) -> int:
    """The highest index of this stack's replica Droplets alive, plus one (0: none): its GPU
    Droplets by their names, among those with the stack's tag (a lone Droplet made before
    autoscale was turned on has no replica tag, and is replica 0). GPU Droplets are listed
    with gpus=true only (docs/facts.md, DO OpenAPI droplets_list)."""
    result = digitalocean.get_droplets(
        gpus=True, filters=[{"key": "tags", "values": [cfg.stack_tag]}]
    )
    names = {cfg.replica_name(i): i for i in range(catalog.MAX_REPLICAS)}
    alive = [
        names[d.name]
        for d in result.droplets
        if d.name in names and cfg.stack_tag in (d.tags or [])
    ]
    return max(alive) + 1 if alive else 0


def resolve(cfg: StackConfig) -> tuple[StackConfig, Count | None]:
    """The stack's config with this run's count; without autoscale, as given."""
    if not cfg.autoscale.enabled:
        return cfg, None
    count = decide(cfg.autoscale, live_count(cfg), os.environ.get(ENV))
    pulumi.log.info(f"autoscale: {count.replicas} replica(s): {count.note}")
    return cfg.model_copy(update={"replicas": count.replicas}), count
