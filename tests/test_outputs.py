"""components/cloud/outputs.py: what a stack exports, under Pulumi's mocks. The contract names
(DESIGN.md's: endpoint, apiKey, servedModelName, ipv4, sshCommand, hourlyPriceUsd,
bootstrapSeconds) on every Droplet stack, one Droplet or a set; apiKey and sshPrivateKey the only
secret ones; every name a run exports documented in docs/outputs.md (test_docs.py reads the
source; this, what a run really exports, conditional outputs included). A `platform:
kubernetes` stack (export_kubernetes): the Droplet's names where they mean the same, its own,
and its prices part by part."""

from __future__ import annotations

import re

import pytest
from pulumi_harness import (
    DEFAULT_OFFERS,
    FAKE_API_KEY,
    FAKE_IPV4,
    ROOT,
    plain_strings,
    run_program,
    stack_config,
)
from test_kube_edge import LB_IP
from test_kube_platform import HF, run
from test_plan_snapshot import _kube

from components.cloud.kube import router_values
from components.spec import config
from components.spec.kube import HA_PRICE_MONTH

# DESIGN.md's "Outputs (contract names)": kept on every platform where they mean the same.
CONTRACT = ("endpoint", "apiKey", "servedModelName", "ipv4", "sshCommand", "hourlyPriceUsd",
            "bootstrapSeconds")  # fmt: skip
# What no Kubernetes stack has (docs/outputs.md): no SSH reaches a node, nothing bootstraps.
NOT_ON_KUBERNETES = {"sshCommand", "sshPrivateKey", "bootstrapSeconds"}


def documented() -> set[str]:
    """Every name in docs/outputs.md's tables."""
    page = (ROOT / "docs" / "outputs.md").read_text()
    return set(re.findall(r"^\| `(\w+)` \|", page, flags=re.MULTILINE))


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-droplet", "a-set"])
def test_every_contract_output_is_exported_and_only_the_keys_are_secret(replicas: int) -> None:
    run = run_program({**stack_config("dev"), "replicas": replicas})
    assert run.error is None, run.error
    out = {name: o.value for name, o in run.outputs.items()}
    assert set(CONTRACT) <= set(out), set(CONTRACT) - set(out)
    assert out["endpoint"].endswith("/v1") and out["servedModelName"] == "nemotron"
    assert out["ipv4"] == FAKE_IPV4 and out["hourlyPriceUsd"] > 0
    assert out["sshCommand"].endswith(f"root@{FAKE_IPV4}")
    # Seconds per bootstrap phase, the phases bootstrapTimeline draws.
    seconds = out["bootstrapSeconds"]
    assert seconds and set(seconds) == set(out["bootstrapTimeline"])
    assert all(isinstance(s, float) and s > 0 for s in seconds.values())
    assert {n for n, o in run.outputs.items() if o.secret} == {"apiKey", "sshPrivateKey"}
    assert out["apiKey"] == FAKE_API_KEY
    # With a set, what only a set has; and nothing a run exports is missing from the doc.
    assert ({"replicas", "balancer"} <= set(out)) is (replicas > 1)
    assert set(out) <= documented(), set(out) - documented()


def test_a_kubernetes_stack_keeps_the_contract_names_that_mean_the_same() -> None:
    result = run(_kube("gpu-h100x1-80gb", 0))
    assert result.error is None, result.error
    names = set(result.outputs)
    assert set(CONTRACT) - NOT_ON_KUBERNETES <= names
    assert not NOT_ON_KUBERNETES & names
    assert names <= documented(), names - documented()


def test_a_kubernetes_stack_exports_the_droplets_names_and_its_own() -> None:
    result = run(_kube("gpu-h100x1-80gb", 0))
    assert result.error is None, result.error
    out = {name: o.value for name, o in result.outputs.items()}
    assert out["endpoint"] == f"https://{LB_IP}/v1" and out["ipv4"] == LB_IP
    assert result.outputs["apiKey"].secret and out["apiKey"] == FAKE_API_KEY
    assert [n for n, o in result.outputs.items() if o.secret] == ["apiKey"]
    assert out["size"] == "gpu-h100x1-80gb" and out["region"] == "tor1"
    # The costs at the sizes offer's prices: 2 CPU nodes, one Load Balancer node, no HA; the
    # Volumes (the edge's 1 GiB and one 100 GiB weights Volume per server, up to 2) apart.
    cpu = 2 * DEFAULT_OFFERS["s-2vcpu-4gb"]["priceHourly"] * 672
    assert out["idleMonthlyParts"] == {
        "controlPlane": 0.0, "cpuPool": round(cpu, 2), "loadBalancer": 10.0, "volumes": 20.1,
    }  # fmt: skip
    assert out["idleMonthlyPriceUsd"] == round(round(cpu, 2) + 10.0 + 20.1, 2)
    idle = out["idleHourlyPriceUsd"]
    assert idle == round((round(cpu, 2) + 10.0) / 672, 5)
    # Asleep at min 0: the endpoint costs its idle price; each GPU node adds the size's.
    assert out["hourlyPriceUsd"] == idle and out["gpuNodeHourlyPriceUsd"] == 3.39
    assert out["maxHourlyPriceUsd"] == round(idle + 2 * 3.39, 5)
    assert out["cacheMonthlyPriceUsd"] == 20.1
    assert out["cluster"] == {"id": "doks-uuid-0001", "name": "nemotron-kube",
                              "version": "1.36.2-do.1", "ha": False}  # fmt: skip
    assert out["kubeconfigCommand"] == "doctl kubernetes cluster kubeconfig save doks-uuid-0001"
    # No output and no plain input carries the key, the HF token or the kubeconfig.
    for r in result.registrations:
        for path, text in plain_strings(r.raw):
            assert FAKE_API_KEY not in text and HF["hfToken"] not in text, (r.name, path)
            assert "FAKE-DOKS-TOKEN" not in text, (r.name, path)
    assert not {"sshCommand", "sshPrivateKey", "bootstrapSeconds"} & set(out)
    # The program ties KEDA's cooldown for the last server to the router's hold (776 s for this
    # model): a wake whose clients gave up is not taken back to zero halfway.
    (scaled,) = [r for r in result.registrations
                 if r.type == "kubernetes:keda.sh/v1alpha1:ScaledObject"]  # fmt: skip
    parsed = config.parse(_kube("gpu-h100x1-80gb", 0), "kube", frozenset({"hfToken"}))
    assert scaled.inputs["spec"]["cooldownPeriod"] == router_values.hold_seconds(parsed) > 300


def test_ha_and_a_floor_of_one_node_are_priced() -> None:
    cfg = _kube("gpu-l40sx1-48gb", 1)
    cfg["kubernetes"] = {**cfg["kubernetes"], "ha": True}
    result = run(cfg)
    assert result.error is None, result.error
    out = {name: o.value for name, o in result.outputs.items()}
    assert out["idleMonthlyParts"]["controlPlane"] == HA_PRICE_MONTH
    assert out["hourlyPriceUsd"] == round(out["idleHourlyPriceUsd"] + 1.57, 5)
