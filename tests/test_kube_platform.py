"""`platform: kubernetes` as a stack key (components/spec/config.py, components/cloud/kube/
platform.py): the real program (__main__.py) under Pulumi's mocks for a Kubernetes stack, and
every refusal before anything is declared. Its outputs and prices (outputs.export_kubernetes):
test_outputs.py, which runs it with `run` here. The resources and inputs themselves are held by
the plan snapshots (test_plan_snapshot.py, kube-*)."""

from __future__ import annotations

from typing import Any

import pytest
from pulumi_harness import DEFAULT_OFFERS, offer, run_program
from test_kube_edge import LB_IP, EdgeCloud
from test_plan_snapshot import STACKS, _kube

from components.host import vllm_service
from components.spec import config

HF = STACKS["kube-h100-min0"][1]


def run(cfg: dict[str, Any], offers: dict[str, dict] | None = None) -> Any:
    return run_program(cfg, secrets=HF, offers=offers, cloud_type=EdgeCloud, stack="kube")


def test_a_pool_size_not_offered_in_the_region_is_refused_before_anything_is_declared() -> None:
    offers = {**DEFAULT_OFFERS, "gpu-h100x1-80gb": offer("gpu-h100x1-80gb", ["nyc2"], 3.39)}
    result = run(_kube("gpu-h100x1-80gb", 0), offers)
    assert (
        "kubernetes.region: gpu-h100x1-80gb (kubernetes.gpuPool.size) is not offered in tor1"
        in (str(result.error))
    )
    assert result.registrations == []
    gone = {k: v for k, v in DEFAULT_OFFERS.items() if k != "s-2vcpu-4gb"}
    result = run(_kube("gpu-h100x1-80gb", 0), gone)
    assert "kubernetes.cpuPool.size: s-2vcpu-4gb is not offered to this account now" in (
        str(result.error)
    )
    assert result.registrations == []


# Each Droplet-only key on a Kubernetes stack, named in its refusal as the stack file gives it.
DROPLET_ONLY = {
    "droplet.regions": {"droplet": {"regions": ["tor1"]}},
    "replicas": {"replicas": 2},
    "bootstrap.driver": {"bootstrap": {"driver": {"mode": "auto"}}},
    "autodown.idleMinutes": {"autodown": {"idleMinutes": 30}},
    "cache.sizeGb": {"cache": {"sizeGb": 83}},
    "balancer.kind": {"balancer": {"kind": "caddy"}},
    "wake.enabled": {"wake": {"enabled": True}},
    "access.sshCidrs": {"access": {"sshCidrs": ["0.0.0.0/0"]}},
    "access.sshKeyFingerprints": {"access": {"sshKeyFingerprints": []}},
    "vllm.install": {"vllm": {"install": "source"}},
    "vllm.gitRef": {"vllm": {"gitRef": "main"}},
}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(config.ConfigError) as err:
        config.parse(raw, "kube", frozenset({"hfToken"}))
    return err.value.problems


@pytest.mark.parametrize("field", list(DROPLET_ONLY))
def test_a_droplet_only_key_is_refused_naming_it(field: str) -> None:
    raw = _kube("gpu-h100x1-80gb", 0)
    for key, value in DROPLET_ONLY[field].items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    (problem,) = problems(raw)
    assert problem.startswith(f"{field}: means nothing with platform: kubernetes"), problem


def test_the_weights_on_the_servers_volume_are_prefetched() -> None:
    """A Kubernetes server reads its weights from its Volume (network block storage), where
    vLLM's prefetch is the remedy it applies itself only to NFS and Lustre (vllm_service
    .load_strategy): on, as a Droplet's cache Volume gets it."""
    cfg = config.parse(_kube("gpu-h100x1-80gb", 0), "kube", frozenset({"hfToken"}))
    args = vllm_service.serve_args(cfg, host="0.0.0.0")
    assert args[args.index("--safetensors-load-strategy") + 1] == "prefetch"


def test_autoscale_is_refused_on_kubernetes_too_as_the_retired_key() -> None:
    """`autoscale` is no key of any platform: on Kubernetes it gets the one retired-key message
    (which names the platform's own scaling), not a second one beside it."""
    raw = _kube("gpu-h100x1-80gb", 0)
    raw["autoscale"] = {"max": 2}
    (problem,) = problems(raw)
    assert problem.startswith("autoscale: the Droplet autoscaler is retired"), problem
    assert "platform: kubernetes" in problem and "KEDA" in problem


