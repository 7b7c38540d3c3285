"""The policy pack's rules as plain functions of a resource's inputs, so tests can call them.

Each returns the violation messages for one resource (empty: compliant). Sizes and list prices
come from the program's catalog, the one place that holds them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from components.spec import catalog  # after the path is set

DROPLET = "digitalocean:index/droplet:Droplet"
FIREWALL = "digitalocean:index/firewall:Firewall"
LOAD_BALANCER = "digitalocean:index/loadBalancer:LoadBalancer"
# A `platform: kubernetes` stack's GPU pool: each node is a Droplet of its size, at its price.
NODE_POOL = "digitalocean:index/kubernetesNodePool:KubernetesNodePool"


def pool_nodes(props: Mapping[str, Any]) -> int:
    """The most nodes a node pool may bill: the autoscaler's max, else its fixed count."""
    key = "maxNodes" if props.get("autoScale") else "nodeCount"
    return int(props.get(key) or 0)


def stack_of(urn: str) -> str:
    """urn:pulumi:<stack>::<project>::<type>::<name>"""
    prefix = "urn:pulumi:"
    return urn[len(prefix) :].split("::", 1)[0] if urn.startswith(prefix) else ""


def _ports(port_range: str | None) -> range:
    if not port_range or port_range == "all":
        return range(1, 65536)
    low, _, high = port_range.partition("-")
    return range(int(low), int(high or low) + 1)


def vllm_port_exposed(props: Mapping[str, Any]) -> list[str]:
    return [
        f"inbound rule {rule.get('protocol')} {rule.get('portRange')} from "
        f"{rule.get('sourceAddresses')} reaches vLLM's internal port {catalog.VLLM_PORT}; "
        "vLLM must stay on loopback behind the gateway"
        for rule in props.get("inboundRules") or []
        if rule.get("protocol") in ("tcp", None)
        and catalog.VLLM_PORT in _ports(rule.get("portRange"))
    ]


def missing_tags(props: Mapping[str, Any], urn: str) -> list[str]:
    tags: Sequence[str] = props.get("tags") or []
    wanted = [catalog.PROJECT, f"stack:{stack_of(urn)}"]
    missing = [t for t in wanted if t not in tags]
    return (
        [f"droplet lacks the tag(s) {missing}; every droplet carries {wanted}"] if missing else []
    )


def budget_for(config: Mapping[str, Any], urn: str) -> Mapping[str, Any]:
    """The budget that applies to a stack: its own entry under `stacks`, else the default."""
    own = (config.get("stacks") or {}).get(stack_of(urn)) or {}
    return {**{k: v for k, v in config.items() if k != "stacks"}, **own}


# Where a refusal says to change the budget: the default, or one stack's own entry.
WIDEN = ', or its entry under "stacks" for this stack alone'


def size_outside_budget(props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    size = str(props.get("size"))
    if not size.startswith("gpu-"):
        # The Caddy balancer's CPU Droplet (replicas >= 2): a small allowlist of its own.
        small: Sequence[str] = config.get("allowedBalancerSizes") or [catalog.BALANCER_SIZE]
        return (
            []
            if size in small
            else [
                f"size {size} is not in the balancer's allowlist {list(small)} "
                f"(policy/config.json: allowedBalancerSizes{WIDEN})"
            ]
        )
    allowed: Sequence[str] = config.get("allowedSizes") or catalog.NVIDIA_SIZES
    ceiling = config.get("maxHourlyPriceUsd")
    problems = []
    if size not in allowed:
        problems.append(
            f"size {size} is not in the allowlist {list(allowed)} "
            f"(policy/config.json: allowedSizes{WIDEN})"
        )
    if ceiling is not None:
        known = catalog.SIZES.get(size)
        price = known.list_price_usd_hour if known else None
        if price is None:
            problems.append(f"size {size} has no known list price to compare with ${ceiling}/h")
        elif price > float(ceiling):
            problems.append(
                f"size {size} lists at ${price}/h, above the ceiling ${ceiling}/h "
                f"(policy/config.json: maxHourlyPriceUsd{WIDEN})"
            )
    return problems


def open_to_anywhere_in_prod(props: Mapping[str, Any], urn: str) -> list[str]:
    if stack_of(urn) != "prod":
        return []
    rules = props.get("inboundRules") or []
    https = any(rule.get("portRange") == "443" for rule in rules)
    return [
        f"port {rule.get('portRange')} is open to anywhere ({', '.join(open_)}) in prod; "
        "narrow access.sshCidrs / access.apiCidrs"
        for rule in rules
        if (open_ := [a for a in rule.get("sourceAddresses") or [] if a in catalog.ANYWHERE])
        # Beside HTTPS, port 80 only answers the ACME CA's challenges (from anywhere) and
        # redirects: it carries no API.
        and not (https and rule.get("portRange") == "80")
    ]


def list_price(type_: str, props: Mapping[str, Any]) -> float:
    """What one resource lists at per hour: a GPU Droplet's size, a Load Balancer's nodes (the
    small CPU balancer Droplet and the rest count as nothing here)."""
    if type_ == DROPLET:
        known = catalog.SIZES.get(str(props.get("size")))
        return known.list_price_usd_hour or 0.0 if known else 0.0
    if type_ == LOAD_BALANCER:
        return catalog.lb_hourly_price(int(props.get("sizeUnit") or 1))
    if type_ == NODE_POOL:
        known = catalog.SIZES.get(str(props.get("size")))
        price = known.list_price_usd_hour or 0.0 if known else 0.0
        return pool_nodes(props) * price
    return 0.0


def set_outside_budget(
    resources: Sequence[tuple[str, Mapping[str, Any]]], config: Mapping[str, Any]
) -> list[str]:
    """The whole stack's hourly list price (every replica, the balancer) under its ceiling."""
    ceiling = config.get("maxTotalHourlyPriceUsd")
    if ceiling is None:
        return []
    total = sum(list_price(type_, props) for type_, props in resources)
    gpus = sum(
        1
        for type_, props in resources
        if type_ == DROPLET and str(props.get("size")).startswith("gpu-")
    )
    nodes = sum(pool_nodes(props) for type_, props in resources if type_ == NODE_POOL)
    what, fewer = f"{gpus} GPU Droplet(s) and the balancer", "fewer replicas"
    if nodes:
        what = f"{nodes} GPU node(s), the most the cluster autoscaler may add"
        fewer = "a lower kubernetes.gpuPool.maxNodes"
    if total > float(ceiling):
        return [
            f"the stack lists at ${total:.2f}/h ({what}), above "
            f"the ceiling ${ceiling}/h: {fewer}, a smaller size, or a larger "
            "maxTotalHourlyPriceUsd in policy/config.json"
        ]
    return []
