"""Check a stack's whole configuration without deploying anything; exit non-zero naming every bad
field.

    python -m components.validate --stack dev
    read -rs DIGITALOCEAN_TOKEN && export DIGITALOCEAN_TOKEN   # paste it: no echo, no history
    python -m components.validate --stack prod                 # and the cloud

Offline it reads `stacks/Pulumi.<stack>.yaml` and checks what `pulumi up` checks first: that its
keys are under this project's namespace, and every field of every section, together (the
model fits the size, the entry fits the replicas, ...). Encrypted values are taken as set. With
a token in DIGITALOCEAN_TOKEN it also asks DigitalOcean what only the account knows: whether the
size is offered in one of `droplet.regions` now, whether its boot disk holds what the stack puts
there (and notes its disks and memory), whether `access.dnsZone` is a domain of the account, and
whether the token may read each kind of resource the stack makes (the provider reads
every resource back after creating it, so a token without the read scope fails half-way through
`pulumi up`). It reads only (GET); the token is never printed. A write scope cannot be checked
without writing, and DigitalOcean has no endpoint that lists a token's scopes: those, and the
autodown token's, are named, not checked. With wake on and a token in GITHUB_TOKEN (any that
may read the repository) it checks that `wake.githubRef` is a branch there; that the stack is
one of the deploy workflow's `stack` choices is checked offline, as `pulumi up` does.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import render
from .host import autodown, vllm_service
from .spec import bill, catalog, config
from .spec.kube import DOKS_MINOR
from .spec.schema import StackConfig

ROOT = Path(__file__).resolve().parent.parent
# The one client of each outside service (scripts/clients/, standard library only: the CI
# scripts and the hosts run the same ones).
sys.path.append(str(ROOT / "scripts"))
from clients import digitalocean, github, transport  # noqa: E402

API_URL = digitalocean.API_URL
TIMEOUT_SECONDS = 20
# What asking an API can raise besides an answer: no connection, a time-out, a cut or
# oversized answer, a body that is not JSON.
ASK_ERRORS = (OSError, http.client.HTTPException, transport.FailedError, ValueError)


def file_problems(
    stack: str, stacks: Path = ROOT / "stacks"
) -> tuple[list[str], StackConfig | None]:
    """Everything wrong with the stack file, and its config when there is nothing."""
    path = stacks / f"Pulumi.{stack}.yaml"
    if not path.exists():
        there = sorted(p.stem.removeprefix("Pulumi.") for p in stacks.glob("Pulumi.*.yaml"))
        return [f"no stack file {path} (stacks there: {', '.join(there) or 'none'})"], None
    try:
        data = config.read_stack_file(path)
    except config.ConfigError as err:
        return err.problems, None
    keys = list((data.get("config") or {}).keys())
    where = str(path)
    problems = [f"{where}: {p}" for p in config.namespace_problems(keys, where="it")]
    if problems:
        return problems, None
    raw, secret = render.stack_raw(stack, stacks)
    try:
        cfg = config.parse(raw, stack, secret)
    except config.ConfigError as err:
        return [f"{where}: {p}" for p in err.problems], None
    budget = kube_budget_problems(cfg)
    return [f"{where}: {p}" for p in budget], cfg


POLICY_CONFIG = ROOT / "policy" / "config.json"


def kube_budget_problems(cfg: StackConfig, policy: Path = POLICY_CONFIG) -> list[str]:
    """A GPU pool whose most nodes list over the policy pack's stack-within-budget (its
    rules.set_outside_budget counts maxNodes at the size's list price): said here, not when the
    pipeline's preview refuses it."""
    if cfg.platform != "kubernetes" or not policy.exists():
        return []
    pool = cfg.kube.gpu_pool
    price = catalog.SIZES[pool.size].list_price_usd_hour
    rule = json.loads(policy.read_text()).get("stack-within-budget") or {}
    ceiling = {**rule, **((rule.get("stacks") or {}).get(cfg.stack) or {})}.get(
        "maxTotalHourlyPriceUsd"
    )
    if ceiling is None or price is None or pool.max_nodes * price <= float(ceiling):
        return []
    return [
        f"kubernetes.gpuPool.maxNodes: {pool.max_nodes} x {pool.size} lists at "
        f"${pool.max_nodes * price:.2f}/h, over the policy pack's stack-within-budget "
        f"(${float(ceiling):g}/h for {cfg.stack}): the pipeline's preview would refuse it; lower "
        "maxNodes, or raise maxTotalHourlyPriceUsd in policy/config.json"
    ]


