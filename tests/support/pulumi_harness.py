"""Run the real Pulumi program (`__main__.py`) under Pulumi's mocks and record what it declares.

The mock monitor is subclassed to keep what the stock one throws away: each registration's raw
inputs with their secret markers, its dependencies, parent and custom timeouts, so that tests can
assert security properties (no secret in a plain input) and edges, not only values.
"""

from __future__ import annotations

import json
import runpy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings

ROOT = Path(__file__).resolve().parent.parent.parent
PROJECT = "nemotron-droplet"
SECRET_SIG = "4dabf18193072939515e22adb298388d"

# A syntactically real OpenSSH private key body is not needed: any unique marker will do, the
# tests look for it verbatim wherever it must not be.
FAKE_PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE-PRIVATE-KEY-b3BlbnNzaC1rZXktdjEAAAAA\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
FAKE_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFAKEPUBLICKEY nemotron"
FAKE_HOST_PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE-HOST-KEY-aG9zdGtleWhvc3RrZXk\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
FAKE_HOST_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFAKEHOSTKEY"
FAKE_API_KEY = "FAKEgeneratedApiKey0123456789abcdefghijklmnopqrs"
FAKE_FINGERPRINT = "aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99"
FAKE_IPV4 = "203.0.113.10"
FAKE_DROPLET_ID = "424242"

SIZES_TOKEN = "digitalocean:index/getSizes:getSizes"
DROPLETS_TOKEN = "digitalocean:index/getDroplets:getDroplets"
DOMAIN_TOKEN = "digitalocean:index/getDomain:getDomain"
VOLUME_TOKEN = "digitalocean:index/getVolume:getVolume"
REGION_TOKEN = "digitalocean:index/getRegion:getRegion"
TAG_TOKEN = "digitalocean:index/getTag:getTag"
VOLUME = "digitalocean:index/volume:Volume"
VOLUME_ATTACHMENT = "digitalocean:index/volumeAttachment:VolumeAttachment"
DNS_RECORD = "digitalocean:index/dnsRecord:DnsRecord"
FAKE_RECORD_ID = "31415926"


# When each phase ran in the mocked bootstrap (epoch seconds): one after the other, from 1e9.
FAKE_PHASE_START = {
    name: 1_000_000_000.0 + 10 * i
    for i, name in enumerate(
        ("preflight", "driver", "cgroup", "reboot", "reboot-wait", "cache", "conda", "vllm",
         "model", "service", "gateway", "autodown", "ready", "member", "wake", "router")
    )
}  # fmt: skip


def fake_stdout(phase: str) -> str:
    """What a bootstrap phase prints last, as the mocked remote Command returns it."""
    return json.dumps(
        {
            "phase": phase,
            "changed": True,
            "seconds": 1.5,
            "started_at": FAKE_PHASE_START[phase],
            "ended_at": FAKE_PHASE_START[phase] + 1.5,
            "boot_id": "b00t",
            "run": f"run-{phase}",
            "rebooting": False,
        }
    )


def offer(slug: str, regions: list[str], price: float = 0.76, available: bool = True) -> dict:
    """One entry of the sizes API as the provider returns it (camelCase, as mocks expect)."""
    return {
        "slug": slug,
        "available": available,
        "regions": regions,
        "priceHourly": price,
        "priceMonthly": round(price * 672, 2),
        "vcpus": 8,
        "memory": 32768,
        "disk": 500,
        "transfer": 10.0,
        "gpuInfos": [],
    }


DEFAULT_OFFERS = {
    "gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["nyc2", "tor1"], 0.76),
    "gpu-h100x1-80gb": offer("gpu-h100x1-80gb", ["nyc2", "tor1", "ams3"], 3.39),
    "gpu-h100x8-640gb": offer("gpu-h100x8-640gb", ["nyc2"], 23.92),
    "gpu-l40sx1-48gb": offer("gpu-l40sx1-48gb", ["tor1"], 1.57),
    # The Caddy balancer's CPU size, sold everywhere.
    "s-1vcpu-1gb": offer("s-1vcpu-1gb", ["nyc2", "tor1", "ams3"], 0.00893),
    # The Kubernetes platform's CPU pool size.
    "s-2vcpu-4gb": offer("s-2vcpu-4gb", ["nyc2", "tor1", "ams3"], 0.03571),
}
# The Load Balancer's and the Reserved IP's addresses as the mocks give them.
FAKE_LB_IPV4 = "203.0.113.200"
FAKE_RESERVED_IPV4 = "203.0.113.201"


