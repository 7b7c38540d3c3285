"""Where the Droplet lives (components/cloud/region.py), under Pulumi's mocks: a new one in the
first preferred region that offers the size (one sizes lookup, one droplets lookup), a refusal
that lists where the size is offered, and on day 2 an existing Droplet kept where it is (and its
price its own) while availability moves, even when its size is offered nowhere; another stack's
Droplet never taken for this one; a new size placed from availability, the current region
first. The program and its fakes are test_droplet.py's."""

from __future__ import annotations

import pytest
from pulumi_harness import (
    DROPLETS_TOKEN,
    FAKE_DROPLET_ID,
    SIZES_TOKEN,
    existing_droplet,
    offer,
    run_program,
)
from test_droplet import DROPLET, dev

from components.spec.config import ConfigError


def test_region_is_the_first_preferred_one_that_offers_the_size() -> None:
    offers = {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["ams3", "atl1", "nyc2"])}
    run = run_program(dev(droplet={"regions": ["tor1", "nyc2", "atl1"]}), offers=offers)
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "nyc2"
    assert sorted(c.token for c in run.cloud.calls) == [DROPLETS_TOKEN, SIZES_TOKEN]
    sizes = next(c for c in run.cloud.calls if c.token == SIZES_TOKEN)
    assert sizes.args["filters"] == [{"key": "slug", "values": ["gpu-4000adax1-20gb"]}]


def test_no_preferred_region_lists_where_the_size_is_offered() -> None:
    offers = {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["sfo3", "atl1"])}
    run = run_program(dev(droplet={"regions": ["tor1", "nyc2"]}), offers=offers)
    assert isinstance(run.error, ConfigError)
    assert run.error.problems == [
        "droplet.regions: gpu-4000adax1-20gb is not offered in tor1, nyc2; it is offered in: "
        "atl1, sfo3. Add one of these to droplet.regions"
    ]
    assert run.registrations == []


@pytest.mark.parametrize(
    "offers",
    [
        {},
        {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", [])},
        {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["tor1"], available=False)},
    ],
)
def test_size_offered_nowhere_fails_before_anything_is_declared(offers: dict) -> None:
    run = run_program(dev(), offers=offers)
    assert isinstance(run.error, ConfigError)
    assert run.error.problems[0].startswith("droplet.size: ")
    assert run.registrations == []


def test_an_existing_droplet_stays_where_it_is_when_availability_moves() -> None:
    """The first-choice region sold out since the Droplet was made: a routine update must not
    move (replace) it, and its price comes from the Droplet itself."""
    offers = {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["ams3"], 0.80)}
    mine = existing_droplet(region="tor1", price=0.76)
    run = run_program(dev(vllm={"maxModelLen": 16384}), offers=offers, droplets=[mine])
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "tor1"
    assert run.outputs["region"].value == "tor1"
    assert run.outputs["hourlyPriceUsd"].value == 0.76
    assert run.outputs["placement"].value == f"kept: Droplet {FAKE_DROPLET_ID} exists in tor1"
    lookup = next(c for c in run.cloud.calls if c.token == DROPLETS_TOKEN)
    assert lookup.args["gpus"] is True
    assert lookup.args["filters"] == [
        {"key": "name", "values": ["nemotron-dev"]},
        {"key": "tags", "values": ["stack:dev"]},
    ]


@pytest.mark.parametrize(
    "offers",
    [{}, {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", [])}],
    ids=["size-not-listed", "offered-nowhere"],
)
def test_an_existing_droplet_keeps_updating_when_its_size_is_offered_nowhere(offers: dict) -> None:
    run = run_program(dev(), offers=offers, droplets=[existing_droplet(region="nyc2")])
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "nyc2"


def test_another_stacks_droplet_is_not_taken_for_this_one() -> None:
    theirs = [
        existing_droplet(name="nemotron-prod", stack="prod", region="ams3"),
        existing_droplet(name="nemotron-dev", stack="other", region="ams3"),
    ]
    run = run_program(dev(), droplets=theirs)
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "tor1"
    assert run.outputs["placement"].value.startswith("chosen: tor1")


def test_a_new_size_is_placed_from_availability_preferring_the_droplets_region() -> None:
    """A size change replaces the Droplet: it goes where the new size is offered, its current
    region first when that one offers it."""
    offers = {"gpu-l40sx1-48gb": offer("gpu-l40sx1-48gb", ["tor1", "nyc2"], 1.57)}
    mine = existing_droplet(region="nyc2")  # the 4000 Ada one
    run = run_program(dev(droplet={"size": "gpu-l40sx1-48gb"}), offers=offers, droplets=[mine])
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "nyc2"
    assert run.outputs["hourlyPriceUsd"].value == 1.57
    run = run_program(
        dev(droplet={"size": "gpu-l40sx1-48gb"}),
        offers={"gpu-l40sx1-48gb": offer("gpu-l40sx1-48gb", ["sfo3"])},
        droplets=[mine],
    )
    assert isinstance(run.error, ConfigError)
    assert run.error.problems[0].startswith("droplet.regions: gpu-l40sx1-48gb is not offered in")
