"""The cache Volume's name (components/spec/volume.py): valid and unique per replica at any
length of `droplet.name`, a cut name keeping what it can of the base and a hash of the whole, the
names of existing stacks unchanged (a Volume is adopted by its name), and in the program a long
name giving each replica its own Volume, the device the cache phase is told. The cache Volume
itself under Pulumi's mocks: test_cache.py."""

from __future__ import annotations

import hashlib
import re

import pytest
from pulumi_harness import VOLUME, run_program
from test_cache import cache_stdin
from test_droplet import dev

from components.spec import catalog, config
from components.spec.schema import StackConfig
from components.spec.volume import VOLUME_NAME, volume_name


def named(name: str) -> StackConfig:
    """The dev stack with this droplet.name, unvalidated (droplet.name accepts 63 characters;
    64 checks the rule past it)."""
    cfg = config.parse(dev(cache={"sizeGb": 100}), "dev")
    return cfg.model_copy(update={"droplet": cfg.droplet.model_copy(update={"name": name})})


LENGTHS = (56, 57, 63, 64)


REPLICAS = range(catalog.MAX_REPLICAS)


@pytest.mark.parametrize("length", LENGTHS)
def test_volume_names_are_valid_and_unique_per_replica_at_any_length(length: int) -> None:
    names = [volume_name(named("n" * length), r) for r in REPLICAS]
    for name in names:
        assert VOLUME_NAME.match(name) and len(name) <= 64, name
    assert len(set(names)) == len(names), names
    # Long names that share their first 55 characters get Volumes of their own.
    other = [volume_name(named("n" * (length - 1) + "x"), r) for r in REPLICAS]
    assert not set(names) & set(other), (names, other)
    # Each ends with its replica's suffix, kept whole when the base is cut.
    for r, name in enumerate(names):
        assert name.endswith(f"-{r}-cache" if r else "-cache"), name


def test_a_cut_name_keeps_the_base_it_can_and_a_hash_of_the_whole() -> None:
    base = "a" * 57
    assert volume_name(named(base), 0) == f"{base}-cache"  # 63: fits, unchanged
    cut = volume_name(named(base), 1)
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    assert cut == f"{'a' * 47}-{digest}-1-cache" and len(cut) == 64
    # Not the one Volume for every replica, as when the base was cut after the suffix.
    assert cut != volume_name(named(base), 2)


def test_names_of_existing_stacks_are_unchanged() -> None:
    """An existing Volume is adopted by its name: a name that fits is exactly what the program
    made before (base[:58] + "-cache", the base the replica's name), or its Volume is orphaned."""

    for name in ("nemotron-dev", "nemotron-prod", "Nemo.Droplet_1", "7b-box", "n" * 56):
        for r in REPLICAS:
            base = re.sub(r"[^a-z0-9-]", "-", (f"{name}-{r}" if r else name).lower())
            if not base[:1].isalpha():
                base = f"n-{base}"
            assert len(base) <= 58, "a name the program did not have to cut"
            assert volume_name(named(name), r) == f"{base}-cache", (name, r)
    assert volume_name(named("nemotron-dev"), 0) == "nemotron-dev-cache"
    assert volume_name(named("nemotron-dev"), 2) == "nemotron-dev-2-cache"


def test_a_long_droplet_name_gives_each_replica_its_own_volume_in_the_program() -> None:
    name = "n" * 63
    run = run_program(dev(cache={"sizeGb": 100}, droplet={"name": name}))
    assert run.error is None, run.error
    volume = run.one(VOLUME)
    assert volume.inputs["name"] == volume_name(named(name), 0)
    assert len(volume.inputs["name"]) == 64
    assert f"NEMO_CACHE_DEVICE={catalog.VOLUME_DEVICE_PREFIX}{volume.inputs['name']}\n" in (
        cache_stdin(run)
    )