@dataclass
class Registration:
    type: str
    name: str
    urn: str
    inputs: dict[str, Any]  # plain values, secrets unwrapped
    raw: dict[str, Any]  # wire form: secrets still wrapped in their marker
    dependencies: list[str]
    parent: str
    custom_timeouts: dict[str, str]
    delete_before_replace: bool = False
    replace_on_changes: tuple[str, ...] = ()
    retain_on_delete: bool = False
    import_id: str = ""


def existing_volume(
    name: str = "nemotron-dev-cache",
    region: str = "tor1",
    size: int = 100,
    droplet_ids: tuple[int, ...] = (),
    volume_id: str = "vol-kept-0001",
) -> dict:
    """One Volume as the volume data source reports it (camelCase, as mocks expect)."""
    return {
        "id": volume_id,
        "name": name,
        "region": region,
        "size": size,
        "dropletIds": list(droplet_ids),
        "description": "nemotron-droplet cache",
        "filesystemType": "ext4",
        "filesystemLabel": "nemotron-cache",
        "tags": [],
        "urn": f"do:volume:{volume_id}",
    }


def existing_droplet(
    name: str = "nemotron-dev",
    region: str = "tor1",
    size: str = "gpu-4000adax1-20gb",
    stack: str = "dev",
    price: float = 0.76,
    droplet_id: int = int(FAKE_DROPLET_ID),
) -> dict:
    """One GPU Droplet as the droplets data source lists it (camelCase, as mocks expect)."""
    return {
        "id": droplet_id,
        "name": name,
        "region": region,
        "size": size,
        "tags": ["nemotron-droplet", f"stack:{stack}"],
        "priceHourly": price,
        "createdAt": "2026-11-30T10:00:00Z",
        "status": "active",
    }


