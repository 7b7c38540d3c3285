"""The endpoint's Droplets in rolling order (components/cloud/endpoint.py), under Pulumi's mocks:
`replicas: 1` plans exactly what a stack without the key plans (growing a stack replaces
nothing), a new set starts all at once, a live set restarts one replica at a time (downloads
still side by side), and a new size replaces a live set one Droplet at a time, each deleted
first. The set's entry and its helpers are test_entry.py's."""

from __future__ import annotations

from pulumi_harness import Run, offer, run_program
from test_droplet import DROPLET, dev
from test_entry import (
    COMMAND,
    LOAD_BALANCER,
    RESERVED_IP,
    _caddy_offer,
    depends,
    live_set,
    of,
)


def test_replicas_1_plans_exactly_what_a_stack_without_the_key_plans() -> None:
    without = run_program(dev())
    with_one = run_program({**dev(), "replicas": 1})
    assert without.error is None and with_one.error is None

    def plan(run: Run) -> list[tuple[str, str, str, list[str]]]:
        return sorted(
            (r.type, r.name, repr(r.inputs), sorted(r.dependencies)) for r in run.registrations
        )

    assert plan(without) == plan(with_one)
    assert "replicas" not in without.outputs and "balancer" not in without.outputs
    assert not of(without, LOAD_BALANCER) and not of(without, RESERVED_IP)


def test_a_new_set_starts_all_at_once() -> None:
    run = run_program({**dev(), "replicas": 3})
    commands = of(run, COMMAND)
    for later in ("bootstrap-1", "bootstrap-2"):
        for phase in ("reboot", "service"):
            assert not any(
                "ready" in d or "member" in d for d in depends(run, commands[f"{later}-{phase}"])
            )
    assert not any(
        d.startswith(("bootstrap", "balancer-member"))
        for d in depends(run, of(run, DROPLET)["gpu-1"])
    )


def test_a_live_set_restarts_one_replica_at_a_time() -> None:
    run = run_program({**dev(), "replicas": 3}, droplets=live_set(3))
    assert run.error is None, run.error
    commands = of(run, COMMAND)
    for previous, later in (("bootstrap", "bootstrap-1"), ("bootstrap-1", "bootstrap-2")):
        index = previous.removeprefix("bootstrap").removeprefix("-") or "0"
        for phase in ("reboot", "service"):
            deps = depends(run, commands[f"{later}-{phase}"])
            assert {f"{previous}-ready", f"balancer-member-{index}"} <= deps, (later, phase)
        # Downloads and installs still run side by side: only restarts wait.
        for phase in ("model", "vllm", "conda"):
            assert f"{previous}-ready" not in depends(run, commands[f"{later}-{phase}"])
    # Nothing replaces a Droplet here: they are created in parallel.
    assert not depends(run, of(run, DROPLET)["gpu-1"]) & {"bootstrap-ready", "balancer-member-0"}


def test_a_new_size_replaces_a_live_set_one_droplet_at_a_time() -> None:
    offers = {"gpu-l40sx1-48gb": offer("gpu-l40sx1-48gb", ["tor1"], 1.57), **_caddy_offer()}
    run = run_program(
        {**dev(droplet={"size": "gpu-l40sx1-48gb", "regions": ["tor1"]}), "replicas": 3},
        droplets=live_set(3),
        offers=offers,
    )
    assert run.error is None, run.error
    droplets = of(run, DROPLET)
    assert {"bootstrap-ready", "balancer-member-0"} <= depends(run, droplets["gpu-1"])
    assert {"bootstrap-1-ready", "balancer-member-1"} <= depends(run, droplets["gpu-2"])
    # Every Droplet of the set, the balancer's too, is replaced (deleted first) for a new size,
    # never resized in place by the provider's update.
    assert set(droplets) == {"gpu", "gpu-1", "gpu-2", "balancer"}
    for droplet in droplets.values():
        assert droplet.delete_before_replace, droplet.name
        assert droplet.replace_on_changes == ("size",), droplet.name
