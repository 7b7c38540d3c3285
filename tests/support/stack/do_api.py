"""A fake DigitalOcean API that keeps DigitalOcean's contract, for the stack emulation and the
tests of what calls the API (autodown, the lease that deletes expired GPU Droplets).

Every rule below names the file of DigitalOcean's OpenAPI (github.com/digitalocean/openapi,
paths under specification/) it comes from. The token scopes each endpoint asks for are not copied
by hand: they are extracted from the OpenAPI's operation files (each operation's `security`
block, plus the "Requires `x` scope" sentences of its description and of its query parameters)
into do_api_scopes.json, which carries the commit it was read from; test_stack_api.py
re-extracts it when the OpenAPI snapshot is on the machine. Regenerate with
`PYTHONPATH=tests/support python -m stack.do_api [<openapi bare git dir>]` from the repository root.

Usage::

    account = Account()
    account.add_droplet("nemotron-0", "gpu-h100x1-80gb", tags=["nemotron"])
    token = account.add_token("lease", ["droplet:read", "droplet:delete"])
    with DigitalOceanAPI(account) as api:  # api.url: point the client's base URL at it
        ...
    api.requests  # what was asked: method, path, query, token *name*, status
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import posixpath
import re
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import loopback

from components.spec import catalog

SCOPES_FILE = Path(__file__).with_name("do_api_scopes.json")
SNAPSHOT = Path("/work/.mirror/digitalocean+openapi/repo")
SPEC = "specification"

# The operations this fake serves, as the OpenAPI names their paths
# (specification/DigitalOcean-public.v2.yaml, `paths`).
OPERATIONS = (
    ("GET", "/v2/account"),
    ("GET", "/v2/droplets"),
    ("DELETE", "/v2/droplets"),
    ("GET", "/v2/droplets/{droplet_id}"),
    ("DELETE", "/v2/droplets/{droplet_id}"),
    ("GET", "/v2/tags/{tag_id}"),
    ("GET", "/v2/domains/{domain_name}/records"),
    ("DELETE", "/v2/domains/{domain_name}/records/{domain_record_id}"),
    # What `python -m components.validate` reads: the sizes, a domain, and one page of each
    # kind of resource a stack makes (the provider reads each back after creating it).
    ("GET", "/v2/sizes"),
    ("GET", "/v2/domains/{domain_name}"),
    ("GET", "/v2/account/keys"),
    ("GET", "/v2/firewalls"),
    ("GET", "/v2/tags"),
    ("GET", "/v2/reserved_ips"),
    ("GET", "/v2/load_balancers"),
    # And for a `platform: kubernetes` stack, what DOKS offers (kubernetes_list_options.yml).
    ("GET", "/v2/kubernetes/options"),
    # And the real run's last resort for a cluster `pulumi destroy` left (realrun/cleanup.py).
    ("GET", "/v2/kubernetes/clusters"),
    # What `nemodrop status` reads besides: the Volumes and the account's balance.
    ("GET", "/v2/volumes"),
    ("GET", "/v2/customers/my/balance"),
    # And, for a kube stack, the cluster's kubeconfig: its API server, CA and a token.
    ("GET", "/v2/kubernetes/clusters/{cluster_id}/kubeconfig"),
    ("DELETE", "/v2/kubernetes/clusters/{cluster_id}/destroy_with_associated_resources/dangerous"),
)

# Error bodies: the examples of specification/shared/responses/*.yml.
UNAUTHORIZED = {"id": "unauthorized", "message": "Unable to authenticate you."}
FORBIDDEN = {"id": "forbidden", "message": "You do not have permission to perform this action."}
NOT_FOUND = {"id": "not_found", "message": "The resource you requested could not be found."}
TOO_MANY = {"id": "too_many_requests", "message": "API rate limit exceeded."}
SERVER_ERROR = {"id": "server_error", "message": "Unexpected server-side error"}

# specification/description.yml, "Rate Limit": 5,000 requests per hour and 250 per minute per
# token; each request counts for one hour from when it was made (no fixed window).
PER_HOUR = 5000
PER_MINUTE = 250
# specification/shared/parameters.yml `per_page`: default 20, maximum 200 (description.yml,
# "Links & Pagination": "The maximum number of results per page is 200").
PER_PAGE_DEFAULT = 20
PER_PAGE_MAX = 200


# ---- the account --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """A Droplet size (specification/resources/sizes/models/size.yml, gpu_info.yml)."""

    slug: str
    price_hourly: float
    vcpus: int = 1
    memory: int = 1024  # MiB
    disk: int = 25  # GiB: the boot disk (disk_info's `local`)
    scratch: int = 0  # GiB: a GPU size's scratch disk (disk_info's `scratch`), 0: none
    gpu_count: int = 0
    gpu_model: str = ""
    vram_gib: int = 0

    @property
    def gpu(self) -> bool:
        return self.gpu_count > 0

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "slug": self.slug,
            "memory": self.memory,
            "vcpus": self.vcpus,
            "disk": self.disk,
            "disk_info": self.disk_info(),
            "transfer": 1.0,
            "price_monthly": round(self.price_hourly * 672, 2),
            "price_hourly": self.price_hourly,
            "regions": [],
            "available": True,
            "description": self.slug,
        }
        if self.gpu:
            out["gpu_info"] = self.gpu_info()
        return out

    def disk_info(self) -> list[dict[str, Any]]:
        """sizes/models/disk_info.yml: the boot disk, and the scratch disk where there is one."""
        disks = [("local", self.disk), ("scratch", self.scratch)]
        return [
            {"type": kind, "size": {"amount": gib, "unit": "gib"}} for kind, gib in disks if gib
        ]

    def gpu_info(self) -> dict[str, Any]:
        return {
            "count": self.gpu_count,
            "model": self.gpu_model,
            "vram": {"amount": self.vram_gib, "unit": "gib"},
        }


def size(slug: str) -> Size:
    """The project's GPU catalog (components/spec/catalog.py) as sizes; any other slug a plain CPU
    size. The H100's shape is the OpenAPI's example (droplets/responses/examples.yml,
    gpu_droplets), as the catalog records it; a size the catalog has no disks or memory for
    gets that shape per GPU, and prices without a list price are made up."""
    gpu = catalog.SIZES.get(slug)
    if gpu is None:
        return Size(slug, 0.00893)
    model = f"{gpu.vendor}_{gpu.gpu_model.lower().replace(' ', '_')}"
    return Size(
        slug,
        gpu.list_price_usd_hour or 3.44 * gpu.gpu_count,
        vcpus=20 * gpu.gpu_count,
        memory=(gpu.memory_gib or 240 * gpu.gpu_count) * 1024,
        disk=gpu.boot_disk_gib or 720 * gpu.gpu_count,
        scratch=gpu.scratch_disk_gib or 5120 * gpu.gpu_count,
        gpu_count=gpu.gpu_count,
        gpu_model=model,
        vram_gib=gpu.vram_gb_per_gpu,
    )


@dataclass
class Droplet:
    """specification/resources/droplets/models/droplet.yml (the fields callers read)."""

    id: int
    name: str
    size: Size
    region: str
    tags: list[str]
    created_at: str
    public_ipv4: str
    private_ipv4: str
    status: str = "active"  # new, active, off, archive
    image: str = "gpu-h100x1-base"

    def as_json(self, volume_ids: list[str]) -> dict[str, Any]:
        s = self.size
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "memory": s.memory,
            "vcpus": s.vcpus,
            "disk": s.disk,
            "locked": False,
            "status": self.status,
            "kernel": None,
            "created_at": self.created_at,
            "features": ["droplet_agent", "private_networking"],
            "backup_ids": [],
            "next_backup_window": None,
            "snapshot_ids": [],
            "image": {"slug": self.image, "name": self.image, "distribution": "Ubuntu"},
            "volume_ids": volume_ids,
            "size": s.as_json(),
            "size_slug": s.slug,
            # droplets/models/network_v4.yml: one private and one public address.
            "networks": {
                "v4": [
                    {
                        "ip_address": self.private_ipv4,
                        "netmask": "255.255.0.0",
                        "gateway": "nil",
                        "type": "private",
                    },
                    {
                        "ip_address": self.public_ipv4,
                        "netmask": "255.255.255.0",
                        "gateway": self.public_ipv4.rsplit(".", 1)[0] + ".1",
                        "type": "public",
                    },
                ],
                "v6": [],
            },
            "region": {"slug": self.region, "name": self.region, "features": [], "sizes": []},
            "tags": list(self.tags),
            "vpc_uuid": "00000000-0000-4000-8000-000000000001",
        }
        if s.gpu:
            out["gpu_info"] = s.gpu_info()
        return out


@dataclass
class Record:
    """specification/resources/domains/models/domain_record.yml."""

    id: int
    type: str
    name: str  # relative to the zone; "@" for the apex
    data: str
    ttl: int = 1800

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "name": self.name,
            "data": self.data,
            "priority": None,
            "port": None,
            "ttl": self.ttl,
            "weight": None,
            "flags": None,
            "tag": None,
        }


@dataclass
class Volume:
    id: str
    name: str
    region: str
    size_gigabytes: int
    droplet_ids: list[int] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    created_at: str = "2026-01-01T00:00:00Z"

    def as_json(self) -> dict[str, Any]:
        """volumes/models/volume_full.yml (the fields callers read)."""
        return {
            "id": self.id,
            "name": self.name,
            "region": {"slug": self.region, "name": self.region},
            "size_gigabytes": self.size_gigabytes,
            "droplet_ids": list(self.droplet_ids),
            "tags": list(self.tags),
            "created_at": self.created_at,
            "filesystem_type": "ext4",
        }


@dataclass(frozen=True)
class Token:
    """A personal access token: its name (what the request log shows) and its custom scopes;
    full_access for a legacy read/write token."""

    name: str
    scopes: frozenset[str]
    full_access: bool = False


class Account:
    """One DigitalOcean account's state. Read and change it under `lock` while a server runs."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.droplets: dict[int, Droplet] = {}
        self.tags: set[str] = set()
        self.domains: dict[str, dict[int, Record]] = {}
        self.volumes: dict[str, Volume] = {}
        self.tokens: dict[str, Token] = {}  # secret -> token
        # Size slug -> the regions it is offered in now (GET /v2/sizes lists these).
        self.offered: dict[str, list[str]] = {}
        # A size of another shape than the catalog's (its disks, its memory) for a test.
        self.shapes: dict[str, Size] = {}
        # What DOKS offers (GET /v2/kubernetes/options): version slugs, node sizes, regions.
        self.kube_versions: list[str] = []
        self.kube_sizes: list[str] = []
        self.kube_regions: list[str] = []
        # DOKS clusters (GET /v2/kubernetes/clusters): id -> the fields a caller reads.
        self.clusters: dict[str, dict[str, Any]] = {}
        # A cluster's kubeconfig (GET .../kubeconfig answers it as YAML): id -> the YAML text.
        self.kubeconfigs: dict[str, str] = {}
        # Reserved IPs and Load Balancers as their list answers hold them
        # (reserved_ips/models/reserved_ip.yml, load_balancers/models/load_balancer.yml).
        self.reserved_ips: list[dict[str, Any]] = []
        self.load_balancers: list[dict[str, Any]] = []
        # billing/models/balance.yml: amounts as strings.
        self.month_to_date_usage = "0.00"
        self._ids = itertools.count(400_000_001)
        self._hosts = itertools.count(10)
        # Called with a Droplet's id once a DELETE removed it (the emulation powers it off).
        self.on_remove: list[Callable[[int], None]] = []

    def add_droplet(
        self,
        name: str,
        size_slug: str,
        region: str = "tor1",
        tags: list[str] | None = None,
        *,
        id: int | None = None,
        created_at: datetime | None = None,
        public_ipv4: str | None = None,
        private_ipv4: str | None = None,
        status: str = "active",
    ) -> Droplet:
        """A Droplet; addresses default to the documentation ranges (public 203.0.113.0/24,
        private 198.18.0.0/24), never DigitalOcean's real ones."""
        with self.lock:
            host = next(self._hosts)
            droplet = Droplet(
                id=next(self._ids) if id is None else id,
                name=name,
                size=size(size_slug),
                region=region,
                tags=list(tags or []),
                created_at=_timestamp(created_at or datetime.now(UTC)),
                public_ipv4=public_ipv4 or f"203.0.113.{host}",
                private_ipv4=private_ipv4 or f"198.18.0.{host}",
                status=status,
            )
            assert droplet.id not in self.droplets, f"Droplet {droplet.id} exists"
            self.droplets[droplet.id] = droplet
            self.tags.update(droplet.tags)  # tagging creates the tag (tags/tags_assign_resources)
            return droplet

    def add_cluster(self, name: str, tags: list[str]) -> str:
        """A DOKS cluster (kubernetes/models/cluster.yml: `id` a UUID, `name`, `tags`)."""
        with self.lock:
            cluster_id = f"bd5f5959-5e1e-4205-a714-{next(self._ids):012d}"
            self.clusters[cluster_id] = {"id": cluster_id, "name": name, "tags": list(tags)}
            return cluster_id

    def remove_droplet(self, droplet_id: int) -> bool:
        """Delete a Droplet as DigitalOcean does on DELETE: its Volumes stay, detached (only the
        destroy_with_associated_resources endpoints remove them)."""
        with self.lock:
            if self.droplets.pop(droplet_id, None) is None:
                return False
            for volume in self.volumes.values():
                if droplet_id in volume.droplet_ids:
                    volume.droplet_ids.remove(droplet_id)
        for hook in self.on_remove:
            hook(droplet_id)
        return True

    def add_record(self, zone: str, type_: str, name: str, data: str) -> Record:
        with self.lock:
            record = Record(next(self._ids), type_, name, data)
            self.domains.setdefault(zone, {})[record.id] = record
            return record

    def add_volume(
        self,
        name: str,
        size_gigabytes: int,
        region: str = "tor1",
        droplet_id: int | None = None,
        *,
        tags: list[str] | None = None,
        created_at: datetime | None = None,
    ) -> Volume:
        with self.lock:
            volume = Volume(
                f"506f78a4-e098-11e5-ad9f-{next(self._ids):012d}",
                name,
                region,
                size_gigabytes,
                [] if droplet_id is None else [droplet_id],
                list(tags or []),
                _timestamp(created_at or datetime.now(UTC)),
            )
            self.volumes[volume.id] = volume
            return volume

    def add_token(
        self, name: str, scopes: list[str] | tuple[str, ...] = (), *, secret: str | None = None
    ) -> str:
        """A token with exactly `scopes`; returns its secret (the Bearer value)."""
        return self._token(Token(name, frozenset(scopes)), secret)

    def add_full_access_token(self, name: str, *, secret: str | None = None) -> str:
        return self._token(Token(name, frozenset(), full_access=True), secret)

    def _token(self, token: Token, secret: str | None) -> str:
        secret = secret or f"dop_v1_{secrets.token_hex(32)}"
        with self.lock:
            self.tokens[secret] = token
        return secret

    def volume_ids(self, droplet_id: int) -> list[str]:
        return [v.id for v in self.volumes.values() if droplet_id in v.droplet_ids]


