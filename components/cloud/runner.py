"""The machine that runs `pulumi up` must reach the Droplets over SSH: every phase of the
bootstrap runs there. From a laptop or an office, `access.sshCidrs` can name its address; from
a GitHub-hosted runner it cannot. GitHub: "Since there are so many IP address ranges for
GitHub-hosted runners, we do not recommend that you use these as allowlists for your internal
resources. Instead, we recommend you use larger runners with a static IP address range, or
self-hosted runners" (github/docs content/actions/reference/runners/github-hosted-runners.md,
"IP addresses"; the ranges are Azure's, updated weekly). A deploy from such a runner (a push, or
a wake) with a narrower list would dial SSH until the phase times out, so it is
refused before anything is created, naming the field and what works.

The runner says what it is: GITHUB_ACTIONS=true and RUNNER_ENVIRONMENT=github-hosted
(github-hosted or self-hosted; GitHub docs, "Variables reference", default environment
variables). A larger runner with a static range is github-hosted too: deploy.yml hands the
repository variable RUNNER_EGRESS_CIDRS to the program, and the list must cover those ranges.
Only `pulumi up` is checked: a preview (preview.yml on every pull request) connects to nothing.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

import pulumi

from ..spec import catalog
from ..spec.schema import StackConfig
from .stack_config import StackConfigError

# deploy.yml's env: the repository variable of the same name (space-separated CIDRs).
EGRESS_ENV = "RUNNER_EGRESS_CIDRS"


def ssh_problem(ssh_cidrs: list[str], env: Mapping[str, str]) -> str | None:
    """Why this run's runner cannot reach the Droplets over SSH, or None (not a GitHub-hosted
    runner, or one the list admits)."""
    if env.get("GITHUB_ACTIONS") != "true" or env.get("RUNNER_ENVIRONMENT") != "github-hosted":
        return None
    allowed = [ipaddress.ip_network(c, strict=False) for c in ssh_cidrs]
    egress = env.get(EGRESS_ENV, "").split()
    if not egress:
        if ipaddress.ip_network(catalog.ANYWHERE[0]) in allowed:
            return None
        return (
            f"access.sshCidrs: {ssh_cidrs} does not admit this GitHub-hosted runner, which "
            "connects from an address of Azure's that changes every job (GitHub publishes no "
            "stable one), so the bootstrap's SSH would time out. Accepted for a stack CI "
            'deploys: ["0.0.0.0/0", "::/0"] (SSH is key-only, with a pinned host key); or a '
            "self-hosted runner, or a larger runner with a static IP range, named in "
            f"access.sshCidrs and in the repository variable {EGRESS_ENV}"
        )
    try:
        ranges = [ipaddress.ip_network(c, strict=False) for c in egress]
    except ValueError as err:
        return f"{EGRESS_ENV} (a repository variable): {err}; accepted: CIDRs, space-separated"
    outside = [
        str(r)
        for r in ranges
        if not any(r.version == a.version and r.subnet_of(a) for a in allowed)  # type: ignore[arg-type]
    ]
    if outside:
        return (
            f"access.sshCidrs: {ssh_cidrs} does not cover {' '.join(outside)} of "
            f"{EGRESS_ENV}, where this runner connects from: add them to access.sshCidrs"
        )
    return None


def check(cfg: StackConfig) -> None:
    """Refuse an `up` whose runner the Droplets' SSH rule would not admit (see above)."""
    if pulumi.runtime.is_dry_run():
        return
    problem = ssh_problem(cfg.access.ssh_cidrs, os.environ)
    if problem:
        raise StackConfigError([problem])
