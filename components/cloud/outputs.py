"""Every stack output, in one place: what each says and where it comes from. `export()` is the
list a user reads in `pulumi stack output`; the functions under it shape the ones made of
several parts (the set's price, each replica, the entry, each cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from ..host import balancer, gateway, phases, wake
from ..spec import catalog, kube
from ..spec.bill import balancer_hourly_price, bill_warning, set_hourly_price
from ..spec.schema import StackConfig, set_secret
from . import cache
from .droplet import REPLACEMENT_NOTE, ssh_command
from .endpoint import Endpoint
from .site import Site


def export(
    cfg: StackConfig,
    site: Site,
    built: Endpoint,
    api_key: pulumi.Output[str],
) -> None:
    """The stack's outputs (names are a contract: docs/outputs.md), and what `pulumi up` warns."""
    first, hostname = built.gpus[0], built.hostname
    plans, placement = site.cache_plans, site.placement
    pulumi.export("endpoint", hostname.apply(lambda host: gateway.endpoint(cfg, host)))
    pulumi.export("endpointTls", cfg.access.https)
    pulumi.export("certificate", hostname.apply(lambda host: certificate(cfg, host)))
    pulumi.export("apiKey", api_key)
    pulumi.export("servedModelName", cfg.model.served_name)
    pulumi.export("ipv4", first.ipv4)
    pulumi.export("region", placement.region)
    pulumi.export("size", cfg.droplet.size)
    pulumi.export("placement", placement.reason)
    hourly = set_hourly_price(cfg, placement.price_hourly, site.caddy_price)
    pulumi.export("hourlyPriceUsd", hourly)
    pulumi.export("dropletReplacement", replacement_note(cfg, REPLACEMENT_NOTE))
    pulumi.export("cache", cache_output(cfg, plans, built, 0))
    volumes_monthly = round(sum(p.monthly_price_usd for p in plans), 2)
    pulumi.export("cacheMonthlyPriceUsd", volumes_monthly)
    pulumi.export(
        "sshCommand",
        pulumi.Output.all(first.ipv4, first.host_public_key).apply(
            lambda v: ssh_command(cfg.stack, v[0], v[1])
        ),
    )
    pulumi.export("sshHostPublicKey", first.host_public_key)
    pulumi.export("sshPrivateKey", first.private_key_openssh)
    pulumi.export("bootstrapSeconds", built.bootstraps[0].seconds)
    pulumi.export("bootstrapTimeline", built.bootstraps[0].timeline)
    pulumi.export(
        "autodown",
        {
            "mode": cfg.autodown.mode,
            "idleMinutes": cfg.autodown.idle_minutes,
            "maxHours": cfg.autodown.max_hours,
            # The deadline of a Droplet that never serves (phases.bootstrap_minutes).
            "bootstrapMinutes": phases.bootstrap_minutes(cfg) if cfg.autodown.enabled else None,
        },
    )
    if cfg.pooled:
        pulumi.export("replicas", replicas(cfg, plans, built))
        pulumi.export("balancer", balancer_output(cfg, built, site.caddy_price))
    pulumi.export("wake", wake.output(cfg, site.caddy_price, volumes_monthly))
    if cfg.wake.enabled and not cfg.autodown.enabled:
        pulumi.log.warn(
            "wake.enabled without autodown: nothing puts the GPU set to sleep, so the front only "
            "adds its cost; set autodown.idleMinutes (the set sleeps when idle, wakes on a keyed "
            "request)"
        )
    if cfg.autodown.enabled and cfg.autodown.token is None:
        pulumi.log.warn(
            "autodown runs as a dry run (logs only) until it has a token that may delete "
            f"Droplets: {set_secret('autodown.token')}"
        )
    unstopped = bill_warning(cfg, hourly)
    if unstopped:
        pulumi.log.warn(unstopped)


