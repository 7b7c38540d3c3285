"""nemodrop/timeline.py from a stack's `bootstrapTimeline` output: the critical path drawn, a
download beside its floor (the link's speed, or the cache), the disks preflight saw, and what to
do without the output."""

from __future__ import annotations

import json
from pathlib import Path

from test_tools import (
    TIMELINE,
    run_tool,
)


def test_timeline_finds_the_critical_path_and_draws_it(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.json"
    timeline = {**TIMELINE, "old": {"start": None, "end": None, "seconds": 3.0, "after": []}}
    outputs.write_text(json.dumps({"endpoint": "https://x/v1", "bootstrapTimeline": timeline}))
    png = tmp_path / "timeline.png"
    proc = run_tool("timeline", "--outputs", str(outputs), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "bootstrap: 400 s from the first phase's start" in proc.stdout
    path_lines = proc.stdout.split("critical path (share of the wall time):\n")[1].splitlines()
    path = [line.split()[0] for line in path_lines if line.startswith("  ")]
    assert path == ["preflight", "conda", "vllm", "reboot", "reboot-wait", "service", "ready"]
    assert "  vllm             130.0 s   32.5%" in proc.stdout
    assert "no times recorded for: old" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_timeline_puts_a_download_next_to_its_floor(tmp_path: Path) -> None:
    """8 GB in 90 s is 89 MB/s; at 10 Gbit/s the same bytes take 6.4 s: 14x, marked. A cached
    run (nothing fetched) is not compared with anything."""
    outputs = tmp_path / "outputs.json"
    timeline = {**TIMELINE}
    timeline["model"] = {**TIMELINE["model"], "download_bytes": 8_000_000_000,
                         "download_seconds": 90.0}  # fmt: skip
    timeline["conda"] = {**TIMELINE["conda"], "download_bytes": 0, "download_seconds": 0.0}
    outputs.write_text(json.dumps({"bootstrapTimeline": timeline}))
    proc = run_tool("timeline", "--outputs", str(outputs))
    assert proc.returncode == 0, proc.stderr
    assert ("  model        fetched 8.00 GB in 90.0 s (89 MB/s); at 10 Gbit/s: 6.4 s  <- 14x its "
            "floor") in proc.stdout  # fmt: skip
    assert "conda        fetched" not in proc.stdout
    slower = run_tool("timeline", "--outputs", str(outputs), "--link-gbps", "2")
    assert "at 2 Gbit/s: 32.0 s" in slower.stdout and "its floor" not in slower.stdout
    outputs.write_text(json.dumps({"bootstrapTimeline": TIMELINE}))
    cached = run_tool("timeline", "--outputs", str(outputs))
    assert "downloads: nothing fetched on the runs recorded" in cached.stdout


def test_timeline_lists_the_disks_preflight_saw(tmp_path: Path) -> None:
    """Where a GPU size's scratch disk appears is not documented: preflight's list says it."""
    outputs = tmp_path / "outputs.json"
    timeline = {**TIMELINE}
    timeline["preflight"] = {**TIMELINE["preflight"], "disks": [
        {"name": "vda", "gib": 720, "mounts": "/,/boot/efi", "volume": False},
        {"name": "vdb", "gib": 5120, "mounts": "", "volume": False},
        {"name": "sda", "gib": 60, "mounts": "/mnt/nemotron-cache", "volume": True},
    ]}  # fmt: skip
    outputs.write_text(json.dumps({"bootstrapTimeline": timeline}))
    proc = run_tool("timeline", "--outputs", str(outputs))
    assert proc.returncode == 0, proc.stderr
    assert "disks the Droplet saw:" in proc.stdout
    assert "  preflight    vda            720 GiB  mounted at /,/boot/efi\n" in proc.stdout
    assert "  preflight    vdb          5,120 GiB  not mounted\n" in proc.stdout
    assert "  preflight    sda             60 GiB  mounted at /mnt/nemotron-cache, a Volume" in (
        proc.stdout
    )
    outputs.write_text(json.dumps({"bootstrapTimeline": TIMELINE}))
    assert "disks the Droplet saw" not in run_tool("timeline", "--outputs", str(outputs)).stdout


def test_timeline_without_the_output_says_what_to_do(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"endpoint": "https://x/v1"}))
    proc = run_tool("timeline", "--outputs", str(outputs))
    assert proc.returncode == 2
    assert "no bootstrapTimeline output: pulumi up with this version first" in proc.stderr