@dataclass(frozen=True)
class Read:
    """One page of a kind of resource: what the stack makes, the path, and the scopes DigitalOcean
    asks for (the operation's `security` in its OpenAPI, specification/resources/<file>)."""

    what: str
    path: str
    scopes: tuple[str, ...]
    source: str


# Reads every stack needs: its Droplets (found by name and tag before a replacement), their tags,
# SSH keys and Cloud Firewalls. Volumes are left out: volumes_list.yml names the legacy
# `api:read`, not a custom scope, so a probe could not say which scope is missing.
READS = (
    Read("Droplets", "/v2/droplets", ("droplet:read",), "droplets/droplets_list.yml"),
    Read("tags", "/v2/tags", ("tag:read",), "tags/tags_list.yml"),
    Read("SSH keys", "/v2/account/keys", ("ssh_key:read",), "ssh_keys/sshKeys_list.yml"),
    Read("Cloud Firewalls", "/v2/firewalls", ("firewall:read",), "firewalls/firewalls_list.yml"),
)
RESERVED_IPS = Read(
    "Reserved IPs", "/v2/reserved_ips", ("reserved_ip:read",), "reserved_ips/reservedIPs_list.yml"
)
LOAD_BALANCERS = Read(
    "Load Balancers", "/v2/load_balancers", ("load_balancer:read",),
    "load_balancers/loadBalancers_list.yml",
)  # fmt: skip
SIZES_SCOPES = ("sizes:read", "regions:read")  # sizes/sizes_list.yml


def reads(cfg: StackConfig) -> tuple[Read, ...]:
    """The reads this stack's resources need: the Caddy entry holds a Reserved IP, the managed
    one is a Load Balancer."""
    extra: tuple[Read, ...] = ()
    if cfg.pooled:
        extra = (RESERVED_IPS,) if cfg.balancer_kind == "caddy" else (LOAD_BALANCERS,)
    return READS + extra


# disk_info's units, in GiB. The OpenAPI's examples all say gib; a unit not listed is left out.
DISK_UNITS = {"gib": 1, "tib": 1024}


def disks(size: dict[str, Any]) -> dict[str, int]:
    """A size's disks in GiB by type, from its `disk_info` (sizes/models/disk_info.yml: every
    Droplet has a `local` or `boot` disk, GPU sizes a `scratch` disk "for non-persistent
    data"), the boot disk from `disk` when disk_info names none."""
    found: dict[str, int] = {}
    for d in size.get("disk_info") or []:
        amount, unit = (d.get("size") or {}).get("amount"), (d.get("size") or {}).get("unit")
        if d.get("type") and isinstance(amount, int) and unit in DISK_UNITS:
            found[d["type"]] = amount * DISK_UNITS[unit]
    if "local" not in found and "boot" not in found and size.get("disk"):
        found["local"] = int(size["disk"])
    return found


def size_problems(cfg: StackConfig, size: dict[str, Any], notes: list[str]) -> list[str]:
    """What the offered size's disks and memory say about this stack: the boot disk must hold
    what preflight asks of it, the vLLM env and the weights (preflight fails on the Droplet
    when it does not: here it is said before anything is billed); weights prefetched into the
    page cache should fit the memory (vLLM's own bound: 90% of the memory free)."""
    found = disks(size)
    memory_gib = int(size.get("memory") or 0) // 1024
    shown = ", ".join(f"{kind} disk {gib} GiB" for kind, gib in sorted(found.items()))
    notes.append(f"{cfg.droplet.size}: {shown or 'no disk listed'}, memory {memory_gib} GiB "
                 f"(GET /v2/sizes; the catalog holds what DigitalOcean documents)")  # fmt: skip
    # The catalog's documented figures (components/spec/catalog.py), held to the live ones.
    live = {"boot disk": found.get("local") or found.get("boot"), "scratch disk":
            found.get("scratch"), "memory": memory_gib or None}  # fmt: skip
    documented = {"boot disk": cfg.size.boot_disk_gib, "scratch disk": cfg.size.scratch_disk_gib,
                  "memory": cfg.size.memory_gib}  # fmt: skip
    differ = [f"{what} {gib} GiB (the API: {live[what]} GiB)" for what, gib in documented.items()
              if gib is not None and live[what] is not None and live[what] != gib]  # fmt: skip
    if differ:
        notes.append(f"components/spec/catalog.py documents {cfg.droplet.size} with "
                     f"{', '.join(differ)}: the catalog is out of date")  # fmt: skip
    problems = []
    # What preflight asks of the boot disk (NEMO_DISK_NEED_GB, before any Volume is mounted).
    need = cfg.boot_disk_need_gb
    boot = found.get("local") or found.get("boot")
    if boot is not None and need > boot:
        problems.append(
            f"droplet.size: {cfg.droplet.size}'s boot disk is {boot} GiB; this stack needs about "
            f"{need} GB on it (the vLLM env and the weights; preflight checks it on the "
            "Droplet): choose a larger size or a smaller model (model.id)"
        )
    weights = cfg.model_disk_gb
    bound = vllm_service.PREFETCH_MEMORY_SHARE * memory_gib
    if vllm_service.load_strategy(cfg) == "prefetch" and memory_gib and weights > bound:
        notes.append(
            f"vllm.safetensorsLoadStrategy: prefetch reads about {weights} GB of weights into "
            f"the page cache, more than 90% of {cfg.droplet.size}'s {memory_gib} GiB: set it "
            "to lazy, or vLLM may read them twice"
        )
    return problems


