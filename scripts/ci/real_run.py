#!/usr/bin/env python3
"""A real run on a real account, bounded by a cost cap: what .github/workflows/real-run.yml runs.

    python scripts/ci/real_run.py plan --cost-cap 5 --name real-run-1 --out-dir run
    AUTODOWN_TOKEN=dop_v1_... python scripts/ci/real_run.py init --stack real-run-1
    python scripts/ci/real_run.py up --stack real-run-1 --minutes 60 -- --policy-pack policy
    python scripts/ci/real_run.py outputs --stack real-run-1 --out run/outputs.json
    python scripts/ci/real_run.py cleanup --stack real-run-1 --minutes 15 --out-dir run
    python scripts/ci/real_run.py summary --out-dir run --started 1767000000 --ended 1767003000

This project cannot reach a cloud from its own machines; its users can, and their runs are the
measure that counts. One run deploys a throwaway stack (the dev stack's config under a unique
name, autodown on), checks it (smoke.py --strict), measures it (a short bench.py), draws its
bootstrap (timeline.py), and deletes it whatever happened before. Each step lives here, not in
the workflow's YAML, so that the tests run it.

`plan` turns the cost cap into every bound the run has: the minutes of Droplet time the cap buys
at the size's list price (components/spec/catalog.py), each step's timeout, the job's, and the
throwaway stack's autodown.maxHours, so that a runner that dies mid-run still leaves a Droplet
that deletes itself before the cap is spent, when the AUTODOWN_TOKEN secret lets autodown
delete. Without it, the lease workflow (scripts/ci/lease.py) is the guard, and it acts up to its
grace plus its schedule (about 45 minutes) past maxHours: beyond the cap on a small one. A cap
too small for a useful run is refused, naming the minimum and what it is made of.

`summary` writes the job summary (smoke lines, bench table, the bootstrap as a text chart, the
cost) from whatever files the run left: any of them may be missing because an earlier step
failed, and the summary says which and why instead of failing. Secrets never reach it: the
outputs file is saved without them (`outputs`), the summary reads only the keys it shows, and the
tools whose text it quotes print no key (tests/test_tools.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

# The program's catalog, and the user tools this job runs (timeline.py) in scripts/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from components.spec import catalog  # sizes and list prices, models and their disk size

ROOT = Path(__file__).resolve().parents[2]

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
# Outputs that are secrets (components/cloud/outputs.py): never written to a file, never summarised.
SECRET_OUTPUTS = ("apiKey", "sshPrivateKey")
# The outputs the summary reads; nothing else is looked at.
SUMMARY_OUTPUTS = (
    "size",
    "region",
    "hourlyPriceUsd",
    "servedModelName",
    "bootstrapTimeline",
    "autodown",
)
STACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,47}$")
# How long `pulumi stack init` and `pulumi config set` may take (a state backend round trip).
INIT_SECONDS = 300


class PlanError(Exception):
    """An input the plan cannot use; the message names it and what is accepted."""


# ---- plan ------------------------------------------------------------------------------------


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
    droplet_minutes: int  # the most the Droplet exists under the run's own bounds
    job_minutes: int
    max_hours: float  # autodown.maxHours of the throwaway stack

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
            "max-hours": f"{self.max_hours:g}",
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


def fixed_minutes() -> int:
    """The Droplet's minutes that do not depend on the cap: everything after `up`'s budget."""
    return (
        UP_CANCEL_GRACE_MINUTES
        + 1
        + SMOKE_MINUTES
        + BENCH_MINUTES
        + OUTPUTS_MINUTES
        + TIMELINE_MINUTES
        + DESTROY_MINUTES
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
    if not (math.isfinite(cap) and cap > 0):
        raise PlanError(f"--cost-cap {cap!r}: accepted: a positive number of dollars, like 5")
    cold, parts = cold_start(model)
    fixed = fixed_minutes()
    min_minutes = cold + fixed
    min_cost = cents_up(price * min_minutes / 60)
    why = (
        f"{min_minutes} min of Droplet time: pulumi up's cold start, an estimate of {cold} min "
        f"({parts}: docs/cache.md, Where the minutes go), plus this run's bounds for the rest "
        f"({fixed} min: interrupting up {UP_CANCEL_GRACE_MINUTES + 1}, smoke {SMOKE_MINUTES}, "
        f"bench {BENCH_MINUTES}, outputs {OUTPUTS_MINUTES}, timeline {TIMELINE_MINUTES}, "
        f"destroy {DESTROY_MINUTES})"
    )
    budget = math.floor(round(cap / price * 60, 6))
    if budget < min_minutes:
        raise PlanError(
            f"--cost-cap {cap:g}: ${cap:.2f} buys {budget} min of {size} at ${price:g}/hour, "
            f"less than the minimum useful run, {why}: ${min_cost:.2f}. Accepted: a cap of "
            f"{min_cost:.2f} or more"
        )
    room = GITHUB_JOB_LIMIT_MINUTES - SETUP_MINUTES - SUMMARY_MINUTES - fixed
    up = min(budget - fixed, UP_CEILING_MINUTES, room)
    up_step = up + UP_CANCEL_GRACE_MINUTES + 1
    droplet = up + fixed
    # From the first bootstrap, which begins once the Droplet exists: the Droplet is gone before
    # the run's own bounds end, and the run's steps that need it are over by then.
    max_minutes = droplet - CREATE_MINUTES - AUTODOWN_LAG_MINUTES
    assert max_minutes >= droplet - DESTROY_MINUTES, "autodown must not cut the run short"
    plan = Plan(
        stack=name,
        size=size,
        price=price,
        cap=cap,
        budget_minutes=budget,
        min_minutes=min_minutes,
        min_cost=min_cost,
        cold_start_minutes=cold,
        up_minutes=up,
        up_step_minutes=up_step,
        smoke_minutes=SMOKE_MINUTES,
        bench_minutes=BENCH_MINUTES,
        outputs_minutes=OUTPUTS_MINUTES,
        timeline_minutes=TIMELINE_MINUTES,
        destroy_minutes=DESTROY_MINUTES,
        droplet_minutes=droplet,
        job_minutes=min(SETUP_MINUTES + droplet + SUMMARY_MINUTES, GITHUB_JOB_LIMIT_MINUTES),
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


def write_stack_file(stacks: Path, source_name: str, plan: Plan, source: dict[str, Any]) -> Path:
    path = stacks / f"Pulumi.{plan.stack}.yaml"
    text = STACK_FILE_HEADER.format(
        source=source_name, size=plan.size, cap=plan.cap, max_hours=plan.max_hours
    ) + yaml.safe_dump(
        throwaway_config(source, plan.size, plan.max_hours), sort_keys=False, width=100
    )
    path.write_text(text)
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


def cmd_plan(args: argparse.Namespace) -> int:
    stacks: Path = args.stacks
    try:
        check_name(args.name, stacks)
        source = read_source(stacks, args.stack_from)
        section = source["config"].get(f"{NAMESPACE}:droplet") or {}
        size = args.size or section.get("size") or catalog.DEFAULT_SIZE
        model = source["config"].get(f"{NAMESPACE}:model") or {}
        price = price_of(size, args.price)
        plan, why = make_plan(args.cost_cap, size, price, args.name, model)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = write_stack_file(stacks, args.stack_from, plan, source)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan.json").write_text(json.dumps({**asdict(plan), "minimum": why}, indent=2))
    print(
        f"plan: ${plan.cap:.2f} buys {plan.budget_minutes} min of {plan.size} at "
        f"${plan.price:g}/hour; the run's bounds allow {plan.droplet_minutes} min of Droplet "
        f"time (at most ${cents_up(plan.price * plan.droplet_minutes / 60):.2f}); autodown "
        f"maxHours {plan.max_hours:g}; minimum useful run {why}: ${plan.min_cost:.2f}"
    )
    print(f"plan: wrote {path}")
    github_output(plan.github_outputs())
    return 0


def github_output(values: dict[str, str]) -> None:
    """Step outputs: `key=value` lines appended to $GITHUB_OUTPUT when set (and printed)."""
    lines = [f"{k}={v}" for k, v in values.items()]
    for line in lines:
        print(f"output: {line}")
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a") as f:
            f.write("".join(f"{line}\n" for line in lines))


# ---- running the Pulumi CLI, bounded ---------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str
    # Why it was interrupted: "" (it was not), "timeout" or "cancelled" (SIGINT or SIGTERM here).
    stopped: str = ""


def run_bounded(
    argv: Sequence[str],
    seconds: float,
    grace_seconds: float = 30.0,
    input_text: str | None = None,
    capture: bool = False,
) -> Ran:
    """Run a command for at most `seconds`; then interrupt it (SIGINT, as Ctrl-C: Pulumi
    finishes what is in flight, saves its state and releases the stack's lock), and kill it only
    if it is still there `grace_seconds` later. An interrupt or SIGTERM of this process (the
    runner cancelling the job) is passed on the same way. The command runs in a session of its
    own, so that it gets that one SIGINT and no second one from a terminal's or a process
    group's Ctrl-C: a second SIGINT makes Pulumi stop at once, without saving."""
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(  # noqa: S603 (argv from this file, no shell)
        list(argv),
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=pipe,
        stderr=pipe,
        text=True,
        start_new_session=True,
    )
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        out, err = proc.communicate(input_text, timeout=seconds)
        return Ran(proc.returncode, out or "", err or "")
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as why:
        stopped = "timeout" if isinstance(why, subprocess.TimeoutExpired) else "cancelled"
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=grace_seconds)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            out, err = proc.communicate()
        return Ran(proc.returncode, out or "", err or "", stopped)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(signum: int, frame: object) -> None:
    """SIGTERM, as the runner sends when it cancels a step: handled as an interrupt."""
    raise KeyboardInterrupt


