"""`plan --platform kubernetes`: the throwaway stack is the kube example (stacks/Pulumi.kube.yaml)
on ONE GPU node that is always there (gpuPool and replicas 1..1), with the run's four image
digests; its bounds come from the cap at the cluster's hourly price, part by part.

Why one node from the start, not a wake from zero: a new stack's first model server downloads
its weights from the Hub, which the router's hold (the wake budget, docs/kubernetes.md) does not
cover, so a first request at min 0 measures that download or gets the router's 503, not a wake.
A true wake needs a server that has run once, then KEDA's cooldown and the autoscaler's removal of
the node, then a request: more billed time than this run's default cap holds. This run measures
the served endpoint (smoke, bench); a wake run is a later step.

Each price is the program's own: the GPU size's list price (components/spec/catalog.py, as the
Droplet plan), the idle parts (control plane with `ha`, the CPU pool, the Load Balancer, the
Volumes) from spec/kube.py idle_monthly_parts, which the stack's outputs use, per hour of a
billing month (catalog.HOURS_PER_BILLING_MONTH). The CPU pool's size is priced from
spec/kube.py CPU_LIST_PRICE_MONTH (the sizes API needs a token the plan job has not), or
--cpu-price.

No autodown exists on Kubernetes, and the lease (scripts/ci/lease.py) deletes GPU Droplets,
not clusters (a node it deleted, the node pool would make again). What bounds the bill if the
runner dies: nothing of ours; the next run's cleanup does not look for other runs' clusters. So
the summary says so, and `cleanup --cluster NAME` deletes the run's cluster with its Load
Balancer and Volumes through the DigitalOcean API when `pulumi destroy` could not.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from components.cloud.kube import manifests, router_values
from components.spec import catalog, kube
from components.spec import config as spec_config

from .plan import BENCH_MINUTES as BENCH
from .plan import (
    DOWNLOAD_MB_PER_S,
    DROPPED,
    DROPPED_SECTIONS,
    NAMESPACE,
    Plan,
    PlanError,
    bounds,
    cents_up,
    fixed_minutes,
    fixed_text,
    price_of,
    without_secrets,
)
from .plan import OUTPUTS_MINUTES as OUTPUTS
from .plan import SMOKE_MINUTES as SMOKE
from .plan import TIMELINE_MINUTES as TIMELINE

# The cluster's create, its CPU pool and the charts on it (KEDA, Prometheus, the router): no
# figure is published and none is measured here; an estimate that the real run replaces.
CLUSTER_MINUTES = 10
CHARTS_MINUTES = 3
# destroy deletes the cluster with its Load Balancer and Volumes (destroy_all_associated_
# resources), a refresh and a second destroy if the first fails, then the API's last resort.
DESTROY_MINUTES = 25
# One GPU node, there from the start (see the docstring): the bill's GPU part is one node.
GPU_NODES = 1

# The four digests a kube stack requires: the path in `kubernetes:`, the plan's flag, and the
# repository variable real-run.yml reads when the workflow's input is empty.
DIGESTS = (
    (("imageDigest",), "image_digest", "KUBE_IMAGE_DIGEST"),
    (("edge", "imageDigest"), "edge_image_digest", "KUBE_EDGE_IMAGE_DIGEST"),
    (("router", "eppImageDigest"), "epp_image_digest", "KUBE_EPP_IMAGE_DIGEST"),
    (("router", "proxyImageDigest"), "proxy_image_digest", "KUBE_PROXY_IMAGE_DIGEST"),
)


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def digest_where(path: tuple[str, ...], dest: str, variable: str) -> str:
    return f"kubernetes.{'.'.join(path)} ({flag(dest)} or the repository variable {variable})"


def with_digests(section: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The kubernetes section with the run's digests (a flag wins over the source's); all four
    present, or one line naming those missing (the program checks their form: config.parse)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in section.items()}
    absent = []
    for path, dest, variable in DIGESTS:
        given = (getattr(args, dest, None) or "").strip()
        holder = out
        for key in path[:-1]:
            holder = holder.setdefault(key, {})
        if given:
            holder[path[-1]] = given
        elif not holder.get(path[-1]):
            absent.append(digest_where(path, dest, variable))
    if absent:
        raise PlanError(
            "a kubernetes run needs the four image digests (sha256:<64 hex>, "
            "stacks/Pulumi.kube.yaml says how to look each up); missing: " + "; ".join(absent)
        )
    return out


def throwaway_kube_config(
    source: dict[str, Any], size: str, args: argparse.Namespace
) -> dict[str, Any]:
    """The source's non-secret config on one always-there GPU node of `size`, with the
    digests; what would collide with the source (its DNS record) left out, as for a Droplet."""
    prefix = f"{NAMESPACE}:"
    out: dict[str, Any] = {}
    for key, value in (source.get("config") or {}).items():
        section = key.removeprefix(prefix)
        if (isinstance(value, dict) and set(value) == {"secure"}) or section in DROPPED_SECTIONS:
            continue
        kept = without_secrets(value)
        if key.startswith(prefix) and isinstance(kept, dict):
            kept = {k: v for k, v in kept.items() if k not in DROPPED.get(section, ())}
        out[key] = kept
    cluster = with_digests(dict(out.get(f"{prefix}kubernetes") or {}), args)
    cluster["gpuPool"] = {**(cluster.get("gpuPool") or {}), "size": size, "minNodes": GPU_NODES,
                          "maxNodes": GPU_NODES}  # fmt: skip
    cluster["replicas"] = {"min": GPU_NODES, "max": GPU_NODES}
    out[f"{prefix}platform"] = "kubernetes"
    out[f"{prefix}kubernetes"] = cluster
    return {"config": out}


def parsed(config: dict[str, Any], name: str) -> Any:
    """The throwaway stack as the program reads it (every field checked, the digests' form
    among them), before anything is written or billed."""
    prefix = f"{NAMESPACE}:"
    raw = {k.removeprefix(prefix): v for k, v in config["config"].items() if k.startswith(prefix)}
    try:
        return spec_config.parse(raw, name)
    except spec_config.ConfigError as err:
        where = "; ".join(digest_where(*d) for d in DIGESTS)
        raise PlanError(
            "the throwaway kube stack is refused: "
            + "; ".join(err.problems)
            + f" (the digests come from: {where})"
        ) from None


def hourly_parts(cfg: Any, gpu_price: float, cpu_price: float | None) -> dict[str, float]:
    """The cluster's price per hour, part by part, at list prices: the program's own parts
    (spec/kube.py idle_monthly_parts, the stack's `idleMonthlyParts` output) per billing-month
    hour, and the GPU node at its size's price."""
    k = cfg.kube
    if cpu_price is None:
        month = kube.CPU_LIST_PRICE_MONTH.get(k.cpu_pool.size)
        if month is None:
            raise PlanError(
                f"kubernetes.cpuPool.size {k.cpu_pool.size}: spec/kube.py has no list price for "
                "it; pass --cpu-price USD_PER_HOUR (DigitalOcean's price for one node)"
            )
        cpu_price = month / catalog.HOURS_PER_BILLING_MONTH
    monthly = kube.idle_monthly_parts(k, cpu_price)
    hours = catalog.HOURS_PER_BILLING_MONTH
    parts = {part: round(dollars / hours, 5) for part, dollars in monthly.items()}
    return {"gpuNodes": round(GPU_NODES * gpu_price, 5), **parts}


def cold_start(cfg: Any) -> tuple[int, str]:
    """`pulumi up` to a served model on a new cluster, in minutes, and its parts: the wake
    budget's parts (components/cloud/kube/router_values.py, docs/kubernetes.md) with the
    weights from the Hub (a new server's first start), after the cluster and its charts."""
    disk_gb = cfg.model_disk_gb
    parts = (
        ("cluster and CPU pool (estimate)", CLUSTER_MINUTES),
        ("charts (estimate)", CHARTS_MINUTES),
        ("GPU node joins", math.ceil(router_values.NODE_JOIN_SECONDS / 60)),
        (
            f"{router_values.IMAGE_GB} GB image pull",
            math.ceil(router_values.IMAGE_GB * 1000 / manifests.VOLUME_READ_MB_S / 60),
        ),
        (
            f"{disk_gb} GB of weights from the Hub at {DOWNLOAD_MB_PER_S} MB/s",
            math.ceil(disk_gb * 1000 / DOWNLOAD_MB_PER_S / 60),
        ),
        ("vLLM starts", math.ceil(manifests.ENGINE_COLD_SECONDS / 60)),
    )
    return sum(m for _, m in parts), ", ".join(f"{what} {m}" for what, m in parts)


def make_kube_plan(
    cap: float, name: str, source: dict[str, Any], args: argparse.Namespace
) -> tuple[Plan, str, dict[str, Any], dict[str, float]]:
    """The plan, what its minimum is made of, the throwaway stack's config, the hourly parts."""
    section = (source.get("config") or {}).get(f"{NAMESPACE}:kubernetes") or {}
    size = args.size or (section.get("gpuPool") or {}).get("size") or catalog.DEFAULT_SIZE
    gpu_price = price_of(size, args.price)
    config = throwaway_kube_config(source, size, args)
    cfg = parsed(config, name)
    parts = hourly_parts(cfg, gpu_price, args.cpu_price)
    price = round(sum(parts.values()), 5)
    cold, cold_parts = cold_start(cfg)
    # The timeline step is skipped on Kubernetes; its bound is counted all the same, so that
    # every step's timeout the workflow reads stays a positive number inside the job's.
    fixed = fixed_minutes(destroy=DESTROY_MINUTES)
    min_minutes = cold + fixed
    min_cost = cents_up(price * min_minutes / 60)
    shown = ", ".join(f"{part} ${dollars:g}" for part, dollars in parts.items())
    why = (
        f"{min_minutes} min of the cluster: pulumi up to a served model, an estimate of {cold} "
        f"min ({cold_parts}: docs/kubernetes.md, What a wake costs in time), plus this run's "
        f"bounds for the rest ({fixed_text(destroy=DESTROY_MINUTES)})"
    )
    b = bounds(
        cap,
        price,
        min_minutes,
        fixed,
        f"--cost-cap {cap:g}: ${cap:.2f} buys {{budget}} min of a cluster at ${price:g}/hour "
        f"({shown}: list prices), less than the minimum useful run, {why}: ${{min_cost:.2f}}. "
        "Accepted: a cap of {min_cost:.2f} or more",
    )
    plan = Plan(
        stack=name,
        size=size,
        price=price,
        cap=cap,
        budget_minutes=b.budget,
        min_minutes=min_minutes,
        min_cost=min_cost,
        cold_start_minutes=cold,
        up_minutes=b.up,
        up_step_minutes=b.up_step,
        smoke_minutes=SMOKE,
        bench_minutes=BENCH,
        outputs_minutes=OUTPUTS,
        timeline_minutes=TIMELINE,  # the step is skipped (no bootstrap on Kubernetes)
        destroy_minutes=DESTROY_MINUTES,
        droplet_minutes=b.billed,
        job_minutes=b.job,
        max_hours=None,  # no autodown on Kubernetes
        platform="kubernetes",
        cluster=cfg.droplet_name,
    )
    return plan, why, config, parts


STACK_FILE_HEADER = """\
# A throwaway stack for one real run (scripts/ci/real_run.py plan --platform kubernetes;
# .github/workflows/real-run.yml): the {source} stack's non-secret config on one {size} node that
# is there from the start (gpuPool and replicas 1..1), with the run's image digests. Its bound:
# ${price:g}/hour for at most {minutes} min (the ${cap:.2f} cap). No autodown on Kubernetes:
# the run's destroy step deletes the cluster (its Load Balancer and Volumes with it), and the
# DigitalOcean API does if destroy cannot. `pulumi stack rm` deletes this file with the stack.
"""