def certificate(cfg: StackConfig, host: str) -> str:
    if cfg.pooled and cfg.balancer_kind == "managed":
        return (
            f"Let's Encrypt, for {host}, issued and renewed by DigitalOcean for the Load Balancer"
        )
    return gateway.certificate(cfg, host)


def replacement_note(cfg: StackConfig, single: str) -> str:
    if not cfg.pooled:
        return single
    return (
        "one replica at a time: a new droplet.size or droplet.image re-creates each replica "
        "only after the one before it is back in the pool (replica 0 first), so the endpoint "
        "keeps serving on the others; a new model, vLLM or flag restarts each replica's vLLM "
        "in turn the same way, each drained first. A region move or a change to "
        "access.sshKeyFingerprints re-creates every replica at once (the endpoint is down "
        "until one is ready); balancer.size re-creates the balancer Droplet (its Reserved IP "
        "stays; streams through it are cut)."
    )


def replica_fields(
    cfg: StackConfig,
    index: int,
    ipv4: str,
    private_ipv4: str,
    host_public_key: str,
    seconds: dict[str, float],
) -> dict[str, object]:
    return {
        "name": cfg.replica_name(index),
        "ipv4": ipv4,
        "privateIpv4": private_ipv4,
        "sshCommand": ssh_command(cfg.stack, ipv4, host_public_key),
        "sshHostPublicKey": host_public_key,
        "logs": f"nemodrop logs --stack {cfg.stack} --replica {index}",
        "bootstrapSeconds": round(sum(seconds.values()), 1),
    }


def routing_text(cfg: StackConfig) -> str:
    """How the entry picks a replica, for the `balancer` output (balancer.routing)."""
    if cfg.routing == "round-robin":
        return (
            "DigitalOcean's own (no algorithm to choose), /health checks every "
            f"{catalog.LB_CHECK_INTERVAL_SECONDS} s"
        )
    checks = f"active /health checks every {balancer.HEALTH_INTERVAL_SECONDS} s"
    if cfg.routing == "cache-aware":
        return (
            f"cache-aware: vllm-router {catalog.ROUTER_VERSION} on the front sends each request "
            "to the replica whose prefix cache holds most of its prompt, within a bound on "
            f"uneven load (balancer.routing; docs/routing.md); {checks}"
        )
    return f"least outstanding requests (Caddy least_conn), {checks}"


def balancer_fields(
    cfg: StackConfig,
    caddy_price: float,
    address: str,
    ipv4: str = "",
    host_public_key: str = "",
) -> dict[str, object]:
    """`address`: the endpoint's own IPv4 (the Reserved IP or the Load Balancer's): where
    access.domain's A record points when you keep it yourself."""
    kind = cfg.balancer_kind
    out: dict[str, object] = {
        "kind": kind,
        "address": address,
        "routing": routing_text(cfg),
        "hourlyPriceUsd": balancer_hourly_price(cfg, caddy_price),
    }
    if kind == "caddy":
        out["dropletIpv4"] = ipv4
        out["sshCommand"] = ssh_command(cfg.stack, ipv4, host_public_key)
        out["sshHostPublicKey"] = host_public_key
        out["logs"] = f"nemodrop logs --stack {cfg.stack} --balancer"
    else:
        out["nodes"] = cfg.balancer.nodes
    return out


def cache_output(
    cfg: StackConfig, plans: list[cache.Plan], built: Endpoint, index: int
) -> pulumi.Input[dict[str, Any]]:
    """Replica `index`'s cache, as the `cache` output describes it."""
    volume = built.cache_volumes[index]
    if volume is None:
        return cache.output(cfg, plans[index], replica=index)
    return volume.volume.id.apply(
        lambda volume_id: cache.output(cfg, plans[index], volume_id, replica=index)
    )


