"""What the always-on CPU pool must hold: the resource requests of every pod the platform puts
there (KEDA's, Prometheus', the edge's, the router's) against the pool's nodes as their size
slug states them (no Pulumi). router.py refuses a pool that cannot hold them before it declares
anything, naming `cpuPool.size` and `cpuPool.count`.

A floor, not a promise: DOKS keeps part of each node for itself (the kubelet's reservation,
its own agents in kube-system), which no source here gives per size; the real run reads each
node's allocatable.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...spec.kube import KubePlatformConfig
from . import edge_manifests, router_values

# KEDA's three pods, at its chart's default requests (kedacore/charts v2.20.2 keda/values.yaml
# `resources.operator`, `.metricServer`, `.webhooks`: 100m and 100Mi each; scaling.py sets none).
KEDA_PODS = ("operator", "metricServer", "webhooks")
KEDA_REQUEST = {"cpu": "100m", "memory": "100Mi"}
# Prometheus' server at its chart's default, which requests nothing (prometheus-community/
# helm-charts prometheus-29.27.0 charts/prometheus/values.yaml `server.resources: {}`), and so
# counts 0 here.


@dataclasses.dataclass(frozen=True)
class Pod:
    name: str
    millicpu: int
    memory_mib: int


def millicpu(quantity: str) -> int:
    """A Kubernetes CPU quantity (`500m`, `2`) in millicores."""
    if quantity.endswith("m"):
        return int(quantity[:-1])
    return round(float(quantity) * 1000)


def memory_mib(quantity: str) -> int:
    """A Kubernetes memory quantity in the binary units used here (`512Mi`, `1Gi`) in MiB."""
    units = {"Mi": 1, "Gi": 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    raise ValueError(f"{quantity!r}: not a quantity in Mi or Gi")


def _pod(name: str, *requests: dict[str, Any]) -> Pod:
    return Pod(
        name,
        sum(millicpu(r["cpu"]) for r in requests),
        sum(memory_mib(r["memory"]) for r in requests),
    )


def cpu_pool_pods() -> list[Pod]:
    """Every pod the platform runs on the CPU pool, with the sum of its containers' requests."""
    return [
        *(_pod(f"keda-{name}", KEDA_REQUEST) for name in KEDA_PODS),
        Pod("prometheus-server", 0, 0),
        _pod("edge", edge_manifests.RESOURCES["requests"]),
        _pod(
            "router",
            router_values.EPP_RESOURCES["requests"],
            router_values.PROXY_RESOURCES["requests"],
        ),
    ]


def check_cpu_pool(kube: KubePlatformConfig) -> None:
    """Refuse a CPU pool whose nodes cannot hold the platform's pods: the largest pod must fit
    one node, and all of them the pool."""
    pool = kube.cpu_pool
    node_cpu, node_mem = pool.node_millicpu, pool.node_memory_mib
    pods = cpu_pool_pods()
    biggest = max(pods, key=lambda p: (p.millicpu, p.memory_mib))
    if biggest.millicpu > node_cpu or biggest.memory_mib > node_mem:
        raise ValueError(
            f"kubernetes.cpuPool.size {pool.size} ({node_cpu}m CPU, {node_mem}Mi per node) "
            f"cannot hold the {biggest.name} pod ({biggest.millicpu}m, {biggest.memory_mib}Mi "
            "requested); accepted: a CPU size whose node holds it"
        )
    cpu = sum(p.millicpu for p in pods)
    mem = sum(p.memory_mib for p in pods)
    if cpu > node_cpu * pool.count or mem > node_mem * pool.count:
        raise ValueError(
            f"kubernetes.cpuPool.count {pool.count} x kubernetes.cpuPool.size {pool.size} "
            f"({node_cpu * pool.count}m CPU, {node_mem * pool.count}Mi) cannot hold the CPU "
            f"pool's pods ({cpu}m, {mem}Mi requested: {', '.join(p.name for p in pods)}); "
            "accepted: more or larger nodes"
        )