def pulumi_cli() -> str:
    exe = shutil.which("pulumi")
    if exe is None:
        raise SystemExit(
            "error: no Pulumi CLI on PATH (the workflow installs it with pulumi/actions)"
        )
    return exe


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no message"


def cmd_init(args: argparse.Namespace) -> int:
    """Create the stack, then give autodown its token through stdin (never a command line)."""
    started = int(time.time())
    github_output({"started": str(started)})  # first: the summary needs it even if init fails
    pulumi = pulumi_cli()
    made = run_bounded([pulumi, "stack", "init", args.stack], INIT_SECONDS)
    if made.returncode != 0:
        print(f"error: pulumi stack init {args.stack} failed (above)", file=sys.stderr)
        return 1
    token = os.environ.get("AUTODOWN_TOKEN", "")
    if not token:
        print(
            "::warning::no AUTODOWN_TOKEN secret: autodown runs as a dry run on this Droplet; "
            "only this run's destroy step and the lease workflow stop the bill"
        )
        github_output({"autodown": "dry-run"})
        return 0
    argv = [pulumi, "config", "set", "--secret", "--path", "autodown.token", "--stack", args.stack]
    given = run_bounded(argv, INIT_SECONDS, input_text=token, capture=True)
    if given.returncode != 0:
        # Pulumi's own message names the key, never the value; still, print only its last line.
        print(f"error: setting autodown.token failed: {last_line(given.stderr)}", file=sys.stderr)
        return 1
    github_output({"autodown": "delete"})
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    pulumi = pulumi_cli()
    extra = [a for a in args.pulumi_args if a != "--"]
    argv = [pulumi, "up", "--yes", "--stack", args.stack, *extra]
    ran = run_bounded(argv, args.minutes * 60, args.grace_minutes * 60)
    if ran.stopped:
        why = (
            f"ran past its {args.minutes:g} minutes (its share of the cost cap)"
            if ran.stopped == "timeout"
            else "was cancelled"
        )
        print(
            f"error: pulumi up {why}: interrupted so that it saved its state and released the "
            "stack's lock; the destroy step deletes what it created",
            file=sys.stderr,
        )
        return 1
    return ran.returncode


