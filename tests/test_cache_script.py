"""The cache phase for real under bash, and what the later phases make of a warm cache.

A cache Volume here is an image file formatted by the real mkfs.ext4 (tests/support/fakes/mount binds
its content when it is mounted); a re-created Droplet is a second sandbox with a fresh disk and
the same image attached. One test attaches the image as a loop device instead, for the paths a
block device takes (blockdev, the kernel's mount, online resize2fs). Everything else is what the
other phase tests use.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox import Downloads, Sandbox
from test_phase_scripts import MODEL, Phases

from components.spec import catalog

# cache.sizeGb of the stacks these tests render: the least the dev model accepts (weights, two
# vLLM envs, compile caches).
CACHE_GB = 58
# A Volume as DigitalOcean makes it for that cache.sizeGb: an image of that size, sparse, which
# the phase formats lazily (mkfs.ext4 -E lazy_itable_init=1,lazy_journal_init=1): a few MiB of
# this machine's disk. Its size is what the fake df reports of it (tests/support/fakes/df),
# so the model phase's disk check sees the Volume's room, not this machine's.
VOLUME_BYTES = CACHE_GB << 30
# A Volume adopted smaller than cache.sizeGb asks (made by hand, or before the size was raised):
# big enough for ext4 with a journal.
IMAGE_BYTES = 64 * 1024 * 1024


def sparse_image(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    return sparse_image(tmp_path / "volume.img", VOLUME_BYTES)


@pytest.fixture
def small_volume(tmp_path: Path) -> Path:
    return sparse_image(tmp_path / "volume.img", IMAGE_BYTES)


def format_ext4(image: Path) -> None:
    """The filesystem the cache phase makes (its options: lazy, so a sparse image stays small)."""
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-L", catalog.CACHE_LABEL,
         "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image)],
        check=True,
    )  # fmt: skip


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
    """The cache phase rendered for a stack with a cache (cache.sizeGb) and `image` as its
    Volume's device: the deploy-time input bootstrap.py passes, so every setting is rendered."""
    p = Phases(box, downloads, cache={"sizeGb": CACHE_GB}, **overrides)
    attach(p, image)
    # The device appears within two seconds here or never (the wait's bound, not its logic).
    p.extra["cache"] = {"NEMO_CACHE_WAIT_SECONDS": 2}
    return p


def attach(p: Phases, image: Path | None) -> None:
    """The Volume attached at `image` (None: detached, the cache off for this Droplet)."""
    p.inputs["cache"] = {"cache_device": str(image) if image else ""}


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


