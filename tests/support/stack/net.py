"""The emulated network: the internet and DigitalOcean's network as one namespace, each Droplet a
namespace of its own, Cloud Firewalls as nftables rules in it.

    world (netns <prefix>-world)
      <prefix>pub  bridge, 203.0.113.1/24: the public network, the Droplets' default gateway
      <prefix>vpc  bridge, no address of its own: the region's VPC (198.51.100.0/24)
      lo           192.0.2.x/32: the outside services (ACME CA, DigitalOcean API, downloads) and
                   the client address users' requests come from
    host i (netns <prefix>-h<i>): eth0 public on <prefix>pub, eth1 private on <prefix>vpc, as on
      a Droplet (eth0 public, eth1 VPC), default route via 203.0.113.1

The world does not forward: a VPC address is reachable only from the VPC (and from an address the
world is given on it, such as a Load Balancer's), as on DigitalOcean.

Every namespace and link name starts with the run's prefix, `nds` + the owning process id (5
base-36 digits) + a counter (2): `reap(prefix)` finds a run's leftovers, `reap_orphans()` those
of runs whose process is gone. Only documentation addresses are used (RFC 5737).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import loopback
from sandbox import Sandbox

T = TypeVar("T")

PUBLIC_NET = ipaddress.ip_network("203.0.113.0/24")  # RFC 5737 TEST-NET-3
VPC_NET = ipaddress.ip_network("198.51.100.0/24")  # RFC 5737 TEST-NET-2
SERVICES_NET = ipaddress.ip_network("192.0.2.0/24")  # RFC 5737 TEST-NET-1
GATEWAY = "203.0.113.1"
ACME_CA = "192.0.2.10"
DO_API = "192.0.2.20"
DOWNLOADS = "192.0.2.30"
GITHUB_API = "192.0.2.40"
CLIENT = "192.0.2.100"

PREFIX_BASE = "nds"
SSHD = "/usr/sbin/sshd"
NETNS_DIR = Path("/run/netns")  # where `ip netns add` mounts a namespace (ip-netns(8))
CLONE_NEWNET = 0x40000000  # <linux/sched.h>
TABLE = "digitalocean"  # the nftables table that stands for a Droplet's Cloud Firewalls

_libc = ctypes.CDLL(None, use_errno=True)
_counter = itertools.count(1)


def _base36(n: int, width: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out.rjust(width, "0")[-width:]


def new_prefix() -> str:
    """A run's prefix, fixed width (10), so no prefix is the start of another. Link names are
    prefix + 4 at most: within IFNAMSIZ (15)."""
    return f"{PREFIX_BASE}{_base36(os.getpid(), 5)}{_base36(next(_counter), 2)}"


def _ip(*argv: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        ["ip", *argv], input=stdin, capture_output=True, text=True, check=False, timeout=30
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


class Netns:
    """A network namespace, and ways to run things in it: commands (`ip netns exec`), and
    Python code of this process (a thread that entered it with setns(2): the sockets it creates
    stay in the namespace, so servers and clients can be threads of the test)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.procs: list[subprocess.Popen[Any]] = []
        self.servers: list[ThreadingHTTPServer] = []

    def argv(self, argv: Iterable[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def run(
        self, argv: Iterable[str], input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(argv),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def popen(self, argv: Iterable[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """A long-running command here; killed and waited for when the namespace is removed."""
        proc = subprocess.Popen(self.argv(argv), **kwargs)
        self.procs.append(proc)
        return proc

    def python(self, *args: str, **kwargs: Any) -> subprocess.Popen[Any]:
        """This interpreter here (`-m module ...`, or a script), e.g. a fake service's server."""
        return self.popen([sys.executable, *args], **kwargs)

    def ip(self, *commands: str) -> None:
        """`ip` commands run in this namespace in one batch."""
        _ip("-n", self.name, "-batch", "-", stdin="\n".join(commands) + "\n")

    def call(self, fn: Callable[[], T]) -> T:
        """fn() in a new thread that entered this namespace: what it creates (sockets, child
        processes) belongs here. setns(2) with CLONE_NEWNET changes the calling thread only,
        and never the main one: `ip netns pids` (what reap kills) reads a process's main
        thread's namespace, so this process is never among a namespace's processes."""
        result: list[T] = []
        error: list[BaseException] = []

        def body() -> None:
            try:
                fd = os.open(NETNS_DIR / self.name, os.O_RDONLY)
                try:
                    if _libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns {self.name}")
                finally:
                    os.close(fd)
                result.append(fn())
            except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
                error.append(e)

        thread = threading.Thread(target=body, name=f"netns {self.name}", daemon=True)
        thread.start()
        thread.join()
        if error:
            raise error[0]
        return result[0]

    def connect(
        self, address: str, port: int, source: str | None = None, timeout: float = 3
    ) -> socket.socket:
        """A TCP connection from here (from `source` when given). A firewall's drop shows as
        TimeoutError."""
        sock = self.call(socket.socket)
        try:
            if source is not None:
                sock.bind((source, 0))
            sock.settimeout(timeout)
            sock.connect((address, port))
        except BaseException:
            sock.close()
            raise
        return sock

    def reaches(
        self, address: str, port: int, source: str | None = None, timeout: float = 0.5
    ) -> bool:
        """Whether a TCP connection from here is accepted (a drop waits out the timeout: the
        namespaces are one machine, an answer takes well under a millisecond)."""
        try:
            self.connect(address, port, source, timeout).close()
        except OSError:
            return False
        return True

    def serve(
        self,
        handler: Callable[..., BaseHTTPRequestHandler] | type[Any],
        address: str = "0.0.0.0",
        port: int = 0,
    ) -> ThreadingHTTPServer:
        """An HTTP server listening here, run by a thread of this process (loopback.serve on a
        socket of this namespace; stop it with loopback.stop, or let the namespace's stop do it)."""
        server = loopback.serve(handler, loopback.bound(address, port, self.call(socket.socket)))
        self.servers.append(server)
        return server

    def pids(self) -> list[int]:
        if not (NETNS_DIR / self.name).exists():
            return []
        return [int(p) for p in _ip("netns", "pids", self.name).split()]

    def stop(self) -> None:
        """End everything running here: servers, commands, any other process inside."""
        for server in self.servers:
            loopback.stop(server)
        self.servers.clear()
        _kill_all(self.name)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs.clear()


def _kill_all(ns: str) -> None:
    """SIGKILL every process in the namespace until none is left (one may fork meanwhile)."""
    for _ in range(100):
        pids = (
            [int(p) for p in _ip("netns", "pids", ns).split()] if (NETNS_DIR / ns).exists() else []
        )
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    raise RuntimeError(f"processes keep appearing in netns {ns}")


class World(Netns):
    """The internet and DigitalOcean's network: the bridges, the outside services' addresses,
    the Droplets (hosts), Load Balancers' addresses and the Cloud Firewalls."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or new_prefix()
        super().__init__(f"{self.prefix}-world")
        self.public_bridge, self.vpc_bridge = f"{self.prefix}pub", f"{self.prefix}vpc"
        self.hosts: list[Host] = []
        # Held while the hosts change or their rules are rewritten (threads remove Droplets).
        self.hosts_lock = threading.RLock()
        self.load_balancers: dict[str, list[str]] = {}
        self.firewalls: dict[str, Firewall] = {}
        self._index = itertools.count(1)
        atexit.register(self.close)
        _ip("netns", "add", self.name)
        self.ip(
            "link set lo up",
            f"link add name {self.public_bridge} type bridge",
            f"link set {self.public_bridge} up",
            f"addr add {GATEWAY}/{PUBLIC_NET.prefixlen} dev {self.public_bridge}",
            f"link add name {self.vpc_bridge} type bridge",
            f"link set {self.vpc_bridge} up",
        )
        for address in (ACME_CA, DO_API, DOWNLOADS, GITHUB_API, CLIENT):
            self.add_address(address)
        # What the world sends to a Droplet comes from the client address unless bound to
        # another: users' requests.
        self.ip(f"route replace {PUBLIC_NET} dev {self.public_bridge} src {CLIENT}")

    def add_address(self, address: str) -> None:
        """An address of the world: 192.0.2.x an outside service or client (on lo), 203.0.113.x
        a public one (a Load Balancer's), 198.51.100.x one in the VPC (a Load Balancer's)."""
        ip = ipaddress.ip_address(address)
        if ip in SERVICES_NET:
            self.ip(f"addr add {ip}/32 dev lo")
        elif ip in PUBLIC_NET:
            self.ip(f"addr add {ip}/32 dev {self.public_bridge}")
        elif ip in VPC_NET:
            self.ip(f"addr add {ip}/{VPC_NET.prefixlen} dev {self.vpc_bridge}")
        else:
            raise ValueError(f"{address}: not a documentation address of the emulation")

    def add_host(
        self,
        name: str,
        public_ip: str,
        private_ip: str | None = None,
        tags: Iterable[str] = (),
        droplet_id: int | None = None,
    ) -> Host:
        host = Host(self, next(self._index), name, public_ip, private_ip, tags, droplet_id)
        with self.hosts_lock:
            self.hosts.append(host)
            self.refresh_firewalls()
        return host

    def add_load_balancer(self, uid: str, *addresses: str) -> None:
        """A Load Balancer's addresses (its traffic to Droplets comes from them)."""
        for address in addresses:
            self.add_address(address)
        self.load_balancers[uid] = list(addresses)
        self.refresh_firewalls()

    def set_firewall(self, name: str, inputs: Mapping[str, Any]) -> Firewall:
        """Create or update a Cloud Firewall from its resource inputs (the mocks' camelCase)."""
        self.firewalls[name] = Firewall(name, inputs)
        self.refresh_firewalls()
        return self.firewalls[name]

    def remove_firewall(self, name: str) -> None:
        self.firewalls.pop(name, None)
        self.refresh_firewalls()

    def set_tags(self, host: Host, tags: Iterable[str]) -> None:
        host.tags = set(tags)
        self.refresh_firewalls()

    def refresh_firewalls(self) -> None:
        """Rewrite every host's rules: DigitalOcean re-evaluates a firewall when its Droplets,
        their tags or the sources it names change. Under the world's lock: two Droplets going at
        once (autodown deletes a peer, then itself) must not rewrite one being removed."""
        with self.hosts_lock:
            for host in list(self.hosts):
                host.apply_rules(ruleset(host, self))

    def addresses_of(
        self, *, tags: Iterable[str] = (), droplet_ids: Iterable[Any] = ()
    ) -> list[str]:
        """The public and private addresses of the Droplets with one of the tags or ids: a
        Droplet's traffic comes from the first over the internet, from the second over the VPC
        (which ones a tag source admits is not documented; firewall_rule.yml says "Droplets")."""
        tags, ids = set(tags), {int(i) for i in droplet_ids}
        out: list[str] = []
        for host in self.hosts:
            if host.tags & tags or host.droplet_id in ids:
                out += [host.public_ip, *([host.private_ip] if host.private_ip else [])]
        return out

    def close(self) -> None:
        """Stop everything and remove every namespace and link of the run, even when a
        stop fails."""
        try:
            for ns in [*self.hosts, self]:
                ns.stop()
        finally:
            self.hosts.clear()
            reap(self.prefix)
            atexit.unregister(self.close)


class Host(Netns):
    """One Droplet: eth0 on the public bridge, eth1 on the VPC bridge when it has a private
    address, loopback up, the default route via the world."""

    def __init__(
        self,
        world: World,
        index: int,
        name: str,
        public_ip: str,
        private_ip: str | None,
        tags: Iterable[str],
        droplet_id: int | None,
    ) -> None:
        super().__init__(f"{world.prefix}-h{index}")
        self.world, self.label = world, name
        self.public_ip, self.private_ip = public_ip, private_ip
        self.tags, self.droplet_id = set(tags), droplet_id
        self.reserved: list[str] = []
        if ipaddress.ip_address(public_ip) not in PUBLIC_NET:
            raise ValueError(f"{public_ip}: a public address is in {PUBLIC_NET}")
        if private_ip is not None and ipaddress.ip_address(private_ip) not in VPC_NET:
            raise ValueError(f"{private_ip}: a private address is in {VPC_NET}")
        _ip("netns", "add", self.name)
        links = [(f"{world.prefix}p{index}", "eth0", world.public_bridge)]
        if private_ip:
            links.append((f"{world.prefix}v{index}", "eth1", world.vpc_bridge))
        # Each veth is made in the world with its peer straight in the host: neither end ever
        # exists in this machine's own namespace.
        world.ip(
            *itertools.chain.from_iterable(
                (
                    f"link add name {outer} type veth peer name {inner} netns {self.name}",
                    f"link set {outer} master {bridge}",
                    f"link set {outer} up",
                )
                for outer, inner, bridge in links
            )
        )
        commands = [
            "link set lo up",
            f"addr add {public_ip}/{PUBLIC_NET.prefixlen} dev eth0",
            "link set eth0 up",
        ]
        if private_ip:
            commands += [f"addr add {private_ip}/{VPC_NET.prefixlen} dev eth1", "link set eth1 up"]
        # `src`: the Droplet's own address, not a Reserved IP added later, as on DigitalOcean.
        commands.append(f"route add default via {GATEWAY} dev eth0 src {public_ip}")
        self.ip(*commands)

    def add_address(self, address: str) -> None:
        """A Reserved IP assigned to this Droplet. On DigitalOcean it reaches the Droplet via
        its anchor address (a 10.x one this emulation must not use); here it is an address of
        eth0. Every cached neighbour entry for it is dropped, so a reassignment is seen at once
        (real Reserved IPs move within seconds)."""
        if ipaddress.ip_address(address) not in PUBLIC_NET:
            raise ValueError(f"{address}: a Reserved IP is in {PUBLIC_NET}")
        self.ip(f"addr add {address}/32 dev eth0")
        self.reserved.append(address)
        for ns in [self.world, *self.world.hosts]:
            ns.ip(f"neigh flush to {address}")

    def remove_address(self, address: str) -> None:
        self.ip(f"addr del {address}/32 dev eth0")
        self.reserved.remove(address)

    def apply_rules(self, nft: str | None) -> None:
        """Replace the firewall table in one transaction (`nft -f`); None: no firewall, every
        port open, as for a Droplet no firewall names."""
        if nft is None:
            nft = f"table inet {TABLE}\ndelete table inet {TABLE}\n"
        proc = self.run(["nft", "-f", "-"], input=nft)
        if proc.returncode != 0:
            raise RuntimeError(f"nft in {self.name}: {proc.stderr.strip()}\n{nft}")

    def rules(self) -> str:
        """The firewall table as nftables lists it ('' without one)."""
        return self.run(["nft", "list", "table", "inet", TABLE]).stdout

    def remove(self) -> None:
        """Delete the Droplet: its processes, its namespace (its veths go with it). Out of the
        world's hosts first, under its lock: stop() kills every process in the namespace, which
        would include an `nft` that another host's removal runs here to refresh its rules."""
        with self.world.hosts_lock:
            if self in self.world.hosts:
                self.world.hosts.remove(self)
        self.stop()
        with self.world.hosts_lock:
            _ip("netns", "del", self.name)
            self.world.refresh_firewalls()


# ---- Cloud Firewalls ---------------------------------------------------------------------------


@dataclass
class Firewall:
    """A digitalocean:index/firewall:Firewall's inputs as the mocks record them: dropletIds,
    tags, inboundRules[].{protocol, portRange, sourceAddresses, sourceTags, sourceDropletIds,
    sourceLoadBalancerUids}, outboundRules[] with destination* likewise. Its rules are the API's
    firewall_rule.yml (digitalocean/openapi specification/resources/firewalls/models): a rule
    allows its protocol and ports from (to) the union of its targets; all else is denied, and
    the firewall is stateful (replies pass)."""

    name: str
    inputs: Mapping[str, Any]

    def applies_to(self, host: Host) -> bool:
        ids = {int(i) for i in self.inputs.get("dropletIds") or []}
        tags = set(self.inputs.get("tags") or [])
        return host.droplet_id in ids or bool(host.tags & tags)

    def nft_rules(self, direction: str, world: World) -> list[str]:
        """This firewall's accept rules for `inbound` or `outbound`."""
        key, match = ("source", "saddr") if direction == "inbound" else ("destination", "daddr")
        out = []
        for rule in self.inputs.get(f"{direction}Rules") or []:
            targets = [
                *(rule.get(f"{key}Addresses") or []),
                *world.addresses_of(
                    tags=rule.get(f"{key}Tags") or [],
                    droplet_ids=rule.get(f"{key}DropletIds") or [],
                ),
                *itertools.chain.from_iterable(
                    world.load_balancers.get(uid, [])
                    for uid in rule.get(f"{key}LoadBalancerUids") or []
                ),
            ]
            networks = [ipaddress.ip_network(t, strict=False) for t in targets]
            for family, version, icmp in (("ip", 4, "icmp"), ("ip6", 6, "ipv6-icmp")):
                nets = sorted({str(n) for n in networks if n.version == version})
                if nets:
                    proto = _protocol_match(rule["protocol"], rule.get("portRange"), icmp)
                    comment = re.sub(r"[^A-Za-z0-9.:-]", "_", self.name)
                    out.append(
                        f'{family} {match} {{ {", ".join(nets)} }} {proto} accept comment "{comment}"'
                    )
        return out


def _protocol_match(protocol: str, port_range: str | None, icmp: str) -> str:
    """nft for a rule's protocol and ports. The API writes all ports as "0", the provider as
    "all" or "1-65535"; ICMP has no ports (firewall_rule.yml, `ports`)."""
    if protocol == "icmp":
        return f"meta l4proto {icmp}"
    if protocol not in ("tcp", "udp"):
        raise ValueError(f"firewall protocol {protocol!r}: tcp, udp or icmp")
    ports = (port_range or "0").strip()
    if ports in ("0", "all"):
        return f"meta l4proto {protocol}"
    low, _, high = ports.partition("-")
    if not all(p.isdigit() and 1 <= int(p) <= 65535 for p in (low, high or low)):
        raise ValueError(f"firewall ports {port_range!r}: a port, a range N-M, 0 or all")
    return f"{protocol} dport {ports}"


def ruleset(host: Host, world: World) -> str | None:
    """The host's nftables table from every firewall that names it (DigitalOcean applies the
    union of a Droplet's firewalls), or None when none does. The table is deleted and made
    again in the same file: `nft -f` applies a file as one transaction, so no packet sees a
    half-written table."""
    firewalls = [f for f in world.firewalls.values() if f.applies_to(host)]
    if not firewalls:
        return None

    def chain(direction: str, hook: str, lo: str) -> str:
        rules = [r for f in firewalls for r in f.nft_rules(direction, world)]
        body = "\n".join(
            [
                f"type filter hook {hook} priority filter; policy drop;",
                f'{lo} "lo" accept',
                "ct state established,related accept",
                *rules,
            ]
        )
        return f"chain {direction} {{\n{textwrap.indent(body, '    ')}\n}}"

    chains = textwrap.indent(
        chain("inbound", "input", "iif") + "\n" + chain("outbound", "output", "oif"), "    "
    )
    return f"table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n{chains}\n}}\n"


# ---- sshd on a host ----------------------------------------------------------------------------


def sshd_config(listen: str, port: int, host_key: Path, authorized_keys: Path) -> str:
    """An sshd_config for a test's sshd: key login only (root too), no PAM, no pid file, files
    outside ~ (StrictModes off), sftp served in-process."""
    return textwrap.dedent(f"""\
        ListenAddress {listen}
        Port {port}
        HostKey {host_key}
        AuthorizedKeysFile {authorized_keys}
        PermitRootLogin prohibit-password
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        UsePAM no
        StrictModes no
        PidFile none
        Subsystem sftp internal-sftp
        """)


class Sshd:
    """The Droplet's OpenSSH server: in the host's namespace, inside its sandbox (its disk),
    listening on 0.0.0.0:22 with the given host key and authorized key; what cloud-init
    sets up from the program's user data (components/cloud/droplet.py cloud_config)."""

    def __init__(
        self, host: Host, box: Sandbox, folder: Path, host_key: str, authorized_key: str
    ) -> None:
        self.host, self.box, self.folder = host, box, folder
        folder.mkdir(parents=True, exist_ok=True)
        key = folder / "ssh_host_ed25519_key"
        key.touch(mode=0o600)
        key.write_text(host_key.strip() + "\n")
        self.host_public_key = " ".join(
            subprocess.run(
                ["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True
            ).stdout.split()[:2]
        )
        (folder / "authorized_keys").write_text(authorized_key.strip() + "\n")
        self.config = folder / "sshd_config"
        self.config.write_text(sshd_config("0.0.0.0", 22, key, folder / "authorized_keys"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with (self.folder / "sshd.log").open("ab") as log:
            self.proc = self.host.popen(
                self.box.command(f"{SSHD} -D -e -f {self.config}"),
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        # Its MainPID, as systemd would know it: `systemctl stop ssh` (the fake) stops it.
        (self.box.run_dir / "sshd.pid").write_text(f"{self.proc.pid}\n")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.host.reaches("127.0.0.1", 22):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        log_text = (self.folder / "sshd.log").read_text(errors="replace")
        raise RuntimeError(f"sshd did not start in {self.host.name}:\n{log_text}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def reboot(self) -> None:
        """A reboot: every process of the Droplet ends (sshd, sessions, services), the sandbox
        reboots (tests/support/sandbox.py: /run empties, a new boot id, enabled units start, here in
        the host's namespace), sshd comes back."""
        self.stop()
        _kill_all(self.host.name)
        self.host.call(self.box.reboot)
        self.start()

    def known_hosts(self) -> str:
        """known_hosts lines pinning the host key for the host's public and Reserved IPs."""
        return "".join(
            f"{a} {self.host_public_key}\n" for a in [self.host.public_ip, *self.host.reserved]
        )


def ssh_argv(
    identity: Path, known_hosts: Path, target: str, *remote: str, source: str | None = None
) -> list[str]:
    """An ssh client argv as pulumi-command dials: one key, the pinned host key, no prompts.
    Run it in the world: `world.run(ssh_argv(...))`."""
    argv = ["ssh", "-F", "/dev/null", "-i", str(identity), "-o", "IdentitiesOnly=yes"]
    argv += ["-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known_hosts}"]
    argv += ["-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5"]
    if source:
        argv += ["-b", source]
    return [*argv, target, *remote]


# ---- cleanup -----------------------------------------------------------------------------------


def namespaces() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


def reap(prefix: str) -> None:
    """Remove what a run left: the processes in its namespaces, the namespaces (their links go
    with them), and any link of this machine's namespace with the prefix."""
    if not prefix.startswith(PREFIX_BASE):
        raise ValueError(f"{prefix!r}: not an emulation prefix ({PREFIX_BASE}...)")
    for ns in namespaces():
        if ns.startswith(prefix):
            _kill_all(ns)
            _ip("netns", "del", ns)
    for link in json.loads(_ip("-j", "link", "show") or "[]"):
        if link["ifname"].startswith(prefix):
            with contextlib.suppress(RuntimeError):  # its peer's deletion may have taken it
                _ip("link", "del", link["ifname"])


def reap_orphans() -> None:
    """Reap the runs whose process is gone (a killed pytest)."""
    for ns in namespaces():
        match = re.fullmatch(rf"{PREFIX_BASE}([0-9a-z]{{5}})[0-9a-z]{{2}}-.*", ns)
        if match and not Path(f"/proc/{int(match.group(1), 36)}").exists():
            reap(ns[: len(PREFIX_BASE) + 7])


@contextlib.contextmanager
def running_world() -> Iterator[World]:
    """A World removed afterwards whatever happens (its namespaces, links, processes)."""
    reap_orphans()
    world = World()
    try:
        yield world
    finally:
        world.close()