def _timestamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- scopes, from the OpenAPI ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """What a token needs for one operation: any one of `alternatives` (the OpenAPI `security`
    list is an OR of scope sets), and for each query parameter present its own scopes."""

    alternatives: tuple[frozenset[str], ...]
    parameters: dict[str, frozenset[str]]

    def allows(self, token: Token, query: dict[str, list[str]]) -> bool:
        if token.full_access:
            return True
        if not any(need <= token.scopes for need in self.alternatives):
            return False
        return all(need <= token.scopes for p, need in self.parameters.items() if p in query)


_REQUIRES = re.compile(r"requires `([a-z_]+:[a-z_]+)` scope", re.IGNORECASE)


def extract_scopes(read: Callable[[str], str], commit: str) -> dict[str, Any]:
    """The scopes table of OPERATIONS from the OpenAPI: read(path) returns a file's text."""
    import yaml  # noqa: PLC0415 (only when regenerating; PyYAML is a dev requirement)

    paths = yaml.safe_load(read(f"{SPEC}/DigitalOcean-public.v2.yaml"))["paths"]
    operations: dict[str, Any] = {}
    for method, path in OPERATIONS:
        file = posixpath.join(SPEC, paths[path][method.lower()]["$ref"])
        op = yaml.safe_load(read(file))
        # Some scopes are only in prose: droplets_destroy_byTag.yml "requires `tag:read` scope".
        described = sorted(set(_REQUIRES.findall(op.get("description", ""))))
        alternatives = [
            sorted({*scopes, *described}) for entry in op["security"] for scopes in entry.values()
        ]
        parameters: dict[str, list[str]] = {}
        for ref in op.get("parameters", []):
            target, _, key = ref["$ref"].partition("#/")
            param = yaml.safe_load(read(posixpath.normpath(posixpath.join(file, "..", target))))
            param = param[key]
            needs = sorted(set(_REQUIRES.findall(param.get("description", ""))))
            if param["in"] == "query" and needs:
                parameters[param["name"]] = needs
        operations[f"{method} {path}"] = {
            "file": file,
            "scopes": alternatives,
            "query_parameter_scopes": parameters,
        }
    return {"source": "github.com/digitalocean/openapi", "commit": commit, "operations": operations}


