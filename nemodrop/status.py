"""`nemodrop status`: what a stack runs now, since when, and what it has cost, read from the
cloud with the user's DigitalOcean token, beside Pulumi's view of it and the endpoint's own.

    nemodrop status --stack dev          # its Droplets or cluster, health, waker, cost
    nemodrop status --stack dev --json   # the same, one JSON document

Honest about what it does not know: Pulumi's state when no pulumi CLI is there, the account's
billing when the token lacks billing:read, the hours of Droplets that no longer exist.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemodrop import cli, program, target, wake
from nemodrop.clients import digitalocean, transport

# The tools' requirements: a Python without them still lists the subcommand; running it says
# in one line what is missing and the command that installs it (run(), as wake.py does).
missing: ModuleNotFoundError | None = None
try:
    import requests
except ModuleNotFoundError as err:
    missing = err

if TYPE_CHECKING:  # imported when status runs (nemodrop/program.py says why)
    from components.spec.schema import StackConfig
    from nemodrop import inventory

# The variable the program, CI and lease.py read the token from (transport.Api names it).
TOKEN_ENV = "DIGITALOCEAN_TOKEN"  # noqa: S105 (a variable's name, not a secret)
WIDTH = 80  # every line of the text output fits a terminal of this width
HEALTH_SECONDS = 10.0
PULUMI_SECONDS = 60.0
KUBE_SECONDS = 10.0
KUBE_ANSWER_BYTES = 1024 * 1024  # one object of the cluster's API
# DigitalOcean's kubeconfig (kubernetes/kubernetes_get_kubeconfig.yml, openapi at 7c1300c):
# YAML with the API server's URL, its CA and, for clusters with token auth, a token.
KUBECONFIG_PATH = "/v2/kubernetes/clusters/{id}/kubeconfig"
KUBECONFIG_SCOPE = "kubernetes:access_cluster"
# The model servers' StatefulSet and the KEDA ScaledObject that scales it: both named
# manifests.NAME in manifests.NAMESPACE (manifests.model_server, scaling.py's ScaledObject).
STATEFULSET_PATH = "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}"
SCALEDOBJECT_PATH = "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects/{name}"
# What reading the cloud can raise besides an answer: no connection, a time-out, a cut or
# oversized answer, a body that is not JSON (validate.ASK_ERRORS), and a refusal.
API_ERRORS = (OSError, http.client.HTTPException, transport.FailedError, ValueError,
              transport.RefusedError)  # fmt: skip


def add_parser(subparsers: cli.Subparsers) -> None:
    parser = cli.subcommand(subparsers, "status", __doc__)
    parser.add_argument("--stack", required=True, help="the stack (stacks/Pulumi.NAME.yaml)")
    parser.add_argument(
        "--stacks", type=Path, help="the folder of the stack files (default: the checkout's)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--endpoint", help="base URL ending in /v1 (default: the stack's)")
    parser.add_argument("--cacert", metavar="PEM", help="CA bundle for the endpoint")
    parser.add_argument("--api-url", default=digitalocean.API_URL, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if missing is not None:
        target.missing_package(missing)
    token = os.environ.get(TOKEN_ENV)
    if not token:
        return fail(f"no DigitalOcean token: set {TOKEN_ENV} (read scopes suffice)", 2)
    cfg = program.stack_config(args.stack, args.stacks)
    from nemodrop import inventory  # noqa: PLC0415 (the program's names: nemodrop/program.py)

    outputs, pulumi_said = pulumi_view(args.stack)
    api = digitalocean.api(args.api_url, token)
    try:
        found = inventory.read(api, cfg)
    except API_ERRORS as err:
        return fail(f"DigitalOcean: {err}", 1)
    now = datetime.now(UTC)
    endpoint = args.endpoint or outputs.get("endpoint") or os.environ.get("OPENAI_BASE_URL")
    key = outputs.get("apiKey") or os.environ.get("OPENAI_API_KEY") or ""
    report = {
        "stack": cfg.stack, "platform": cfg.platform, "wake": cfg.wake.enabled,
        "droplets": [asdict(d) for d in found.droplets],
        "volumes": [asdict(v) for v in found.volumes],
        "reservedIps": found.reserved_ips, "loadBalancers": found.load_balancers,
        "clusters": [asdict(c) for c in found.clusters],
        "servers": servers(api, found) if cfg.platform == "kubernetes" else None,
        "pulumi": pulumi_said, "disagree": disagreements(cfg, found, outputs, bool(pulumi_said)),
        "health": health(endpoint, args.cacert),
        "lastWake": last_wake(endpoint, key, args.cacert) if cfg.wake.enabled else None,
        "cost": costs(found, now),
    }  # fmt: skip
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def pulumi_view(stack: str) -> tuple[dict[str, Any], str]:
    """The stack's outputs (target.stack_outputs, secrets too: the key asks the waker) and a
    word on them; ({}, "") without the pulumi CLI. Nothing here prints a value it read."""
    if shutil.which("pulumi") is None:
        return {}, ""
    outputs = target.stack_outputs(stack, show_secrets=True, seconds=PULUMI_SECONDS)
    return outputs, f"pulumi stack output --stack {stack}"


def expected_names(cfg: StackConfig, outputs: dict[str, Any]) -> list[str]:
    """The GPU Droplets Pulumi lists: the `replicas` output's names (cloud/outputs.py
    replica_fields), or the one Droplet of a stack that has an `ipv4` output and no list."""
    named = [str(r.get("name")) for r in outputs.get("replicas") or [] if isinstance(r, dict)]
    if named:
        return named
    return [cfg.replica_name(0)] if outputs.get("ipv4") and cfg.platform == "droplet" else []


def disagreements(
    cfg: StackConfig, found: inventory.Inventory, outputs: dict[str, Any], read: bool
) -> list[str]:
    """Where the cloud and Pulumi's outputs differ (the config's replica names when Pulumi's
    state was not read): a replica gone (asleep with wake, else deleted outside Pulumi: by
    autodown or by hand), a Droplet tagged for the stack that neither lists."""
    if cfg.platform != "droplet":
        return []
    names = expected_names(cfg, outputs) if read else []
    whose = "Pulumi's state" if read else "the config"
    if not read:
        names = [cfg.replica_name(i) for i in range(cfg.replicas)]
    known = {*names, cfg.balancer_name}
    there = {d.name for d in found.droplets}
    gone = "asleep (wake on: a request wakes it)" if cfg.wake.enabled else "gone (autodown?)"
    out = [f"{n}: in {whose}, not in DigitalOcean: {gone}" for n in names if n not in there]
    # The front never sleeps: a Caddy front Pulumi lists (or the config plans) and the cloud
    # lacks was deleted outside Pulumi.
    caddy = (outputs.get("balancer") or {}).get("kind") == "caddy" if read else (
        cfg.pooled and cfg.balancer_kind == "caddy")  # fmt: skip
    if caddy and cfg.balancer_name not in there:
        out.append(f"{cfg.balancer_name}: the front, in {whose}, not in DigitalOcean")
    out += [f"{d.name}: tagged {cfg.stack_tag}, not in {whose}"
            for d in found.droplets if d.name not in known]  # fmt: skip
    return out


def servers(api: transport.Api, found: inventory.Inventory) -> dict[str, Any]:
    """The model servers on the stack's cluster: the StatefulSet's wanted and ready counts and
    the ScaledObject's state, read from the cluster's API with the kubeconfig DigitalOcean gives
    the user's token. Any failure is one line of why; the kubeconfig's token is never shown."""
    if not found.clusters:
        return {"said": "not read: no cluster"}
    try:
        server, ca, kube_token = kubeconfig(api, found.clusters[0].id)
        sts = kube_get(server, ca, kube_token, STATEFULSET_PATH)
        wanted = int((sts.get("spec") or {}).get("replicas") or 0)
        ready = int((sts.get("status") or {}).get("readyReplicas") or 0)
    except transport.RefusedError:  # a 403 (a 401 refused the inventory already)
        return {"said": f"not read: the token lacks {KUBECONFIG_SCOPE}"}
    except (*API_ERRORS, KeyError, TypeError, AttributeError, StopIteration) as err:
        return {"said": f"not read: {why(err)}"}
    state = "asleep: 0 wanted" if wanted == 0 else "waking" if ready < wanted else ""
    said = f"{ready} of {wanted} ready" + (f" ({state})" if state else "")
    try:  # KEDA's view, when it is there (CRD keda.sh/v1alpha1: status.conditions)
        scaled = kube_get(server, ca, kube_token, SCALEDOBJECT_PATH).get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in scaled.get("conditions") or []}
    except (*API_ERRORS, KeyError, TypeError, AttributeError) as err:
        return {"said": said, "wanted": wanted, "ready": ready,
                "scaler": f"not read: {why(err)}"}  # fmt: skip
    scaler = f"Ready {conditions.get('Ready')}, Active {conditions.get('Active')}, " + (
        f"last active {scaled.get('lastActiveTime') or 'never'}")  # fmt: skip
    return {"said": said, "wanted": wanted, "ready": ready, "scaler": scaler}


def why(err: BaseException) -> str:
    """An error as one short reason: urllib's URLError by its reason (a refused connection,
    a certificate that the cluster's CA did not sign), the others by their message."""
    reason = getattr(err, "reason", None)
    text = str(reason if reason is not None else err) or type(err).__name__
    return text if isinstance(err, transport.FailedError) else f"{type(err).__name__}: {text}"


