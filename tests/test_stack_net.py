"""The stack emulation's network (tests/support/stack/net.py): the world, Droplets as namespaces with a
real sshd in their sandbox, Cloud Firewalls as nftables rules, Reserved IPs, and the cleanup."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from pulumi_harness import FAKE_DROPLET_ID, run_program, stack_config
from sandbox import Sandbox
from stack.net import (
    CLIENT,
    DOWNLOADS,
    Host,
    Sshd,
    World,
    namespaces,
    reap,
    running_world,
    ssh_argv,
)

from components.spec import catalog

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "nft", "sshd", "ssh")),
    reason="needs root, iproute2, nftables and openssh (./check installs them)",
)

CLIENT2 = "192.0.2.101"
A_PUBLIC, A_PRIVATE = "203.0.113.11", "198.51.100.11"
B_PUBLIC, B_PRIVATE = "203.0.113.12", "198.51.100.12"
RESERVED = "203.0.113.201"
EVERYWHERE = ["0.0.0.0/0", "::/0"]
OPEN_OUTBOUND = [
    {"protocol": "tcp", "portRange": "1-65535", "destinationAddresses": EVERYWHERE},
    {"protocol": "udp", "portRange": "1-65535", "destinationAddresses": EVERYWHERE},
    {"protocol": "icmp", "destinationAddresses": EVERYWHERE},
]


@pytest.fixture
def world() -> Iterator[World]:
    with running_world() as w:
        yield w


def keygen(path: Path) -> tuple[str, str]:
    """A new Ed25519 key pair: (private key text, public key line)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.read_text(), Path(f"{path}.pub").read_text()


def listen(host: Host, *ports: int, stack: ExitStack) -> None:
    """Listening sockets on the host's every address; closed with the stack."""
    for port in ports:
        stack.enter_context(host.call(partial(socket.create_server, ("0.0.0.0", port))))


def names_itself(host: Host, port: int) -> None:
    """An HTTP server in the host that answers with the host's name."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = host.label.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    host.serve(Handler, port=port)


def get(world: World, address: str, port: int) -> str:
    """The body of GET / from the world's client address."""
    with world.connect(address, port) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        answer = b"".join(iter(lambda: sock.recv(4096), b""))
    return answer.split(b"\r\n\r\n", 1)[1].decode()


def test_ssh_from_the_world_reaches_the_host_in_its_sandbox_with_the_pinned_key(
    world: World, tmp_path: Path
) -> None:
    host_key, _ = keygen(tmp_path / "host")
    _, client_pub = keygen(tmp_path / "client")
    box = Sandbox(tmp_path / "a-disk")
    a = world.add_host("a", A_PUBLIC, A_PRIVATE)
    world.add_host("b", B_PUBLIC, B_PRIVATE)
    sshd = Sshd(a, box, tmp_path / "a-sshd", host_key, client_pub)
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts())
    remote = "echo $SSH_CONNECTION; cat /proc/sys/kernel/random/boot_id; ip -4 -o addr show"

    proc = world.run(ssh_argv(tmp_path / "client", known, f"root@{A_PUBLIC}", remote))
    assert proc.returncode == 0, proc.stderr
    connection, boot_id, *addresses = proc.stdout.splitlines()
    # From the world's client address, to the host's public address; in the host's namespace
    # (its eth0 and eth1) and in its sandbox (the sandbox's boot id).
    assert connection.split()[0] == CLIENT and connection.split()[2:] == [A_PUBLIC, "22"]
    assert boot_id == box.boot_id
    assert any(f"eth0    inet {A_PUBLIC}/24" in line for line in addresses), addresses
    assert any(f"eth1    inet {A_PRIVATE}/24" in line for line in addresses), addresses

    # The host key is pinned: another one is refused; the other host runs no sshd.
    other = tmp_path / "other_known_hosts"
    other.write_text(f"{A_PUBLIC} {keygen(tmp_path / 'impostor')[1]}")
    proc = world.run(ssh_argv(tmp_path / "client", other, f"root@{A_PUBLIC}", "true"))
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr
    proc = world.run(ssh_argv(tmp_path / "client", known, f"root@{B_PUBLIC}", "true"))
    assert proc.returncode == 255 and "Connection refused" in proc.stderr

    # A reboot: sshd comes back on a new boot id.
    sshd.reboot()
    proc = world.run(ssh_argv(tmp_path / "client", known, f"root@{A_PUBLIC}", remote))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1] == box.boot_id != boot_id


