"""The cache Volume under mocks: made only when configured, attached to the Droplet, left alone
by a Droplet replacement, adopted when an earlier destroy kept it, not silently lost when the
Droplet must go to another region, and its price an output. (The Volume's name:
test_volume.py.)"""

from __future__ import annotations

import logging

import pytest
from pulumi_harness import (
    FAKE_DROPLET_ID,
    REGION_TOKEN,
    VOLUME,
    VOLUME_ATTACHMENT,
    VOLUME_TOKEN,
    Run,
    existing_droplet,
    existing_volume,
    run_program,
)
from test_bootstrap import commands
from test_droplet import dev

from components.render import render_stack
from components.spec import catalog
from components.spec.config import ConfigError

DEVICE = f"{catalog.VOLUME_DEVICE_PREFIX}nemotron-dev-cache"


def cached(size_gb: int = 100, **cache: object) -> dict:
    return dev(cache={"sizeGb": size_gb, **cache})


def cache_stdin(run: Run) -> str:
    return str(commands(run)["cache"].inputs["stdin"])


def test_no_cache_configured_declares_no_volume_and_asks_nothing() -> None:
    run = run_program(dev())
    assert run.error is None, run.error
    assert not [r for r in run.registrations if r.type in (VOLUME, VOLUME_ATTACHMENT)]
    assert not [c for c in run.cloud.calls if c.token in (VOLUME_TOKEN, REGION_TOKEN)]
    assert run.outputs["cache"].value["state"] == "off"
    assert run.outputs["cacheMonthlyPriceUsd"].value == 0.0
    # The cache phase runs (it undoes a cache an earlier run set up) with no device.
    assert "NEMO_CACHE_DEVICE=''" in cache_stdin(run)
    assert "RequiresMountsFor" not in str(commands(run)["service"].inputs["stdin"])


def test_a_configured_cache_is_a_volume_attached_to_the_droplet_before_the_cache_phase() -> None:
    run = run_program(cached(100))
    assert run.error is None, run.error
    volume = run.one(VOLUME)
    assert volume.inputs["name"] == "nemotron-dev-cache"
    assert volume.inputs["region"] == run.outputs["region"].value == "tor1"
    assert volume.inputs["size"] == 100
    assert volume.inputs["tags"] == ["nemotron-droplet", "stack:dev"]
    # The cache phase formats it only when empty: DigitalOcean must not (and an adopted one's
    # inputs must match what DigitalOcean reports).
    assert "initialFilesystemType" not in volume.inputs
    assert volume.retain_on_delete is False and volume.import_id == ""

    attachment = run.one(VOLUME_ATTACHMENT)
    droplet = run.one("digitalocean:index/droplet:Droplet")
    assert attachment.inputs["dropletId"] == int(FAKE_DROPLET_ID)
    assert attachment.inputs["volumeId"] == "vol-cache-new"
    assert droplet.urn in attachment.dependencies and volume.urn in attachment.dependencies

    cache_phase = commands(run)["cache"]
    assert attachment.urn in cache_phase.dependencies
    # A new attachment (a new Droplet, a new Volume) runs the cache phase again.
    assert cache_phase.inputs["triggers"][-1] == "cache-attachment-id"
    assert f"NEMO_CACHE_DEVICE={DEVICE}\n" in cache_stdin(run)
    assert (
        f"RequiresMountsFor={catalog.CONDA_PREFIX} {catalog.HF_HOME}"
        in commands(run)["service"].inputs["stdin"]
    )

    out = run.outputs["cache"].value
    assert out["state"] == "new" and out["volume"] == "nemotron-dev-cache"
    assert out["volumeId"] == "vol-cache-new" and out["sizeGb"] == 100
    assert out["monthlyPriceUsd"] == run.outputs["cacheMonthlyPriceUsd"].value == 10.0
    assert "deleteCommand" not in out


def test_the_volume_survives_a_droplet_replacement_in_the_plan() -> None:
    """A new Droplet (new id) changes the attachment and nothing of the Volume: Pulumi keeps
    the Volume (same inputs, no dependency on the Droplet) and attaches it to the new one."""
    before = run_program(cached(100))
    after = run_program(cached(100), droplet_id="777777")
    volume_a, volume_b = before.one(VOLUME), after.one(VOLUME)
    assert volume_a.inputs == volume_b.inputs
    droplet = after.one("digitalocean:index/droplet:Droplet")
    assert droplet.urn not in volume_b.dependencies
    assert before.one(VOLUME_ATTACHMENT).inputs["dropletId"] == int(FAKE_DROPLET_ID)
    assert after.one(VOLUME_ATTACHMENT).inputs["dropletId"] == 777777


def test_keep_on_destroy_retains_the_volume_and_says_how_to_delete_it() -> None:
    run = run_program(cached(100, keepOnDestroy=True))
    assert run.one(VOLUME).retain_on_delete is True
    assert (
        run.outputs["cache"].value["deleteCommand"] == "doctl compute volume delete vol-cache-new"
    )