def kubeconfig(api: transport.Api, cluster_id: str) -> tuple[str, str, str]:
    """(API server URL, CA PEM, token) of the cluster's current context, from DigitalOcean's
    kubeconfig. A kubeconfig without a token (certificate auth) is a KeyError."""
    import yaml  # noqa: PLC0415 (the program's requirement: nemodrop/program.py)

    path = KUBECONFIG_PATH.format(id=cluster_id)
    answer = api.call("GET", path, KUBECONFIG_SCOPE)
    if answer.status_code != 200:
        raise transport.FailedError(f"the kubeconfig: HTTP {answer.status_code}")
    try:
        doc = yaml.safe_load(answer.body)
    except yaml.YAMLError:
        raise ValueError("the kubeconfig is not YAML") from None
    context = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in doc["users"] if u["name"] == context["user"])
    if "token" not in user:
        raise KeyError("the kubeconfig has no token (certificate auth is not read)")
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    return str(cluster["server"]), ca, str(user["token"])


def kube_get(server: str, ca: str, token: str, template: str) -> dict[str, Any]:
    """One object of the cluster's API: HTTPS verified against the cluster's CA alone, the
    token as Bearer, no redirect followed (transport.request), bounded and timed."""
    from components.cloud.kube import manifests  # noqa: PLC0415 (nemodrop/program.py)

    path = template.format(ns=manifests.NAMESPACE, name=manifests.NAME)
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    answer = transport.request("GET", server.rstrip("/") + path, headers, KUBE_SECONDS,
                               KUBE_ANSWER_BYTES, cadata=ca)  # fmt: skip
    kind = path.split("/")[-2]  # statefulsets, scaledobjects
    if answer.status_code != 200:
        raise transport.FailedError(f"the cluster's API: HTTP {answer.status_code} ({kind})")
    obj = answer.json()
    if not isinstance(obj, dict):
        raise ValueError(f"the cluster's API: not an object ({kind})")
    return obj


