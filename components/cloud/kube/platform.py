"""The Kubernetes platform's wiring (`platform: kubernetes`): the prices and offers checked
first, then the cluster, the model server, KEDA, [the router], the edge, and the outputs.
__main__.py calls `build()` for such a stack, as it builds Droplets for the others.

The order is the traffic's, backwards: the edge forwards to the router (once it exists), the
router to the model's Service; KEDA scales the model on the router's and vLLM's metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...spec.schema import StackConfig
from .. import dns, outputs, region, stack_config
from ..stack_config import StackConfigError
from . import autoscaler, capacity, cluster, edge, model, router_values
from .router import Router


@dataclass(frozen=True)
class Prices:
    """Hourly list prices from the sizes offer, the Droplet path's source (region.lookup)."""

    cpu_node: float
    gpu_node: float


def prices(cfg: StackConfig) -> Prices:
    """Both pools' sizes as DigitalOcean offers them to this account now: a size not sold, or
    not in kubernetes.region, is refused before anything is declared (a DOKS node is a Droplet
    of its pool's size, billed at that size's price: shared FACTS.md)."""
    kube = cfg.kube
    found: dict[str, float] = {}
    problems = []
    for field, size in (("cpuPool", kube.cpu_pool.size), ("gpuPool", kube.gpu_pool.size)):
        offer = region.lookup(size)
        if offer is None or not offer.available:
            problems.append(f"kubernetes.{field}.size: {size} is not offered to this account now")
        elif kube.region not in offer.regions:
            where = ", ".join(sorted(offer.regions)) or "no region right now"
            problems.append(
                f"kubernetes.region: {size} (kubernetes.{field}.size) is not offered in "
                f"{kube.region} now; it is in: {where}"
            )
        else:
            found[field] = offer.price_hourly
    if problems:
        raise StackConfigError(problems)
    return Prices(cpu_node=found["cpuPool"], gpu_node=found["gpuPool"])


def build(cfg: StackConfig) -> None:
    """Declare the platform and export its outputs (outputs.export_kubernetes)."""
    kube = cfg.kube
    listed = prices(cfg)
    try:
        # Every pod the CPU pool runs must fit it (KEDA, Prometheus, the router, the edge).
        capacity.check_cpu_pool(kube)
    except ValueError as err:
        raise StackConfigError([str(err)]) from None
    # The edge keeps access.domain's record in access.dnsZone, as a Droplet's gateway does.
    dns.check_zone(cfg)
    api_key = stack_config.api_key_or_new()
    hf_token = stack_config.hf_token()
    doks = cluster.DoksCluster(cfg.droplet_name, kube)
    server = model.ModelServer("vllm", cfg, kube, api_key, hf_token, doks.provider)
    hold = router_values.hold_seconds(cfg)
    autoscaler.Autoscaler("vllm", kube, hold, server.servers, doks.provider)
    # llm-d's router between the edge and the servers: it holds a request while none is ready
    # (up to the wake budget) and its queue is what wakes one (KEDA's trigger).
    router = Router("router", cfg, kube, server, doks.provider)
    gate = edge.Edge("edge", cfg, kube, server.secret, doks.provider, upstream=router.upstream)
    outputs.export_kubernetes(
        cfg,
        outputs.KubeBuilt(
            endpoint=gate.endpoint,
            host=gate.host,
            ipv4=gate.ipv4,
            cluster_id=doks.cluster.id,
            cluster_name=doks.cluster.name,
            version=doks.cluster.version,
        ),
        api_key,
        listed.cpu_node,
        listed.gpu_node,
    )
