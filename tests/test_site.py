"""Where a set goes when its GPU Droplets are gone (site.plan_site, region.choose), under mocks:
a live Caddy front (its Droplet, the Reserved IP assigned to it, the cache Volumes beside it)
pins the region, and a size sold out there is refused before anything is created, never a
move (issue 32). A kept Volume with no front stays a preference."""

from __future__ import annotations

import json
from typing import Any

import pulumi_harness
import pytest
from pulumi_harness import (
    DEFAULT_OFFERS,
    DROPLETS_TOKEN,
    FakeCloud,
    Run,
    existing_droplet,
    existing_volume,
    offer,
    run_program,
)
from test_droplet import DROPLET, dev
from test_entry import ASSIGNMENT, RESERVED_IP, WAKE, live_set, of

from components.spec.config import ConfigError

GPU = "gpu-4000adax1-20gb"
FRONT_ID = 515151
BALANCER_TAG = "nemotron-dev:balancer"
AUTODOWN = {"idleMinutes": 30, "maxHours": 8}


class FrontCloud(FakeCloud):
    """The harness's account, with CPU Droplets too: DigitalOcean lists them without
    `type=gpus` (the harness's own list is of GPU Droplets only)."""

    def __init__(self, *args: Any, cpu_droplets: list[dict[str, Any]] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.cpu_droplets = cpu_droplets or []

    def _droplets(self, a: dict):
        if a.get("gpus") is True:
            return super()._droplets(a)

        def matches(d: dict, f: dict) -> bool:
            value = d.get(f["key"])
            values = value if isinstance(value, list) else [value]
            return any(str(v) in f["values"] for v in values)

        found = [d for d in self.cpu_droplets if all(matches(d, f) for f in a.get("filters", []))]
        return {"droplets": found, "id": "droplets"}, []


@pytest.fixture(autouse=True)
def cpu_droplets_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pulumi_harness, "FakeCloud", FrontCloud)


def front(region: str = "tor1", stack: str = "dev") -> dict[str, Any]:
    """The Caddy front's Droplet as the (plain, CPU) droplets list shows it."""
    d = existing_droplet(
        name=f"nemotron-{stack}-lb", region=region, size="s-1vcpu-1gb", stack=stack,
        price=0.00893, droplet_id=FRONT_ID,
    )  # fmt: skip
    return {**d, "tags": [*d["tags"], f"nemotron-{stack}:balancer"]}


def gpu_offered_in(*regions: str) -> dict[str, dict]:
    return {**DEFAULT_OFFERS, GPU: offer(GPU, list(regions), 0.76)}


def woken(**account: Any) -> Run:
    """The dev stack with wake on (one replica behind the front), its GPU Droplet gone."""
    return run_program(dev(autodown=AUTODOWN), secrets={"wake": json.dumps(WAKE)}, **account)


def cpu_lists(run: Run) -> int:
    return sum(1 for c in run.cloud.calls if c.token == DROPLETS_TOKEN and not c.args.get("gpus"))


def test_a_live_front_in_a_sold_out_region_refuses_the_wake_and_names_what_pins_it() -> None:
    run = woken(
        offers=gpu_offered_in("nyc2", "ams3"),
        cpu_droplets=[front("tor1")],
        tags=(BALANCER_TAG,),
    )
    assert isinstance(run.error, ConfigError), run.error
    [problem] = run.error.problems
    assert problem == (
        f"droplet.size: {GPU} is not offered in tor1 today, where this stack's front Droplet "
        f"{FRONT_ID} (nemotron-dev-lb) and its Reserved IP stay (offered in: ams3, nyc2); wait "
        "and wake or up again, or `pulumi destroy` and up elsewhere (a new address)"
    )
    assert "\n" not in problem and len(problem) < 300, "one line for an annotation"
    assert "nothing was created" in str(run.error)
    assert not of(run, DROPLET) and not of(run, RESERVED_IP), "refused before anything is declared"


