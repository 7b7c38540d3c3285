"""The emulated account: what the program's invokes read and the providers that make its
resources, on the emulation's world (net.py): a Droplet is a host with a real sshd on its disk
(a phase sandbox), a Firewall nftables rules on the hosts it names, keys real Ed25519 keys, a
Volume an image file that appears on the Droplet it is attached to under /dev/disk/by-id.

The DigitalOcean provider's behaviour relied on (terraform-provider-digitalocean, docs/facts.md):
a Droplet's image, region, ssh_keys, user_data, monitoring, droplet_agent and vpc_uuid force a
new one (the program adds size through replaceOnChanges); a Droplet is active with its
addresses when create returns; deleting it deletes the machine (its Volumes stay, detached).
A Volume's region, name, description, snapshot and initial filesystem force a new one; its size
changes in place (a resize action) and never shrinks (volume/resource_volume.go, CustomizeDiff);
an attachment's droplet_id and volume_id force a new one, and its delete detaches
(volume/resource_volume_attachment.go). On the Droplet, an attached Volume is the disk
/dev/disk/by-id/scsi-0DO_Volume_<its name> (DigitalOcean docs, Volumes: "How to mount").

Why an image file and not a loop device: the cache phase grows a mounted filesystem online
(resize2fs), which the kernel allows only with CAP_SYS_RESOURCE (fs/ext4/ioctl.c,
EXT4_IOC_RESIZE_FS), a capability this machine's root does not have: a loop device mounts, but
its growth fails here for a reason of this machine. The image file is what the cache phase
tests use (tests/support/fakes/mount binds its content when mounted; resize2fs grows it offline).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import secrets
import string
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from pulumi.runtime import mocks as pulumi_mocks
from sandbox import Sandbox

from components.spec import catalog
from stack import do_api, net
from stack.engine import Resource
from stack.load_balancer import LoadBalancer

DROPLET = "digitalocean:index/droplet:Droplet"
FIREWALL = "digitalocean:index/firewall:Firewall"
SSH_KEY = "digitalocean:index/sshKey:SshKey"
PRIVATE_KEY = "tls:index/privateKey:PrivateKey"
PASSWORD = "random:index/randomPassword:RandomPassword"
TAG = "digitalocean:index/tag:Tag"
RESERVED_IP = "digitalocean:index/reservedIp:ReservedIp"
ASSIGNMENT = "digitalocean:index/reservedIpAssignment:ReservedIpAssignment"
LOAD_BALANCER = "digitalocean:index/loadBalancer:LoadBalancer"
CERTIFICATE = "digitalocean:index/certificate:Certificate"
DNS_RECORD = "digitalocean:index/dnsRecord:DnsRecord"
VOLUME = "digitalocean:index/volume:Volume"
ATTACHMENT = "digitalocean:index/volumeAttachment:VolumeAttachment"
# terraform-provider-digitalocean droplet/resource_droplet.go, ForceNew (camelCase, as the
# engine sees the inputs).
DROPLET_FORCE_NEW = frozenset(
    {"image", "region", "sshKeys", "userData", "monitoring", "dropletAgent", "vpcUuid"}
)
# volume/resource_volume.go and resource_volume_attachment.go, ForceNew.
FORCE_NEW = {
    DROPLET: DROPLET_FORCE_NEW,
    VOLUME: frozenset(
        {
            "region",
            "name",
            "description",
            "snapshotId",
            "initialFilesystemType",
            "initialFilesystemLabel",
        }
    ),
    ATTACHMENT: frozenset({"dropletId", "volumeId"}),
    # sshkey/resource_ssh_key.go, reservedip/resource_reserved_ip_assignment.go,
    # tag/resource_tag.go, domain/resource_record.go: ForceNew.
    SSH_KEY: frozenset({"publicKey"}),
    ASSIGNMENT: frozenset({"ipAddress", "dropletId"}),
    TAG: frozenset({"name"}),
    DNS_RECORD: frozenset({"domain", "type"}),
}
# Where DigitalOcean names an attached Volume on the Droplet (its docs, Volumes: "How to
# mount"): written here, not taken from the program, so a wrong prefix there fails here.
VOLUME_BY_ID = "/dev/disk/by-id/scsi-0DO_Volume_"


@dataclass
class Machine:
    """A Droplet of the emulated account."""

    id: int
    name: str
    size: str
    region: str
    tags: list[str]
    host: net.Host
    box: Sandbox
    sshd: net.Sshd
    created_at: str
    stop: threading.Event = field(default_factory=threading.Event)

    def shell(self, command: str) -> subprocess.CompletedProcess[str]:
        """`command` (bash) on the Droplet as its own sessions see it: in sshd's mount and
        network namespaces. A change to its disk goes through this: writing the sandbox's
        overlay layer from outside while sshd's overlay is mounted is undefined (overlayfs
        docs, "Changes to underlying filesystems")."""
        assert self.sshd.proc is not None, "sshd is not running"
        argv = ["nsenter", "-t", str(self.sshd.proc.pid), "-m", "-n", "bash", "-c", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@dataclass
class Disk:
    """A Volume of the emulated account: a sparse image file of its size."""

    id: str
    name: str
    region: str
    size_gb: int
    image: Path
    tags: list[str]
    droplet_ids: list[int] = field(default_factory=list)

    @property
    def device(self) -> str:
        return VOLUME_BY_ID + self.name


def ed25519_pair() -> tuple[str, str]:
    """A new key as the tls provider gives it: OpenSSH private key text and public key line."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, public.decode() + "\n"