def droplet_offer_problems(
    cfg: StackConfig, offered: dict[str, Any], notes: list[str]
) -> list[str]:
    """The Droplet's size sold to this account now, in one of droplet.regions, and its disks."""
    size = offered.get(cfg.droplet.size)
    if size is None or not size.get("available", False):
        return [f"droplet.size: {cfg.droplet.size} is not offered to this account now"]
    problems = size_problems(cfg, size, notes)
    regions = [r for r in cfg.droplet.regions if r in size.get("regions", [])]
    if not regions:
        where = ", ".join(size.get("regions", [])) or "no region right now"
        problems.append(
            f"droplet.regions: {cfg.droplet.size} is offered in none of "
            f"{', '.join(cfg.droplet.regions)} now (it is in: {where})"
        )
    return problems


def offered_sizes(get: Any) -> tuple[dict[str, Any], list[str]]:
    """The sizes sold to this account by slug (GET /v2/sizes), or why the token may not list
    them (401, 403); FailedError for any other answer."""
    sizes = get("/v2/sizes", per_page=digitalocean.PER_PAGE)
    if sizes.status_code == 401:
        return {}, ["DIGITALOCEAN_TOKEN: DigitalOcean refused it (HTTP 401): not a valid token"]
    if sizes.status_code == 403:
        return {}, [
            "DIGITALOCEAN_TOKEN: may not list the sizes (HTTP 403): it needs the scopes "
            f"{' and '.join(SIZES_SCOPES)}"
        ]
    if sizes.status_code != 200:
        raise transport.FailedError(f"GET /v2/sizes: HTTP {sizes.status_code}")
    return {s["slug"]: s for s in sizes.json().get("sizes", [])}, []


def cloud_problems(
    cfg: StackConfig, token: str, api_url: str = API_URL, notes: list[str] | None = None
) -> list[str]:
    """What only the account knows: the size offered in a region the stack allows, the DNS
    zone among its domains (GET /v2/sizes, GET /v2/domains/{name}: DigitalOcean OpenAPI
    sizes_list.yml, domains_get.yml)."""

    def get(path: str, **params: Any) -> transport.Answer:
        return digitalocean.get(api_url, path, token, TIMEOUT_SECONDS, **params)

    problems: list[str] = []
    if cfg.platform == "kubernetes":
        # The nodes are Droplets of the pools' sizes, priced and offered as Droplets are.
        problems += kube_problems(cfg, get)
    offered, refused = offered_sizes(get)
    if refused:
        return refused
    if cfg.platform == "kubernetes":
        problems += pool_offer_problems(cfg, offered)
    else:
        problems += droplet_offer_problems(cfg, offered, notes if notes is not None else [])
    zone = cfg.access.dns_zone
    if zone:
        found = get(f"/v2/domains/{zone}")
        if found.status_code == 404:
            problems.append(
                f"access.dnsZone: {zone} is not a domain of this DigitalOcean account "
                "(Networking > Domains)"
            )
        elif found.status_code == 403:
            problems.append(
                f"DIGITALOCEAN_TOKEN: may not read the domain {zone} (HTTP 403): it needs the "
                "scope domain:read (domains/domains_get.yml)"
            )
        elif found.status_code >= 400:
            problems.append(f"access.dnsZone: could not read {zone} (HTTP {found.status_code})")
    for read in reads(cfg) if cfg.platform == "droplet" else ():
        answer = get(read.path, per_page=1)
        if answer.status_code == 403:
            problems.append(
                f"DIGITALOCEAN_TOKEN: may not read {read.what} (HTTP 403): it needs the scope "
                f"{' and '.join(read.scopes)} ({read.source}); `pulumi up` reads back each "
                "one it makes"
            )
        elif answer.status_code >= 400:
            problems.append(f"DIGITALOCEAN_TOKEN: could not read {read.what} "
                            f"(HTTP {answer.status_code})")  # fmt: skip
    return problems


