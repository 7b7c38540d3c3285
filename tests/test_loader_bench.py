"""scripts/loader_bench.py for real under the pinned vLLM (.vllm-venv), on a tiny checkpoint:
every loader has its row, each run read every tensor written, the rates agree with the bytes and
seconds, and what cannot be measured here says why. Nothing depends on the machine's speed."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
TOOL = ROOT / "scripts" / "loader_bench.py"
sys.path.insert(0, str(ROOT / "scripts"))
import loader_bench  # noqa: E402 (a script's module, from scripts/: stdlib imports only)

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="no .vllm-venv/bin/python: ./check installs the pinned vLLM"
)
KEYS = ["lazy", "eager", "prefetch", "multithread", "runai_streamer", "fastsafetensors",
        "instanttensor"]  # fmt: skip
RUNS = 2
GB = 0.05


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VLLM_PYTHON), str(TOOL), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    """One real run: 0.05 GB in shards of 0.02 GB (three), two runs each, two threads."""
    folder = tmp_path_factory.mktemp("loader_bench")
    out = folder / "out.json"
    proc = run_tool("--gb", str(GB), "--runs", str(RUNS), "--threads", "2", "--shard-gb",
                    "0.02", "--dir", str(folder), "--json", str(out))  # fmt: skip
    if "is in memory" in proc.stderr:
        pytest.skip(f"pytest's tmp folder is not on a disk: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout, folder


def measured(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for row in result["loaders"] if row["measured"]]


def test_every_loader_has_a_row(bench: tuple[dict[str, Any], str, Path]) -> None:
    result, stdout, _ = bench
    assert [row["key"] for row in result["loaders"]] == KEYS
    for row in [result["baseline"], *result["loaders"]]:
        assert row["label"] in stdout
    # The default and the strategies of DefaultModelLoader are always measurable on a CPU.
    assert {row["key"] for row in measured(result)} >= {"lazy", "eager", "prefetch", "multithread"}
    assert "--safetensors-load-strategy eager" in stdout
    assert '"num_threads": 2' in stdout


def test_every_run_read_the_tensors_written(bench: tuple[dict[str, Any], str, Path]) -> None:
    result, _, _ = bench
    ck = result["checkpoint"]
    # The layout the tool wrote, recomputed here: 263 tensors whatever the size, ~0.05 GB.
    shapes = [shape for _, shape in loader_bench.layout(ck["scale"])]
    assert ck["tensors"] == len(shapes) == 263
    assert ck["tensor_bytes"] == sum(loader_bench.nbytes(s) for s in shapes)
    assert ck["tensor_bytes"] == pytest.approx(GB * 1e9, rel=0.05)
    assert ck["shards"] == len(ck["files"]) == 3
    assert ck["tensor_bytes"] < ck["file_bytes"] < ck["tensor_bytes"] + 3 * 64 * 1024  # headers
    for row in measured(result):
        for phase in ("cold", "warm"):
            assert len(row[phase]) == RUNS, (row["key"], phase)
            for run in row[phase]:
                assert (run["tensors"], run["bytes"]) == (ck["tensors"], ck["tensor_bytes"])
    for run in result["baseline"]["cold"] + result["baseline"]["warm"]:
        assert run["bytes"] == ck["file_bytes"]


def test_rates_agree_with_bytes_and_seconds(bench: tuple[dict[str, Any], str, Path]) -> None:
    result, _, _ = bench
    for row in [result["baseline"], *measured(result)]:
        for phase in ("cold", "warm"):
            runs = row[phase]
            for run in runs:
                assert run["seconds"] > 0 and run["gbps"] > 0
                assert run["gbps"] * 1e9 * run["seconds"] == pytest.approx(run["bytes"], rel=1e-9)
            rates = [run["gbps"] for run in runs]
            assert row[f"{phase}_summary"] == {
                "median_gbps": statistics.median(rates),
                "min_gbps": min(rates),
                "max_gbps": max(rates),
            }


def test_cold_runs_start_uncached_and_warm_runs_cached(
    bench: tuple[dict[str, Any], str, Path],
) -> None:
    result, stdout, _ = bench
    for row in [result["baseline"], *measured(result)]:
        assert all(run["resident_before"] <= 0.01 for run in row["cold"]), row["key"]
        assert all(run["resident_before"] >= 0.99 for run in row["warm"]), row["key"]
    assert "not in their phase's cache state" not in stdout


def test_unmeasured_loaders_say_why(bench: tuple[dict[str, Any], str, Path]) -> None:
    result, stdout, _ = bench
    rows = {row["key"]: row for row in result["loaders"]}
    for key in ("fastsafetensors", "instanttensor"):
        assert not rows[key]["measured"] and not rows[key]["cold"]
        assert "CUDA memory" in rows[key]["reason"]
        assert f"{rows[key]['label']:<26} not measured: {rows[key]['reason']}" in stdout
    runai = rows["runai_streamer"]
    if not runai["measured"]:
        assert "pip install 'vllm[runai]' (runai-model-streamer" in runai["reason"]
        assert "runai_streamer             not measured: " in stdout


def test_json_holds_the_table_and_the_machine(bench: tuple[dict[str, Any], str, Path]) -> None:
    result, stdout, folder = bench
    assert result["table"] == stdout.rstrip("\n")
    machine = result["machine"]
    assert machine["cpus"] >= 1 and machine["disk"]["fstype"] and machine["disk"]["device"]
    assert machine["vllm"] == "0.33.0"
    # The generated checkpoint is gone: only the JSON is left.
    assert sorted(p.name for p in folder.iterdir()) == ["out.json"]


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    for flag in ("--gb", "--runs", "--threads", "--shard-gb"):
        proc = run_tool(flag, "0", "--dir", str(tmp_path / "never"))
        assert proc.returncode == 2, proc.stderr
        assert f"{flag} must be positive" in proc.stderr
    assert not (tmp_path / "never").exists()
