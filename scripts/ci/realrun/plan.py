"""`plan`: every bound of the run from the cost cap and the size's list price, and the
throwaway stack file it deploys (the source stack's non-secret config, made safe beside it).
Runs in the plan job, which has Python and PyYAML only.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from components.spec import catalog

from .runner import github_output

NAMESPACE = catalog.PROJECT

# ---- what a useful run needs: estimates, in minutes ----------------------------------------
# The cold start of `pulumi up`, from docs/cache.md's "Where the minutes go" table (cold column,
# upper ends; none of them measured here: this machine has no DigitalOcean access).
CREATE_MINUTES = 3  # Droplet created, SSH answers: 1-3 min
DRIVER_MINUTES = 6  # driver install and the reboot, when the image's driver is too old: 3-6 min
CONDA_MINUTES = 1  # Miniforge and two small envs: about 1 min
VLLM_MINUTES = 1  # `uv pip install` of the lock: 39 s measured (docs/facts.md)
COMPILE_MINUTES = 3  # torch.compile and CUDA graph capture: 1-3 min
# The weights come from the Hub at an assumed 100-150 MB/s (docs/cache.md): the slow end.
DOWNLOAD_MB_PER_S = 100
# A model the catalog does not know: assume this much to download.
UNKNOWN_MODEL_DISK_GB = 30

# ---- the bounds this run gives each step (step timeouts in the workflow) --------------------
# `up` is interrupted (SIGINT) at its share of the budget; Pulumi then finishes the operations in
# flight, saves the state and releases the stack's lock, so that destroy can run. This long.
UP_CANCEL_GRACE_MINUTES = 5
# No cold start docs/cache.md lists comes near this (deploy.yml gives a whole deploy 120 minutes):
# a cap that buys more is not spent waiting on a stuck `pulumi up`.
UP_CEILING_MINUTES = 120
SMOKE_MINUTES = 10  # 8 checks, each request bounded by smoke.py --timeout 60
BENCH_MINUTES = 10  # two levels of 16 requests of 128 tokens: about 2 minutes on the dev size
OUTPUTS_MINUTES = 2  # `pulumi stack output`
TIMELINE_MINUTES = 2  # a chart from the outputs
DESTROY_MINUTES = 15  # destroy, a refresh and a second destroy if the first fails, stack rm
# No Droplet yet or any more: checkout, virtualenvs, the CLI; then the summary and the artifact.
SETUP_MINUTES = 20
SUMMARY_MINUTES = 5
# Autodown's timer looks every minute, then calls the API: it deletes up to this late.
AUTODOWN_LAG_MINUTES = 2
# GitHub-hosted runners end any job after 6 hours.
GITHUB_JOB_LIMIT_MINUTES = 360

# Keys of the stack file that a throwaway stack must not copy from the stack it starts from:
# its Droplet's own name and the endpoint's DNS record would collide with that stack's, a cache
# Volume can outlive the run (and a cold run is what is measured), and replicas multiply the
# price the budget is computed from, and so does wake (a front the budget does not price; its
# token is a secret the throwaway stack has not). autodown is rewritten from the cap.
DROPPED = {
    "droplet": ("name",),
    "access": ("domain", "dnsZone"),
}
DROPPED_SECTIONS = ("cache", "replicas", "balancer", "wake")
STACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,47}$")


class PlanError(Exception):
    """An input the plan cannot use; the message names it and what is accepted."""


@dataclass(frozen=True)
class Plan:
    stack: str
    size: str
    price: float  # USD per hour: the catalog's list price, or --price
    cap: float
    budget_minutes: int  # minutes of Droplet time the cap buys at that price
    min_minutes: int  # the minimum useful run (estimates)
    min_cost: float
    cold_start_minutes: int
    up_minutes: int
    up_step_minutes: int
    smoke_minutes: int
    bench_minutes: int
    outputs_minutes: int
    timeline_minutes: int
    destroy_minutes: int
    droplet_minutes: int  # the most the Droplet (or the cluster) exists under the run's bounds
    job_minutes: int
    max_hours: float | None  # autodown.maxHours of the throwaway stack (None: no autodown)
    platform: str = "droplet"
    cluster: str = ""  # the cluster's name (platform kubernetes), for cleanup's last resort

    def github_outputs(self) -> dict[str, str]:
        return {
            "stack": self.stack,
            "size": self.size,
            "price": f"{self.price:g}",
            "cap": f"{self.cap:g}",
            "budget-minutes": str(self.budget_minutes),
            "up-minutes": str(self.up_minutes),
            "up-step-minutes": str(self.up_step_minutes),
            "smoke-minutes": str(self.smoke_minutes),
            "bench-minutes": str(self.bench_minutes),
            "outputs-minutes": str(self.outputs_minutes),
            "timeline-minutes": str(self.timeline_minutes),
            "destroy-minutes": str(self.destroy_minutes),
            "job-minutes": str(self.job_minutes),
            "platform": self.platform,
            "cluster": self.cluster,
            **({} if self.max_hours is None else {"max-hours": f"{self.max_hours:g}"}),
        }


def cents_up(dollars: float) -> float:
    """Dollars rounded up to the cent (a bound must not round down)."""
    return math.ceil(round(dollars * 100, 6)) / 100


def model_disk_gb(model: dict[str, Any]) -> int:
    """The weights' size of the stack's `model` section, as StackConfig.model_disk_gb counts it
    (the plan job runs without the program's requirements): diskGb, else the catalog's (the
    default model when no id), else vramGb, else a guess for an unknown model."""
    known = catalog.MODELS.get(model.get("id") or catalog.DEFAULT_MODEL)
    given = model.get("diskGb")
    if given is not None:
        return int(given)
    if known is not None:
        return known.disk_gb
    return int(model.get("vramGb") or UNKNOWN_MODEL_DISK_GB)


def cold_start(model: dict[str, Any]) -> tuple[int, str]:
    """`pulumi up`'s cold start for a stack's `model` section, in minutes, and its parts."""
    disk_gb = model_disk_gb(model)
    download = math.ceil(disk_gb * 1000 / DOWNLOAD_MB_PER_S / 60)
    parts = (
        ("Droplet created", CREATE_MINUTES),
        ("driver and reboot", DRIVER_MINUTES),
        ("conda", CONDA_MINUTES),
        ("vLLM", VLLM_MINUTES),
        (f"{disk_gb} GB of weights at {DOWNLOAD_MB_PER_S} MB/s", download),
        ("compile and CUDA graphs", COMPILE_MINUTES),
    )
    total = sum(m for _, m in parts)
    return total, ", ".join(f"{what} {m}" for what, m in parts)


def fixed_minutes(destroy: int = DESTROY_MINUTES) -> int:
    """The Droplet's minutes that do not depend on the cap: everything after `up`'s budget."""
    after_up = UP_CANCEL_GRACE_MINUTES + 1 + SMOKE_MINUTES + BENCH_MINUTES + OUTPUTS_MINUTES
    return after_up + TIMELINE_MINUTES + destroy


def fixed_text(destroy: int = DESTROY_MINUTES) -> str:
    """What fixed_minutes is made of, in words."""
    return (
        f"{fixed_minutes(destroy)} min: interrupting up {UP_CANCEL_GRACE_MINUTES + 1}, "
        f"smoke {SMOKE_MINUTES}, bench {BENCH_MINUTES}, outputs {OUTPUTS_MINUTES}, "
        f"timeline {TIMELINE_MINUTES}, destroy {destroy}"
    )


@dataclass(frozen=True)
class Bounds:
    """The cap turned into minutes: what both platforms' plans share."""

    budget: int  # minutes the cap buys at `price`
    up: int
    up_step: int
    billed: int  # the most the resources exist under the run's own bounds
    job: int


def bounds(cap: float, price: float, min_minutes: int, fixed: int, refusal: str) -> Bounds:
    """Every step's bound from the cap at `price` dollars an hour; `refusal` (a format string
    with {budget} and {min_cost}) says why a cap below the minimum is refused."""
    if not (math.isfinite(cap) and cap > 0):
        raise PlanError(f"--cost-cap {cap!r}: accepted: a positive number of dollars, like 5")
    budget = math.floor(round(cap / price * 60, 6))
    if budget < min_minutes:
        min_cost = cents_up(price * min_minutes / 60)
        raise PlanError(refusal.format(budget=budget, min_cost=min_cost))
    room = GITHUB_JOB_LIMIT_MINUTES - SETUP_MINUTES - SUMMARY_MINUTES - fixed
    up = min(budget - fixed, UP_CEILING_MINUTES, room)
    billed = up + fixed
    return Bounds(
        budget=budget,
        up=up,
        up_step=up + UP_CANCEL_GRACE_MINUTES + 1,
        billed=billed,
        job=min(SETUP_MINUTES + billed + SUMMARY_MINUTES, GITHUB_JOB_LIMIT_MINUTES),
    )


def price_of(size: str, price: float | None) -> float:
    known = catalog.SIZES.get(size)
    if known is None or known.vendor != "nvidia":
        accepted = ", ".join(catalog.NVIDIA_SIZES)
        what = "an AMD (ROCm) size" if known else "not a size the catalog knows"
        raise PlanError(f"--size {size!r}: {what}; accepted: {accepted}")
    if price is not None:
        if not (math.isfinite(price) and price > 0):
            raise PlanError(f"--price {price!r}: accepted: a positive number of dollars per hour")
        return price
    if known.list_price_usd_hour is None:
        raise PlanError(
            f"--size {size}: components/spec/catalog.py has no list price for it; pass --price "
            "USD_PER_HOUR (DigitalOcean's current price for the size)"
        )
    return known.list_price_usd_hour


def make_plan(
    cap: float, size: str, price: float, name: str, model: dict[str, Any]
) -> tuple[Plan, str]:
    """Every bound of the run from the cap; the second value says what the minimum is made of."""
    cold, parts = cold_start(model)
    fixed = fixed_minutes()
    min_minutes = cold + fixed
    min_cost = cents_up(price * min_minutes / 60)
    why = (
        f"{min_minutes} min of Droplet time: pulumi up's cold start, an estimate of {cold} min "
        f"({parts}: docs/cache.md, Where the minutes go), plus this run's bounds for the rest "
        f"({fixed_text()})"
    )
    b = bounds(
        cap,
        price,
        min_minutes,
        fixed,
        f"--cost-cap {cap:g}: ${cap:.2f} buys {{budget}} min of {size} at ${price:g}/hour, "
        f"less than the minimum useful run, {why}: ${{min_cost:.2f}}. Accepted: a cap of "
        "{min_cost:.2f} or more",
    )
    # From the first bootstrap, which begins once the Droplet exists: the Droplet is gone before
    # the run's own bounds end, and the run's steps that need it are over by then.
    max_minutes = b.billed - CREATE_MINUTES - AUTODOWN_LAG_MINUTES
    assert max_minutes >= b.billed - DESTROY_MINUTES, "autodown must not cut the run short"
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
        smoke_minutes=SMOKE_MINUTES,
        bench_minutes=BENCH_MINUTES,
        outputs_minutes=OUTPUTS_MINUTES,
        timeline_minutes=TIMELINE_MINUTES,
        destroy_minutes=DESTROY_MINUTES,
        droplet_minutes=b.billed,
        job_minutes=b.job,
        # Rounded down to 4 places: the lease (whole minutes, rounded up) stays at max_minutes.
        max_hours=math.floor(max_minutes / 60 * 10_000) / 10_000,
    )
    return plan, why