def cmd_outputs(args: argparse.Namespace) -> int:
    """The stack's outputs without the secret ones, for the summary and the artifact."""
    pulumi = pulumi_cli()
    argv = [pulumi, "stack", "output", "--json", "--stack", args.stack]
    ran = run_bounded(argv, args.minutes * 60, capture=True)
    if ran.returncode != 0:
        print(f"error: pulumi stack output: {last_line(ran.stderr)}", file=sys.stderr)
        return 1
    try:
        outputs = json.loads(ran.stdout or "{}")
    except ValueError:
        print("error: pulumi stack output --json printed no JSON", file=sys.stderr)
        return 1
    if not isinstance(outputs, dict):
        print("error: pulumi stack output --json printed no JSON object", file=sys.stderr)
        return 1
    kept = {k: v for k, v in outputs.items() if k not in SECRET_OUTPUTS}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(kept, indent=2))
    print(f"outputs: wrote {args.out} ({len(kept)} outputs; left out: {', '.join(SECRET_OUTPUTS)})")
    return 0


# ---- cleanup: destroy and remove, whatever came before --------------------------------------


@dataclass
class Cleanup:
    stack: str
    found: bool = False
    destroyed: bool = False
    removed: bool = False
    ended: int | None = None  # when the stack's resources were gone (epoch seconds)
    message: str = ""