def test_the_kubernetes_section_only_with_its_platform_and_the_platform_named() -> None:
    droplet = {**STACKS["dev"][0], "kubernetes": {"ha": False}}
    assert problems(droplet) == [
        "kubernetes: read only with platform: kubernetes, and this stack's platform is droplet "
        "(the default): set platform: kubernetes, or remove it"
    ]
    assert problems({**STACKS["dev"][0], "platform": "k8s"}) == [
        "platform: 'k8s': accepted: droplet, kubernetes"
    ]
    no_section = {k: v for k, v in _kube("gpu-h100x1-80gb", 0).items() if k != "kubernetes"}
    (problem,) = problems(no_section)
    assert problem.startswith("kubernetes: platform: kubernetes needs this section")
    raw = _kube("gpu-h100x1-80gb", 0)
    raw["kubernetes"] = {**raw["kubernetes"], "gpuPool": {"size": "gpu-h200x1-141gb"}}
    (problem,) = problems(raw)
    assert problem.startswith("kubernetes.gpuPool.size: 'gpu-h200x1-141gb' is not a GPU size")


def test_what_carries_over_is_checked_against_the_gpu_pools_size() -> None:
    """model and vllm carry over, checked as on a Droplet of the GPU pool's size (the serve
    flags read it): the Super model does not fit an L40S."""
    raw = _kube("gpu-l40sx1-48gb", 0)
    raw["model"] = {"id": "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8"}
    raw["vllm"] = {**raw["vllm"], "maxModelLen": 32768}
    found = problems(raw)
    assert any(p.startswith("model.id: nvidia/NVIDIA-Nemotron-3-Super") and "gpu-l40sx1-48gb" in p
               for p in found), found  # fmt: skip
    cfg = config.parse(_kube("gpu-l40sx1-48gb", 0), "kube")
    assert cfg.platform == "kubernetes" and cfg.droplet.size == cfg.kube.gpu_pool.size


def test_the_edges_sources_and_the_weights_volume_are_refused_before_anything() -> None:
    raw = _kube("gpu-h100x1-80gb", 0)
    raw["access"] = {"apiCidrs": ["8.8.8.0/24"]}
    assert problems(raw) == [
        "access.apiCidrs ['8.8.8.0/24']: the Kubernetes platform's Load Balancer admits the same "
        "sources on every port, and the ACME CA validates the certificate from the internet "
        "through it; accepted: ['0.0.0.0/0', '::/0'] (every route still needs the key), or "
        "access.https false"
    ]
    result = run(raw)
    assert result.error is not None and result.registrations == []
    raw = _kube("gpu-h100x1-80gb", 0)
    raw["kubernetes"] = {**raw["kubernetes"], "weights": {"sizeGb": 20}}
    (problem,) = problems(raw)
    assert problem.startswith("kubernetes.weights.sizeGb: 20 GiB cannot hold"), problem


def test_a_cpu_pool_too_small_for_its_pods_is_refused_before_anything_is_declared() -> None:
    """The router, KEDA, Prometheus and the edge run on the CPU pool (kube/capacity.py): the
    program refuses a pool that cannot hold their requests before the cluster is declared."""
    raw = _kube("gpu-h100x1-80gb", 0)
    raw["kubernetes"] = {**raw["kubernetes"], "cpuPool": {"size": "s-1vcpu-1gb", "count": 1}}
    result = run(
        raw, offers={**DEFAULT_OFFERS, "s-1vcpu-1gb": offer("s-1vcpu-1gb", ["tor1"], 0.00893)}
    )
    assert "kubernetes.cpuPool" in str(result.error), result.error
    assert result.registrations == []


def test_a_dns_zone_not_in_the_account_is_refused_before_anything_is_declared() -> None:
    raw = _kube("gpu-h100x1-80gb", 0)
    raw["access"] = {**raw["access"], "domain": "llm.example.com", "dnsZone": "example.com",
                     "acmeEmail": "ops@example.com"}  # fmt: skip
    result = run(raw)
    assert "access.dnsZone: example.com is not a domain of this DigitalOcean account" in str(
        result.error
    )
    assert result.registrations == []
    kept = run_program(raw, secrets=HF, cloud_type=EdgeCloud, stack="kube", zones=("example.com",))
    assert kept.error is None, kept.error
    (record,) = [
        r for r in kept.registrations if r.type == "digitalocean:index/dnsRecord:DnsRecord"
    ]
    assert record.inputs["value"] == LB_IP and record.inputs["name"] == "llm"
    assert kept.outputs["endpoint"].value == "https://llm.example.com/v1"