# What DOKS offers now (GET /v2/kubernetes/options, scope kubernetes:read: DigitalOcean
# OpenAPI specification/resources/kubernetes/kubernetes_list_options.yml at 7c1300c4; its
# response, models/options.yml: `options` with `versions` [{slug, kubernetes_version,
# supported_features}], `sizes` [{name, slug}] and `regions` [{name, slug}]).
KUBE_OPTIONS = "/v2/kubernetes/options"
KUBE_SCOPES = ("kubernetes:read",)


def kube_problems(cfg: StackConfig, get: Any) -> list[str]:
    """A Kubernetes minor, region or node size DOKS does not offer, named by its field, before
    anything bills: the cluster takes the newest patch of DOKS_MINOR (kube/cluster.py), so a
    minor DOKS has retired or not yet released fails the create half-way."""
    answer = get(KUBE_OPTIONS)
    if answer.status_code == 403:
        return [
            "DIGITALOCEAN_TOKEN: may not read DOKS's options (HTTP 403): it needs the scope "
            f"{' and '.join(KUBE_SCOPES)} (kubernetes/kubernetes_list_options.yml)"
        ]
    if answer.status_code >= 400:
        return [f"DIGITALOCEAN_TOKEN: could not read DOKS's options (HTTP {answer.status_code})"]
    options = answer.json().get("options") or {}
    k = cfg.kube
    problems = []
    minors = sorted({".".join(str(v.get("kubernetes_version", "")).split(".")[:2])
                     for v in options.get("versions") or []})  # fmt: skip
    if DOKS_MINOR not in minors:
        problems.append(
            f"kubernetes: the program pins Kubernetes {DOKS_MINOR} (spec/kube.py DOKS_MINOR), "
            f"which DOKS does not offer now (it offers: {', '.join(minors) or 'none'}); a "
            "release of this program that pins an offered minor is needed"
        )
    regions = [r.get("slug") for r in options.get("regions") or []]
    if k.region not in regions:
        problems.append(f"kubernetes.region: DOKS does not offer {k.region} now (it offers: "
                        f"{', '.join(sorted(map(str, regions))) or 'none'})")  # fmt: skip
    sizes = {z.get("slug") for z in options.get("sizes") or []}
    for field, size in (("gpuPool", k.gpu_pool.size), ("cpuPool", k.cpu_pool.size)):
        if size not in sizes:
            problems.append(f"kubernetes.{field}.size: {size} is not a node size DOKS offers "
                            "now (GET /v2/kubernetes/options)")  # fmt: skip
    return problems


def pool_offer_problems(cfg: StackConfig, offered: dict[str, Any]) -> list[str]:
    """Each pool's size sold in kubernetes.region now: what `pulumi up` refuses first
    (kube/platform.py prices), from the same sizes list."""
    k, problems = cfg.kube, []
    for field, slug in (("gpuPool", k.gpu_pool.size), ("cpuPool", k.cpu_pool.size)):
        size = offered.get(slug)
        if size is None or not size.get("available", False):
            problems.append(f"kubernetes.{field}.size: {slug} is not offered to this account now")
        elif k.region not in size.get("regions", []):
            where = ", ".join(size.get("regions", [])) or "no region right now"
            problems.append(f"kubernetes.region: {slug} (kubernetes.{field}.size) is not "
                            f"offered in {k.region} now (it is in: {where})")  # fmt: skip
    return problems


GITHUB_API_URL = github.API_URL


