"""`init`, `up` and `outputs`: the stack created with autodown's token, `pulumi up` within its
share of the cap, and the outputs saved without the secret ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from nemodrop import target

from .runner import github_output, last_line, pulumi_cli, run_bounded

# Outputs that are secrets (components/cloud/outputs.py): never written to a file, never summarised.
SECRET_OUTPUTS = ("apiKey", "sshPrivateKey")
# What stops a Kubernetes run's bill, said where it starts and in the summary.
KUBE_NO_AUTODOWN = (
    "no autodown on Kubernetes, and the lease workflow deletes GPU Droplets, not clusters: "
    "this run's destroy step, then its DigitalOcean API last resort, delete the cluster; a "
    "cluster a dead runner leaves bills until you delete it (docs/ci.md)"
)
# How long `pulumi stack init` and `pulumi config set` may take (a state backend round trip).
INIT_SECONDS = 300


def cmd_init(args: argparse.Namespace) -> int:
    """Create the stack, then give autodown its token through stdin (never a command line)."""
    started = int(time.time())
    github_output({"started": str(started)})  # first: the summary needs it even if init fails
    pulumi = pulumi_cli()
    made = run_bounded([pulumi, "stack", "init", args.stack], INIT_SECONDS)
    if made.returncode != 0:
        print(f"error: pulumi stack init {args.stack} failed (above)", file=sys.stderr)
        return 1
    if getattr(args, "platform", "droplet") == "kubernetes":
        # No autodown on Kubernetes (a stack key of Droplets only): nothing to give a token.
        print(f"::warning::{KUBE_NO_AUTODOWN}")
        github_output({"autodown": "none"})
        return 0
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
    """The stack's outputs without the secret ones, for the summary and the artifact: read
    without --show-secrets, so their values never reach this process."""
    try:
        outputs = target.stack_outputs(args.stack, show_secrets=False, seconds=args.minutes * 60)
    except target.TargetError:
        return 1  # it said why
    kept = {k: v for k, v in outputs.items() if k not in SECRET_OUTPUTS}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(kept, indent=2))
    print(f"outputs: wrote {args.out} ({len(kept)} outputs; left out: {', '.join(SECRET_OUTPUTS)})")
    return 0