class FakeCloud(pulumi_mocks.Mocks):
    def __init__(
        self,
        offers: dict[str, dict],
        droplets: list[dict] | None = None,
        droplet_id: str = "",
        zones: tuple[str, ...] = (),
        ipv4: str = "",
        volumes: list[dict] | None = None,
        no_volumes_in: tuple[str, ...] = (),
        tags: tuple[str, ...] = (),
    ):
        self.offers = offers
        # The account's Volumes, and the regions that sell none (their features lack "storage").
        self.volumes = volumes or []
        self.no_volumes_in = no_volumes_in
        # The account's tags (a tag exists once something carried it).
        self.tags = tags
        # The domains of the account (Networking > Domains).
        self.zones = zones
        self.ipv4 = ipv4 or FAKE_IPV4
        # The id the provider gives a created Droplet (a replacement gets a new one).
        self.droplet_id = droplet_id or FAKE_DROPLET_ID
        self.droplets = droplets or []
        self.calls: list[pulumi_mocks.MockCallArgs] = []

    def call(self, args: pulumi_mocks.MockCallArgs):
        self.calls.append(args)
        handlers = {
            SIZES_TOKEN: self._sizes,
            DROPLETS_TOKEN: self._droplets,
            DOMAIN_TOKEN: self._domain,
            VOLUME_TOKEN: self._volume,
            REGION_TOKEN: self._region,
            TAG_TOKEN: self._tag,
        }
        if args.token not in handlers:
            raise AssertionError(f"unexpected invoke {args.token}")
        return handlers[args.token](args.args)

    # Each returns (outputs, failures): a failure is what a provider's error looks like to the
    # program, a failed invoke it can catch (a plain exception would be an RPC-level crash).

    def _sizes(self, a: dict):
        wanted = {v for f in a.get("filters", []) for v in f["values"]}
        return {"sizes": [o for slug, o in self.offers.items() if slug in wanted]}, []

    def _droplets(self, a: dict):
        # The provider's filters: every filter must match; a list attribute matches when any
        # element is one of the values.
        assert a.get("gpus") is True, "GPU Droplets are hidden without gpus=true"

        def matches(d: dict, f: dict) -> bool:
            value = d.get(f["key"])
            values = value if isinstance(value, list) else [value]
            return any(str(v) in f["values"] for v in values)

        found = [d for d in self.droplets if all(matches(d, f) for f in a.get("filters", []))]
        return {"droplets": found, "id": "droplets"}, []

    def _domain(self, a: dict):
        name = a["name"]
        if name not in self.zones:
            message = f"Error retrieving domain: 404 The resource could not be found ({name})"
            return {}, [("name", message)]
        return {
            "name": name,
            "ttl": 1800,
            "zoneFile": "",
            "urn": f"do:domain:{name}",
            "id": name,
        }, []

    def _volume(self, a: dict):
        # The provider's data source (datasource_digitalocean_volume.go, findVolumeByName): the
        # name among the account's Volumes (in `region` when given), exactly one.
        name, region = a["name"], a.get("region")
        found = [v for v in self.volumes if v["name"] == name and region in (None, v["region"])]
        if not found:
            return {}, [("name", f"no volumes found with name {name}")]
        if len(found) > 1:
            message = f"too many volumes found with name {name} (found {len(found)}, expected 1)"
            return {}, [("name", message)]
        return found[0], []

    def _tag(self, a: dict):
        name = a["name"]
        if name not in self.tags:
            return {}, [("name", f"tag not found: GET /v2/tags/{name}: 404 tag not found")]
        return {"name": name, "id": name, "totalResourceCount": 1, "dropletsCount": 1}, []

    def _region(self, a: dict):
        slug = a["slug"]
        features = ["backups", "ipv6", "metadata", "install_agent", "image_transfer"]
        if slug not in self.no_volumes_in:
            features.append("storage")
        region = {"slug": slug, "name": slug, "available": True, "sizes": [], "id": slug}
        return {**region, "features": features}, []

    def new_resource(self, args: pulumi_mocks.MockResourceArgs):  # noqa: PLR0911 (one per type)
        outs = dict(args.inputs)
        if args.typ == "tls:index/privateKey:PrivateKey" and args.name.endswith("host-key"):
            outs.update(
                privateKeyOpenssh=FAKE_HOST_PRIVATE_KEY,
                privateKeyPem=FAKE_HOST_PRIVATE_KEY,
                publicKeyOpenssh=FAKE_HOST_PUBLIC_KEY + "\n",
            )
        elif args.typ == "tls:index/privateKey:PrivateKey":
            outs.update(
                privateKeyOpenssh=FAKE_PRIVATE_KEY,
                privateKeyPem=FAKE_PRIVATE_KEY,
                publicKeyOpenssh=FAKE_PUBLIC_KEY,
            )
        elif args.typ == "random:index/randomPassword:RandomPassword":
            outs.update(result=FAKE_API_KEY, bcryptHash="$2a$10$fake")
        elif args.typ == "digitalocean:index/sshKey:SshKey":
            outs.update(fingerprint=FAKE_FINGERPRINT)
        elif args.typ == "command:remote:Command":
            # bootstrap-<phase>, bootstrap-<k>-<phase>, balancer-<phase>, balancer-member-<k>
            name = args.name.removeprefix("balancer-").removeprefix("bootstrap-")
            # A phase this list lacks fails loudly (a StopIteration from next() hung the mocks).
            known = [p for p in sorted(FAKE_PHASE_START, key=len, reverse=True) if p in name]
            assert known, f"pulumi_harness: no fake result for the Command {args.name}"
            phase = known[0]
            outs["stdout"] = fake_stdout(phase)
            outs["stderr"] = f"[{phase}] done"
        elif args.typ == DNS_RECORD:
            name, zone = args.inputs["name"], args.inputs["domain"]
            outs["fqdn"] = zone if name == "@" else f"{name}.{zone}"
            return FAKE_RECORD_ID, outs  # DigitalOcean's record ids are numbers
        elif args.typ == VOLUME:
            # An adopted Volume keeps its id; a new one gets one.
            return args.resource_id or f"vol-{args.name}-new", outs
        elif args.typ == "digitalocean:index/droplet:Droplet":
            # Replica k (gpu-k) and the balancer get addresses and ids of their own; replica 0
            # (gpu) those the single-Droplet tests know.
            n = (
                0
                if args.name == "gpu"
                else 90
                if args.name == "balancer"
                else int(args.name.rsplit("-", 1)[1])
            )
            ipv4 = self.ipv4 if n == 0 else f"203.0.113.{10 + n}"
            outs.update(ipv4Address=ipv4, ipv4AddressPrivate=f"10.110.0.{2 + n}", status="active")
            return (self.droplet_id if n == 0 else f"{self.droplet_id}{n}"), outs
        elif args.typ == "digitalocean:index/loadBalancer:LoadBalancer":
            refuse_load_balancer(args.inputs)
            outs.update(ip=FAKE_LB_IPV4, status="active")
            return "lb-uuid-0001", outs
        elif args.typ == "digitalocean:index/reservedIp:ReservedIp":
            outs.update(ipAddress=FAKE_RESERVED_IPV4)
            return FAKE_RESERVED_IPV4, outs
        elif args.typ == "digitalocean:index/certificate:Certificate":
            outs.setdefault("name", f"{args.name}-a1b2c3")
            return "cert-uuid-0001", outs
        return f"{args.name}-id", outs


# Where DigitalOcean takes no size_unit, only the older size slug (its OpenAPI,
# load_balancers/models/load_balancer_base.yml), and the most nodes it takes.
LB_SLUG_REGIONS = ("ams2", "nyc2", "sfo1")
LB_SLUGS = ("lb-small", "lb-medium", "lb-large")


