#!/usr/bin/env python3
"""A real run on a real account, bounded by a cost cap: what .github/workflows/real-run.yml runs.

    python scripts/ci/real_run.py plan --cost-cap 5 --name real-run-1 --out-dir run
    read -rs AUTODOWN_TOKEN && export AUTODOWN_TOKEN   # pasted: no echo, no history
    python scripts/ci/real_run.py init --stack real-run-1
    python scripts/ci/real_run.py up --stack real-run-1 --minutes 60 -- --policy-pack policy
    python scripts/ci/real_run.py outputs --stack real-run-1 --out run/outputs.json
    python scripts/ci/real_run.py cleanup --stack real-run-1 --minutes 15 --out-dir run
    python scripts/ci/real_run.py summary --out-dir run --started 1767000000 --ended 1767003000

This project cannot reach a cloud from its own machines; its users can, and their runs are the
measure that counts. One run deploys a throwaway stack (the dev stack's config under a unique
name, autodown on), checks it (smoke.py --strict), measures it (a short bench.py), draws its
bootstrap (timeline.py), and deletes it whatever happened before. Each step lives in a module
of realrun/ beside this file (this one is their command line), not in the workflow's YAML, so
that the tests run it.

`plan` turns the cost cap into every bound the run has: the minutes of Droplet time the cap buys
at the size's list price (components/spec/catalog.py), each step's timeout, the job's, and the
throwaway stack's autodown.maxHours, so that a runner that dies mid-run still leaves a Droplet
that deletes itself before the cap is spent, when the AUTODOWN_TOKEN secret lets autodown
delete. Without it, the lease workflow (scripts/ci/lease.py) is the guard, and it acts up to its
grace plus its schedule (about 45 minutes) past maxHours: beyond the cap on a small one. A cap
too small for a useful run is refused, naming the minimum and what it is made of.

`plan --platform kubernetes` deploys the kube example's cluster instead, on one GPU node from
the start, bounded by the cap at the cluster's hourly price part by part (realrun/kubeplan.py);
with no autodown on Kubernetes, `cleanup --cluster` deletes the cluster through the DigitalOcean
API when `pulumi destroy` cannot (realrun/cleanup.py).

`summary` writes the job summary (smoke lines, bench table, the bootstrap as a text chart, the
cost) from whatever files the run left: any of them may be missing because an earlier step
failed, and the summary says which and why instead of failing. Secrets never reach it: the
outputs file is saved without them (`outputs`), the summary reads only the keys it shows, and the
tools whose text it quotes print no key (tests/test_tools.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

# The program's catalog, and the user tools the steps reuse (target.py, bench_report.py,
# timeline.py) in scripts/; the steps themselves in realrun/ beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from realrun import cleanup, deploy, plan, summary

ROOT = Path(__file__).resolve().parents[2]
# components.spec.schema.PLATFORMS, spelt here: the plan job imports the standard library alone
# before a Kubernetes plan (tests/test_real_run.py holds the two equal).
PLATFORMS = ("droplet", "kubernetes")


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
    p.add_argument(
        "--platform",
        choices=PLATFORMS,
        default="droplet",
        help="droplet (default): the dev stack's Droplet; kubernetes: the kube example's cluster",
    )
    p.add_argument(
        "--stack-from", help="the stack to copy (default dev; kube with --platform kubernetes)"
    )
    p.add_argument("--cpu-price", type=positive, help="USD/hour of one CPU node (kubernetes)")
    for dest in ("image_digest", "edge_image_digest", "epp_image_digest", "proxy_image_digest"):
        # Not secrets: an image's digest. Empty: the --stack-from file's (realrun/kubeplan.py).
        p.add_argument("--" + dest.replace("_", "-"), dest=dest, default="", help="kubernetes")
    p.add_argument("--name", required=True, help="the throwaway stack's name (unique)")
    p.add_argument("--stacks", type=Path, default=ROOT / "stacks", help="the stack files' folder")
    p.add_argument("--out-dir", type=Path, required=True, help="where plan.json goes")
    p.set_defaults(func=plan.cmd_plan)

    p = sub.add_parser("init", help="pulumi stack init; autodown.token from $AUTODOWN_TOKEN")
    p.add_argument("--stack", required=True)
    p.add_argument("--platform", choices=PLATFORMS, default="droplet")
    p.set_defaults(func=deploy.cmd_init)

    p = sub.add_parser("up", help="pulumi up, interrupted at --minutes")
    p.add_argument("--stack", required=True)
    p.add_argument("--minutes", type=positive, required=True)
    p.add_argument("--grace-minutes", type=positive, default=plan.UP_CANCEL_GRACE_MINUTES)
    p.add_argument("pulumi_args", nargs=argparse.REMAINDER, help="-- then more pulumi up flags")
    p.set_defaults(func=deploy.cmd_up)

    p = sub.add_parser("outputs", help="the stack outputs without the secret ones, to a file")
    p.add_argument("--stack", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=positive, default=plan.OUTPUTS_MINUTES)
    p.set_defaults(func=deploy.cmd_outputs)

    p = sub.add_parser("cleanup", help="pulumi destroy and stack rm, whatever came before")
    p.add_argument("--stack", default="", help="empty: the plan never ran, nothing to do")
    p.add_argument("--minutes", type=positive, default=plan.DESTROY_MINUTES)
    p.add_argument("--out-dir", type=Path, required=True, help="where cleanup.json goes")
    p.add_argument(
        "--cluster",
        default="",
        help="a kubernetes run's cluster (plan's output): deleted through the DigitalOcean API "
        "($DIGITALOCEAN_TOKEN) if pulumi destroy cannot",
    )
    p.add_argument("--api-url", default=cleanup.API_URL, help=argparse.SUPPRESS)
    p.set_defaults(func=cleanup.cmd_cleanup)

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
    p.set_defaults(func=summary.cmd_summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