def github_problems(cfg: StackConfig, token: str, api_url: str = GITHUB_API_URL) -> list[str]:
    """What only GitHub knows of a wake's dispatch: that the branch it runs from exists (GET
    /repos/{owner}/{repo}/git/ref/heads/{branch}, GitHub REST git/get-ref; a dispatch to a
    missing ref is refused with 422 "No ref found"). A repository renamed or moved answers a
    redirect (docs.github.com/en/rest/using-the-rest-api, "HTTP redirects"), which no client
    here follows with a token: the waker's dispatch would fail, so its name must be the new one."""
    w = cfg.wake
    if not (w.enabled and w.trigger == "github" and w.github_repo):
        return []
    url = f"{api_url.rstrip('/')}/repos/{w.github_repo}/git/ref/heads/{w.github_ref}"
    answer = github.get(url, token, "nemotron-droplet-validate", TIMEOUT_SECONDS)
    if answer.status_code == 401:
        return ["GITHUB_TOKEN: GitHub refused it (HTTP 401)"]
    if 300 <= answer.status_code < 400:
        return [f"wake.githubRepo: GitHub answers {w.github_repo} with a redirect (HTTP "
                f"{answer.status_code}): the repository was renamed or moved; give its current "
                "owner/name (the wake's dispatch follows no redirect)"]  # fmt: skip
    if answer.status_code == 404:
        return [f"wake.githubRef: {w.github_repo} has no branch {w.github_ref!r} (or the token "
                "cannot see the repository): GitHub would refuse every wake with 422"]  # fmt: skip
    if answer.status_code >= 400:
        return [f"wake.githubRef: could not read it (HTTP {answer.status_code})"]
    return []


def unstopped_bill(cfg: StackConfig) -> str:
    """`pulumi up`'s warning when nothing stops the bill (spec/bill.py, the same words), at the
    catalog's list price: `pulumi up` reads the live one, and a Caddy balancer's, from the API."""
    price = cfg.size.list_price_usd_hour
    caddy = cfg.pooled and cfg.balancer_kind == "caddy"
    which = " (list price" + (", plus the balancer Droplet's)" if caddy else ")")
    if price is None:
        which = f" (the catalog lists no price for {cfg.droplet.size}; DigitalOcean's applies)"
    return bill.bill_warning(cfg, bill.set_hourly_price(cfg, price or 0.0), which)


def _why(err: Exception) -> str:
    """What went wrong, without a URL's query or a body: the error's kind, or our own words."""
    return str(err) if isinstance(err, transport.FailedError) else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stack", required=True, help="stack name: stacks/Pulumi.<stack>.yaml")
    parser.add_argument(
        "--stacks", type=Path, default=ROOT / "stacks", help="the folder of stack files (stacks/)"
    )
    parser.add_argument("--api-url", default=API_URL, help=argparse.SUPPRESS)
    parser.add_argument("--github-api-url", default=GITHUB_API_URL, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag, value in (("--api-url", args.api_url), ("--github-api-url", args.github_api_url)):
        if problem := transport.token_url_problem(value):
            parser.error(f"{flag}: {problem}")
    problems, cfg = file_problems(args.stack, args.stacks)
    token = os.environ.get("DIGITALOCEAN_TOKEN", "")
    notes: list[str] = []
    if cfg is not None and token:
        try:
            problems += cloud_problems(cfg, token, args.api_url, notes)
        except ASK_ERRORS as err:
            problems.append(f"DigitalOcean could not be asked: {_why(err)}")
    github_token = os.environ.get("GITHUB_TOKEN", "")
    if cfg is not None and github_token:
        try:
            problems += github_problems(cfg, github_token, args.github_api_url)
        except ASK_ERRORS as err:
            problems.append(f"GitHub could not be asked: {_why(err)}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"{args.stack}: {len(problems)} problem(s); nothing was created", file=sys.stderr)
        return 2
    assert cfg is not None
    cloud = "checked with DigitalOcean" if token else "not checked (no DIGITALOCEAN_TOKEN)"
    if cfg.platform == "kubernetes":
        k = cfg.kube
        print(
            f"{args.stack}: ok: kubernetes: DOKS {DOKS_MINOR} in {k.region}, "
            f"{k.replicas.min} to {k.replicas.max} x {k.gpu_pool.size}, serving {cfg.model.id}; "
            f"the cloud: {cloud}"
        )
        print(
            f"{args.stack}: the cluster bills until `pulumi destroy`, idle or not (its CPU pool, "
            f"Load Balancer and Volumes); each GPU node its size's price while it exists"
            + (f" ({k.replicas.min} always)" if k.replicas.min else "")
        )
        return 0
    print(
        f"{args.stack}: ok: {cfg.replicas} x {cfg.droplet.size} in the first of "
        f"{', '.join(cfg.droplet.regions)} that offers it, serving {cfg.model.id}; "
        f"the cloud: {cloud}"
    )
    if unstopped := unstopped_bill(cfg):
        print(f"{args.stack}: {unstopped}")
    if cfg.autodown.enabled:
        # No read-only call tells a token's scopes; a delete is the only test of droplet:delete.
        print(
            f"{args.stack}: not checkable without deleting: autodown.token must have exactly "
            f"{', '.join(autodown.token_scopes(cfg))} (docs/stop-paying.md, The token)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