def refuse_load_balancer(inputs: dict[str, Any]) -> None:
    """What DigitalOcean's API refuses of a Load Balancer, as it would (a failed create)."""
    unit, size, region = inputs.get("sizeUnit"), inputs.get("size"), inputs["region"]
    if region in LB_SLUG_REGIONS and unit is not None:
        raise AssertionError(f"422: size_unit is not available in {region}: use size")
    if region not in LB_SLUG_REGIONS and size is not None:
        raise AssertionError(f"422: size is replaced by size_unit in {region}")
    if unit is not None and not 1 <= unit <= 100:
        raise AssertionError(f"422: size_unit must be 1-100, got {unit}")
    if size is not None and size not in LB_SLUGS:
        raise AssertionError(f"422: size must be one of {LB_SLUGS}, got {size}")


class Recorder(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi_mocks.Mocks):
        super().__init__(mocks)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request):  # noqa: N802 (the monitor's gRPC name)
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            raw = json_format.MessageToDict(request.object)
            self.registrations.append(
                Registration(
                    type=request.type,
                    name=request.name,
                    urn=response.urn,
                    inputs=_unwrap(raw),
                    raw=raw,
                    dependencies=list(request.dependencies),
                    parent=request.parent,
                    custom_timeouts={
                        "create": request.customTimeouts.create,
                        "update": request.customTimeouts.update,
                        "delete": request.customTimeouts.delete,
                    },
                    delete_before_replace=request.deleteBeforeReplace,
                    replace_on_changes=tuple(request.replaceOnChanges),
                    retain_on_delete=request.retainOnDelete,
                    import_id=request.importId,
                )
            )
        return response


def _unwrap(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get(SECRET_SIG) == "1b47061264138c4ac30d75fd1eb44270":
            return _unwrap(value.get("value"))
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def plain_strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a wire-form value that is NOT inside a secret marker, with its path."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG) == "1b47061264138c4ac30d75fd1eb44270":
            return
        for k, v in value.items():
            yield from plain_strings(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from plain_strings(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


@dataclass
class Output:
    value: Any
    secret: bool


@dataclass
class Run:
    registrations: list[Registration]
    outputs: dict[str, Output]
    cloud: FakeCloud
    error: BaseException | None = None

    def one(self, type_: str, name: str | None = None) -> Registration:
        found = [r for r in self.registrations if r.type == type_ and name in (None, r.name)]
        assert len(found) == 1, f"expected one {type_}, found {len(found)}"
        return found[0]


def stack_config(stack: str) -> dict[str, Any]:
    """The config of a shipped stack file, keys without the namespace."""
    data = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    prefix = f"{PROJECT}:"
    return {k[len(prefix) :]: v for k, v in data["config"].items() if k.startswith(prefix)}


def run_program(
    config: dict[str, Any],
    *,
    stack: str = "dev",
    secrets: dict[str, str] | None = None,
    offers: dict[str, dict] | None = None,
    cloud_type: type[FakeCloud] | None = None,
    **account: Any,
) -> Run:
    """Run __main__.py with `config` (keys without namespace; plain values JSON-encoded the way
    the engine passes structured config) and `secrets` (marked secret), against a FakeCloud
    with these `offers` and `account` (its other arguments: droplets, volumes, zones, ...)."""
    # `cloud_type`: a FakeCloud that answers more (the Kubernetes platform's, tests/test_kube*).
    cloud = (cloud_type or FakeCloud)(DEFAULT_OFFERS if offers is None else offers, **account)
    monitor = Recorder(cloud)
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(cloud, project=PROJECT, stack=stack, preview=False, monitor=monitor)
    all_config = {
        f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in config.items()
    }
    secrets = secrets or {}
    all_config.update({f"{PROJECT}:{k}": v for k, v in secrets.items()})
    pulumi.runtime.set_all_config(all_config, [f"{PROJECT}:{k}" for k in secrets])

    result = Run(registrations=monitor.registrations, outputs={}, cloud=cloud)

    @pulumi.runtime.test
    def program():
        runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
        stack_resource = pulumi_settings.get_root_resource()
        exported: dict[str, Any] = getattr(stack_resource, "outputs", {})
        names = list(exported)

        outs = [pulumi.Output.from_input(exported[n]) for n in names]

        async def resolve() -> None:
            for n, o in zip(names, outs, strict=True):
                value = await o.future(with_unknowns=True)
                secret = await o.is_secret()
                result.outputs[n] = Output(value=value, secret=bool(secret))

        return pulumi.Output.from_input(resolve())

    try:
        program()
    except BaseException as err:  # noqa: BLE001 (tests assert on it)
        result.error = err
    return result
