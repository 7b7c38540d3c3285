"""`cleanup`: `pulumi destroy` and `pulumi stack rm`, whatever came before; a stack whose
destroy fails is kept (its state is what knows what still bills), never forced.

A Kubernetes run (`--cluster NAME`) has a last resort, because nothing else deletes a cluster
left behind (no autodown on Kubernetes; the lease deletes GPU Droplets, and a node it deleted
the node pool would make again): when destroy fails, or Pulumi cannot say, the run's cluster is
found by its name and the project's tag through the DigitalOcean API and deleted with its Load
Balancer and Volumes (DigitalOcean OpenAPI at 7c1300c4, specification/resources/kubernetes/:
GET /v2/kubernetes/clusters, kubernetes_list_clusters.yml, scope `kubernetes:read`; DELETE
/v2/kubernetes/clusters/{id}/destroy_with_associated_resources/dangerous,
kubernetes_destroy_associatedResourcesDangerous.yml, `kubernetes:delete`, 204). Through
scripts/clients/digitalocean.py, as the lease: its retries, no redirect followed, the token never
printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from clients import digitalocean, transport

from components.spec import catalog

from .runner import Ran, github_output, last_line, run_bounded

CLUSTERS = "/v2/kubernetes/clusters"
API_URL = digitalocean.API_URL


@dataclass
class Cleanup:
    stack: str
    found: bool = False
    destroyed: bool = False
    removed: bool = False
    ended: int | None = None  # when the stack's resources were gone (epoch seconds)
    message: str = ""
    cluster: str = ""  # a Kubernetes run's cluster name: the API's last resort looks for it
    cluster_deleted: bool = False  # deleted through the API (destroy could not)


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
    """Destroy; if that fails, refresh (the Droplet may have deleted itself) and try again.
    Neither needs `--run-program` on a cluster, unlike deploy.yml's: the provider's stored
    kubeconfig expires 7 days after the `up` that fetched it, and this destroy runs in that
    up's own job, which GitHub ends within 6 hours (plan.GITHUB_JOB_LIMIT_MINUTES)."""
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


def list_clusters(api: transport.Api) -> list[dict[str, Any]]:
    """Every cluster of the account, page by page."""
    return digitalocean.pages(api, CLUSTERS, "kubernetes_clusters", "kubernetes:read")


def delete_cluster(name: str, api_url: str) -> tuple[bool, str]:
    """The last resort: the run's cluster (its name, and the project's tag the program gives
    it: kube/cluster.py) deleted with its Load Balancer and Volumes. (deleted, what happened)."""
    token = os.environ.get("DIGITALOCEAN_TOKEN", "")
    if not token:
        return False, f"no DIGITALOCEAN_TOKEN to look for cluster {name} through the API"
    if problem := transport.token_url_problem(api_url):
        return False, f"--api-url: {problem}"
    api = digitalocean.api(api_url, token)
    try:
        ours = [
            c for c in list_clusters(api)
            if c.get("name") == name and catalog.PROJECT in (c.get("tags") or [])
        ]  # fmt: skip
        if not ours:
            return False, f"the DigitalOcean API lists no cluster {name}: nothing left to delete"
        for found in ours:
            target = f"{CLUSTERS}/{found['id']}/destroy_with_associated_resources/dangerous"
            answer = api.call("DELETE", target, "kubernetes:delete")
            if answer.status_code not in (204, 404):
                raise transport.FailedError(f"DELETE {CLUSTERS}/{found['id']}/...: HTTP "
                                        f"{answer.status_code}")  # fmt: skip
    except (transport.RefusedError, transport.FailedError) as err:
        return False, f"the DigitalOcean API could not delete cluster {name}: {err}"
    ids = ", ".join(str(c["id"]) for c in ours)
    return True, (
        f"cluster {name} ({ids}) deleted through the DigitalOcean API with its Load Balancer "
        "and Volumes"
    )


def last_resort(result: Cleanup, api_url: str) -> None:
    """After destroy failed or Pulumi could not say: the API deletes the run's cluster."""
    if not result.cluster:
        return
    deleted, said = delete_cluster(result.cluster, api_url)
    result.cluster_deleted = deleted
    if deleted:
        result.ended = int(time.time())
        said += (
            "; the stack's state still lists what was deleted: once the console shows nothing "
            f"left, `pulumi stack rm --force {result.stack}`"
        )
    else:
        said += (
            f". **Nothing else deletes a cluster left behind**: delete {result.cluster} in the "
            "console (Kubernetes), choosing to destroy its Load Balancer and Volumes too"
        )
    result.message = f"{result.message} Last resort: {said}"


def cleanup(
    stack: str, minutes: float, cluster: str = "", api_url: str = API_URL
) -> tuple[int, Cleanup]:
    """Destroy the stack and remove it. Nothing to do when it was never made; when destroy
    fails the stack is kept (`stack rm` would drop the state of what still bills), never
    forced; a Kubernetes run's cluster then goes through the API (last_resort)."""
    deadline = time.monotonic() + max(minutes - 1, 0.5) * 60  # done before the step's timeout

    def remaining() -> float:
        return deadline - time.monotonic()

    result = Cleanup(stack, cluster=cluster)
    pulumi = shutil.which("pulumi")
    if not stack or pulumi is None:
        result.message = (
            "no stack name: the plan did not run, so nothing was created"
            if not stack
            else "no Pulumi CLI: it is installed before the stack is created, so nothing was; "
            "if that is wrong, " + by_hand(stack)
        )
        if stack:
            last_resort(result, api_url)
        return (0 if not stack else 1), result
    entry, problem = listed_entry(pulumi, stack, remaining())
    if problem:
        result.message = f"{problem}; " + by_hand(stack)
        last_resort(result, api_url)
        return 1, result
    if entry is None:
        result.message = f"nothing to destroy: stack {stack} was never created"
        result.ended = int(time.time())
        return 0, result
    result.found = True
    if not destroy(pulumi, result, remaining):
        last_resort(result, api_url)
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
    code, result = cleanup(
        args.stack or "", args.minutes, getattr(args, "cluster", "") or "",
        getattr(args, "api_url", API_URL),
    )  # fmt: skip
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cleanup.json").write_text(json.dumps(asdict(result), indent=2))
    print(f"cleanup: {result.message}", file=sys.stderr if code else sys.stdout)
    if result.ended is not None:
        github_output({"ended": str(result.ended)})
    return code