def test_a_firewall_admits_ssh_only_from_its_cidr_and_a_new_one_replaces_it(
    world: World,
) -> None:
    world.add_address(CLIENT2)
    a = world.add_host("a", A_PUBLIC, A_PRIVATE, droplet_id=1)
    b = world.add_host("b", B_PUBLIC, B_PRIVATE, droplet_id=2)
    with ExitStack() as stack:
        listen(a, 22, 8000, stack=stack)
        listen(b, 22, stack=stack)
        assert world.reaches(A_PUBLIC, 22, CLIENT2), "no firewall: open"

        def ssh_from(cidr: str, outbound: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "dropletIds": [1],
                "inboundRules": [{"protocol": "tcp", "portRange": "22", "sourceAddresses": [cidr]}],
                "outboundRules": outbound,
            }

        world.set_firewall("a-fw", ssh_from(f"{CLIENT}/32", OPEN_OUTBOUND))
        assert world.reaches(A_PUBLIC, 22, CLIENT)
        assert not world.reaches(A_PUBLIC, 22, CLIENT2)
        assert not world.reaches(A_PUBLIC, 8000, CLIENT), "a port no rule names"
        assert world.reaches(B_PUBLIC, 22, CLIENT2), "b is not in the firewall"
        # Outbound: the program's rules open everything (a download from the world).
        downloads = world.call(lambda: socket.create_server((DOWNLOADS, 8080)))
        stack.enter_context(downloads)
        assert a.reaches(DOWNLOADS, 8080)

        # Re-applied with another source and no outbound rule: replaced, not added to.
        world.set_firewall("a-fw", ssh_from(f"{CLIENT2}/32", []))
        assert world.reaches(A_PUBLIC, 22, CLIENT2)
        assert not world.reaches(A_PUBLIC, 22, CLIENT)
        assert not a.reaches(DOWNLOADS, 8080), "no outbound rule: nothing goes out"
        assert a.rules().count("tcp dport 22 accept") == 1

        world.remove_firewall("a-fw")
        assert world.reaches(A_PUBLIC, 22, CLIENT) and world.reaches(A_PUBLIC, 8000, CLIENT)
        assert a.rules() == ""


def test_a_source_tag_admits_the_tagged_hosts_addresses_and_no_other(world: World) -> None:
    gpu = world.add_host("gpu", A_PUBLIC, A_PRIVATE, droplet_id=1)
    peer = world.add_host("balancer", B_PUBLIC, B_PRIVATE, droplet_id=2)
    world.set_firewall(
        "gpu-fw",
        {
            "tags": ["role:gpu"],
            "inboundRules": [
                {"protocol": "tcp", "portRange": "8080", "sourceTags": ["role:balancer"]},
                {"protocol": "tcp", "portRange": "9090", "sourceDropletIds": [2]},
                {"protocol": "tcp", "portRange": "7070", "sourceLoadBalancerUids": ["lb-1"]},
            ],
            "outboundRules": OPEN_OUTBOUND,
        },
    )
    with ExitStack() as stack:
        listen(gpu, 8080, 9090, 7070, stack=stack)
        assert peer.reaches(A_PRIVATE, 8080), "the firewall names no Droplet yet"
        world.set_tags(gpu, ["role:gpu"])
        assert not peer.reaches(A_PRIVATE, 8080, B_PRIVATE), "the peer has no tag"
        world.set_tags(peer, ["role:balancer"])
        assert peer.reaches(A_PRIVATE, 8080, B_PRIVATE)
        assert peer.reaches(A_PUBLIC, 8080, B_PUBLIC)
        assert not world.reaches(A_PUBLIC, 8080, CLIENT), "the internet has no tag"
        # By Droplet id, and by Load Balancer (its address in the VPC).
        assert peer.reaches(A_PRIVATE, 9090, B_PRIVATE)
        assert not world.reaches(A_PUBLIC, 9090, CLIENT)
        world.add_load_balancer("lb-1", "198.51.100.250")
        assert world.reaches(A_PRIVATE, 7070, "198.51.100.250")
        assert not peer.reaches(A_PRIVATE, 7070, B_PRIVATE)