def extract_from_snapshot(git_dir: Path = SNAPSHOT) -> dict[str, Any]:
    def read(path: str) -> str:
        return _git(git_dir, "show", f"HEAD:{path}")

    return extract_scopes(read, _git(git_dir, "rev-parse", "HEAD").strip())


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(git_dir), *args], capture_output=True, text=True, check=True
    ).stdout


def load_rules(path: Path = SCOPES_FILE) -> dict[tuple[str, str], Rule]:
    table = json.loads(path.read_text())["operations"]
    rules = {}
    for key, entry in table.items():
        method, template = key.split(" ", 1)
        rules[method, template] = Rule(
            tuple(frozenset(s) for s in entry["scopes"]),
            {p: frozenset(s) for p, s in entry["query_parameter_scopes"].items()},
        )
    return rules


# ---- the server ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request as the log keeps it: the token's name, never its secret ("?" for a token the
    account does not know, None for no Authorization header)."""

    method: str
    path: str
    query: dict[str, list[str]]
    token: str | None
    status: int


@dataclass
class Reply:
    status: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    yaml: str | None = None  # a YAML body instead of JSON (the kubeconfig)


class BadRequestError(Exception):
    """A query the API refuses: 400 with the message."""


Handler = Callable[[dict[str, str], dict[str, list[str]], Token, str], Reply]


class DigitalOceanAPI:
    """The API over plain HTTP on host:port (0: a free port), served from threads of this
    process until stop(). `sock`: an already bound, listening socket to serve instead (one made
    inside a network namespace, say); `tls`: a server context to answer HTTPS with (the
    emulation's api.digitalocean.com).

    Knobs: fail(n, status) answers the next n requests with a 5xx; throttle(n, retry_after)
    with 429; per_minute/per_hour are the per-token budgets (429 with Retry-After once spent);
    vanish_after_list(*ids) deletes Droplets right after the next Droplet list is answered (another
    actor's delete between a caller's list and its delete); tag_delete_reaches_gpus: whether
    DELETE /v2/droplets?tag_name= deletes GPU Droplets, which the OpenAPI does not say (default:
    it does not, so a caller relying on it is caught)."""

    def __init__(
        self,
        account: Account | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sock: socket.socket | None = None,
        clock: Callable[[], float] = time.time,
        rules: dict[tuple[str, str], Rule] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.account = account or Account()
        self.clock = clock
        self.rules = rules or load_rules()
        self.requests: list[Seen] = []
        self.per_minute = PER_MINUTE
        self.per_hour = PER_HOUR
        self.tag_delete_reaches_gpus = False
        self._faults: deque[Reply] = deque()
        self._vanish: list[int] = []
        self._spent: dict[str, deque[float]] = {}
        self._routes = [
            (method, template, _pattern(template), self._handler(method, template))
            for method, template in OPERATIONS
        ]
        self._server = _server(self, host, port, sock, tls)

    @property
    def url(self) -> str:
        host, port = self._server.socket.getsockname()[:2]
        return f"{'https' if self._server.tls else 'http'}://{host}:{port}"

    def stop(self) -> None:
        loopback.stop(self._server)

    def __enter__(self) -> DigitalOceanAPI:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # knobs

    def fail(self, n: int = 1, status: int = 500) -> None:
        assert 500 <= status < 600
        with self.account.lock:
            self._faults.extend(Reply(status, SERVER_ERROR) for _ in range(n))

    def throttle(self, n: int = 1, retry_after: int = 30) -> None:
        with self.account.lock:
            self._faults.extend(
                Reply(429, TOO_MANY, {"retry-after": str(retry_after)}) for _ in range(n)
            )

    def vanish_after_list(self, *droplet_ids: int) -> None:
        with self.account.lock:
            self._vanish.extend(droplet_ids)

    # the answer to one request

    def answer(self, method: str, target: str, authorization: str, host: str) -> Reply:
        """Everything but the socket: faults, 401, rate limit, route, 403, the operation."""
        split = urlsplit(target)
        query = parse_qs(split.query, keep_blank_values=True)
        with self.account.lock:
            token = self.account.tokens.get(authorization.removeprefix("Bearer "))
            reply = self._answer(method, split.path, query, token, host)
            name = token.name if token else ("?" if authorization else None)
            self.requests.append(Seen(method, split.path, query, name, reply.status))
            reply.headers = {**self._ratelimit_headers(token, reply), **reply.headers}
            return reply

    def _answer(
        self, method: str, path: str, query: dict[str, list[str]], token: Token | None, host: str
    ) -> Reply:
        if self._faults:
            return self._faults.popleft()
        if token is None:
            return Reply(401, UNAUTHORIZED)
        wait = self._spend(token.name)
        if wait is not None:
            # description.yml "Rate Limit": a spent budget answers 429 with retry-after.
            return Reply(429, TOO_MANY, {"retry-after": str(wait)})
        return self._route(method, path, query, token, host)

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        for m, template, pattern, handler in self._routes:
            found = pattern.fullmatch(path)
            if found is None or m != method:
                continue
            if not self.rules[m, template].allows(token, query):
                return Reply(403, FORBIDDEN)
            try:
                return handler(found.groupdict(), query, token, host)
            except BadRequestError as err:
                return Reply(400, {"id": "bad_request", "message": str(err)})
        return Reply(404, NOT_FOUND)

    def _spend(self, name: str) -> int | None:
        """Count a request against the token's budgets (each request counts for an hour,
        description.yml "Rate Limit"); the seconds to wait when a budget is spent (the refused
        request does not count)."""
        now = self.clock()
        spent = self._spent.setdefault(name, deque())
        while spent and spent[0] <= now - 3600:
            spent.popleft()
        last_minute = [t for t in spent if t > now - 60]
        if len(last_minute) >= self.per_minute:
            return max(1, math.ceil(last_minute[0] + 60 - now))
        if len(spent) >= self.per_hour:
            return max(1, math.ceil(spent[0] + 3600 - now))
        spent.append(now)
        return None

    def _ratelimit_headers(self, token: Token | None, reply: Reply) -> dict[str, str]:
        """shared/headers.yml: ratelimit-limit (per hour), -remaining (0 also when the minute's
        burst limit is met, description.yml), -reset (when the oldest counted request expires)."""
        now = self.clock()
        spent = self._spent.get(token.name, deque()) if token else deque()
        remaining = max(0, self.per_hour - len(spent))
        if reply.status == 429:
            remaining = 0
        reset = spent[0] + 3600 if spent else now
        return {
            "ratelimit-limit": str(self.per_hour),
            "ratelimit-remaining": str(remaining),
            "ratelimit-reset": str(int(reset)),
        }

    # the operations

    def _handler(self, method: str, template: str) -> Handler:
        handlers: dict[tuple[str, str], Handler] = {
            ("GET", "/v2/account"): self._get_account,
            ("GET", "/v2/droplets"): self._list_droplets,
            ("DELETE", "/v2/droplets"): self._delete_by_tag,
            ("GET", "/v2/droplets/{droplet_id}"): self._get_droplet,
            ("DELETE", "/v2/droplets/{droplet_id}"): self._delete_droplet,
            ("GET", "/v2/tags/{tag_id}"): self._get_tag,
            ("GET", "/v2/domains/{domain_name}/records"): self._list_records,
            (
                "DELETE",
                "/v2/domains/{domain_name}/records/{domain_record_id}",
            ): self._delete_record,
            ("GET", "/v2/sizes"): self._list_sizes,
            ("GET", "/v2/domains/{domain_name}"): self._get_domain,
            ("GET", "/v2/account/keys"): self._empty("ssh_keys", "/v2/account/keys"),
            ("GET", "/v2/firewalls"): self._empty("firewalls", "/v2/firewalls"),
            ("GET", "/v2/tags"): self._list_tags,
            ("GET", "/v2/reserved_ips"): self._listed("reserved_ips", "/v2/reserved_ips"),
            ("GET", "/v2/load_balancers"): self._listed("load_balancers", "/v2/load_balancers"),
            ("GET", "/v2/volumes"): self._list_volumes,
            ("GET", "/v2/customers/my/balance"): self._get_balance,
            ("GET", "/v2/kubernetes/options"): self._kube_options,
            ("GET", "/v2/kubernetes/clusters"): self._list_clusters,
            ("GET", "/v2/kubernetes/clusters/{cluster_id}/kubeconfig"): self._kubeconfig,
            (
                "DELETE",
                "/v2/kubernetes/clusters/{cluster_id}/destroy_with_associated_resources/dangerous",
            ): self._delete_cluster,
        }
        return handlers[method, template]

    def _list_sizes(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """sizes/sizes_list.yml: every size, each with the regions it is offered in now and
        `available` (false when it is offered nowhere)."""
        items = []
        for slug, regions in sorted(self.account.offered.items()):
            item = (self.account.shapes.get(slug) or size(slug)).as_json()
            item.update(regions=list(regions), available=bool(regions))
            items.append(item)
        return _page("sizes", items, query, f"http://{host}/v2/sizes")

    def _kube_options(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """kubernetes/kubernetes_list_options.yml, models/options.yml: one object `options`
        with `regions` (name, slug), `versions` (slug, kubernetes_version,
        supported_features) and `sizes` (name, slug); not paginated."""
        a = self.account
        versions = [
            {"slug": v, "kubernetes_version": v.split("-", 1)[0],
             "supported_features": ["cluster-autoscaler", "token-authentication"]}
            for v in a.kube_versions
        ]  # fmt: skip
        return Reply(200, {"options": {
            "regions": [{"name": r, "slug": r} for r in a.kube_regions],
            "versions": versions,
            "sizes": [{"name": z, "slug": z} for z in a.kube_sizes],
        }})  # fmt: skip

    def _list_clusters(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """kubernetes/kubernetes_list_clusters.yml: `kubernetes_clusters`, paginated."""
        items = [dict(c) for c in self.account.clusters.values()]
        return _page("kubernetes_clusters", items, query, f"http://{host}/v2/kubernetes/clusters")

    def _kubeconfig(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """kubernetes/kubernetes_get_kubeconfig.yml, responses/kubeconfig.yml: the kubeconfig
        as application/yaml (server, certificate-authority-data, a user's token); 404 for an
        unknown cluster."""
        text = self.account.kubeconfigs.get(params["cluster_id"])
        if params["cluster_id"] not in self.account.clusters or text is None:
            return Reply(404, NOT_FOUND)
        return Reply(200, yaml=text)

    def _delete_cluster(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """kubernetes/kubernetes_destroy_associatedResourcesDangerous.yml: 204 with no body
        (the cluster, its Load Balancers and Volumes go), 404 for an unknown id."""
        if self.account.clusters.pop(params["cluster_id"], None) is None:
            return Reply(404, NOT_FOUND)
        return Reply(204, None)

    def _get_domain(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        # domains/domains_get.yml: the domain, or 404 for one the account does not have.
        name = params["domain_name"]
        if name not in self.account.domains:
            return Reply(404, NOT_FOUND)
        return Reply(200, {"domain": {"name": name, "ttl": 1800, "zone_file": ""}})

    def _list_tags(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        # tags/tags_list.yml (counts left out: callers here read the names).
        items = [{"name": t, "resources": {"count": 0}} for t in sorted(self.account.tags)]
        return _page("tags", items, query, f"http://{host}/v2/tags")

    def _empty(self, key: str, path: str) -> Handler:
        """A collection this fake keeps none of (its models are not emulated): an empty page,
        so a caller's read is answered and its token's scope checked."""

        def handler(
            params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
        ) -> Reply:
            return _page(key, [], query, f"http://{host}{path}")

        return handler

    def _listed(self, key: str, path: str) -> Handler:
        """A collection the account keeps as its list answer holds it (self.account.<key>)."""

        def handler(
            params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
        ) -> Reply:
            items = [dict(item) for item in getattr(self.account, key)]
            return _page(key, items, query, f"http://{host}{path}")

        return handler

    def _list_volumes(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """volumes/volumes_list.yml: `volumes`, paginated; `name` (and `region`) filter."""
        name, region = _one(query, "name"), _one(query, "region")
        items = [
            v.as_json()
            for v in self.account.volumes.values()
            if (name is None or v.name == name) and (region is None or v.region == region)
        ]
        return _page("volumes", items, query, f"http://{host}/v2/volumes")

    def _get_balance(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """billing/balance_get.yml, models/balance.yml: strings, `generated_at` a time."""
        usage = self.account.month_to_date_usage
        return Reply(200, {
            "month_to_date_balance": usage, "account_balance": "0.00",
            "month_to_date_usage": usage, "generated_at": _timestamp(datetime.now(UTC)),
        })  # fmt: skip

    def _get_account(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        # account/models/account.yml
        account = {
            "droplet_limit": 25,
            "floating_ip_limit": 3,
            "email": "emulated@example.com",
            "name": "emulated",
            "uuid": "b6fr89dbf6d9156cace5f3c78dc9851d957381ef",
            "email_verified": True,
            "status": "active",
            "status_message": "",
        }
        return Reply(200, {"account": account})

    def _list_droplets(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """droplets/droplets_list.yml and droplets/parameters.yml: `tag_name` "can not be
        combined with `name` or `type`"; without `type=gpus` GPU Droplets are left out, with it
        only they are listed (so no filter by tag ever lists a GPU Droplet); `name` is an exact,
        case-insensitive match. The OpenAPI gives no status for a refused combination: 400."""
        tag = _one(query, "tag_name")
        name = _one(query, "name")
        kind = _one(query, "type") or "droplets"
        if tag is not None and (name is not None or "type" in query):
            raise BadRequestError("tag_name can not be combined with name or type")
        if kind not in ("droplets", "gpus"):
            raise BadRequestError("type must be droplets or gpus")
        found = [
            d
            for d in sorted(self.account.droplets.values(), key=lambda d: d.id)
            if d.size.gpu == (kind == "gpus")
            and (tag is None or tag in d.tags)
            and (name is None or d.name.lower() == name.lower())
        ]
        items = [d.as_json(self.account.volume_ids(d.id)) for d in found]
        reply = _page("droplets", items, query, f"http://{host}/v2/droplets")
        for droplet_id in self._vanish:  # the race: gone right after the caller saw it
            self.account.remove_droplet(droplet_id)
        self._vanish.clear()
        return reply

    def _get_droplet(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        droplet = self.account.droplets.get(_id(params["droplet_id"]))
        if droplet is None:
            return Reply(404, NOT_FOUND)
        return Reply(200, {"droplet": droplet.as_json(self.account.volume_ids(droplet.id))})

    def _delete_droplet(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        # droplets/droplets_destroy.yml: 204 (no_content_with_content_type.yml), 404 unknown.
        if not self.account.remove_droplet(_id(params["droplet_id"])):
            return Reply(404, NOT_FOUND)
        return Reply(204, None, {"content-type": "application/json; charset=utf-8"})

    def _delete_by_tag(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """droplets/droplets_destroy_byTag.yml: `tag_name` is required; 204, or 404 for a tag
        the account does not have. Whether GPU Droplets go too is not documented."""
        tag = _one(query, "tag_name")
        if not tag:
            raise BadRequestError("tag_name is required")
        if tag not in self.account.tags:
            return Reply(404, NOT_FOUND)
        for droplet in list(self.account.droplets.values()):
            if tag in droplet.tags and (self.tag_delete_reaches_gpus or not droplet.size.gpu):
                self.account.remove_droplet(droplet.id)
        return Reply(204, None, {"content-type": "application/json; charset=utf-8"})

    def _get_tag(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """tags/tags_get.yml: the tag and counts of what carries it, "only resources that you
        are authorized to see" (tags/models/tags.yml: Droplets need droplet:read)."""
        name = params["tag_id"]
        if name not in self.account.tags:  # tags are case stable (tags/models/tags.yml)
            return Reply(404, NOT_FOUND)

        def sees(scope: str) -> bool:
            return token.full_access or scope in token.scopes

        droplets = [d for d in self.account.droplets.values() if name in d.tags]
        volumes = [v for v in self.account.volumes.values() if name in v.tags]
        droplets = droplets if sees("droplet:read") else []
        volumes = volumes if sees("block_storage:read") else []
        tagged: dict[str, Any] = {"count": len(droplets)}
        if droplets:
            last = max(droplets, key=lambda d: d.id).id
            tagged["last_tagged_uri"] = f"https://api.digitalocean.com/v2/droplets/{last}"
        resources = {
            "count": len(droplets) + len(volumes),
            "droplets": tagged,
            "volumes": {"count": len(volumes)},
        }
        return Reply(200, {"tag": {"name": name, "resources": resources}})

    def _list_records(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        """domains/domains_list_records.yml: `name` is a fully qualified name, `type` a record
        type; 404 for a domain the account does not have."""
        zone = params["domain_name"]
        records = self.account.domains.get(zone)
        if records is None:
            return Reply(404, NOT_FOUND)
        name, type_ = _one(query, "name"), _one(query, "type")
        items = [
            r.as_json()
            for r in sorted(records.values(), key=lambda r: r.id)
            if (name is None or (zone if r.name == "@" else f"{r.name}.{zone}") == name)
            and (type_ is None or r.type == type_)
        ]
        return _page("domain_records", items, query, f"http://{host}/v2/domains/{zone}/records")

    def _delete_record(
        self, params: dict[str, str], query: dict[str, list[str]], token: Token, host: str
    ) -> Reply:
        # domains/domains_delete_record.yml: 204 (no_content.yml: no content type), 404.
        records = self.account.domains.get(params["domain_name"], {})
        if records.pop(_id(params["domain_record_id"]), None) is None:
            return Reply(404, NOT_FOUND)
        return Reply(204)


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template))