def health(endpoint: str | None, cacert: str | None) -> dict[str, Any]:
    """GET /health on the endpoint's host: the gate answers it without the key
    (components/host/gateway.py gate), and on a sleeping front the waker answers it, which
    never wakes the set (gateway.py, wake.held)."""
    if not endpoint:
        return {"url": None, "said": "not asked: no endpoint (--endpoint or Pulumi's outputs)"}
    url = endpoint.rstrip("/").removesuffix("/v1") + "/health"
    try:
        answer = requests.get(url, timeout=HEALTH_SECONDS, verify=cacert or True,
                              allow_redirects=False)  # fmt: skip
    except requests.RequestException as err:
        return {"url": url, "status": None, "said": f"no answer ({type(err).__name__})"}
    return {"url": url, "status": answer.status_code, "said": f"HTTP {answer.status_code}"}


def last_wake(endpoint: str | None, key: str, cacert: str | None) -> dict[str, Any]:
    """The waker's state through the gate with the stack's key (wake.py's GET): its mode,
    since when, and the last wake's steps."""
    if not endpoint or not key:
        return {"said": "not asked: no endpoint and key (Pulumi's outputs or OPENAI_API_KEY)"}
    url = wake.control_url(endpoint)
    to = target.Target(endpoint, key, None, cacert=cacert)  # its headers: the key as Bearer
    try:
        answer = requests.get(url, headers=to.headers, timeout=HEALTH_SECONDS, verify=to.verify,
                              allow_redirects=False)  # fmt: skip
        state = answer.json() if answer.status_code == 200 else None
    except (requests.RequestException, ValueError) as err:
        return {"said": f"no answer ({type(err).__name__})"}
    if not isinstance(state, dict):
        return {"said": f"HTTP {answer.status_code}"}
    return {"said": f"{state.get('mode')} since {state.get('since')}",
            "last": state.get("last_wake") or {}}  # fmt: skip


