"""What a stack costs per hour, and the sentence said when nothing on its own stops that bill:
`pulumi up` warns it at the live price (cloud/outputs.py), `python -m components.validate`
prints it at the catalog's list price. One place, so the two say the same words."""

from __future__ import annotations

from . import catalog
from .schema import StackConfig


def bill_warning(cfg: StackConfig, hourly: float, which_price: str = "") -> str:
    """What `pulumi up` and validate say when nothing on its own will stop the bill ("": autodown
    deletes); `which_price` follows the price (validate's is the list price)."""
    if cfg.autodown.mode == "delete":
        return ""
    why = {
        "off": "autodown is off (no autodown.idleMinutes or autodown.maxHours)",
        "dry-run": "autodown only logs (autodown.dryRun, or no autodown.token)",
    }[cfg.autodown.mode]
    what = f"{cfg.replicas} GPU Droplets cost" if cfg.pooled else "the GPU Droplet costs"
    return (
        f"nothing will stop the bill: {what} ${hourly:.2f}/hour{which_price} until `pulumi "
        f"destroy`, idle or not; {why}. See the README, Stop paying"
    )


def balancer_hourly_price(cfg: StackConfig, caddy_price: float = 0.0) -> float:
    """The entry's hourly price: the Load Balancer's nodes, or the Caddy Droplet's size (the
    Reserved IP is free while assigned)."""
    if not cfg.pooled:
        return 0.0
    return (
        catalog.lb_hourly_price(cfg.balancer.nodes)
        if cfg.balancer_kind == "managed"
        else caddy_price
    )


def set_hourly_price(cfg: StackConfig, gpu_price: float, caddy_price: float = 0.0) -> float:
    """What the endpoint costs per hour: every GPU replica and the entry in front of them."""
    return round(cfg.replicas * gpu_price + balancer_hourly_price(cfg, caddy_price), 5)