def test_a_live_front_keeps_the_set_in_its_region_though_an_earlier_one_offers_the_size() -> None:
    # tor1 comes first in the dev stack's droplet.regions and offers the size again today.
    run = woken(
        offers=gpu_offered_in("tor1", "nyc2"),
        cpu_droplets=[front("nyc2")],
        tags=(BALANCER_TAG,),
    )
    assert run.error is None, run.error
    droplets = of(run, DROPLET)
    assert {name: d.inputs["region"] for name, d in droplets.items()} == {
        "gpu": "nyc2",
        "balancer": "nyc2",
    }
    assert of(run, RESERVED_IP)["balancer-ip"].inputs["region"] == "nyc2"
    assert of(run, ASSIGNMENT), "the address stays assigned to the front"
    assert run.outputs["region"].value == "nyc2"
    assert run.outputs["placement"].value == (
        f"kept: front Droplet {FRONT_ID} (nemotron-dev-lb) and its Reserved IP stay in nyc2, "
        f"which offers {GPU} now"
    )


def test_the_cache_volumes_beside_a_live_front_are_named_in_the_refusal() -> None:
    volumes = [
        existing_volume("nemotron-dev-cache", "tor1", 60, volume_id="vol-0"),
        existing_volume("nemotron-dev-1-cache", "tor1", 60, volume_id="vol-1"),
    ]
    run = run_program(
        {**dev(cache={"sizeGb": 60}), "replicas": 2},
        offers=gpu_offered_in("nyc2"),
        cpu_droplets=[front("tor1")],
        tags=(BALANCER_TAG,),
        volumes=volumes,
    )
    assert isinstance(run.error, ConfigError), run.error
    [problem] = run.error.problems
    assert (
        f"front Droplet {FRONT_ID} (nemotron-dev-lb), its Reserved IP, Volume nemotron-dev-cache "
        "and Volume nemotron-dev-1-cache stay"
    ) in problem, problem
    assert "offered in: nyc2" in problem


def test_a_size_change_with_a_live_front_is_refused_where_the_new_size_is_not_sold() -> None:
    # A live replica of the old size does not keep the region for the new one; the front does.
    offers = {**DEFAULT_OFFERS, "gpu-l40sx1-48gb": offer("gpu-l40sx1-48gb", ["nyc2"], 1.57)}
    run = run_program(
        {**dev(droplet={"size": "gpu-l40sx1-48gb"}), "replicas": 2},
        offers=offers,
        droplets=live_set(2),
        cpu_droplets=[front("tor1")],
        tags=(BALANCER_TAG, "nemotron-dev:replica"),
    )
    assert isinstance(run.error, ConfigError), run.error
    assert run.error.problems[0].startswith(
        "droplet.size: gpu-l40sx1-48gb is not offered in tor1 today"
    )


def test_a_kept_volume_alone_is_a_preference_not_a_pin() -> None:
    """No front holds the address (a lone Droplet, wake off): the Volume's region comes first
    while it offers the size, and the day it does not the Droplet goes where the size is, with
    a new, cold cache (state `moved`), rather than not at all."""
    kept = [existing_volume("nemotron-dev-cache", "nyc2", 60)]
    there = run_program(dev(cache={"sizeGb": 60}), volumes=kept)
    assert there.error is None, there.error
    assert there.outputs["region"].value == "nyc2"
    assert there.outputs["cache"].value["state"] == "kept"

    moved = run_program(dev(cache={"sizeGb": 60}), volumes=kept, offers=gpu_offered_in("tor1"))
    assert moved.error is None, moved.error
    assert moved.outputs["region"].value == "tor1"
    assert moved.outputs["cache"].value["state"] == "moved"
    assert cpu_lists(there) == cpu_lists(moved) == 0, "no front is looked for without one"


def test_a_new_set_is_placed_as_before_and_lists_no_cpu_droplets_until_a_front_was_made() -> None:
    fresh = woken()
    assert fresh.error is None, fresh.error
    assert fresh.outputs["region"].value == "tor1"
    assert fresh.outputs["placement"].value.startswith("chosen: tor1 is the first")
    assert cpu_lists(fresh) == 0, "no balancer tag: no front ever, no list"
    # The tag outlives a destroyed front (it is never deleted): the list finds none, and the
    # set is placed as a new one, where the size is offered.
    after_destroy = woken(tags=(BALANCER_TAG,), offers=gpu_offered_in("nyc2"))
    assert after_destroy.error is None, after_destroy.error
    assert after_destroy.outputs["region"].value == "nyc2"
    assert cpu_lists(after_destroy) == 1
