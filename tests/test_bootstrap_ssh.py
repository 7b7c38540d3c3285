"""The whole bootstrap over a real SSH connection, the way pulumi-command runs it: `bash -s` as
the command, the script on stdin, no environment forwarded, the host key pinned; the reboot is
a restart of the server under a new boot id, and the next phase dials until SSH answers."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sandbox import Downloads, Sandbox, free_port
from stack.net import sshd_config
from test_cache_script import VOLUME_BYTES, sparse_image
from test_phase_scripts import Phases, service_pid, unit_env, use_new_locks, vllm_envs, vllm_lock

from components.cloud import bootstrap
from components.host import phase_settings, phases

SSHD = "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SSHD),
    reason="needs root and openssh-server (./check installs it)",
)


class Droplet:
    """The sandbox behind a real sshd on loopback."""

    def __init__(self, box: Sandbox, keys: Path) -> None:
        self.box, self.keys = box, keys
        self.port = free_port()
        for name in ("host", "client"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True
            )
        (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
        host_pub = " ".join((keys / "host.pub").read_text().split()[:2])
        (keys / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_pub}\n")
        (keys / "sshd_config").write_text(
            sshd_config("127.0.0.1", self.port, keys / "host", keys / "authorized_keys")
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.box.command(f"{SSHD} -D -e -f {self.keys / 'sshd_config'}"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("sshd did not start")

    def stop(self) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def reboot_if_asked(self) -> bool:
        if not self.box.reboot_requested():
            return False
        self.stop()
        self.box.reboot()
        self.start()
        return True

    def ssh_argv(self, *remote: str, tool: str = "ssh") -> list[str]:
        port_flag = "-p" if tool == "ssh" else "-P"
        return [
            tool,
            "-F",
            "/dev/null",
            "-i",
            str(self.keys / "client"),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={self.keys / 'known_hosts'}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "ConnectTimeout=5",
            port_flag,
            str(self.port),
            *remote,
        ]

    def run_phase(
        self, script: str, wait_for_ssh: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """`bash -s` with the script on stdin; dial until SSH answers when asked (-1 dials)."""
        argv = self.ssh_argv("root@127.0.0.1", phases.RUNNER)
        deadline = time.monotonic() + 60
        while True:
            proc = subprocess.run(
                argv,
                input=script,
                capture_output=True,
                text=True,
                timeout=300,
                env={"PATH": os.environ["PATH"], "LANG": "C", "NEMO_FROM_CLIENT": "1"},
                check=False,
            )
            dial_failed = proc.returncode == 255 and "Connection refused" in proc.stderr
            if not (wait_for_ssh and dial_failed and time.monotonic() < deadline):
                return proc
            time.sleep(0.2)

    def copy(self, local: Path, remote: str) -> None:
        """What CopyToRemote does: SFTP, parent folders created."""
        batch = f"-mkdir {Path(remote).parent.parent!s}\n-mkdir {Path(remote).parent!s}\nput {local} {remote}\n"
        proc = subprocess.run(
            self.ssh_argv("-b", "-", "root@127.0.0.1", tool="sftp"),
            input=batch,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr


@pytest.fixture
def droplet(tmp_path: Path) -> Iterator[Droplet]:
    box = Sandbox(tmp_path / "droplet")
    keys = tmp_path / "keys"
    keys.mkdir()
    d = Droplet(box, keys)
    yield d
    d.stop()
    box.stop_services()


def run_bootstrap(droplet: Droplet, p: Phases, cache_device: str = "") -> dict[str, dict[str, Any]]:
    """All phases in the program's order (phases.BOOTSTRAP), the ones that overlap side by side,
    as `pulumi up` runs them."""
    results: dict[str, dict[str, Any]] = {}

    def phase(name: str, **kwargs: Any) -> dict[str, Any]:
        spec = next(ph for ph in phases.BOOTSTRAP if ph.name == name)
        if "cache_device" in spec.inputs:
            kwargs["cache_device"] = cache_device
        proc = droplet.run_phase(phases.render(name, p.settings(name, **kwargs)), spec.wait_for_ssh)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        results[name] = bootstrap.parse_result(proc.stdout)
        return results[name]

    def downloads() -> None:
        phase("cache")
        phase("conda")
        droplet.copy(p.cfg.lock_file, phase_settings.remote_lock_path(p.cfg))
        with ThreadPoolExecutor(max_workers=2) as inner:
            for future in [inner.submit(phase, "vllm"), inner.submit(phase, "model")]:
                future.result()

    phase("preflight")
    with ThreadPoolExecutor(max_workers=2) as pool:
        branches = [pool.submit(lambda: (phase("driver"), phase("cgroup"))), pool.submit(downloads)]
        for future in branches:
            future.result()
    asked = phase("reboot")
    results["rebooted"] = {"done": droplet.reboot_if_asked()}
    phase("reboot-wait", reboot_result=asked)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(phase, "service"), pool.submit(phase, "gateway")]:
            future.result()
    phase("autodown")
    phase("ready")
    return results


@pytest.mark.parametrize("cached", [False, True], ids=["no-cache", "cache-volume"])
def test_the_whole_bootstrap_over_ssh_with_one_reboot_then_a_second_up_changes_nothing(
    droplet: Droplet, tmp_path: Path, cached: bool
) -> None:
    downloads = Downloads(tmp_path / "www")
    device = ""
    if cached:
        # The cache Volume: an image file (tests/support/fakes/mount) of the size DigitalOcean
        # makes for the stack's cache.sizeGb (sparse: the model phase checks its room); after
        # the reboot only the fstab lines the cache phase wrote bring it back, as on a Droplet.
        image = sparse_image(tmp_path / "volume.img", VOLUME_BYTES)
        droplet.box.attach_volume(image)
        device = str(image)
    try:
        droplet.box.hw("driver", "575.57.08")  # the image's driver is too old for CUDA 13
        p = Phases(droplet.box, downloads)
        p.extra["cache"] = {"NEMO_CACHE_DEVICE": device}
        first = run_bootstrap(droplet, p, device)
        assert first["driver"]["changed"] is True
        assert first["reboot"]["rebooting"] is True
        assert first["rebooted"]["done"] is True
        assert first["reboot-wait"]["boot_id"] != first["reboot"]["boot_id"]
        assert first["reboot-wait"]["driver"] == "580.159.04"
        for name in ("conda", "vllm", "model", "service", "gateway", "autodown"):
            assert first[name]["changed"] is True, name
        assert first["cache"]["cache"] == ("new" if cached else "off")
        assert first["ready"]["ready_seconds"] >= 0
        if cached:
            # vLLM answered from its env and the weights on the Volume, after the reboot: the
            # Volume holds /opt/conda whole, the vllm phase's new envs with it.
            (env,) = (Path(f"{device}.fs") / "conda" / "envs").glob("vllm-0.33.0-*")
            assert (env / "bin" / "vllm").exists() and (env / ".nemotron-vllm").exists()
            assert (
                f"ExecStart=/opt/conda/envs/{env.name}/bin/vllm "
                in droplet.box.file("/etc/systemd/system/vllm.service").read_text()
            )
            assert list((Path(f"{device}.fs") / "hf" / "hub").iterdir())
        boot = droplet.box.boot_id

        second = run_bootstrap(droplet, p, device)
        assert second["rebooted"]["done"] is False, "never a second reboot"
        assert droplet.box.boot_id == boot
        for name in phases.PHASE_NAMES:
            assert second[name]["changed"] is False, name
    finally:
        downloads.close()


def test_a_new_vllm_installs_beside_the_running_one_and_one_restart_switches(
    droplet: Droplet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new lock, the whole bootstrap again: the vllm phase installs the release into a new env
    while the service runs the old one; the service phase switches (one restart, no reboot) and
    removes the old env."""
    use_new_locks(tmp_path, monkeypatch)
    downloads = Downloads(tmp_path / "www")
    try:
        run_bootstrap(droplet, Phases(droplet.box, downloads))
        (old,) = vllm_envs(droplet.box)
        pid, boot = service_pid(droplet.box), droplet.box.boot_id
        log = droplet.box.file("/var/lib/fake-systemd/log")
        restarts = log.read_text().count("restart vllm.service")
        second = run_bootstrap(droplet, Phases(droplet.box, downloads, **vllm_lock("0.33.1")))
        assert second["rebooted"]["done"] is False and droplet.box.boot_id == boot
        assert second["vllm"]["changed"] is True and second["vllm"]["vllm"] == "0.33.1"
        assert second["service"]["changed"] is True
        for name in ("preflight", "driver", "cgroup", "conda", "model", "gateway"):
            assert second[name]["changed"] is False, name
        (env,) = vllm_envs(droplet.box)
        assert env != old and env.startswith("/opt/conda/envs/vllm-0.33.1-")
        assert unit_env(droplet.box) == env and service_pid(droplet.box) != pid
        assert log.read_text().count("restart vllm.service") == restarts + 1
        assert "(vLLM 0.33.1)" in droplet.box.file("/var/log/fake-vllm.log").read_text()
    finally:
        downloads.close()


def test_a_failed_phase_over_ssh_shows_phase_step_and_fix(droplet: Droplet, tmp_path: Path) -> None:
    downloads = Downloads(tmp_path / "www")
    try:
        droplet.box.set_gpus(0)
        p = Phases(droplet.box, downloads)
        proc = droplet.run_phase(
            phases.render("preflight", p.settings("preflight")), wait_for_ssh=True
        )
        assert proc.returncode == 1
        assert "[preflight] FAILED at step gpu: no NVIDIA GPU on the PCI bus" in proc.stderr
        assert "[preflight] fix: " in proc.stderr
    finally:
        downloads.close()


def test_the_client_environment_does_not_reach_the_phase(droplet: Droplet) -> None:
    proc = droplet.run_phase("env\n")
    assert proc.returncode == 0, proc.stderr
    assert "NEMO_FROM_CLIENT" not in proc.stdout