def fingerprint(public_key: str) -> str:
    """An SSH key's MD5 fingerprint, as DigitalOcean names keys (aa:bb:...)."""
    digest = hashlib.md5(base64.b64decode(public_key.split()[1]), usedforsecurity=False)
    return ":".join(f"{b:02x}" for b in digest.digest())


def cloud_config_host_key(user_data: str) -> str:
    """The host key the program's cloud-config installs (what cloud-init does at first boot)."""
    config = yaml.safe_load(user_data.removeprefix("#cloud-config\n"))
    key: str = config["ssh_keys"]["ed25519_private"]
    return key


class Account(pulumi_mocks.Mocks):
    """The emulated DigitalOcean account (its invokes) and the provider of its resources."""

    def __init__(self, world: net.World, workdir: Path, offers: dict[str, dict[str, Any]]):
        self.world, self.workdir, self.offers = world, workdir, offers
        self.machines: dict[int, Machine] = {}
        self.keys: dict[str, str] = {}  # fingerprint -> public key
        self.tags: set[str] = set()
        self.reserved = itertools.count(200)
        # DNS zones of the account (Networking > Domains) and their records: name -> address.
        self.zones: set[str] = set()
        self.records: dict[str, str] = {}
        # Certificates DigitalOcean issued (name -> chain, key), and Load Balancers.
        self.certificates: dict[str, tuple[str, str]] = {}
        self.balancers: dict[str, LoadBalancer] = {}
        self.lb_addresses = itertools.count(150)
        # How DigitalOcean's Let's Encrypt certificates are issued here (the scenario's CA).
        self.issue_certificate: Callable[[list[str]], tuple[str, bytes]] | None = None
        self.ids = itertools.count(424_242_001)
        self.addresses = itertools.count(10)
        self.lock = threading.Lock()
        # What prepares a new Droplet's disk before its first boot (the outside services'
        # names and trust: internet.py), when the test has such services.
        self.prepare_box: list[Any] = []
        self.volumes: dict[str, Disk] = {}
        # The same account as DigitalOcean's API shows it (do_api.py), when the scenario serves
        # one: its Droplets are these machines, and its DELETE powers one off.
        self.api: do_api.Account | None = None
        serve_metadata(world, self.machines)

    def serve_api(self, api: do_api.Account) -> None:
        """Keep `api`'s Droplets in step with this account's machines, both ways."""
        self.api = api
        api.on_remove.append(self._deleted_by_api)

    def _deleted_by_api(self, droplet_id: int) -> None:
        """A DELETE through the API (autodown's): the Droplet powers off and goes a moment
        after the 204 (in its own thread: the caller of the DELETE runs on it)."""

        def power_off() -> None:
            time.sleep(0.5)
            with self.lock:
                machine = self.machines.pop(droplet_id, None)
            if machine is not None:
                self._power_off(machine)

        threading.Thread(target=power_off, daemon=True).start()

    def offer_in(self, size: str, regions: list[str]) -> None:
        """Where DigitalOcean offers `size` from now on (a region sold out, or back): what the
        sizes invoke answers next. The offers are copied, never changed in place (the default
        ones are shared)."""
        with self.lock:
            listed = {**self.offers[size], "regions": list(regions), "available": bool(regions)}
            self.offers = {**self.offers, size: listed}

    # ---- invokes ---------------------------------------------------------------------------

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        handlers = {
            "digitalocean:index/getSizes:getSizes": self._sizes,
            "digitalocean:index/getDroplets:getDroplets": self._droplets,
            "digitalocean:index/getRegion:getRegion": self._region,
            "digitalocean:index/getTag:getTag": self._tag_lookup,
            "digitalocean:index/getDomain:getDomain": self._domain,
            "digitalocean:index/getVolume:getVolume": self._volume,
        }
        if args.token not in handlers:
            raise AssertionError(f"the emulated account does not answer {args.token}")
        return handlers[args.token](args.args)

    # Each returns (outputs, failures): a failure is how the provider's error reaches the program.

    def _sizes(self, a: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        wanted = {v for f in a.get("filters", []) for v in f["values"]}
        return {"sizes": [o for slug, o in self.offers.items() if slug in wanted]}, []

    def _droplets(self, a: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        return {"droplets": self._listed(a), "id": "droplets"}, []

    def _region(self, a: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        features = ["backups", "ipv6", "metadata", "install_agent", "storage"]
        slug = a["slug"]
        return {"slug": slug, "name": slug, "available": True, "sizes": [],
                "features": features, "id": slug}, []  # fmt: skip

    def _tag_lookup(self, a: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        # The provider's data source fails a missing tag (tag/datasource_tag.go).
        if a["name"] in self.tags:
            return {"name": a["name"], "id": a["name"]}, []
        return {}, [("name", f"tag not found: GET /v2/tags/{a['name']}: 404 tag not found")]

    def _domain(self, a: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        zone = a["name"]
        if zone in self.zones:
            return {"name": zone, "ttl": 1800, "zoneFile": "", "id": zone,
                    "urn": f"do:domain:{zone}"}, []  # fmt: skip
        return {}, [
            ("name", f"Error retrieving domain: 404 The resource could not be found ({zone})")
        ]

    def _volume(self, a: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        """getVolume by name (and region): the provider fails none or several
        (volume/datasource_volume.go)."""
        found = [v for v in self.volumes.values() if v.name == a["name"]
                 and a.get("region") in (None, v.region)]  # fmt: skip
        if not found:
            return {}, [("name", f"no volumes found with name {a['name']}")]
        if len(found) > 1:
            return {}, [
                (
                    "name",
                    f"too many volumes found with name {a['name']} (found {len(found)}, expected 1)",
                )
            ]
        v = found[0]
        return {"id": v.id, "name": v.name, "region": v.region, "size": v.size_gb,
                "dropletIds": list(v.droplet_ids), "tags": v.tags, "description": "",
                "filesystemType": "", "filesystemLabel": "", "urn": f"do:volume:{v.id}"}, []  # fmt: skip

    def _listed(self, a: dict[str, Any]) -> list[dict[str, Any]]:
        """getDroplets: GPU Droplets only with gpus=true (DigitalOcean OpenAPI droplets_list)."""
        found = []
        for m in self.machines.values():
            row = {"id": m.id, "name": m.name, "region": m.region, "size": m.size,
                   "tags": m.tags, "createdAt": m.created_at, "status": "active",
                   "priceHourly": self.offers.get(m.size, {}).get("priceHourly", 0.0),
                   "image": ""}  # fmt: skip
            gpu = m.size.startswith("gpu-")
            if gpu != bool(a.get("gpus")):
                continue

            def matches(f: dict[str, Any], row: dict[str, Any] = row) -> bool:
                value = row.get(f["key"])
                values = value if isinstance(value, list) else [value]
                return any(str(v) in f["values"] for v in values)

            if all(matches(f) for f in a.get("filters", [])):
                found.append(row)
        return found

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        raise AssertionError("the engine makes resources through create()")

    # ---- the provider ----------------------------------------------------------------------

    def force_new(self, type_: str) -> frozenset[str]:
        return FORCE_NEW.get(type_, frozenset())

    def create(self, new: Resource) -> tuple[str, dict[str, Any]]:
        makers = {
            PRIVATE_KEY: self._private_key,
            PASSWORD: self._password,
            SSH_KEY: self._ssh_key,
            DROPLET: self._create_droplet,
            FIREWALL: self._firewall,
            TAG: self._tag,
            RESERVED_IP: self._reserved_ip,
            ASSIGNMENT: self._assignment,
            CERTIFICATE: self._certificate,
            LOAD_BALANCER: self._load_balancer,
            DNS_RECORD: self._dns_record,
            VOLUME: self._volume_create,
            ATTACHMENT: self._attach,
        }
        make = makers.get(new.type)
        if make is None:
            raise NotImplementedError(f"the emulated account cannot make {new.type} yet")
        return make(new)

    def _private_key(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        private, public = ed25519_pair()
        keys = {"privateKeyOpenssh": private, "privateKeyPem": private, "publicKeyOpenssh": public}
        return secrets.token_hex(8), {**inputs, **keys}

    def _password(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        alphabet = string.ascii_letters + string.digits
        value = "".join(secrets.choice(alphabet) for _ in range(int(inputs["length"])))
        return secrets.token_hex(8), {**inputs, "result": value}

    def _ssh_key(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        print_ = fingerprint(inputs["publicKey"])
        self.keys[print_] = inputs["publicKey"]
        return str(next(self.ids)), {**inputs, "fingerprint": print_}

    def _firewall(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        firewall_id = str(next(self.ids))
        self.world.set_firewall(firewall_id, inputs)
        return firewall_id, dict(inputs)

    def _tag(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        self.tags.add(inputs["name"])
        return inputs["name"], dict(inputs)

    def _reserved_ip(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        address = f"203.0.113.{next(self.reserved)}"
        return address, {**inputs, "ipAddress": address, "urn": f"do:floatingip:{address}"}

    def _certificate(self, new: Resource) -> tuple[str, dict[str, Any]]:
        """A Let's Encrypt certificate DigitalOcean issues for domains in its DNS (the
        provider's `lets_encrypt` type); auto-named, as the provider names it."""
        assert self.issue_certificate is not None, "the scenario gives the account a CA"
        name = f"{new.name}-{secrets.token_hex(4)}"
        chain, key = self.issue_certificate(list(new.inputs["domains"]))
        self.certificates[name] = (chain, key.decode())
        return secrets.token_hex(8), {**new.inputs, "name": name, "state": "verified"}

    def _load_balancer(self, new: Resource) -> tuple[str, dict[str, Any]]:
        n = next(self.lb_addresses)
        public, vpc = f"203.0.113.{n}", f"198.51.100.{n}"
        uid = f"lb-{secrets.token_hex(6)}"
        self.world.add_load_balancer(uid, public, vpc)
        rule = new.inputs["forwardingRules"][0]
        lb = LoadBalancer(self.world, self.workdir / uid, new.inputs, public, vpc,
                          self.certificates[rule["certificateName"]])  # fmt: skip
        self.balancers[uid] = lb
        self._retarget()
        return uid, {
            **new.inputs,
            "ip": public,
            "status": "active",
            "urn": f"do:loadbalancer:{uid}",
        }

    def _dns_record(self, new: Resource) -> tuple[str, dict[str, Any]]:
        name, zone = new.inputs["name"], new.inputs["domain"]
        fqdn = zone if name == "@" else f"{name}.{zone}"
        self.records[fqdn] = new.inputs["value"]
        return str(next(self.ids)), {**new.inputs, "fqdn": fqdn}

    def _retarget(self) -> None:
        """Each Load Balancer forwards to the Droplets with its tag (re-read as they change)."""
        for lb in self.balancers.values():
            lb.set_targets(
                [m.host.private_ip or "" for m in list(self.machines.values()) if lb.tag in m.tags]
            )

    def _volume_create(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        if any(v.name == inputs["name"] and v.region == inputs["region"]
               for v in self.volumes.values()):  # fmt: skip
            raise RuntimeError(
                f"Error creating Volume: POST /v2/volumes: 409 a volume named {inputs['name']} "
                f"already exists in {inputs['region']}"
            )
        volume_id = str(uuid.uuid4())
        image = self.workdir / "volumes" / f"{volume_id}.img"
        image.parent.mkdir(parents=True, exist_ok=True)
        with image.open("wb") as f:  # a new Volume reads as zeros (sparse: costs nothing here)
            f.truncate(int(inputs["size"]) << 30)
        disk = Disk(volume_id, inputs["name"], inputs["region"], int(inputs["size"]), image,
                    list(inputs.get("tags", [])))  # fmt: skip
        self.volumes[volume_id] = disk
        return volume_id, {**inputs, "dropletIds": [], "filesystemType": "",
                           "urn": f"do:volume:{volume_id}"}  # fmt: skip

    def _volume_resize(self, old: Resource, new: Resource) -> dict[str, Any]:
        disk, size = self.volumes[old.id], int(new.inputs["size"])
        if size < disk.size_gb:
            raise RuntimeError("volumes `size` can only be expanded and not shrunk")
        if size > disk.size_gb:
            # The resize action grows the disk in place, attached or not; the Droplet's kernel
            # sees it when the disk is rescanned (the cache phase does).
            with disk.image.open("r+b") as f:
                f.truncate(size << 30)
            disk.size_gb = size
        disk.tags = list(new.inputs.get("tags", []))
        return {**old.outputs, **new.inputs, "dropletIds": list(disk.droplet_ids)}

    def _attach(self, new: Resource) -> tuple[str, dict[str, Any]]:
        droplet_id, volume_id = int(new.inputs["dropletId"]), str(new.inputs["volumeId"])
        disk, machine = self.volumes[volume_id], self.machines[droplet_id]
        if disk.droplet_ids and disk.droplet_ids != [droplet_id]:
            raise RuntimeError(
                f"Error attaching volume ({volume_id}) to Droplet ({droplet_id}): 422 the volume "
                f"is attached to Droplet {disk.droplet_ids[0]}"
            )
        if machine.region != disk.region:
            raise RuntimeError(
                f"Error attaching volume ({volume_id}) to Droplet ({droplet_id}): 422 the volume "
                f"is in {disk.region}, the Droplet in {machine.region}"
            )
        disk.droplet_ids = [droplet_id]
        machine.box.attach_volume(disk.image, disk.device)
        return f"{droplet_id}-{volume_id}-{secrets.token_hex(4)}", dict(new.inputs)

    def _detach(self, old: Resource) -> None:
        droplet_id, disk = (
            int(old.inputs["dropletId"]),
            self.volumes.get(str(old.inputs["volumeId"])),
        )
        machine = self.machines.get(droplet_id)
        if disk is None or machine is None or droplet_id not in disk.droplet_ids:
            raise RuntimeError(
                f"Error detaching volume ({old.inputs['volumeId']}) from Droplet ({droplet_id}): "
                "404 not attached"
            )
        disk.droplet_ids.remove(droplet_id)
        machine.box.detach_volume(disk.device)

    def _assignment(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        self.machines[int(inputs["dropletId"])].host.add_address(inputs["ipAddress"])
        return f"{inputs['ipAddress']}-{inputs['dropletId']}", dict(inputs)

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        if new.type == FIREWALL:
            self.world.set_firewall(old.id, new.inputs)
        elif new.type == DROPLET:
            machine = self.machines[int(old.id)]
            machine.tags = list(new.inputs.get("tags", []))
            self.world.set_tags(machine.host, machine.tags)
            if self.api is not None and machine.id in self.api.droplets:
                self.api.droplets[machine.id].tags = list(machine.tags)
            self._retarget()
        elif new.type == DNS_RECORD:
            self.records.pop(old.outputs["fqdn"], None)
            return {**old.outputs, **self._dns_record(new)[1]}
        elif new.type == VOLUME:
            return self._volume_resize(old, new)
        elif new.type not in (SSH_KEY,):
            raise NotImplementedError(f"the emulated account cannot update {new.type} yet")
        return {**old.outputs, **new.inputs}

    def delete(self, old: Resource) -> None:
        if old.type == ASSIGNMENT:
            machine = self.machines.get(int(old.inputs["dropletId"]))
            if machine is not None:
                machine.host.remove_address(old.inputs["ipAddress"])
        if old.type == ATTACHMENT:
            self._detach(old)
        elif old.type == VOLUME:
            disk = self.volumes[old.id]
            if disk.droplet_ids:  # stricter than the docs say: the engine detaches first
                raise RuntimeError(
                    f"Error deleting volume: 409 attached to Droplet {disk.droplet_ids[0]}"
                )
            del self.volumes[old.id]
            disk.image.unlink()
        if old.type == DROPLET:
            with self.lock:
                machine = self.machines.pop(int(old.id), None)
            if machine is None:
                # DigitalOcean's delete of a Droplet that is gone: 404, which the provider
                # takes as deleted (droplet/resource_droplet.go, resourceDigitalOceanDropletDelete).
                return
            if self.api is not None:
                self.api.remove_droplet(machine.id)  # its hook finds it gone already
            self._power_off(machine)
        elif old.type == LOAD_BALANCER:
            self.balancers.pop(old.id).stop()
        elif old.type == DNS_RECORD:
            self.records.pop(old.outputs["fqdn"], None)
        elif old.type == FIREWALL:
            self.world.remove_firewall(old.id)

    def _power_off(self, machine: Machine) -> None:
        """The Droplet goes: its processes, its namespace; its Volumes stay, detached."""
        for disk in self.volumes.values():
            if machine.id in disk.droplet_ids:
                disk.droplet_ids.remove(machine.id)
        machine.stop.set()
        machine.sshd.stop()
        machine.box.stop_services()
        machine.host.remove()
        self._retarget()

    def read(self, new: Resource, import_id: str) -> dict[str, Any]:
        raise NotImplementedError(f"the emulated account cannot import {new.type} yet")

    def refresh(self, old: Resource) -> dict[str, Any] | None:
        """`pulumi refresh` of one resource: its outputs as the account has them now, None when
        it is gone (the provider's Read clears the id on a 404: droplet/resource_droplet.go,
        volume/resource_volume_attachment.go's Read when the Volume names another Droplet;
        a Reserved IP's assignment goes with its Droplet)."""
        if old.type == DROPLET:
            return old.outputs if int(old.id) in self.machines else None
        if old.type == ATTACHMENT:
            disk = self.volumes.get(str(old.inputs["volumeId"]))
            attached = disk is not None and int(old.inputs["dropletId"]) in disk.droplet_ids
            return old.outputs if attached else None
        if old.type == VOLUME:
            disk = self.volumes.get(old.id)
            if disk is None:
                return None
            return {**old.outputs, "size": disk.size_gb, "dropletIds": list(disk.droplet_ids)}
        if old.type == ASSIGNMENT:
            return old.outputs if int(old.inputs["dropletId"]) in self.machines else None
        return old.outputs

    def _create_droplet(self, new: Resource) -> tuple[str, dict[str, Any]]:
        inputs = new.inputs
        with self.lock:
            droplet_id, n = next(self.ids), next(self.addresses)
        public, private = f"203.0.113.{n}", f"198.51.100.{n}"
        host = self.world.add_host(
            inputs["name"], public, private, inputs.get("tags", []), droplet_id
        )
        box = Sandbox(self.workdir / f"droplet-{droplet_id}", disks=True,
                      boot_disk_gb=do_api.size(inputs["size"]).disk)  # fmt: skip
        box.set_gpus(catalog_gpu_count(inputs["size"]))
        for prepare in self.prepare_box:
            prepare(box)
        authorized = "".join(
            self.keys[f] + "\n" for f in inputs.get("sshKeys", []) if f in self.keys
        )
        sshd = net.Sshd(
            host, box, box.base / "sshd", cloud_config_host_key(inputs["userData"]), authorized
        )
        machine = Machine(droplet_id, inputs["name"], inputs["size"], inputs["region"],
                          list(inputs.get("tags", [])), host, box, sshd,
                          time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip
        self.machines[droplet_id] = machine
        self._retarget()
        if self.api is not None:
            self.api.add_droplet(inputs["name"], inputs["size"], inputs["region"],
                                 list(inputs.get("tags", [])), id=droplet_id,
                                 public_ipv4=public, private_ipv4=private)  # fmt: skip
        threading.Thread(target=self._reboots, args=(machine,), daemon=True).start()
        return str(droplet_id), {**inputs, "ipv4Address": public, "ipv4AddressPrivate": private,
                                 "status": "active", "urn": f"do:droplet:{droplet_id}"}  # fmt: skip

    def _reboots(self, machine: Machine) -> None:
        """The reboot the Droplet's software asks for: scheduled with `systemd-run
        --on-active=N` (the fake records the line), it comes N seconds later: sshd and every
        session end, the disk stays, a new boot id. (The reboot phase's `systemctl stop ssh`
        before it is the fake systemctl's: net.Sshd gives it the listener's pid.)"""
        while not machine.stop.wait(0.2):
            try:
                request = machine.box.hw("reboot_requested")
                if request:
                    delay = re.search(r"--on-active=(\d+)", request)
                    if machine.stop.wait(int(delay.group(1)) if delay else 0):
                        return
                    machine.sshd.reboot()
            except Exception:
                if machine.stop.is_set():
                    return  # the Droplet was deleted under the reboot
                raise


# DigitalOcean's metadata service, as each Droplet reaches it (DigitalOcean docs, "Droplet
# Metadata": GET http://169.254.169.254/metadata/v1/id answers the asking Droplet's id). Here it
# is an address of the world, reached through each host's default route, and it knows a Droplet
# by the address it asks from. Never on the host itself: a server there would hold port 80.
METADATA_ADDRESS = "169.254.169.254"


def serve_metadata(world: net.World, machines: dict[int, Machine]) -> None:
    """The metadata service for the account's Droplets (the paths their software reads)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            source = self.client_address[0]
            found = [m for m in list(machines.values()) if m.host.public_ip == source]
            answers = {}
            if found:
                answers = {"/metadata/v1/id": str(found[0].id),
                           "/metadata/v1/hostname": found[0].name}  # fmt: skip
            body = answers.get(self.path)
            data = (body if body is not None else "not found").encode()
            loopback.reply(
                self, 200 if body is not None else 404, data, "text/plain; charset=utf-8"
            )

        def log_message(self, *_: Any) -> None:
            pass

    world.ip(f"addr add {METADATA_ADDRESS}/32 dev lo")
    world.serve(Handler, METADATA_ADDRESS, 80)


def catalog_gpu_count(size: str) -> int:
    if not size.startswith("gpu-"):
        return 0
    known = catalog.SIZES.get(size)
    return known.gpu_count if known else int(re.sub(r".*x(\d+)-.*", r"\1", size))