def test_a_kept_volume_is_adopted_and_a_new_droplet_goes_to_its_region(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An earlier destroy kept the Volume in nyc2 (detached): the new Droplet goes there, not to
    tor1 (first in droplet.regions), and the Volume is imported, not made again."""
    kept = existing_volume(region="nyc2", size=100)
    run = run_program(cached(100), volumes=[kept])
    assert run.error is None, run.error
    assert run.outputs["region"].value == "nyc2"
    assert run.outputs["placement"].value == (
        "chosen: nyc2 holds the cache Volume and offers gpu-4000adax1-20gb now"
    )
    volume = run.one(VOLUME)
    assert volume.import_id == kept["id"] and volume.inputs["region"] == "nyc2"
    out = run.outputs["cache"].value
    assert out["state"] == "kept" and out["volumeId"] == kept["id"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "cache" in r.message]


def test_an_existing_droplet_keeps_its_region_over_the_caches() -> None:
    """The live Droplet is in tor1, a detached cache in nyc2 (which offers the size too): the
    Droplet is not moved for the cache; the cache is reported unusable there instead."""
    run = run_program(
        cached(100),
        droplets=[existing_droplet(region="tor1")],
        volumes=[existing_volume(region="nyc2")],
    )
    assert run.outputs["region"].value == "tor1"
    assert run.outputs["placement"].value.startswith("kept: Droplet")
    assert run.outputs["cache"].value["state"] == "moved"
    assert "the Droplet exists in tor1 and stays there" in run.outputs["cache"].value["note"]
    assert run.one(VOLUME).inputs["region"] == "tor1"


def test_the_stacks_own_attached_volume_is_kept() -> None:
    run = run_program(
        cached(100),
        droplets=[existing_droplet(region="tor1")],
        volumes=[existing_volume(region="tor1", droplet_ids=(int(FAKE_DROPLET_ID),))],
    )
    assert run.outputs["cache"].value["state"] == "kept"
    assert run.one(VOLUME).import_id == "vol-kept-0001"


def test_a_cache_in_a_region_without_the_size_is_reported_unusable_not_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The size sold out where the cache is (atl1 offers no RTX 4000 today): the Droplet goes
    to tor1 with a new, empty cache, and the output and the log say why."""
    kept = existing_volume(region="atl1", size=100)
    run = run_program(cached(100), volumes=[kept])
    assert run.error is None, run.error
    assert run.outputs["region"].value == "tor1"
    volume = run.one(VOLUME)
    assert volume.inputs["region"] == "tor1" and volume.import_id == ""
    out = run.outputs["cache"].value
    assert out["state"] == "moved"
    assert "the cache nemotron-dev-cache is in atl1" in out["note"]
    assert "gpu-4000adax1-20gb is not offered in atl1" in out["note"]
    warnings = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("cache: unusable" in w and "atl1" in w for w in warnings), warnings


def test_a_moved_cache_kept_on_destroy_says_the_old_volume_is_still_billed() -> None:
    kept = existing_volume(region="atl1", size=100)
    run = run_program(cached(100, keepOnDestroy=True), volumes=[kept])
    note = run.outputs["cache"].value["note"]
    assert f"doctl compute volume delete {kept['id']}" in note and "still billed" in note


def test_a_region_without_volumes_runs_without_a_cache_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = run_program(cached(100), no_volumes_in=("tor1",))
    assert run.error is None, run.error
    assert not [r for r in run.registrations if r.type in (VOLUME, VOLUME_ATTACHMENT)]
    out = run.outputs["cache"].value
    assert out["state"] == "unavailable" and out["monthlyPriceUsd"] == 0.0
    assert "no Volumes in tor1" in out["note"]
    assert "NEMO_CACHE_DEVICE=''" in cache_stdin(run)
    assert any("cache: unusable" in r.message for r in caplog.records)


def test_a_volume_never_shrinks_and_an_adopted_one_grows_the_next_time() -> None:
    big = run_program(cached(60), volumes=[existing_volume(size=200)])
    assert big.one(VOLUME).inputs["size"] == 200
    assert "a Volume never shrinks" in big.outputs["cache"].value["note"]
    # Detached (maybe not in this stack's state): adopted at its size first.
    small = run_program(cached(300), volumes=[existing_volume(size=100)])
    assert small.one(VOLUME).inputs["size"] == 100
    assert "grows to 300 GiB on the next pulumi up" in small.outputs["cache"].value["note"]
    # Attached (this stack's, in its state): grown now.
    attached = run_program(
        cached(300),
        droplets=[existing_droplet()],
        volumes=[existing_volume(size=100, droplet_ids=(int(FAKE_DROPLET_ID),))],
    )
    assert attached.one(VOLUME).inputs["size"] == 300


def test_volumes_of_the_same_name_in_several_regions_pick_the_droplets() -> None:
    volumes = [
        existing_volume(region="atl1", volume_id="vol-old"),
        existing_volume(region="nyc2", volume_id="vol-new"),
    ]
    run = run_program(cached(100), volumes=volumes)
    assert run.error is None, run.error
    # droplet.regions order: tor1 (none there), nyc2 (has one, offers the size).
    assert run.outputs["region"].value == "nyc2"
    assert run.one(VOLUME).import_id == "vol-new"


@pytest.mark.parametrize("size_gb", [1, 57])
def test_a_cache_too_small_for_the_model_is_refused_before_anything_is_declared(
    size_gb: int,
) -> None:
    run = run_program(cached(size_gb))
    assert isinstance(run.error, ConfigError), run.error
    # Weights, two vLLM envs (an upgrade installs beside the running one), compile caches.
    need = 8 + 2 * catalog.VLLM_ENV_DISK_GB + catalog.CACHE_OVERHEAD_GB
    assert any(
        p.startswith(f"cache.sizeGb: {size_gb} GiB cannot hold") and f"accepted: {need} to" in p
        for p in run.error.problems
    ), run.error.problems
    assert not run.registrations


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ({"sizeGb": 0}, "cache.sizeGb: Input should be greater than or equal to 1"),
        ({"sizeGb": 20000}, "cache.sizeGb: Input should be less than or equal to 16384"),
        ({"sizeGb": "big"}, "cache.sizeGb: Input should be a valid integer"),
        (
            {"keepOnDestory": True},
            "cache.keepOnDestory: unknown key; accepted: sizeGb, keepOnDestroy",
        ),
    ],
)
def test_bad_cache_input_names_the_field(cache: dict, message: str) -> None:
    run = run_program(dev(cache=cache))
    assert isinstance(run.error, ConfigError), run.error
    assert any(p.startswith(message) for p in run.error.problems), run.error.problems