def _id(text: str) -> int:
    """A path id (an integer of at least 1, droplets/parameters.yml `droplet_id`); anything else
    matches nothing, so it is a 404 as for an unknown id."""
    return int(text) if text.isdigit() and int(text) >= 1 else -1


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _positive(query: dict[str, list[str]], name: str, default: int) -> int:
    text = _one(query, name)
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise BadRequestError(f"{name} must be a positive integer")
    return int(text)


def _page(key: str, items: list[dict[str, Any]], query: dict[str, list[str]], base: str) -> Reply:
    """A page of a collection (description.yml "Links & Pagination" and "Meta";
    shared/pages.yml, shared/meta.yml): per_page (default 20, at most 200: more is clamped),
    page from 1; links.pages holds first/prev and next/last only where they make sense;
    meta.total counts every match. The links keep the query's filters."""
    per_page = min(_positive(query, "per_page", PER_PAGE_DEFAULT), PER_PAGE_MAX)
    page = _positive(query, "page", 1)
    last = max(1, math.ceil(len(items) / per_page))
    rest = {k: v[-1] for k, v in query.items() if k not in ("page", "per_page")}

    def link(n: int) -> str:
        return f"{base}?{urlencode({**rest, 'page': n, 'per_page': per_page})}"

    pages: dict[str, str] = {}
    if page > 1:
        pages.update(first=link(1), prev=link(min(page - 1, last)))
    if page < last:
        pages.update(next=link(page + 1), last=link(last))
    start = (page - 1) * per_page
    body = {
        key: items[start : start + per_page],
        "links": {"pages": pages} if pages else {},
        "meta": {"total": len(items)},
    }
    return Reply(200, body)


def _server(
    api: DigitalOceanAPI,
    host: str,
    port: int,
    sock: socket.socket | None,
    tls: ssl.SSLContext | None = None,
) -> loopback.Server:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            reply = api.answer(
                self.command,
                self.path,
                self.headers.get("Authorization", ""),
                self.headers.get("Host") or f"{host}:{port}",
            )
            data = b"" if reply.body is None else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            headers = dict(reply.headers)
            if reply.body is not None:
                headers.setdefault("content-type", "application/json; charset=utf-8")
            if reply.yaml is not None:
                data = reply.yaml.encode()
                headers.setdefault("content-type", "application/yaml")
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_DELETE = do_POST = do_PUT = do_PATCH = _serve  # noqa: N815

        def log_message(self, *_: Any) -> None:
            pass

    return loopback.serve(Handler, loopback.bound(host, port) if sock is None else sock, tls=tls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate do_api_scopes.json")
    parser.add_argument("snapshot", type=Path, nargs="?", default=SNAPSHOT)
    args = parser.parse_args(argv)
    table = extract_from_snapshot(args.snapshot)
    SCOPES_FILE.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    print(f"wrote {SCOPES_FILE} from {table['commit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