def without_secrets(value: Any) -> Any:
    """A config value with every encrypted part (`secure: ...`, at any depth) left out."""
    if isinstance(value, dict):
        return {
            k: without_secrets(v)
            for k, v in value.items()
            if not (isinstance(v, dict) and set(v) == {"secure"})
        }
    return value


def throwaway_config(source: dict[str, Any], size: str, max_hours: float) -> dict[str, Any]:
    """The source stack's non-secret config, made safe to deploy beside it and bounded by the
    plan (see DROPPED)."""
    prefix = f"{NAMESPACE}:"
    out: dict[str, Any] = {}
    for key, value in (source.get("config") or {}).items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            continue
        section = key.removeprefix(prefix)
        if key.startswith(prefix) and section in DROPPED_SECTIONS:
            continue
        kept = without_secrets(value)
        if key.startswith(prefix) and isinstance(kept, dict):
            kept = {k: v for k, v in kept.items() if k not in DROPPED.get(section, ())}
        out[key] = kept
    droplet = dict(out.get(f"{prefix}droplet") or {})
    droplet["size"] = size
    # env:<stack> labels are the source's; this Droplet is the run's.
    tags = [t for t in droplet.get("tags") or [] if not str(t).startswith("env:")]
    droplet["tags"] = [*tags, "env:real-run"]
    out[f"{prefix}droplet"] = droplet
    autodown = dict(out.get(f"{prefix}autodown") or {})
    autodown.pop("dryRun", None)
    autodown.pop("token", None)
    autodown["idleMinutes"] = autodown.get("idleMinutes") or 30
    autodown["maxHours"] = max_hours
    out[f"{prefix}autodown"] = autodown
    return {"config": out}


