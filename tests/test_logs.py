"""nemodrop/logs.py over a real OpenSSH server on loopback: the vLLM journal read with the stack's
key and its pinned host key (a host with another key refused, the first one remembered when the
stack exports none), one replica of a set or the balancer, each with its own host key."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_target import dev_stack
from test_tools import (
    run_tool,
)

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """sshd on 127.0.0.1 with its own host key; every session runs the client's command through
    a recorder with a fake `journalctl` first on PATH, so nothing touches this machine's journal."""
    if not os.path.exists(SSHD):
        pytest.skip("openssh-server is not installed (./check installs it)")
    d = tmp_path / "sshd"
    (d / "bin").mkdir(parents=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host")], check=True
    )
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client")], check=True
    )
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    (d / "bin" / "journalctl").write_text(
        '#!/bin/sh\necho "2026-12-02T10:00:00+0000 droplet vllm[42]: INFO Started server process"\n'
        'echo "2026-12-02T10:00:01+0000 droplet vllm[42]: INFO Application startup complete."\n'
    )
    (d / "bin" / "journalctl").chmod(0o755)
    recorder = d / "session.sh"
    recorder.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$SSH_ORIGINAL_COMMAND" > {d}/command\n'
        f'PATH={d}/bin:/usr/bin:/bin exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
    )
    recorder.chmod(0o755)
    port = _free_port()
    (d / "sshd_config").write_text(
        textwrap.dedent(f"""\
        ListenAddress 127.0.0.1
        Port {port}
        HostKey {d}/host
        AuthorizedKeysFile {d}/authorized_keys
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PermitRootLogin prohibit-password
        StrictModes no
        UsePAM no
        PidFile none
        ForceCommand {recorder}
    """)
    )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield {
            "port": port,
            "dir": d,
            "client_key": (d / "client").read_text(),
            "host_pub": " ".join((d / "host.pub").read_text().split()[:2]),
        }
    finally:
        proc.kill()
        proc.wait()


def run_logs(
    tmp_path: Path, sshd: dict[str, Any], outputs: dict[str, Any], *args: str
) -> subprocess.CompletedProcess[str]:
    env = dev_stack(tmp_path, outputs).env()
    env["HOME"] = str(tmp_path / "home")
    # Its own temporary folder: what it leaves there is this run's alone (tests run side by
    # side, and another's logs.py may be running).
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp_path / "tmp")
    return run_tool(
        "logs", "--stack", "dev", "--port", str(sshd["port"]), *args, env=env, timeout=60
    )


def test_logs_reads_the_journal_over_ssh_with_the_stack_key_and_pinned_host_key(
    tmp_path: Path, sshd: dict[str, Any]
) -> None:
    outputs = {
        "ipv4": "127.0.0.1",
        "sshPrivateKey": sshd["client_key"],
        "sshHostPublicKey": sshd["host_pub"],
    }
    proc = run_logs(tmp_path, sshd, outputs, "-n", "50")
    assert proc.returncode == 0, proc.stderr
    assert "Application startup complete." in proc.stdout
    command = (sshd["dir"] / "command").read_text().strip()
    assert (
        command
        == "journalctl --unit vllm.service --lines 50 --no-pager --output short-iso --follow"
    )
    leftovers = list((tmp_path / "tmp").glob("nemotron-logs-*"))
    assert not [p for p in leftovers if (p / "id").exists()], "the key file is removed on exit"


def test_logs_refuses_a_host_whose_key_is_not_the_pinned_one(
    tmp_path: Path, sshd: dict[str, Any]
) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    outputs = {
        "ipv4": "127.0.0.1",
        "sshPrivateKey": sshd["client_key"],
        "sshHostPublicKey": " ".join(other.with_suffix(".pub").read_text().split()[:2]),
    }
    proc = run_logs(tmp_path, sshd, outputs, "--no-follow")
    assert proc.returncode == 255
    assert "Host key verification failed" in proc.stderr
    assert not (sshd["dir"] / "command").exists(), "no command ran on an unverified host"


def test_logs_remembers_the_first_host_key_when_the_stack_exports_none(
    tmp_path: Path, sshd: dict[str, Any]
) -> None:
    outputs = {"ipv4": "127.0.0.1", "sshPrivateKey": sshd["client_key"]}
    proc = run_logs(tmp_path, sshd, outputs, "--no-follow")
    assert proc.returncode == 0, proc.stderr
    known = (tmp_path / "home" / ".ssh" / "nemotron-droplet-dev.known_hosts").read_text()
    assert sshd["host_pub"].split()[1] in known
    assert "--follow" not in (sshd["dir"] / "command").read_text()


def test_logs_follows_one_replica_of_a_set_or_the_balancer_each_with_its_own_host_key(
    tmp_path: Path, sshd: dict[str, Any]
) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    stranger = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    outputs = {
        # Replica 0 is elsewhere (a documentation address): only the chosen one is dialled.
        "ipv4": "192.0.2.1",
        "sshPrivateKey": sshd["client_key"],
        "sshHostPublicKey": stranger,
        "replicas": [
            {"ipv4": "192.0.2.1", "sshHostPublicKey": stranger},
            {"ipv4": "127.0.0.1", "sshHostPublicKey": sshd["host_pub"]},
            {"ipv4": "127.0.0.1", "sshHostPublicKey": stranger},
        ],
        "balancer": {"dropletIpv4": "127.0.0.1", "sshHostPublicKey": sshd["host_pub"]},
    }
    proc = run_logs(tmp_path, sshd, outputs, "--replica", "1", "--no-follow")
    assert proc.returncode == 0, proc.stderr
    assert "--unit vllm.service" in (sshd["dir"] / "command").read_text()
    (sshd["dir"] / "command").unlink()
    # Replica 2's host key is not the one at that address: refused, nothing runs.
    refused = run_logs(tmp_path, sshd, outputs, "--replica", "2", "--no-follow")
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
    assert not (sshd["dir"] / "command").exists()
    balancer = run_logs(tmp_path, sshd, outputs, "--balancer", "--no-follow")
    assert balancer.returncode == 0, balancer.stderr
    assert "--unit caddy.service" in (sshd["dir"] / "command").read_text()
    missing = run_logs(tmp_path, sshd, outputs, "--replica", "3")
    assert missing.returncode == 2
    assert "has replicas 0 to 2; --replica 3 is not one of them" in missing.stderr
    lone = {k: v for k, v in outputs.items() if k not in ("replicas", "balancer")}
    alone = run_logs(tmp_path, sshd, lone, "--replica", "1")
    assert alone.returncode == 2 and "has one Droplet (replicas: 1)" in alone.stderr
    assert "has no balancer Droplet" in run_logs(tmp_path, sshd, lone, "--balancer").stderr
