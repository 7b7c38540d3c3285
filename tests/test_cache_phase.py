"""The cache phase for real under bash, and what the later phases make of a warm cache.

A cache Volume here is an image file formatted by the real mkfs.ext4 (tests/fakes/mount binds
its content when it is mounted); a re-created Droplet is a second sandbox with a fresh disk and
the same image attached. Everything else is what the other phase tests use.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox import Downloads, Sandbox
from test_phases import MODEL, Phases

from components import catalog

# Big enough for ext4 with a journal; sparse, so it costs nothing on disk.
IMAGE_BYTES = 64 * 1024 * 1024


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    image = tmp_path / "volume.img"
    with image.open("wb") as f:
        f.truncate(IMAGE_BYTES)
    return image


@pytest.fixture
def droplets(tmp_path: Path) -> Iterator[list[Sandbox]]:
    """Make sandboxes ("Droplets") one after the other; their services stop at the end."""
    made: list[Sandbox] = []
    yield made
    for box in made:
        box.stop_services()


def droplet(tmp_path: Path, made: list[Sandbox], image: Path | None) -> Sandbox:
    box = Sandbox(tmp_path / f"droplet-{len(made)}")
    if image is not None:
        box.attach_volume(image)
    made.append(box)
    return box


def with_cache(box: Sandbox, downloads: Downloads, image: Path | None, **overrides) -> Phases:
    p = Phases(box, downloads, **overrides)
    p.extra["cache"] = {
        "NEMO_CACHE_DEVICE": str(image) if image else "",
        "NEMO_CACHE_WAIT_SECONDS": 2,
    }
    return p


def blkid(image: Path, tag: str) -> str:
    out = subprocess.run(
        ["blkid", "-p", "-s", tag, "-o", "value", str(image)],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def bound(box: Sandbox, path: str) -> bool:
    return box.run("", inner=f"mountpoint -q {path}").returncode == 0


def test_a_new_volume_is_formatted_once_mounted_and_bound_where_the_phases_look(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    box = droplet(tmp_path, droplets, volume)
    p = with_cache(box, downloads, volume)
    first = p.ok("cache")
    assert first["changed"] is True and first["cache"] == "new"
    assert blkid(volume, "TYPE") == "ext4" and blkid(volume, "LABEL") == catalog.CACHE_LABEL
    uuid = blkid(volume, "UUID")
    fstab = box.file("/etc/fstab").read_text()
    assert f"UUID={uuid} {catalog.CACHE_MOUNT} ext4 defaults,nofail," in fstab
    for folder, path in catalog.CACHE_BINDS:
        assert f"{catalog.CACHE_MOUNT}/{folder} {path} none bind,nofail," in fstab
        # Every later run (each one a fresh mount namespace here, like a boot) finds the binds.
        assert bound(box, path), path
    # util-linux reads the block as the boot would: it parses, and its one complaint is that
    # the UUID names no block device (here the Volume is an image file).
    check = box.run("", inner="findmnt --verify --tab-file /etc/fstab")
    report = check.stdout + check.stderr
    assert "0 parse errors, 1 error, 0 warnings" in report, report
    assert f"unreachable on boot required source: UUID={uuid}" in report, report

    # Run again: nothing formatted again, nothing changed, and the block is written once.
    again = p.ok("cache")
    assert again["changed"] is False and again["cache"] == "warm"
    assert blkid(volume, "UUID") == uuid
    assert box.file("/etc/fstab").read_text().count("# nemotron-cache: begin") == 1

    # What the phases install lands on the Volume, and a reboot keeps it bound.
    p.ok("conda")
    assert (Path(f"{volume}.fs") / "conda" / "bin" / "conda").exists()
    box.reboot()
    assert bound(box, catalog.CONDA_PREFIX)
    # The service waits for those mounts.
    unit = p.settings("service")["NEMO_UNIT_TEXT"]
    assert "RequiresMountsFor=" not in unit, "no cache device in these settings"
    cached_unit = p.settings("service", cache_device=str(volume))["NEMO_UNIT_TEXT"]
    assert f"RequiresMountsFor={catalog.CONDA_PREFIX} {catalog.HF_HOME}" in cached_unit


def test_a_recreated_droplet_on_a_warm_cache_skips_every_download(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    cold = with_cache(droplet(tmp_path, droplets, volume), downloads, volume)
    for phase in ("cache", "conda", "vllm", "model"):
        assert cold.ok(phase)["changed"] is True, phase
    fetched = len(downloads.requests)
    assert fetched >= 2  # Miniforge and the weights, at least

    # Autodown deleted that Droplet; a new one (a fresh disk) gets the same Volume.
    warm = with_cache(droplet(tmp_path, droplets, volume), downloads, volume)
    assert warm.ok("cache")["cache"] == "warm"
    lines = {}
    for phase in ("conda", "vllm", "model"):
        run = warm.run(phase)
        assert run.returncode == 0, run.stderr
        # (The vllm phase still puts the C compiler on the new Droplet's own disk.)
        if phase != "vllm":
            assert run.result["changed"] is False, (phase, run.stderr)
        assert "step install:" not in run.stderr and "step download:" not in run.stderr
        # One line each says the work was found on the cache, and why it counts as done.
        lines[phase] = [
            line for line in run.stderr.splitlines() if "found on the cache Volume" in line
        ]
        assert len(lines[phase]) == 1, (phase, run.stderr)
    assert "matches the lock" in lines["vllm"][0]
    assert f"complete: {MODEL}@main" in lines["model"][0] and "no download" in lines["model"][0]
    assert len(downloads.requests) == fetched, downloads.requests[fetched:]


def test_a_cache_for_another_revision_or_lock_is_refreshed_not_reused(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    cold = with_cache(droplet(tmp_path, droplets, volume), downloads, volume)
    for phase in ("cache", "conda", "vllm", "model"):
        cold.ok(phase)

    revision = "v2"
    downloads.add(f"/{MODEL}/resolve/{revision}/config.json", b'{"revision": "v2"}')
    box = droplet(tmp_path, droplets, volume)
    warm = with_cache(box, downloads, volume, model={"revision": revision})
    warm.ok("cache")
    warm.ok("conda")
    before = len(downloads.requests)
    run = warm.run("model")
    assert run.returncode == 0 and run.result["changed"] is True, run.stderr
    assert f"the cache holds {MODEL}@main, not {MODEL}@{revision}" in run.stderr
    assert f"/{MODEL}/resolve/{revision}/config.json" in downloads.requests[before:]

    # Another lock (another vLLM, or the same one re-locked): the env is installed again.
    lock = box.file(catalog.LOCKS_DIR + "/" + warm.cfg.lock_file.name)
    lock.write_text(lock.read_text() + "# re-locked\n")
    warm.extra["vllm"] = {"NEMO_LOCK_SHA256": hashlib.sha256(lock.read_bytes()).hexdigest()}
    run = warm.run("vllm")
    assert run.returncode == 0 and run.result["changed"] is True, run.stderr
    assert "found on the cache Volume" not in run.stderr


def test_weights_left_half_downloaded_on_the_cache_are_completed(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    downloads.add(f"/{MODEL}/resolve/main/model.safetensors", b"\0" * 4096)
    cold = with_cache(droplet(tmp_path, droplets, volume), downloads, volume)
    for phase in ("cache", "conda", "model"):
        cold.ok(phase)
    # The Droplet died while a file was still being written: it is short on the Volume.
    hub = Path(f"{volume}.fs") / "hf" / "hub" / f"models--{MODEL.replace('/', '--')}"
    blob = next(b for b in (hub / "blobs").iterdir() if b.stat().st_size == 4096)
    blob.write_bytes(b"\0" * 100)
    for snapshot in (hub / "snapshots").iterdir():
        (snapshot / "model.safetensors").unlink()

    warm = with_cache(droplet(tmp_path, droplets, volume), downloads, volume)
    warm.ok("cache")
    warm.ok("conda")
    before = len(downloads.requests)
    run = warm.run("model")
    assert run.returncode == 0 and run.result["changed"] is True, run.stderr
    assert "incomplete: 1 of 2 files" in run.stderr and "model.safetensors" in run.stderr
    # Only what was missing is fetched.
    assert downloads.requests[before:] == [f"/{MODEL}/resolve/main/model.safetensors"]
    again = warm.run("model")
    assert again.result["changed"] is False and "no download" in again.stderr


def test_turning_the_cache_on_copies_what_the_droplet_has_and_off_undoes_it(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    box = droplet(tmp_path, droplets, None)
    p = with_cache(box, downloads, None)
    assert p.ok("cache")["cache"] == "off"
    for phase in ("conda", "vllm", "model"):
        p.ok(phase)
    fetched = len(downloads.requests)

    # cache.sizeGb set on a live Droplet: the Volume is attached and filled from its disk. A
    # first try was cut short mid-copy: its side folder is discarded, the copy starts again.
    box.attach_volume(volume)
    p.extra["cache"]["NEMO_CACHE_DEVICE"] = str(volume)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", catalog.CACHE_LABEL, str(volume)], check=True)
    Path(f"{volume}.fs-uuid").write_text(blkid(volume, "UUID") + "\n")  # mounted before
    half = Path(f"{volume}.fs") / "conda.partial"
    half.mkdir(parents=True)
    (half / "half-copied").write_text("")
    run = p.run("cache")
    assert run.returncode == 0, run.stderr
    assert f"{catalog.CONDA_PREFIX}: copying what this Droplet has into the cache" in run.stderr
    for phase in ("conda", "vllm", "model"):
        assert p.ok(phase)["changed"] is False, phase
    assert len(downloads.requests) == fetched, "a copy, not a download"
    assert (Path(f"{volume}.fs") / "conda" / "bin" / "conda").exists()
    assert not half.exists() and not (Path(f"{volume}.fs") / "conda" / "half-copied").exists()

    # And unset again: no mounts, no fstab block, the later phases work on the boot disk.
    p.extra["cache"]["NEMO_CACHE_DEVICE"] = ""
    off = p.ok("cache")
    assert off["changed"] is True and off["cache"] == "off"
    assert "nemotron-cache" not in box.file("/etc/fstab").read_text()
    assert not bound(box, catalog.CONDA_PREFIX) and not bound(box, catalog.CACHE_MOUNT)
    assert p.ok("conda")["changed"] is False  # the boot disk still has what it had


def test_a_volume_with_someone_elses_filesystem_is_never_formatted_over(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    subprocess.run(["mkfs.ext2", "-q", "-F", str(volume)], check=True)
    uuid = blkid(volume, "UUID")
    p = with_cache(droplet(tmp_path, droplets, volume), downloads, volume)
    p.failed("cache", "filesystem", "attach an empty Volume")
    assert blkid(volume, "TYPE") == "ext2" and blkid(volume, "UUID") == uuid


def test_a_volume_that_is_not_attached_fails_with_the_fix(
    tmp_path: Path, downloads: Downloads, droplets: list[Sandbox]
) -> None:
    missing = tmp_path / "no-such-volume"
    p = with_cache(droplet(tmp_path, droplets, None), downloads, missing)
    run = p.failed("cache", "attached", "check Volumes in the control panel")
    assert f"no {missing}" in run.failure
