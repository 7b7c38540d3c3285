"""Follow the vLLM service's journal on a stack's Droplet, without handling the key by hand.

    nemodrop logs --stack dev            # last 200 lines, then follow (Ctrl-C stops)
    nemodrop logs --stack dev -n 50 --no-follow
    nemodrop logs --stack dev --replica 2   # one replica of a set (replicas >= 2)
    nemodrop logs --stack dev --balancer    # the Caddy balancer Droplet's gateway

The stack's private key goes to a file readable only by you in a temporary folder that is
removed on exit; it never appears on a command line. When the stack exports the Droplet's SSH
host key (`sshHostPublicKey`), the connection requires exactly that key; otherwise the first
key seen is remembered in ~/.ssh/nemotron-droplet-<stack>.known_hosts and required afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from nemodrop import cli
from nemodrop import target as target_mod

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from components.spec.catalog import CADDY_UNIT, SSH_USER, VLLM_UNIT  # after the path is set


def host_of(
    outputs: dict[str, object], stack: str, replica: int | None, balancer: bool
) -> tuple[str, str]:
    """The address and pinned host key of the Droplet to read: the stack's (replica 0), replica
    `replica` of a set, or the Caddy balancer's."""
    if balancer:
        entry = outputs.get("balancer")
        if not isinstance(entry, dict) or not entry.get("dropletIpv4"):
            raise target_mod.TargetError(
                f"stack {stack} has no balancer Droplet (replicas: 1, or balancer.kind: managed, "
                "which DigitalOcean runs and has no journal to read)"
            )
        return str(entry["dropletIpv4"]), str(entry.get("sshHostPublicKey") or "")
    if replica:
        replicas = outputs.get("replicas")
        if not isinstance(replicas, list):
            raise target_mod.TargetError(
                f"stack {stack} has one Droplet (replicas: 1): use --replica 0 or leave it out"
            )
        if not 0 <= replica < len(replicas):
            raise target_mod.TargetError(
                f"stack {stack} has replicas 0 to {len(replicas) - 1}; "
                f"--replica {replica} is not one of them"
            )
        chosen = replicas[replica]
        return str(chosen["ipv4"]), str(chosen.get("sshHostPublicKey") or "")
    return str(outputs.get("ipv4") or ""), str(outputs.get("sshHostPublicKey") or "")


def ssh_argv(
    host: str, port: int, key_file: Path, known_hosts: Path, pinned: bool, remote: list[str]
) -> list[str]:
    return [
        "ssh",
        "-i",
        str(key_file),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        f"StrictHostKeyChecking={'yes' if pinned else 'accept-new'}",
        "-o",
        "ServerAliveInterval=30",
        "-p",
        str(port),
        f"{SSH_USER}@{host}",
        *remote,
    ]


def journal_command(unit: str, lines: int, follow: bool) -> list[str]:
    command = [
        "journalctl",
        "--unit",
        unit,
        "--lines",
        str(lines),
        "--no-pager",
        "--output",
        "short-iso",
    ]
    return [*command, "--follow"] if follow else command


def add_parser(subparsers: cli.Subparsers) -> None:
    parser = cli.subcommand(subparsers, "logs", __doc__)
    parser.add_argument("--stack", required=True, help="the Pulumi stack whose Droplet to read")
    parser.add_argument("-n", "--lines", type=int, default=200, help="lines of history first")
    parser.add_argument("--no-follow", action="store_true", help="print and exit")
    parser.add_argument("--unit", help=f"systemd unit to read (default {VLLM_UNIT})")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--replica", type=int, help="which replica of a set (0: the first)")
    where.add_argument(
        "--balancer", action="store_true", help=f"the Caddy balancer Droplet ({CADDY_UNIT})"
    )
    parser.add_argument("--port", type=int, default=22, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:

    outputs = target_mod.stack_outputs(args.stack)
    key = outputs.get("sshPrivateKey")
    if not outputs.get("ipv4") or not key:
        raise target_mod.TargetError(
            f"stack {args.stack} has no ipv4/sshPrivateKey outputs: run `pulumi up` for it first"
        )
    # One login key opens every Droplet of a set; each has its own pinned host key.
    host, host_key = host_of(outputs, args.stack, args.replica, args.balancer)
    unit = args.unit or (CADDY_UNIT if args.balancer else VLLM_UNIT)

    workdir = Path(tempfile.mkdtemp(prefix="nemotron-logs-"))  # mode 0700
    try:
        key_file = workdir / "id"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key if key.endswith("\n") else key + "\n")
        if host_key:
            known_hosts = workdir / "known_hosts"
            name = host if args.port == 22 else f"[{host}]:{args.port}"
            known_hosts.write_text(f"{name} {host_key.strip()}\n")
        else:
            known_hosts = Path.home() / ".ssh" / f"nemotron-droplet-{args.stack}.known_hosts"
            known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        remote = journal_command(unit, args.lines, not args.no_follow)
        argv_ = ssh_argv(host, args.port, key_file, known_hosts, bool(host_key), remote)
        if shutil.which("ssh") is None:
            raise target_mod.TargetError("ssh (OpenSSH client) is not on PATH")
        try:
            code = subprocess.call(argv_)  # noqa: S603 (fixed argv, no shell)
        except KeyboardInterrupt:
            code = 0
        if code == 255:
            print(
                f"error: ssh to {host} failed (exit 255): check that access.sshCidrs admits this "
                "machine and that the Droplet is up (`pulumi stack output ipv4`)",
                file=sys.stderr,
            )
        return code
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