def test_the_programs_recorded_firewall_opens_its_ports_and_never_vllms(world: World) -> None:
    run = run_program(stack_config("dev"))
    assert run.error is None, run.error
    (firewall,) = [r for r in run.registrations if r.type == "digitalocean:index/firewall:Firewall"]
    host = world.add_host("gpu", A_PUBLIC, A_PRIVATE, droplet_id=int(FAKE_DROPLET_ID))
    world.set_firewall(firewall.name, firewall.inputs)
    ports = [int(rule["portRange"]) for rule in firewall.inputs["inboundRules"]]
    assert 22 in ports and len(ports) >= 2
    with ExitStack() as stack:
        listen(host, *ports, catalog.VLLM_PORT, stack=stack)
        for port in ports:
            assert world.reaches(A_PUBLIC, port), port
        assert not world.reaches(A_PUBLIC, catalog.VLLM_PORT)
        # Outbound open: TCP to a download server, UDP (a drop would fail sendto with EPERM).
        stack.enter_context(world.call(lambda: socket.create_server((DOWNLOADS, 8080))))
        assert host.reaches(DOWNLOADS, 8080)
        with host.call(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as udp:
            udp.sendto(b"x", (DOWNLOADS, 53))


def test_a_reserved_ip_reaches_the_host_it_is_assigned_to(world: World) -> None:
    a = world.add_host("a", A_PUBLIC, A_PRIVATE)
    b = world.add_host("b", B_PUBLIC, B_PRIVATE)
    names_itself(a, 9000)
    names_itself(b, 9000)
    a.add_address(RESERVED)
    assert get(world, RESERVED, 9000) == "a"
    assert get(world, A_PUBLIC, 9000) == "a"
    a.remove_address(RESERVED)
    b.add_address(RESERVED)
    assert get(world, RESERVED, 9000) == "b"
    assert get(world, A_PUBLIC, 9000) == "a"


def leftovers(prefix: str, marker: str) -> list[str]:
    """What of a run is still there: namespaces, links of this machine, processes whose
    command line names the marker (the sshd's config path)."""
    found = [
        line
        for line in subprocess.check_output(["ip", "netns", "list"], text=True).splitlines()
        if prefix in line
    ]
    found += [
        line
        for line in subprocess.check_output(["ip", "link"], text=True).splitlines()
        if prefix in line
    ]
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if proc.name.isdigit() and marker in cmdline:
            found.append(f"process {proc.name}: {cmdline}")
    return found


def a_running_run(world: World, tmp_path: Path) -> Sshd:
    """Two hosts, a firewall, an sshd and a process in the world."""
    host_key, _ = keygen(tmp_path / "host")
    _, client_pub = keygen(tmp_path / "client")
    a = world.add_host("a", A_PUBLIC, A_PRIVATE, droplet_id=1)
    world.add_host("b", B_PUBLIC)
    world.set_firewall("fw", {"dropletIds": [1], "inboundRules": [], "outboundRules": []})
    world.python("-c", "import time; time.sleep(600)")
    sshd = Sshd(a, Sandbox(tmp_path / "disk"), tmp_path / "sshd", host_key, client_pub)
    assert leftovers(world.prefix, str(sshd.config)), "the run is there"
    return sshd


def test_nothing_is_left_after_the_fixture_even_when_the_test_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the test failed"), running_world() as world:
        sshd = a_running_run(world, tmp_path)
        raise RuntimeError("the test failed")
    assert leftovers(world.prefix, str(sshd.config)) == []


def test_reap_removes_a_run_by_its_prefix_alone_and_no_other_run(tmp_path: Path) -> None:
    """A run whose objects are lost (a killed pytest): reap(prefix) finds its namespaces, its
    processes and a link it left in this machine's namespace; another run is untouched."""
    with running_world() as other, ExitStack() as stack:
        listen(other.add_host("other", "203.0.113.50"), 22, stack=stack)
        lost = World()
        try:
            sshd = a_running_run(lost, tmp_path)
            # A veth left in this namespace (no address, down: it carries nothing).
            subprocess.run(
                [
                    "ip",
                    "link",
                    "add",
                    f"{lost.prefix}x",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"{lost.prefix}y",
                ],
                check=True,
            )
            assert other.prefix != lost.prefix and len(other.prefix) == len(lost.prefix)
            reap(lost.prefix)
            assert sshd.proc is not None
            sshd.proc.wait(timeout=10)  # killed (its parent must collect it)
            assert leftovers(lost.prefix, str(sshd.config)) == []
            assert {f"{other.prefix}-world", f"{other.prefix}-h1"} <= set(namespaces())
            assert other.reaches("203.0.113.50", 22)
        finally:
            lost.close()