STACK_FILE_HEADER = """\
# A throwaway stack for one real run (scripts/ci/real_run.py plan; .github/workflows/real-run.yml):
# the {source} stack's non-secret config without its Droplet name, DNS record, cache Volume or
# replicas, on {size}, with autodown bounded by the cost cap (${cap:.2f}: maxHours {max_hours:g}).
# autodown.token is set by the workflow as a secret (AUTODOWN_TOKEN); without it, a dry run.
# `pulumi stack rm` deletes this file with the stack.
"""


def write_stack_file(stacks: Path, plan: Plan, header: str, config: dict[str, Any]) -> Path:
    path = stacks / f"Pulumi.{plan.stack}.yaml"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False, width=100))
    return path


def read_source(stacks: Path, name: str) -> dict[str, Any]:
    path = stacks / f"Pulumi.{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise PlanError(f"--stack-from {name}: cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError:
        raise PlanError(f"--stack-from {name}: {path} is not YAML") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise PlanError(f"--stack-from {name}: {path} has no `config:` mapping")
    return data


def check_name(name: str, stacks: Path) -> None:
    if not STACK_NAME.match(name):
        raise PlanError(
            f"--name {name!r}: accepted: letters, digits and dashes, starting with a letter or "
            "digit, at most 48 characters (e.g. real-run-<run id>-<attempt>)"
        )
    if (stacks / f"Pulumi.{name}.yaml").exists():
        raise PlanError(
            f"--name {name}: stacks/Pulumi.{name}.yaml exists; a real run never overwrites a "
            "stack file: give it a name of its own"
        )