def find_stack(listing: str, stack: str) -> dict[str, Any] | None:
    """`pulumi stack ls --json`'s entry for `stack` (a backend may qualify the name)."""
    entries = json.loads(listing or "[]")
    for entry in entries if isinstance(entries, list) else []:
        name = str(entry.get("name") or "") if isinstance(entry, dict) else ""
        if name == stack or name.endswith(f"/{stack}"):
            return dict(entry)
    return None


def by_hand(stack: str) -> str:
    return (
        f"by hand, with the same backend and secrets: `pulumi destroy --stack {stack}` then "
        f"`pulumi stack rm {stack}`; until then autodown (maxHours) and the lease workflow are "
        "what deletes the Droplet"
    )


def destroy(pulumi: str, result: Cleanup, remaining: Callable[[], float]) -> bool:
    """Destroy; if that fails, refresh (the Droplet may have deleted itself) and try again."""
    stack = result.stack
    attempts = (
        [[pulumi, "destroy", "--yes", "--skip-preview", "--stack", stack]],
        [
            [pulumi, "refresh", "--yes", "--skip-preview", "--stack", stack],
            [pulumi, "destroy", "--yes", "--skip-preview", "--stack", stack],
        ],
    )
    for attempt in attempts:
        ran = Ran(1, "", "")
        for argv in attempt:
            if remaining() <= 0:
                result.message = f"no time left for `{' '.join(argv[1:3])}`; " + by_hand(stack)
                return False
            ran = run_bounded(argv, remaining())
        if ran.returncode == 0 and not ran.stopped:
            return True
    result.message = "pulumi destroy failed twice (above); the stack is kept: its state is " + (
        "what knows what is left. " + by_hand(stack)
    )
    return False


def listed_entry(pulumi: str, stack: str, seconds: float) -> tuple[dict[str, Any] | None, str]:
    """The stack's entry in `pulumi stack ls --json` (None: not there), or why it is unknown."""
    listed = run_bounded([pulumi, "stack", "ls", "--json"], seconds, capture=True)
    if listed.returncode != 0:
        return None, f"cannot list the stacks ({last_line(listed.stderr)})"
    try:
        return find_stack(listed.stdout, stack), ""
    except ValueError:
        return None, "cannot list the stacks (pulumi stack ls --json printed no JSON)"


