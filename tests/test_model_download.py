"""The model download with the real `hf` (huggingface_hub as the pinned vLLM's lock has it, from
.vllm-venv) against a Hub on loopback that cuts and stalls it mid-file (tests/support/fake_hub.py):

- a cut connection and a stall past HF_HUB_DOWNLOAD_TIMEOUT are resumed by hf itself, with a
  Range from the last whole chunk it kept: the file crosses the wire about once, not again;
- an hf that was stopped (the phase's bound, a reboot) leaves its unfinished file under a name
  no later hf reads: the model phase removes it before it downloads again, so the disk does not
  fill a model's size per stop, and counts only what it moved itself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hub import FakeHub, Fault
from sandbox import Downloads, Sandbox
from test_phase_scripts import Phases

from components.spec import catalog

ROOT = Path(__file__).resolve().parent.parent
HF_ENV = ROOT / ".vllm-venv"
HF = HF_ENV / "bin" / "hf"
pytestmark = pytest.mark.skipif(
    not HF.exists(), reason="no .vllm-venv/bin/hf: ./check installs the pinned vLLM's lock"
)

REPO = "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16"  # the dev stack's model: the phase asks for it
# huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE: hf writes what it receives in chunks of this,
# so a resumed download restarts at the last whole one.
CHUNK = 10 * 1024 * 1024
SIZE = 5 * CHUNK + 12345


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    weights = hashlib.shake_256(b"weights").digest(SIZE)  # incompressible, and the same each run
    h = FakeHub(REPO, {"config.json": b'{"architectures": ["NemotronHForCausalLM"]}',
                       "model.safetensors": weights})  # fmt: skip
    yield h
    h.close()


def hf_download(hub: FakeHub, home: Path, *, timeout: float, bound: float | None = None) -> int:
    """`hf download` as the model phase runs it, optionally under `timeout` as `bounded` does."""
    env = {**os.environ, "HF_HOME": str(home), "HF_ENDPOINT": hub.url,
           "HF_HUB_DOWNLOAD_TIMEOUT": str(timeout), "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
    command = [str(HF), "download", REPO, "--revision", "main"]
    if bound is not None:
        command = ["timeout", str(bound), *command]
    return subprocess.run(
        command, env=env, capture_output=True, timeout=120, check=False
    ).returncode


def blobs(home: Path) -> dict[str, int]:
    folder = home / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs"
    return {p.name: p.stat().st_size for p in folder.iterdir()} if folder.is_dir() else {}


def test_a_cut_and_a_stalled_download_resume_where_they_stopped(
    hub: FakeHub, tmp_path: Path
) -> None:
    cut, stall = 2 * CHUNK + 4096, 4 * CHUNK + 777
    hub.faults["model.safetensors"] = [Fault("cut", cut), Fault("stall", stall, seconds=6)]
    started = time.monotonic()
    assert hf_download(hub, tmp_path, timeout=2) == 0
    assert time.monotonic() - started < 60
    gets = [g for g in hub.gets if g.file == "model.safetensors"]
    # The first answer ends at the cut; the second asks from the last whole chunk before it and
    # ends at the stall; the third asks from the last whole chunk before that, and ends the file.
    assert [g.range for g in gets] == [None, f"bytes={2 * CHUNK}-", f"bytes={4 * CHUNK}-"]
    assert [g.sent for g in gets] == [cut, stall - 2 * CHUNK, SIZE - 4 * CHUNK]
    assert hub.sent("model.safetensors") < SIZE + 2 * CHUNK, "resumed, not fetched again"
    weights = hub.files["model.safetensors"]
    assert blobs(tmp_path) == {
        hub.etag("model.safetensors"): SIZE,
        hub.etag("config.json"): len(hub.files["config.json"]),
    }
    blob = next(tmp_path.glob(f"hub/*/blobs/{hub.etag('model.safetensors')}"))
    assert hashlib.sha256(blob.read_bytes()).digest() == hashlib.sha256(weights).digest()


def test_a_stopped_download_leaves_a_file_no_later_hf_reads(hub: FakeHub, tmp_path: Path) -> None:
    """What the model phase cleans up after: the locked hf's own behaviour, held here so that a
    new huggingface_hub that resumes across runs shows up as a failing test, not as a cleanup
    that throws work away."""
    hub.faults["model.safetensors"] = [Fault("stall", 3 * CHUNK + 5, seconds=20)]
    assert hf_download(hub, tmp_path, timeout=60, bound=4) == 124
    left = {name: size for name, size in blobs(tmp_path).items() if name.endswith(".incomplete")}
    assert list(left.values()) == [3 * CHUNK], left
    assert next(iter(left)).startswith(hub.etag("model.safetensors") + ".")
    requests = len(hub.gets)
    assert hf_download(hub, tmp_path, timeout=60) == 0
    assert hub.gets[requests:][-1].range is None, "the next hf starts the file again from 0"
    assert set(blobs(tmp_path)) >= set(left), "and leaves the stopped one's file where it was"


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Sandbox]:
    s = Sandbox(tmp_path / "droplet")
    yield s
    s.stop_services()


def test_the_model_phase_removes_what_a_stopped_download_left_and_counts_what_it_moved(
    box: Sandbox, downloads: Downloads, hub: FakeHub
) -> None:
    p = Phases(box, downloads)
    p.extra["model"] = {"NEMO_HF_ENV": str(HF_ENV), "NEMO_HF_ENDPOINT": hub.url}
    # A first try stopped mid-file (as the phase's bound or a reboot stops it), on this disk.
    hf_home = box.upper / catalog.HF_HOME.lstrip("/")
    hub.faults["model.safetensors"] = [Fault("stall", 3 * CHUNK + 5, seconds=20)]
    assert hf_download(hub, hf_home, timeout=60, bound=4) == 124
    assert any(name.endswith(".incomplete") for name in blobs(hf_home))
    run = p.run("model")
    assert run.returncode == 0, run.stderr
    assert "[model] removed 1 unfinished file(s), 31 MB, that a stopped download left" in run.stderr
    assert blobs(hf_home) == {
        hub.etag("model.safetensors"): SIZE,
        hub.etag("config.json"): len(hub.files["config.json"]),
    }
    # What this run moved: the weights (the config came whole with the first try), once.
    assert run.result["download_bytes"] == SIZE
    assert run.result["model"] == f"{REPO}@main" and run.result["files"] == 2
    assert not (box.upper / catalog.STATE_DIR.lstrip("/") / "hf-download.err").exists()
    again = p.run("model")
    assert again.result["changed"] is False and "no download" in again.stderr
    shutil.rmtree(hf_home)
