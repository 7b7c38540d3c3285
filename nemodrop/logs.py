"""Follow the vLLM service's journal on a stack's Droplet, without handling the key by hand.

    nemodrop logs --stack dev            # last 200 lines, then follow (Ctrl-C stops)
    nemodrop logs --stack dev -n 50 --no-follow
    nemodrop logs --stack dev --replica 2   # one replica of a set (replicas >= 2)
    nemodrop logs --stack dev --balancer    # the Caddy balancer Droplet's gateway
    nemodrop logs --host 203.0.113.7 --key-file ~/.ssh/dev-droplet --no-follow   # no pulumi
    nemodrop logs --stack dev --no-follow --json # the entries as one JSON document

The stack's private key goes to a file readable only by you in a temporary folder that is
removed on exit; it never appears on a command line. When the stack exports the Droplet's SSH
host key (`sshHostPublicKey`), the connection requires exactly that key; otherwise the first
key seen is remembered in ~/.ssh/nemotron-droplet-<stack>.known_hosts and required afterwards.
Without pulumi, --host and --key-file name the Droplet and the key (--host-key pins its host
key; else it is remembered under the address).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from nemodrop import cli
from nemodrop import target as target_mod


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


def catalog() -> ModuleType:
    """The program's catalog (components/spec/catalog.py: the SSH user, the units a Droplet
    runs), one place for them, read from the Pulumi project: the checkout this package is in,
    or the one the user runs it in. Only logs needs it; the other subcommands run anywhere."""
    project = str(target_mod.pulumi_dir())
    if project not in sys.path:
        sys.path.insert(0, project)
    try:
        return importlib.import_module("components.spec.catalog")
    except ModuleNotFoundError:
        raise target_mod.TargetError(
            f"logs reads the Droplets' SSH user and units from the project's "
            f"components/spec/catalog.py, which {project} lacks: run it in your "
            "nemotron-droplet checkout"
        ) from None


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
        f"{catalog().SSH_USER}@{host}",
        *remote,
    ]


def journal_command(unit: str, lines: int, follow: bool, output: str = "short-iso") -> list[str]:
    command = [
        "journalctl",
        "--unit",
        unit,
        "--lines",
        str(lines),
        "--no-pager",
        "--output",
        output,
    ]
    return [*command, "--follow"] if follow else command


def add_parser(subparsers: cli.Subparsers) -> None:
    parser = cli.subcommand(subparsers, "logs", __doc__)
    parser.add_argument(
        "--stack", help="the Pulumi stack whose Droplet to read (its ipv4 and SSH key outputs)"
    )
    parser.add_argument("--host", help="without --stack (no pulumi): the Droplet's address")
    parser.add_argument(
        "--key-file",
        metavar="FILE",
        help="without --stack: the SSH private key (`pulumi stack output sshPrivateKey "
        "--show-secrets`, saved readable by you alone)",
    )
    parser.add_argument(
        "--host-key",
        help="without --stack: the Droplet's SSH host key to require ('ssh-ed25519 AAAA...'; "
        "the stack's sshHostPublicKey); default: the first seen, then remembered",
    )
    parser.add_argument("-n", "--lines", type=int, default=200, help="lines of history first")
    parser.add_argument("--no-follow", action="store_true", help="print and exit")
    parser.add_argument("--unit", help="systemd unit to read (default: vLLM's)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--replica", type=int, help="which replica of a set (0: the first)")
    where.add_argument(
        "--balancer", action="store_true", help="the Caddy balancer Droplet (Caddy's unit)"
    )
    cli.add_json(parser, "with --no-follow: the entries read, one document")
    parser.add_argument("--port", type=int, default=22, help=argparse.SUPPRESS)


def droplet(args: argparse.Namespace, workdir: Path) -> tuple[str, str, Path, str]:
    """The Droplet to read: its address, its pinned host key ("" for none), the private key's
    file and a name for its remembered host key. From the stack's outputs (the key written to
    `workdir`, readable by this user alone), or from --host and --key-file without pulumi."""
    if not args.stack:
        if args.replica is not None or args.balancer:
            args.usage_error("--replica and --balancer pick a Droplet from --stack's outputs")
        if not args.host or not args.key_file:
            raise target_mod.TargetError(
                "no Droplet: pass --stack NAME, or --host ADDR and --key-file FILE"
            )
        return args.host, args.host_key or "", Path(args.key_file), args.host
    if args.host or args.key_file or args.host_key:
        args.usage_error("--host, --key-file and --host-key are for a Droplet without --stack")
    outputs = target_mod.stack_outputs(args.stack)
    key = outputs.get("sshPrivateKey")
    if not outputs.get("ipv4") or not key:
        raise target_mod.TargetError(
            f"stack {args.stack} has no ipv4/sshPrivateKey outputs: run `pulumi up` for it first"
        )
    # One login key opens every Droplet of a set; each has its own pinned host key.
    host, host_key = host_of(outputs, args.stack, args.replica, args.balancer)
    key_file = workdir / "id"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key if key.endswith("\n") else key + "\n")
    return host, host_key, key_file, args.stack


def entries(journal: str) -> list[dict[str, Any]]:
    """journalctl's `--output json` (one object a line: freedesktop.org journalctl(1), "json")
    as the entries --json prints: each one's time (ISO 8601, UTC), process id and message."""
    found = []
    for line in journal.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # not an entry (a line ssh or the shell printed)
        if not isinstance(entry, dict):
            continue
        micros = int(entry.get("__REALTIME_TIMESTAMP") or 0)
        when = datetime.datetime.fromtimestamp(micros / 1e6, datetime.UTC)
        message = entry.get("MESSAGE")
        found.append(
            {
                "time": when.isoformat(),
                "pid": entry.get("_PID"),
                # A message that is not UTF-8 comes as a list of its bytes.
                "message": bytes(message).decode(errors="replace")
                if isinstance(message, list)
                else str(message or ""),
            }
        )
    return found


def read(argv_: list[str], host: str, unit: str, as_json: bool) -> int:
    """Run ssh: its output straight to the terminal, or collected into one JSON document."""
    if shutil.which("ssh") is None:
        raise target_mod.TargetError("ssh (OpenSSH client) is not on PATH")
    try:
        if as_json:
            proc = subprocess.run(argv_, stdout=subprocess.PIPE, text=True, check=False)  # noqa: S603
            code = proc.returncode
            if code == 0:
                print(json.dumps({"host": host, "unit": unit, "entries": entries(proc.stdout)}))
        else:
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


def run(args: argparse.Namespace) -> int:
    if args.json and not args.no_follow:
        args.usage_error("--json needs --no-follow: it prints the entries read as one document")
    units = catalog()
    unit = args.unit or (units.CADDY_UNIT if args.balancer else units.VLLM_UNIT)
    workdir = Path(tempfile.mkdtemp(prefix="nemotron-logs-"))  # mode 0700
    try:
        host, host_key, key_file, name = droplet(args, workdir)
        if host_key:
            known_hosts = workdir / "known_hosts"
            pinned = host if args.port == 22 else f"[{host}]:{args.port}"
            known_hosts.write_text(f"{pinned} {host_key.strip()}\n")
        else:
            known_hosts = Path.home() / ".ssh" / f"nemotron-droplet-{name}.known_hosts"
            known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        output = "json" if args.json else "short-iso"
        remote = journal_command(unit, args.lines, not args.no_follow, output)
        argv_ = ssh_argv(host, args.port, key_file, known_hosts, bool(host_key), remote)
        return read(argv_, host, unit, args.json)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