def droplet_plan(
    args: argparse.Namespace, source: dict[str, Any]
) -> tuple[Plan, str, str, dict[str, Any]]:
    """The Droplet run's plan, what its minimum is made of, the stack file's header and config."""
    section = source["config"].get(f"{NAMESPACE}:droplet") or {}
    size = args.size or section.get("size") or catalog.DEFAULT_SIZE
    model = source["config"].get(f"{NAMESPACE}:model") or {}
    price = price_of(size, args.price)
    plan, why = make_plan(args.cost_cap, size, price, args.name, model)
    assert plan.max_hours is not None
    header = STACK_FILE_HEADER.format(
        source=args.stack_from, size=size, cap=plan.cap, max_hours=plan.max_hours
    )
    return plan, why, header, throwaway_config(source, size, plan.max_hours)


def cmd_plan(args: argparse.Namespace) -> int:
    stacks: Path = args.stacks
    kube = getattr(args, "platform", "droplet") == "kubernetes"
    source_name = args.stack_from or ("kube" if kube else "dev")
    extra: dict[str, Any] = {}
    try:
        check_name(args.name, stacks)
        source = read_source(stacks, source_name)
        if kube:
            from . import kubeplan  # noqa: PLC0415 (the program's schema: pydantic, kube runs only)

            plan, why, config, parts = kubeplan.make_kube_plan(
                args.cost_cap, args.name, source, args
            )
            header = kubeplan.STACK_FILE_HEADER.format(
                source=source_name, size=plan.size, price=plan.price,
                minutes=plan.droplet_minutes, cap=plan.cap,
            )  # fmt: skip
            extra = {"hourly_parts": parts}
        else:
            plan, why, header, config = droplet_plan(args, source)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = write_stack_file(stacks, plan, header, config)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {**asdict(plan), **extra, "minimum": why}
    (out_dir / "plan.json").write_text(json.dumps(record, indent=2))
    what = "the cluster's" if kube else "Droplet"
    stop = (
        "no autodown on Kubernetes: the destroy step, else the DigitalOcean API, deletes it"
        if plan.max_hours is None
        else f"autodown maxHours {plan.max_hours:g}"
    )
    print(
        f"plan: ${plan.cap:.2f} buys {plan.budget_minutes} min of {plan.size} at "
        f"${plan.price:g}/hour; the run's bounds allow {plan.droplet_minutes} min of {what} "
        f"time (at most ${cents_up(plan.price * plan.droplet_minutes / 60):.2f}); {stop}; "
        f"minimum useful run {why}: ${plan.min_cost:.2f}"
    )
    print(f"plan: wrote {path}")
    github_output(plan.github_outputs())
    return 0
