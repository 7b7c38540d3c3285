"""What a stack has in DigitalOcean now, read with the user's token: its Droplets (the GPU
replicas and the front), Volumes, Reserved IP, Load Balancer, DOKS cluster, and the account's
month-to-date usage. Reads only; every read through scripts/clients/digitalocean.py.

Which resources are the stack's comes from the program's own names (components/spec/schema.py
StackConfig: stack_tag, replica_tag, balancer_tag, balancer_name, droplet_name;
components/spec/volume.py volume_name), so this never guesses a naming rule of its own. The
paths and fields are DigitalOcean's OpenAPI (github.com/digitalocean/openapi at 7c1300c,
specification/DigitalOcean-public.v2.yaml `paths`, each operation's file named below).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from components.spec.schema import StackConfig
from components.spec.volume import volume_name
from nemodrop.clients import digitalocean, transport

# The account's month-to-date usage (billing/balance_get.yml; models/balance.yml: strings,
# `month_to_date_usage` "Amount used in the current billing period"), scope billing:read.
BALANCE_PATH = "/v2/customers/my/balance"


@dataclass(frozen=True)
class Droplet:
    """droplets/models/droplet.yml: the fields status reads, and the stack's role for it."""

    id: int
    name: str
    role: str  # "replica", "front" or "other" (tagged for the stack, neither)
    status: str  # new, active, off, archive
    created_at: str
    size: str
    price_hourly: float  # the size object's price_hourly (sizes/models/size.yml)
    region: str


@dataclass(frozen=True)
class Volume:
    """volumes/models/volume_base_read.yml: name, size_gigabytes, created_at, droplet_ids."""

    id: str
    name: str
    size_gigabytes: int
    created_at: str
    attached: bool


@dataclass(frozen=True)
class Cluster:
    """kubernetes/models/cluster.yml with its node_pools (node_pool.yml: count, nodes)."""

    id: str
    name: str
    status: str
    created_at: str
    ha: bool
    pools: list[dict[str, Any]]  # name, size, count, nodes [{name, status, created_at}]


@dataclass
class Inventory:
    droplets: list[Droplet] = field(default_factory=list)
    volumes: list[Volume] = field(default_factory=list)
    reserved_ips: list[str] = field(default_factory=list)
    load_balancers: list[dict[str, Any]] = field(default_factory=list)  # name, status, ...
    clusters: list[Cluster] = field(default_factory=list)
    # Sizes' hourly prices (GET /v2/sizes), for a cluster's nodes; {} without a cluster.
    prices: dict[str, float] = field(default_factory=dict)
    month_to_date_usage: float | None = None  # the whole account's; None: not read
    balance_problem: str = ""  # why it was not read


def read(api: transport.Api, cfg: StackConfig) -> Inventory:
    """Everything of `cfg`'s stack that DigitalOcean lists now. RefusedError (401, or a 403 of
    a scope) and FailedError (after the retries) go to the caller, except the balance's: a
    token without billing:read still gets the rest."""
    found = Inventory(droplets=droplets(api, cfg))
    found.volumes = volumes(api, cfg)
    ids = {d.id for d in found.droplets}
    # reserved_ips/models/reserved_ip.yml: `droplet` is the Droplet it is assigned to, or null.
    found.reserved_ips = [
        str(r.get("ip"))
        for r in digitalocean.pages(api, "/v2/reserved_ips", "reserved_ips", "reserved_ip:read")
        if ((r.get("droplet") or {}).get("id")) in ids
    ]
    found.load_balancers = [
        {"id": lb.get("id"), "name": lb.get("name"), "status": lb.get("status"),
         "created_at": lb.get("created_at"), "size_unit": lb.get("size_unit") or 1}
        for lb in digitalocean.pages(api, "/v2/load_balancers", "load_balancers",
                                     "load_balancer:read")
        if lb.get("name") == cfg.balancer_name
    ]  # fmt: skip
    if cfg.platform == "kubernetes":
        found.clusters = clusters(api, cfg)
        if found.clusters:
            found.prices = size_prices(api)
    found.month_to_date_usage, found.balance_problem = balance(api)
    return found