def replicas(
    cfg: StackConfig, plans: list[cache.Plan], built: Endpoint
) -> list[pulumi.Output[dict[str, object]]]:
    """The `replicas` output: each replica's addresses, SSH command, logs line and cache."""

    def one(index: int) -> pulumi.Output[dict[str, object]]:
        g, b = built.gpus[index], built.bootstraps[index]
        return pulumi.Output.all(
            g.ipv4,
            g.ipv4_private,
            g.host_public_key,
            b.seconds,
            cache_output(cfg, plans, built, index),
        ).apply(
            lambda v: {
                **replica_fields(cfg, index, v[0], v[1], v[2], v[3]),
                "cache": v[4],
            }
        )

    return [one(i) for i in range(cfg.replicas)]


def balancer_output(
    cfg: StackConfig, built: Endpoint, caddy_price: float
) -> pulumi.Input[dict[str, object]]:
    """The `balancer` output: its kind, routing and price (and the Caddy Droplet's access)."""
    caddy, managed = built.caddy, built.managed
    if caddy is None:
        assert managed is not None, "with replicas there is one entry or the other"
        return managed.ipv4.apply(lambda address: balancer_fields(cfg, caddy_price, address))
    return pulumi.Output.all(caddy.ipv4, caddy.host.ipv4, caddy.host.host_public_key).apply(
        lambda v: balancer_fields(cfg, caddy_price, v[0], v[1], v[2])
    )


@dataclass(frozen=True)
class KubeBuilt:
    """What the Kubernetes platform's outputs read from its components (kube/platform.py)."""

    endpoint: pulumi.Output[str]
    host: pulumi.Output[str]
    ipv4: pulumi.Output[str]
    cluster_id: pulumi.Output[str]
    cluster_name: pulumi.Output[str]
    version: pulumi.Output[str]


def export_kubernetes(
    cfg: StackConfig, built: KubeBuilt, api_key: pulumi.Output[str], cpu_node: float,
    gpu_node: float,
) -> None:  # fmt: skip
    """A `platform: kubernetes` stack's outputs: the Droplet's names where they mean the same
    (docs/outputs.md), the cluster's own, and the costs at the sizes offer's prices."""
    k = cfg.kube
    pulumi.export("endpoint", built.endpoint)
    pulumi.export("endpointTls", cfg.access.https)
    pulumi.export("certificate", built.host.apply(lambda host: gateway.certificate(cfg, host)))
    pulumi.export("apiKey", api_key)
    pulumi.export("servedModelName", cfg.model.served_name)
    pulumi.export("ipv4", built.ipv4)
    pulumi.export("region", k.region)
    pulumi.export("size", k.gpu_pool.size)
    parts = kube.idle_monthly_parts(k, cpu_node)
    idle_monthly = round(sum(parts.values()), 2)
    # Hourly without the Volumes, as a Droplet's hourlyPriceUsd leaves its cache Volume out.
    idle_hourly = round((idle_monthly - parts["volumes"]) / catalog.HOURS_PER_BILLING_MONTH, 5)
    pulumi.export("hourlyPriceUsd", round(idle_hourly + k.replicas.min * gpu_node, 5))
    pulumi.export("idleHourlyPriceUsd", idle_hourly)
    pulumi.export("idleMonthlyPriceUsd", idle_monthly)
    pulumi.export("idleMonthlyParts", parts)
    pulumi.export("cacheMonthlyPriceUsd", parts["volumes"])
    pulumi.export("gpuNodeHourlyPriceUsd", gpu_node)
    pulumi.export("maxHourlyPriceUsd", round(idle_hourly + k.replicas.max * gpu_node, 5))
    pulumi.export(
        "cluster",
        pulumi.Output.all(built.cluster_id, built.cluster_name, built.version).apply(
            lambda v: {"id": v[0], "name": v[1], "version": v[2], "ha": k.ha}
        ),
    )
    # doctl writes the credentials into ~/.kube/config (merged, made the current context) and
    # prints none of them; no secret output is needed (docs/kubernetes.md).
    pulumi.export(
        "kubeconfigCommand",
        built.cluster_id.apply(lambda cid: f"doctl kubernetes cluster kubeconfig save {cid}"),
    )