def cleanup(stack: str, minutes: float) -> tuple[int, Cleanup]:
    """Destroy the stack and remove it. Nothing to do when it was never made; when destroy
    fails the stack is kept (`stack rm` would drop the state of what still bills), never
    forced."""
    deadline = time.monotonic() + max(minutes - 1, 0.5) * 60  # done before the step's timeout

    def remaining() -> float:
        return deadline - time.monotonic()

    result = Cleanup(stack)
    pulumi = shutil.which("pulumi")
    if not stack or pulumi is None:
        result.message = (
            "no stack name: the plan did not run, so nothing was created"
            if not stack
            else "no Pulumi CLI: it is installed before the stack is created, so nothing was; "
            "if that is wrong, " + by_hand(stack)
        )
        return (0 if not stack else 1), result
    entry, problem = listed_entry(pulumi, stack, remaining())
    if problem:
        result.message = f"{problem}; " + by_hand(stack)
        return 1, result
    if entry is None:
        result.message = f"nothing to destroy: stack {stack} was never created"
        result.ended = int(time.time())
        return 0, result
    result.found = True
    if not destroy(pulumi, result, remaining):
        return 1, result
    result.destroyed, result.ended = True, int(time.time())
    removed = run_bounded([pulumi, "stack", "rm", "--yes", "--stack", stack], max(remaining(), 1))
    if removed.returncode != 0:
        result.message = (
            f"destroyed (nothing bills), but `pulumi stack rm {stack}` failed (above): run it "
            "by hand to remove the empty stack"
        )
        return 1, result
    result.removed = True
    result.message = f"destroyed and removed stack {stack}"
    return 0, result


def cmd_cleanup(args: argparse.Namespace) -> int:
    code, result = cleanup(args.stack or "", args.minutes)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cleanup.json").write_text(json.dumps(asdict(result), indent=2))
    print(f"cleanup: {result.message}", file=sys.stderr if code else sys.stdout)
    if result.ended is not None:
        github_output({"ended": str(result.ended)})
    return code


# ---- summary ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    outputs: Path
    smoke: Path
    bench: Path
    timeline_png: Path
    plan: Path
    cleanup: Path
    started: int | None
    ended: int | None
    price: float | None
    cap: float | None


# Which step writes each file, for the line that says why one is missing.
WRITTEN_BY = {
    "outputs": "the outputs step (after a successful `pulumi up`)",
    "smoke": "the smoke step (after a successful `pulumi up`)",
    "bench": "the bench step (after a successful `pulumi up`)",
    "timeline_png": "the timeline step (from the outputs)",
    "plan": "the plan step",
    "cleanup": "the destroy step",
}


def missing(what: str, path: Path, detail: str = "") -> str:
    why = detail or f"it was not written: {WRITTEN_BY[what]} did not run or failed"
    return f"_Missing: `{path}`: {why}._"


def read_json(path: Path) -> tuple[Any, str]:
    """The file's JSON, or None and why not."""
    try:
        return json.loads(path.read_text()), ""
    except FileNotFoundError:
        return None, ""
    except OSError as err:
        return None, f"unreadable ({err.strerror})"
    except ValueError as err:
        return None, f"not JSON ({err})"