def droplets(api: transport.Api, cfg: StackConfig) -> list[Droplet]:
    """The stack's Droplets: GPU ones from `type=gpus` (droplets/parameters.yml droplet_type:
    "By default, only non-GPU Droplets are returned. Can not be combined with `tag_name`"), so
    filtered by the stack's tag here; the CPU ones (the front) by `tag_name`."""
    tag = urllib.parse.quote(cfg.stack_tag, safe="")
    gpus = digitalocean.pages(api, "/v2/droplets?type=gpus", "droplets", "droplet:read")
    cpus = digitalocean.pages(
        api, f"/v2/droplets?tag_name={tag}", "droplets", "droplet:read and tag:read"
    )
    out = []
    for d in [*gpus, *cpus]:
        tags = d.get("tags") or []
        if cfg.stack_tag not in tags:
            continue
        role = (
            "replica" if cfg.replica_tag in tags
            else "front" if cfg.balancer_tag in tags
            else "other"
        )  # fmt: skip
        size = d.get("size") or {}
        out.append(Droplet(
            id=int(d["id"]), name=str(d.get("name")), role=role, status=str(d.get("status")),
            created_at=str(d.get("created_at")), size=str(d.get("size_slug") or size.get("slug")),
            price_hourly=float(size.get("price_hourly") or 0.0),
            region=str((d.get("region") or {}).get("slug") or ""),
        ))  # fmt: skip
    return sorted(out, key=lambda d: (d.role != "front", d.name))


def volumes(api: transport.Api, cfg: StackConfig) -> list[Volume]:
    """The stack's cache Volumes: tagged with the stack's tag (cloud/cache.py), or named as the
    program names them (one adopted from before the tag). volumes_list.yml filters by name and
    region only, so the list is read whole."""
    count = cfg.replicas if cfg.platform == "droplet" else 0
    names = {volume_name(cfg, i) for i in range(count)}
    return [
        Volume(
            id=str(v.get("id")),
            name=str(v.get("name")),
            size_gigabytes=int(v.get("size_gigabytes") or 0),
            created_at=str(v.get("created_at")),
            attached=bool(v.get("droplet_ids")),
        )
        for v in digitalocean.pages(api, "/v2/volumes", "volumes", "block_storage:read")
        if cfg.stack_tag in (v.get("tags") or []) or v.get("name") in names
    ]


def clusters(api: transport.Api, cfg: StackConfig) -> list[Cluster]:
    """The stack's DOKS cluster: named cfg.droplet_name (cloud/kube/platform.py, tagged only
    with the project's tag). kubernetes_list_clusters.yml gives each cluster's node_pools."""
    out = []
    for c in digitalocean.pages(api, "/v2/kubernetes/clusters", "kubernetes_clusters",
                                "kubernetes:read"):  # fmt: skip
        if c.get("name") != cfg.droplet_name:
            continue
        pools = [
            {"name": p.get("name"), "size": p.get("size"), "count": int(p.get("count") or 0),
             "nodes": [{"name": n.get("name"), "status": (n.get("status") or {}).get("state"),
                        "created_at": n.get("created_at")} for n in p.get("nodes") or []]}
            for p in c.get("node_pools") or []
        ]  # fmt: skip
        out.append(Cluster(
            id=str(c.get("id")), name=str(c.get("name")),
            status=str((c.get("status") or {}).get("state")), created_at=str(c.get("created_at")),
            ha=bool(c.get("ha")), pools=pools,
        ))  # fmt: skip
    return out


def size_prices(api: transport.Api) -> dict[str, float]:
    """Each size's price_hourly (sizes/sizes_list.yml), for the nodes of a cluster's pools."""
    sizes = digitalocean.pages(api, "/v2/sizes", "sizes", "sizes:read")
    return {str(s.get("slug")): float(s.get("price_hourly") or 0.0) for s in sizes}


def balance(api: transport.Api) -> tuple[float | None, str]:
    """The account's month_to_date_usage, or None and why not (a token without billing:read
    is refused with 403: the rest of status still holds)."""
    try:
        answer = api.call("GET", BALANCE_PATH, "billing:read")
    except transport.RefusedError:
        # Only a 403 gets here: a 401 refused the reads before this one.
        return None, "the token lacks billing:read"
    if answer.status_code != 200:
        return None, f"GET {BALANCE_PATH}: HTTP {answer.status_code}"
    try:
        return float(str((answer.json() or {}).get("month_to_date_usage"))), ""
    except ValueError:  # not JSON, or no number (models/balance.yml: a string like "11.21")
        return None, f"GET {BALANCE_PATH}: no month_to_date_usage"