def test_the_units_compile_caches_are_on_the_volume_the_cache_phase_binds(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    """What a start compiles (torch.compile's artifacts, the Triton kernels and their autotune
    results, the Mamba2 warm-up's among them) goes where the unit says, and that is on the
    Volume: a kernel written there by one Droplet is the next one's. TRITON_CACHE_DIR unset
    let a cold start put the Mamba2 kernels where the next start did not look."""
    box = droplet(tmp_path, droplets, volume)
    p = with_cache(box, downloads, volume)
    p.ok("cache")
    unit = p.settings("service", cache_device=str(volume))["NEMO_UNIT_TEXT"]
    env = dict(
        line.removeprefix("Environment=").split("=", 1)
        for line in unit.splitlines()
        if line.startswith("Environment=")
    )
    assert env.get("TRITON_CACHE_AUTOTUNING") == "1", unit
    # The journal names each kernel a start benchmarks (vllm_startup.py adds them up).
    assert env.get("TRITON_PRINT_AUTOTUNING") == "1", unit
    for name in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert name in env, f"{name} not in the unit:\n{unit}"
        path = env[name]
        binds = [(f, t) for f, t in catalog.CACHE_BINDS if path.startswith(t + "/")]
        assert binds, f"{name}={path} is under none of the cache's binds"
        folder, target = binds[0]
        wrote = box.run(f"mkdir -p {path} && echo kernel > {path}/probe\n")
        assert wrote.returncode == 0, wrote.stderr
        on_volume = Path(f"{volume}.fs") / folder / path.removeprefix(target + "/") / "probe"
        assert on_volume.read_text() == "kernel\n", name
        # The unit waits for that bind before it starts.
        assert target in unit.split("RequiresMountsFor=", 1)[1].splitlines()[0].split()


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
    attach(p, volume)
    format_ext4(volume)
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
    attach(p, None)
    off = p.ok("cache")
    assert off["changed"] is True and off["cache"] == "off"
    assert "nemotron-cache" not in box.file("/etc/fstab").read_text()
    assert not bound(box, catalog.CONDA_PREFIX) and not bound(box, catalog.CACHE_MOUNT)
    assert p.ok("conda")["changed"] is False  # the boot disk still has what it had


def test_a_volume_with_someone_elses_filesystem_is_never_formatted_over(
    tmp_path: Path, downloads: Downloads, small_volume: Path, droplets: list[Sandbox]
) -> None:
    subprocess.run(["mkfs.ext2", "-q", "-F", str(small_volume)], check=True)
    uuid = blkid(small_volume, "UUID")
    p = with_cache(droplet(tmp_path, droplets, small_volume), downloads, small_volume)
    p.failed("cache", "filesystem", "attach an empty Volume")
    assert blkid(small_volume, "TYPE") == "ext2" and blkid(small_volume, "UUID") == uuid


def test_a_volume_that_is_not_attached_fails_with_the_fix(
    tmp_path: Path, downloads: Downloads, droplets: list[Sandbox]
) -> None:
    missing = tmp_path / "no-such-volume"
    p = with_cache(droplet(tmp_path, droplets, None), downloads, missing)
    run = p.failed("cache", "attached", "check Volumes in the control panel")
    assert f"no {missing}" in run.failure


# ---- a Volume is formatted only when it reads as new -----------------------------------------

GIB = 1 << 30
MIB = 1 << 20


def digest(image: Path) -> str:
    with image.open("rb") as f:
        return hashlib.file_digest(f, "sha1").hexdigest()


def write_at(image: Path, offset: int, data: bytes) -> None:
    """A few bytes at `offset`, the rest of the (sparse) image untouched, as dd seek= does."""
    subprocess.run(
        ["dd", f"of={image}", "bs=1", f"seek={offset}", "conv=notrunc", "status=none"],
        input=data,
        check=True,
    )


@pytest.mark.parametrize(
    ("where", "offset"),
    [
        # No signature anywhere: the first blocks were wiped (wipefs -a), the data is further in.
        ("middle", GIB + 4096),
        ("end", 2 * GIB - 100),
        ("first 64 MiB", 40 * MIB),
    ],
)
def test_a_volume_holding_data_but_no_filesystem_is_refused_and_left_intact(
    tmp_path: Path, downloads: Downloads, droplets: list[Sandbox], where: str, offset: int
) -> None:
    image = tmp_path / "volume.img"
    with image.open("wb") as f:
        f.truncate(2 * GIB)
    write_at(image, offset, b"data")
    before = digest(image)
    p = with_cache(droplet(tmp_path, droplets, image), downloads, image)
    run = p.failed("cache", "filesystem", "blkdiscard")
    assert f"it is not new: the byte at offset {offset} " in run.failure, (where, run.failure)
    assert "delete the Volume in the control panel" in run.failure
    assert "mkfs" not in run.stderr and "formatting it" not in run.stderr
    assert digest(image) == before, "not one byte of the Volume changed"
    assert not Path(f"{image}.fs").exists(), "never mounted"
    assert not box_fstab_has_block(droplets[0])


def box_fstab_has_block(box: Sandbox) -> bool:
    fstab = box.file("/etc/fstab")
    return fstab.exists() and "nemotron-cache" in fstab.read_text()


def test_a_volume_with_a_partition_table_is_refused_with_what_wipefs_finds(
    tmp_path: Path, downloads: Downloads, small_volume: Path, droplets: list[Sandbox]
) -> None:
    # An MBR with one partition (what fdisk writes): an entry at 446, the signature at 510.
    entry = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + struct.pack("<II", 2048, 4096)
    with small_volume.open("r+b") as f:
        f.seek(446)
        f.write(entry)
        f.seek(510)
        f.write(b"\x55\xaa")
    before = digest(small_volume)
    p = with_cache(droplet(tmp_path, droplets, small_volume), downloads, small_volume)
    run = p.failed("cache", "filesystem", "attach an empty Volume")
    assert "the Volume holds a dos partition table (wipefs: dos at 0x1fe)" in run.failure, (
        run.failure
    )
    assert digest(small_volume) == before


def test_a_zero_volume_is_formatted_and_says_why(
    tmp_path: Path, downloads: Downloads, droplets: list[Sandbox]
) -> None:
    """A Volume bigger than the first and last 64 MiB: the samples in between read too."""
    image = tmp_path / "volume.img"
    with image.open("wb") as f:
        f.truncate(3 * GIB)
    p = with_cache(droplet(tmp_path, droplets, image), downloads, image)
    run = p.run("cache")
    assert run.returncode == 0, run.stderr
    assert "a new Volume (zeros in its first and last 64 MiB and in a MiB of every GiB)" in (
        run.stderr
    )
    assert blkid(image, "TYPE") == "ext4"


# ---- growing cache.sizeGb grows the filesystem ----------------------------------------------


def filesystem_bytes(image: Path) -> int:
    """What the ext4 filesystem on a Volume's image spans (its superblock, read by dumpe2fs)."""
    out = subprocess.run(
        ["dumpe2fs", "-h", str(image)], capture_output=True, text=True, check=True
    ).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return int(fields["Block count"]) * int(fields["Block size"])


def test_a_grown_volume_gets_its_filesystem_grown_on_the_next_run(
    tmp_path: Path, downloads: Downloads, small_volume: Path, droplets: list[Sandbox]
) -> None:
    p = with_cache(droplet(tmp_path, droplets, small_volume), downloads, small_volume)
    # Adopted at its own size while cache.sizeGb asks more: it grows on the next pulumi up.
    run = p.run("cache")
    assert f"it grows to {CACHE_GB} GiB on the next pulumi up" in run.stderr, run.stderr
    (Path(f"{small_volume}.fs") / "conda" / "kept").write_text("what the cache held")
    assert filesystem_bytes(small_volume) == IMAGE_BYTES
    # cache.sizeGb raised: DigitalOcean grows the Volume in place, the phase runs again.
    with small_volume.open("r+b") as f:
        f.truncate(4 * IMAGE_BYTES)
    run = p.run("cache")
    assert run.returncode == 0 and run.result["changed"] is True, run.stderr
    grew = [line for line in run.stderr.splitlines() if "the Volume grew to 256MiB" in line]
    assert len(grew) == 1 and "growing its ext4 filesystem from 64MiB" in grew[0], run.stderr
    assert filesystem_bytes(small_volume) == 4 * IMAGE_BYTES
    assert (Path(f"{small_volume}.fs") / "conda" / "kept").read_text() == "what the cache held"
    again = p.run("cache")
    assert again.result["changed"] is False, again.stderr
    assert "the filesystem spans the Volume's 256MiB" in again.stderr


# ---- a bind only of a complete copy ----------------------------------------------------------

# A cp that breaks off the cache's copy (into its side folder) half-way: out of space, or the
# phase killed (its Droplet lost, its bound); every other cp is the real one.
BREAKING_CP = r"""#!/bin/bash
dest=${*: -1}
if [[ $dest == *.partial/ ]]; then
  /usr/bin/cp -a "${*: -2:1}bin" "$dest"
  if [[ -e /etc/cp-kills ]]; then
    # The phase (`bash -s`, a few parents up), and nothing else.
    pid=$PPID
    for _ in 1 2 3; do
      if [[ $(tr '\0' ' ' < "/proc/$pid/cmdline") == "bash -s " ]]; then kill -KILL "$pid"; break; fi
      pid=$(awk '{print $4}' "/proc/$pid/stat")
    done
    exit 137
  fi
  echo "cp: error writing '${dest}python': No space left on device" >&2
  exit 1
fi
exec /usr/bin/cp "$@"
"""


def droplet_has_its_conda(box: Sandbox) -> bool:
    return box.run("", inner=f"test -x {catalog.CONDA_PREFIX}/bin/conda").returncode == 0


def fstab_binds(box: Sandbox) -> list[str]:
    return [
        line.split()[1]
        for line in box.file("/etc/fstab").read_text().splitlines()
        if " none bind," in line
    ]


def cache_turned_on_later(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> tuple[Sandbox, Phases]:
    """A live Droplet that ran the cache phase off and installed its own /opt/conda, then the
    cache turned on (cache.sizeGb set): the Volume attached and named, the cache phase not yet
    run again."""
    box = droplet(tmp_path, droplets, None)
    p = with_cache(box, downloads, None)
    p.ok("cache")
    p.ok("conda")
    box.attach_volume(volume)
    attach(p, volume)
    return box, p


@pytest.mark.parametrize("how", ["fails", "is killed"])
def test_a_copy_cut_short_binds_nothing_now_or_after_a_reboot_and_the_rerun_completes_it(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox], how: str
) -> None:
    box, p = cache_turned_on_later(tmp_path, downloads, volume, droplets)
    # Its copy of /opt/conda breaks off.
    box.file("/usr/local/bin/cp", BREAKING_CP, mode=0o755)
    if how == "is killed":
        box.file("/etc/cp-kills", "")
    run = p.run("cache")
    assert run.returncode != 0 and run.stdout == "", run.stderr
    fs = Path(f"{volume}.fs")
    assert not any((fs / "conda").iterdir()), "the cache's folder holds no part of the copy"
    assert droplet_has_its_conda(box) and not bound(box, catalog.CONDA_PREFIX)
    assert fstab_binds(box) == []
    if how == "is killed":
        assert run.returncode == -signal.SIGKILL and "FAILED" not in run.stderr, run.stderr
    else:
        assert "FAILED at step bind: copying /opt/conda into the cache failed" in run.stderr
        assert "this Droplet keeps its own /opt/conda (not bound, not in /etc/fstab)" in run.stderr

    # The next boot applies /etc/fstab: the Volume is mounted, nothing incomplete is bound.
    box.reboot()
    assert bound(box, catalog.CACHE_MOUNT) and not bound(box, catalog.CONDA_PREFIX)
    assert droplet_has_its_conda(box)

    box.file("/usr/local/bin/cp").unlink()
    box.file("/etc/cp-kills").unlink(missing_ok=True)
    run = p.run("cache")
    assert run.returncode == 0 and run.result["changed"] is True, run.stderr
    assert f"{catalog.CONDA_PREFIX}: copying what this Droplet has into the cache" in run.stderr
    assert (fs / "conda" / "bin" / "conda").exists() and not (fs / "conda.partial").exists()
    assert bound(box, catalog.CONDA_PREFIX) and droplet_has_its_conda(box)
    assert fstab_binds(box) == [path for _, path in catalog.CACHE_BINDS]
    box.reboot()
    assert bound(box, catalog.CONDA_PREFIX) and droplet_has_its_conda(box)
    again = p.run("cache")
    assert again.result["changed"] is False, again.stderr
    assert p.ok("conda")["changed"] is False


def test_an_incomplete_bind_an_earlier_version_left_is_undone_and_the_copy_completed(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    """What the phase used to leave after a copy cut short: every bind in fstab, the cache's
    conda folder empty. After the reboot the empty folder hid the Droplet's /opt/conda and a
    re-run said "bound"."""
    box, p = cache_turned_on_later(tmp_path, downloads, volume, droplets)
    format_ext4(volume)
    uuid = blkid(volume, "UUID")
    Path(f"{volume}.fs-uuid").write_text(uuid + "\n")
    fs = Path(f"{volume}.fs")
    (fs / "conda").mkdir(parents=True)
    (fs / "conda.partial" / "bin").mkdir(parents=True)
    (fs / ".nemotron-cache").write_text("layout 1\ncreated 2026-01-01T00:00:00Z\n")
    mnt = catalog.CACHE_MOUNT
    old_block = [
        "# nemotron-cache: begin (the bootstrap's cache phase writes this block)",
        f"UUID={uuid} {mnt} ext4 defaults,nofail,noatime,discard 0 2",
        *(
            f"{mnt}/{folder} {path} none bind,nofail,x-systemd.requires-mounts-for={mnt} 0 0"
            for folder, path in catalog.CACHE_BINDS
        ),
        "# nemotron-cache: end",
    ]
    box.file("/etc/fstab", "\n".join(old_block) + "\n")
    box.reboot()
    assert bound(box, catalog.CONDA_PREFIX) and not droplet_has_its_conda(box)

    run = p.run("cache")
    assert run.returncode == 0, run.stderr
    assert (
        f"{catalog.CONDA_PREFIX}: the cache's conda is empty, not a copy of this Droplet's: "
        "unbinding it" in run.stderr
    )
    assert f"{catalog.CONDA_PREFIX}: copying what this Droplet has into the cache" in run.stderr
    assert (fs / "conda" / "bin" / "conda").exists()
    assert bound(box, catalog.CONDA_PREFIX) and droplet_has_its_conda(box)
    assert fstab_binds(box) == [path for _, path in catalog.CACHE_BINDS]


def test_a_copy_the_cache_has_no_room_for_is_refused_before_it_starts(
    tmp_path: Path, downloads: Downloads, small_volume: Path, droplets: list[Sandbox]
) -> None:
    box, p = cache_turned_on_later(tmp_path, downloads, small_volume, droplets)
    # The Volume is ours and full: what it holds fills all of its 64 MiB (the fake df reports
    # the image's size and what its content folder holds).
    format_ext4(small_volume)
    Path(f"{small_volume}.fs-uuid").write_text(blkid(small_volume, "UUID") + "\n")
    filler = Path(f"{small_volume}.fs") / "filler"
    filler.parent.mkdir()
    filler.write_bytes(b"\0" * IMAGE_BYTES)
    run = p.failed("cache", "bind", "raise cache.sizeGb")
    assert "the cache has 0B free: not copied" in run.failure, run.failure
    assert not (Path(f"{small_volume}.fs") / "conda.partial").exists()
    assert droplet_has_its_conda(box) and not bound(box, catalog.CONDA_PREFIX)
    assert fstab_binds(box) == []

    filler.unlink()
    p.ok("cache")
    assert bound(box, catalog.CONDA_PREFIX) and droplet_has_its_conda(box)


def test_a_cache_an_earlier_version_filled_is_kept_as_it_is(
    tmp_path: Path, downloads: Downloads, volume: Path, droplets: list[Sandbox]
) -> None:
    """Its folders carry no mark of completeness: a filled one is the cache's (that version,
    too, renamed only whole copies), kept bound; an empty one shows this Droplet's own again."""
    box = droplet(tmp_path, droplets, volume)
    p = with_cache(box, downloads, volume)
    p.ok("cache")
    p.ok("conda")
    shutil.rmtree(Path(f"{volume}.fs") / ".nemotron-complete")
    run = p.run("cache")
    assert run.returncode == 0, run.stderr
    assert f"{catalog.CONDA_PREFIX}: the cache's conda is complete (kept what the cache holds)" in (
        run.stderr
    )
    assert "copying" not in run.stderr and "stopping" not in run.stderr
    assert bound(box, catalog.CONDA_PREFIX) and droplet_has_its_conda(box)
    assert fstab_binds(box) == [path for _, path in catalog.CACHE_BINDS]
    assert p.ok("cache")["changed"] is False


# ---- a Volume that is a block device, as on a Droplet ----------------------------------------


def has_cap_sys_resource() -> bool:
    """Whether this process may grow a mounted ext4 (fs/ext4/ioctl.c, EXT4_IOC_RESIZE_FS needs
    CAP_SYS_RESOURCE, capability 24): some container runtimes take it from root."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)
    return False


def reap_loop_devices() -> None:
    """Detach the loop devices a killed test run left (its image under pytest's temporary root,
    since deleted by pytest's own clean-up of old runs): a test that ends, ends its own."""
    listed = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for line in listed.stdout.splitlines():
        name, _, back = line.strip().partition(" ")
        back = back.strip()
        if "/pytest-of-" in back and back.endswith("(deleted)"):
            subprocess.run(["losetup", "--detach", name], check=False)


@pytest.fixture
def loop_device(small_volume: Path) -> Iterator[str]:
    """The Volume's image as a real block device (a loop device), detached afterwards."""
    reap_loop_devices()
    made = subprocess.run(
        ["losetup", "--find", "--show", str(small_volume)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"no loop device here: {made.stderr.strip()}")
    device = made.stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "--detach", device], check=False)


def in_image(image: Path, path: str) -> bool:
    """Whether the ext4 filesystem in `image` holds `path` (debugfs reads it, unmounted)."""
    probe = subprocess.run(
        ["debugfs", "-R", f"stat {path}", str(image)], capture_output=True, text=True, check=False
    )
    return "Inode:" in probe.stdout


def test_a_block_device_volume_is_formatted_mounted_for_real_and_its_growth_is_asked_of_the_kernel(
    tmp_path: Path,
    downloads: Downloads,
    small_volume: Path,
    loop_device: str,
    droplets: list[Sandbox],
) -> None:
    """The paths an image file never takes: the size from blockdev, the kernel's own ext4
    mount, and the online resize2fs of a grown disk (here losetup --set-capacity stands for
    DigitalOcean's resize and the SCSI rescan)."""
    # Attached as the block device: each later run (a boot, here) mounts it from fstab.
    box = droplet(tmp_path, droplets, Path(loop_device))
    p = with_cache(box, downloads, Path(loop_device))
    first = p.ok("cache")
    assert first["cache"] == "new" and blkid(small_volume, "TYPE") == "ext4"
    p.ok("conda")
    # What the conda phase installed went through the kernel's mount into the filesystem.
    assert in_image(small_volume, "/conda/bin/conda")
    assert not Path(f"{small_volume}.fs").exists(), "not the image-file fake's folder"
    assert p.ok("cache")["cache"] == "warm"

    with small_volume.open("r+b") as f:
        f.truncate(4 * IMAGE_BYTES)
    subprocess.run(["losetup", "--set-capacity", loop_device], check=True)
    run = p.run("cache")
    if has_cap_sys_resource():
        assert run.returncode == 0 and run.result["changed"] is True, run.stderr
        assert "growing its ext4 filesystem from 64MiB" in run.stderr, run.stderr
        assert filesystem_bytes(small_volume) == 4 * IMAGE_BYTES
    else:
        # The kernel refuses the online resize to this machine's root: the phase says what
        # failed and what to do, and the filesystem and what it holds are untouched.
        assert run.returncode != 0
        assert "resize2fs could not grow the filesystem to the Volume's 256MiB" in run.stderr
        assert filesystem_bytes(small_volume) == IMAGE_BYTES
    assert in_image(small_volume, "/conda/bin/conda")


# ---- the fake df: the Droplet's disks, not this machine's -------------------------------------


def test_the_fake_df_reports_the_droplets_boot_disk_and_volume_in_the_real_dfs_layout(
    tmp_path: Path, small_volume: Path
) -> None:
    """What the phases' disk checks read: the boot disk at the size's GiB, less what the sandbox
    wrote; a Volume at its image's size, less what its content holds; the real df's header and
    column layout (the phases take the last line's digits); and this machine's own paths (/run,
    an option the fake does not know) still from the real df."""
    box = Sandbox(tmp_path / "droplet", disks=True, boot_disk_gb=40)
    box.file("/var/lib/written", "x" * (3 << 20))
    format_ext4(small_volume)
    box.attach_volume(small_volume, "/dev/disk/by-id/scsi-0DO_Volume_cache")
    script = """set -e
mkdir -p /mnt/v /var/lib/hf
mount /dev/disk/by-id/scsi-0DO_Volume_cache /mnt/v
mkdir -p /mnt/v/hf && head -c 8388608 /dev/zero > /mnt/v/hf/weights
mount --bind /mnt/v/hf /var/lib/hf
echo ==; df --output=avail -BG /var/lib
echo ==; df --output=used,size -BG /var/lib
echo ==; df --output=avail -k /root
echo ==; df --output=used,size -BG /mnt/v
echo ==; df --output=avail -k /var/lib/hf
echo ==; df --output=avail -k /run
echo ==; df -P /var/lib | tail -n 1
"""
    run = box.run(script)
    assert run.returncode == 0, run.stderr
    parts = [p.strip("\n").splitlines() for p in run.stdout.split("==\n")[1:]]
    boot_kb = 40 << 20
    written_kb = int(parts[2][1])
    assert parts[0] == ["Avail", "  40G"]  # 3 MiB written: rounds up to the whole 40
    assert parts[1] == ["Used 1G-blocks", "  1G       40G"]
    assert parts[2][0] == "   Avail" and boot_kb - (4 << 10) <= written_kb < boot_kb - (3 << 10)
    assert parts[3] == ["Used 1G-blocks", "  1G        1G"]
    volume_free = int(parts[4][1])
    assert (64 << 10) - (8 << 10) - 64 <= volume_free <= (64 << 10) - (8 << 10)
    # Not a disk of the Droplet's (/run is a tmpfs there): the real df, this machine's numbers.
    real = subprocess.run(
        ["df", "--output=avail", "-k", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert abs(int(parts[5][1]) - int(real)) < (1 << 20)
    assert parts[6][0].startswith("overlay ")  # -P: the real df, unchanged