def fmt(value: Any, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else "-"


def bench_section(path: Path) -> list[str]:
    data, problem = read_json(path)
    if data is None:
        return [missing("bench", path, problem)]
    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, list) or not levels:
        return [missing("bench", path, "not a bench.py result file (no levels)")]
    settings = data.get("settings") or {}
    lines = [
        f"Model `{data.get('model', '?')}`; per level {settings.get('requests', '?')} requests of "
        f"about {settings.get('input_tokens', '?')} prompt and "
        f"{settings.get('max_tokens') or 128} output tokens. Latency in ms, p50 / p99.",
        "",
        "| level | ok / err | TTFT | ITL | TPOT | E2E | req/s | out tok/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for r in levels:
        if not isinstance(r, dict):
            continue
        level = r.get("request_rate") if r.get("mode") == "open" else r.get("concurrency")
        label = f"{level}/s" if r.get("mode") == "open" else f"conc {level}"
        ok = (r.get("requests") or 0) - (r.get("errors") or 0)
        cells = [
            " / ".join(fmt((r.get(k) or {}).get(q)) for q in ("p50", "p99"))
            for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
        ]
        lines.append(
            f"| {label} | {ok} / {r.get('errors', '?')} | {' | '.join(cells)} | "
            f"{fmt(r.get('requests_per_s'), 2)} | {fmt(r.get('output_tokens_per_s'))} |"
        )
        if r.get("aborted"):
            notes.append(f"{label} stopped: {r['aborted']}")
        if r.get("errors_by_kind"):
            notes.append(f"{label} errors: {r['errors_by_kind']}")
    return lines + [f"\n{n}" for n in notes]


def smoke_section(path: Path) -> tuple[list[str], str]:
    try:
        text = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return [missing("smoke", path)], "not run"
    except OSError as err:
        return [missing("smoke", path, f"unreadable ({err.strerror})")], "unknown"
    if not text:
        return [missing("smoke", path, "empty: smoke.py printed nothing")], "unknown"
    last = text.splitlines()[-1]
    verdict = "passed" if last == "all checks passed" else "failed"
    return ["```text", text, "```"], verdict


GANTT_WIDTH = 40


def timeline_section(outputs: Any, png: Path) -> list[str]:
    import timeline  # noqa: PLC0415 (the tools' dependencies, only needed here)

    entries = outputs.get("bootstrapTimeline") if isinstance(outputs, dict) else None
    if not isinstance(entries, dict):
        return ["_Missing: no `bootstrapTimeline` in the outputs (see above)._"]
    timed, untimed = timeline.spans(entries)
    if not timed:
        return ["_No phase recorded its times._"]
    origin = min(s.start for s in timed)
    wall = max(s.end for s in timed) - origin or 1.0
    critical = {s.phase for s in timeline.critical_path(timed)}
    lines = [
        f"The bootstrap took {wall:,.0f} s from the first phase's start to the last one's end; "
        "█ marks the critical path (shortening anything else would not bring the endpoint "
        "sooner).",
        "",
        "```text",
        f"{'phase':<12} {'start s':>8} {'seconds':>8}  timeline",
    ]
    for s in timed:
        at = int((s.start - origin) / wall * GANTT_WIDTH)
        length = max(1, round(s.seconds / wall * GANTT_WIDTH))
        bar = ("█" if s.phase in critical else "▒") * length
        lines.append(f"{s.phase:<12} {s.start - origin:>8,.0f} {s.seconds:>8,.1f}  {' ' * at}{bar}")
    # The downloads against the link, and the disks preflight saw: timeline.py's own lines.
    lines += [
        "",
        *timeline.budget(entries),
        *(["", *seen] if (seen := timeline.disks(entries)) else []),
    ]
    lines.append("```")
    if untimed:
        lines += ["", f"No times recorded for: {', '.join(untimed)}."]
    picture = (
        f"The same as a picture: `{png.name}` in this run's artifact"
        if png.exists()
        else missing("timeline_png", png)
    )
    lines += [
        "",
        picture
        + " (a job summary cannot show it: GitHub strips `data:` images from Markdown, and an "
        "artifact needs a signed-in download, not an image link).",
    ]
    return lines


def hourly_price(outputs: Any, fallback: float | None) -> tuple[float | None, str]:
    live = outputs.get("hourlyPriceUsd") if isinstance(outputs, dict) else None
    if isinstance(live, int | float) and live > 0:
        return float(live), "the live price the stack exported (`hourlyPriceUsd`)"
    if fallback is not None:
        return fallback, (
            "the size's list price (components/spec/catalog.py): no live price exported"
        )
    return None, ""


def cost_section(inputs: Inputs, outputs: Any, cleaned: Any) -> list[str]:
    price, source = hourly_price(outputs, inputs.price)
    cap = f" of the ${inputs.cap:.2f} cap" if inputs.cap else ""
    found = cleaned.get("found") if isinstance(cleaned, dict) else None
    if inputs.started is None or found is False:
        return ["$0.00: nothing was created (`pulumi up` never started or no stack was made)."]
    if price is None:
        return ["Unknown: no price (the plan did not run and the stack exported none)."]
    ended, note = inputs.ended, ""
    if ended is None:
        ended = int(time.time())
        note = (
            " **The destroy step did not report an end: the Droplet may still exist and bill** "
            "(see Destroy below); this is the cost up to now."
        )
    seconds = max(ended - inputs.started, 0)
    per_second = cents_up(max(price * seconds / 3600, price / 60, 0.01))
    by_hour = cents_up(price * max(math.ceil(seconds / 3600), 1))
    return [
        f"**About ${per_second:.2f}**{cap}: {seconds // 60} min {seconds % 60} s from the start "
        f"of `pulumi up` to the end of `pulumi destroy` (the Droplet exists only inside it) at "
        f"${price:g}/hour, {source}, per second.{note}",
        "",
        "DigitalOcean bills Droplets per second since 1 January 2026, with a minimum of 60 "
        "seconds or $0.01 (its Droplet pricing page says so for CPU Droplets; its GPU section "
        f"was not readable from here). Billed by the started hour instead: ${by_hour:.2f}.",
    ]


def destroy_section(path: Path, cleaned: Any, problem: str) -> list[str]:
    if not isinstance(cleaned, dict):
        return [
            missing("cleanup", path, problem)
            + " **Check that nothing is left**: `pulumi stack ls`, and the DigitalOcean console "
            "(Droplets tagged `nemotron-droplet`)."
        ]
    return [str(cleaned.get("message") or "no message")]


def autodown_line(outputs: Any) -> str:
    autodown = outputs.get("autodown") if isinstance(outputs, dict) else None
    if not isinstance(autodown, dict):
        return "Autodown: unknown (no outputs)."
    mode = autodown.get("mode")
    line = (
        f"Autodown: `{mode}`, idleMinutes {autodown.get('idleMinutes')}, "
        f"maxHours {autodown.get('maxHours')}"
    )
    if mode == "dry-run":
        line += (
            ": a dry run (no AUTODOWN_TOKEN secret), so had this run's destroy failed, only the "
            "lease workflow would have deleted the Droplet"
        )
    return line + "."


def summary(inputs: Inputs) -> str:
    outputs, outputs_problem = read_json(inputs.outputs)
    plan, _ = read_json(inputs.plan)
    cleaned, cleanup_problem = read_json(inputs.cleanup)
    if isinstance(outputs, dict):  # only the keys the summary shows
        outputs = {k: outputs[k] for k in SUMMARY_OUTPUTS if k in outputs}
    stack = plan.get("stack") if isinstance(plan, dict) else None
    size = (outputs or {}).get("size") or (plan.get("size") if isinstance(plan, dict) else None)
    smoke_lines, smoke_verdict = smoke_section(inputs.smoke)
    head = [
        f"## Real run: `{stack or 'no plan'}`",
        "",
        f"Size `{size or '?'}` in `{(outputs or {}).get('region') or '?'}`, model "
        f"`{(outputs or {}).get('servedModelName') or '?'}`; smoke: {smoke_verdict}. "
        + autodown_line(outputs),
    ]
    if outputs is None:
        head += ["", missing("outputs", inputs.outputs, outputs_problem)]
    if plan is None:
        head += ["", missing("plan", inputs.plan)]
    body = [
        *head,
        "",
        "### Cost",
        "",
        *cost_section(inputs, outputs, cleaned),
        "",
        "### Destroy",
        "",
        *destroy_section(inputs.cleanup, cleaned, cleanup_problem),
        "",
        "### Smoke (`smoke.py --strict`)",
        "",
        *smoke_lines,
        "",
        "### Bench (`bench.py`, short)",
        "",
        *bench_section(inputs.bench),
        "",
        "### Bootstrap timeline",
        "",
        *(
            timeline_section(outputs, inputs.timeline_png)
            if outputs is not None
            else ["_No outputs, so no timeline (see above)._"]
        ),
        "",
        "The artifact keeps the JSON (plan, outputs without secrets, bench, cleanup), the smoke "
        "and timeline text and the timeline picture.",
    ]
    return "\n".join(body) + "\n"


def epoch(text: str | None, what: str) -> int | None:
    """An epoch from a step output; empty means the step did not run."""
    if not text:
        return None
    try:
        return int(float(text))
    except ValueError:
        raise SystemExit(f"error: {what} {text!r}: accepted: epoch seconds, or empty") from None


def dollars(text: str | None, what: str) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SystemExit(f"error: {what} {text!r}: accepted: a number of dollars") from None
    return value if math.isfinite(value) and value > 0 else None


def cmd_summary(args: argparse.Namespace) -> int:
    base: Path = args.out_dir

    def path(given: str | None, name: str) -> Path:
        return Path(given) if given else base / name

    inputs = Inputs(
        outputs=path(args.outputs, "outputs.json"),
        smoke=path(args.smoke, "smoke.txt"),
        bench=path(args.bench, "bench.json"),
        timeline_png=path(args.timeline_png, "timeline.png"),
        plan=path(args.plan, "plan.json"),
        cleanup=path(args.cleanup, "cleanup.json"),
        started=epoch(args.started, "--started"),
        ended=epoch(args.ended, "--ended"),
        price=dollars(args.price, "--price"),
        cap=dollars(args.cap, "--cap"),
    )
    text = summary(inputs)
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


# ---- command line ----------------------------------------------------------------------------


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: accepted: a positive number, like 5 or 2.50"
        ) from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: a positive number, like 5 or 2.50")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="bounds from the cost cap; write the throwaway stack file")
    p.add_argument("--cost-cap", type=positive, required=True, help="dollars, e.g. 5")
    p.add_argument("--size", help="GPU size slug (default: the --stack-from stack's)")
    p.add_argument("--price", type=positive, help="USD/hour, for a size without a list price")
    p.add_argument("--stack-from", default="dev", help="the stack to copy (default dev)")
    p.add_argument("--name", required=True, help="the throwaway stack's name (unique)")
    p.add_argument("--stacks", type=Path, default=ROOT / "stacks", help="the stack files' folder")
    p.add_argument("--out-dir", type=Path, required=True, help="where plan.json goes")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("init", help="pulumi stack init; autodown.token from $AUTODOWN_TOKEN")
    p.add_argument("--stack", required=True)
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("up", help="pulumi up, interrupted at --minutes")
    p.add_argument("--stack", required=True)
    p.add_argument("--minutes", type=positive, required=True)
    p.add_argument("--grace-minutes", type=positive, default=UP_CANCEL_GRACE_MINUTES)
    p.add_argument("pulumi_args", nargs=argparse.REMAINDER, help="-- then more pulumi up flags")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("outputs", help="the stack outputs without the secret ones, to a file")
    p.add_argument("--stack", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=positive, default=OUTPUTS_MINUTES)
    p.set_defaults(func=cmd_outputs)

    p = sub.add_parser("cleanup", help="pulumi destroy and stack rm, whatever came before")
    p.add_argument("--stack", default="", help="empty: the plan never ran, nothing to do")
    p.add_argument("--minutes", type=positive, default=DESTROY_MINUTES)
    p.add_argument("--out-dir", type=Path, required=True, help="where cleanup.json goes")
    p.set_defaults(func=cmd_cleanup)

    p = sub.add_parser("summary", help="the job summary from what the run left")
    p.add_argument("--out-dir", type=Path, default=Path("run"), help="default folder of inputs")
    p.add_argument("--outputs", help="outputs JSON (default OUT_DIR/outputs.json)")
    p.add_argument("--smoke", help="smoke.py's output (default OUT_DIR/smoke.txt)")
    p.add_argument("--bench", help="bench.py --json (default OUT_DIR/bench.json)")
    p.add_argument("--timeline-png", help="timeline.py --png (default OUT_DIR/timeline.png)")
    p.add_argument("--plan", help="plan.json (default OUT_DIR/plan.json)")
    p.add_argument("--cleanup", help="cleanup.json (default OUT_DIR/cleanup.json)")
    p.add_argument("--started", help="epoch when `pulumi up` started (empty: it did not)")
    p.add_argument("--ended", help="epoch when destroy finished (empty: it did not)")
    p.add_argument("--price", help="USD/hour, when the stack exported no price")
    p.add_argument("--cap", help="the cost cap in dollars")
    p.set_defaults(func=cmd_summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