def test_a_volume_attached_to_another_droplet_is_refused_before_anything_is_declared() -> None:
    run = run_program(cached(100), volumes=[existing_volume(droplet_ids=(424242,))])
    assert isinstance(run.error, ConfigError), run.error
    assert any(
        p.startswith("cache.sizeGb: the Volume nemotron-dev-cache") and "Droplet 424242" in p
        for p in run.error.problems
    ), run.error.problems
    assert not run.registrations


def test_the_offline_render_shows_the_cache_phase_with_its_device(tmp_path) -> None:
    files = {p.name: p for p in render_stack("super", tmp_path)}
    assert "NEMO_CACHE_DEVICE=/dev/disk/by-id/scsi-0DO_Volume_nemotron-super-cache\n" in (
        files["04-cache.sh"].read_text()
    )
    assert "RequiresMountsFor=" in files["10-service.sh"].read_text()
    dev = {p.name: p for p in render_stack("dev", tmp_path / "dev")}
    assert "NEMO_CACHE_DEVICE=''" in dev["04-cache.sh"].read_text()


# ---- growing the cache -----------------------------------------------------------------------


def test_a_larger_cache_size_reruns_the_cache_phase_after_the_volume_grows() -> None:
    """cache.sizeGb 100 -> 150 on a live stack: the Volume resizes in place, and the cache phase
    (which grows the filesystem) has a new stdin and waits for the Volume, not only for its
    attachment (which a resize leaves as it is)."""
    live = {"droplets": [existing_droplet()]}
    small = run_program(cached(100), **live)
    large = run_program(cached(150), **live)
    assert small.one(VOLUME).inputs["size"] == 100 and large.one(VOLUME).inputs["size"] == 150
    assert "NEMO_CACHE_SIZE_GB=100\n" in cache_stdin(small)
    assert "NEMO_CACHE_SIZE_GB=150\n" in cache_stdin(large)
    assert cache_stdin(small) != cache_stdin(large)
    phase = commands(large)["cache"]
    assert large.one(VOLUME).urn in phase.dependencies
    assert large.one(VOLUME_ATTACHMENT).urn in phase.dependencies
    assert "150" in phase.inputs["triggers"]
    # Only the cache phase's own settings change: no other phase's stdin does.
    for name, command in commands(small).items():
        if name != "cache":
            assert command.inputs["stdin"] == commands(large)[name].inputs["stdin"], name


def test_a_volume_the_plan_grows_later_reruns_the_cache_phase_when_it_does() -> None:
    """A detached Volume is adopted at its own 100 GiB first (cache.sizeGb 300 does not change
    between the two runs): its size, a trigger of the cache phase, runs it again once it grew."""
    first = run_program(cached(300), volumes=[existing_volume(size=100)])
    then = run_program(
        cached(300),
        droplets=[existing_droplet()],
        volumes=[existing_volume(size=100, droplet_ids=(int(FAKE_DROPLET_ID),))],
    )
    assert first.one(VOLUME).inputs["size"] == 100 and then.one(VOLUME).inputs["size"] == 300
    assert "100" in commands(first)["cache"].inputs["triggers"]
    assert "300" in commands(then)["cache"].inputs["triggers"]


def test_no_cache_asks_no_size() -> None:
    assert "NEMO_CACHE_SIZE_GB=0\n" in cache_stdin(run_program(dev()))
    assert "NEMO_CACHE_SIZE_GB=0\n" in cache_stdin(
        run_program(cached(100), no_volumes_in=("tor1",))
    )