def costs(found: inventory.Inventory, now: datetime) -> dict[str, Any]:
    from nemodrop import cost  # noqa: PLC0415 (the program's prices: nemodrop/program.py)

    lines = cost.lines(found, now)
    return {
        "lines": [asdict(x) for x in lines],
        "stackMonth": round(sum(x.month for x in lines), 2),
        "stackTotal": round(sum(x.total for x in lines), 2),
        "accountMonth": found.month_to_date_usage,
        "accountProblem": found.balance_problem,
        "notCounted": cost.NOT_COUNTED,
    }


def render(report: dict[str, Any]) -> str:
    """The text output, each line at most WIDTH columns."""
    up = sum(d["role"] == "replica" and d["status"] == "active" for d in report["droplets"])
    said = f": {up} GPU Droplet(s) active" if report["platform"] == "droplet" else ""
    lines = [f"stack {report['stack']} ({report['platform']}"
             + (", wake on)" if report["wake"] else ")") + said]  # fmt: skip
    lines += section("Droplets", [
        f"{d['role']:<7} {d['name']} {d['status']} {d['size']} since {short(d['created_at'])}"
        for d in report["droplets"]
    ])  # fmt: skip
    for c in report["clusters"]:
        lines.append(f"cluster {c['name']} {c['status']} since {short(c['created_at'])}")
        lines += [f"  pool {p['name']}: {p['size']} x {p['count']}" for p in c["pools"]]
    if report["servers"] is not None:
        lines.append(f"servers: {report['servers']['said']}")
        if report["servers"].get("scaler"):
            lines.append(f"  scaler: {report['servers']['scaler']}")
    lines += section("Volumes", [
        f"{v['name']} {v['size_gigabytes']} GiB {'attached' if v['attached'] else 'detached'}"
        f" since {short(v['created_at'])}" for v in report["volumes"]
    ])  # fmt: skip
    lines += section("Reserved IP", report["reservedIps"])
    lines += section("Load Balancer", [f"{b['name']} {b['status']}"
                                       for b in report["loadBalancers"]])  # fmt: skip
    lines.append(f"Pulumi's state: {report['pulumi'] or 'not read (no pulumi CLI)'}")
    lines += [f"  differs: {x}" for x in report["disagree"]]
    h = report["health"]
    lines.append(f"health: {h['said']}" + (f" ({h['url']})" if h.get("url") else ""))
    if report["lastWake"] is not None:
        w = report["lastWake"]
        lines.append(f"waker: {w['said']}")
        lines += [f"  {k} {v}" for k, v in (w.get("last") or {}).items()]
    lines += cost_lines(report["cost"])
    return "\n".join(clip(x) for x in lines)


def section(title: str, items: list[str]) -> list[str]:
    return [f"{title}: none"] if not items else [f"{title}:", *(f"  {x}" for x in items)]


def cost_lines(c: dict[str, Any]) -> list[str]:
    out = [f"{'cost so far, USD: hours x price':<56}{'this month':>12}{'since made':>12}"]
    out += [f"  {clip(x['what'], 54):<54}{x['month']:>12.2f}{x['total']:>12.2f}"
            for x in c["lines"]]  # fmt: skip
    out.append(
        f"{'the stack, what exists now':<56}{c['stackMonth']:>12.2f}{c['stackTotal']:>12.2f}"
    )
    account = c["accountMonth"]
    whole = "the whole account (DigitalOcean billing)"
    out.append(f"{whole:<56}{account:>12.2f}{'-':>12}" if account is not None
               else f"the whole account: not read ({c['accountProblem']})")  # fmt: skip
    out.append(f"not counted: {c['notCounted']}")
    return out


def short(timestamp: str) -> str:
    """2026-12-05T10:00:00Z as 2026-12-05 10:00Z: what a reader needs of it."""
    return timestamp[:16].replace("T", " ") + "Z" if len(timestamp) >= 16 else timestamp


def clip(text: str, width: int = WIDTH) -> str:
    """A line cut to `width` columns, an ellipsis where it was cut (a long name, a URL)."""
    return text if len(text) <= width else text[: width - 1] + "…"
