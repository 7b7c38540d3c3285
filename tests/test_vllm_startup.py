"""vLLM's start read from its journal (scripts/vllm_startup.py, timeline.py --journal), with the
log lines the pinned vLLM itself prints: each is formatted here from that release's own source
(.vllm-venv, which ./check installs from the lock), so a vLLM that rewords one fails this test
before it silently drops out of the timeline."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import vllm_startup  # noqa: E402 (a script's module, from scripts/)

SITES = sorted((ROOT / ".vllm-venv" / "lib").glob("python*/site-packages/vllm"))
pytestmark = pytest.mark.skipif(not SITES, reason="no .vllm-venv: ./check installs it")
# What journalctl and vLLM's logger put before a message.
PREFIX = "Dec 03 17:00:01 nemotron-dev vllm[4242]: (EngineCore_DP0 pid=4300) INFO 12-03 17:00:01 [x.py:1] "


@functools.cache
def constants(relative: str) -> list[str]:
    """Every string constant of a source file of the pinned vLLM (adjacent literals joined)."""
    tree = ast.parse((SITES[-1] / relative).read_text())
    return [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def fmt(relative: str, needle: str) -> str:
    """The one format string of `relative` that contains `needle`."""
    found = sorted({c for c in constants(relative) if needle in c})
    assert len(found) == 1, f"{relative}: {needle!r} in {found}"
    return found[0]


def start(
    *,
    cached: bool,
    weights: float,
    compile_s: float,
    capture: float,
    init: float,
    prefetch: float | None = None,
) -> str:
    """One start of the pinned vLLM, in its own words (`prefetch`: with
    --safetensors-load-strategy prefetch, the seconds its read into the page cache took)."""
    utils = "model_executor/model_loader/weight_utils.py"
    graph = (
        fmt("compilation/backends.py", "Directly load the compiled graph")
        % ("", "(1, 8192)", 0.812)
        if cached
        else fmt("compilation/backends.py", "Compiling a graph for compile range")
        % ("", "(1, 8192)", 4.2)
    )
    lines = [
        fmt("v1/engine/core.py", "Initializing a V1 LLM engine") % ("0.33.0", "model=..."),
        fmt(utils, "Filesystem type for checkpoints") % ("EXT4", 7.81, 230.4),
        *([fmt(utils, "page cache finished in") % prefetch] if prefetch is not None else []),
        fmt("model_executor/model_loader/default_loader.py", "Loading weights took") % weights,
        fmt("v1/worker/gpu_model_runner.py", "Model loading took") % ("7.45", weights + 1.5),
        fmt("compilation/backends.py", "Dynamo bytecode transform time") % ("", 5.5),
        graph,
        fmt("compilation/monitor.py", "torch.compile took") % ("", compile_s),
        fmt("v1/worker/gpu_model_runner.py", "Graph capturing finished") % (capture, 0.5),
        fmt("v1/engine/core.py", "took %.2f s (compilation: %.2f s)") % (init, compile_s),
    ]
    return "\n".join(PREFIX + line for line in lines)


def test_each_part_of_a_start_is_read_from_the_pinned_vllms_own_lines() -> None:
    parts = vllm_startup.parse(
        start(cached=False, weights=3.21, compile_s=31.4, capture=12, init=48.2)
    )
    assert parts == {
        "prefetch_s": None,
        "checkpoint_fs": "EXT4",
        "checkpoint_gib": 7.81,
        "weights_s": 3.21,
        "model_load_s": pytest.approx(4.71),
        "model_load_gib": 7.45,
        "dynamo_s": 5.5,
        "compile_s": 31.4,
        "graph_capture_s": 12.0,
        "init_engine_s": 48.2,
        "compile_cache": "miss",
    }


def test_a_prefetched_start_says_how_long_the_page_cache_read_took() -> None:
    """The weights on the cache Volume are prefetched (vllm_service.load_strategy): the read
    into the page cache is its own line, and the filesystem says where the weights were."""
    text = start(cached=True, weights=1.2, compile_s=4.1, capture=11, init=20.5, prefetch=38.25)
    parts = vllm_startup.parse(text)
    assert parts["prefetch_s"] == 38.25 and parts["checkpoint_fs"] == "EXT4"
    report = vllm_startup.report(parts)
    assert re.search(r"weights read from +7\.8 GiB on EXT4$", report, re.M), report
    assert re.search(r"weights into the page cache \(prefetch\) +38\.2 s$", report, re.M), report


def test_the_last_start_counts_and_a_cache_hit_says_so() -> None:
    journal = "\n".join([
        start(cached=False, weights=3.2, compile_s=31.4, capture=12, init=48.2),
        PREFIX + "Shutting down",
        start(cached=True, weights=2.9, compile_s=4.1, capture=11, init=20.5),
    ])  # fmt: skip
    parts = vllm_startup.parse(journal)
    assert parts["compile_cache"] == "hit" and parts["compile_s"] == 4.1
    assert parts["init_engine_s"] == 20.5 and parts["weights_s"] == 2.9


def test_timeline_prints_the_start_beside_the_phases(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.json"
    service = {"start": 100.0, "end": 160.0, "seconds": 60.0, "after": []}
    outputs.write_text(json.dumps({"bootstrapTimeline": {"service": service}}))
    journal = tmp_path / "vllm.log"
    journal.write_text(start(cached=True, weights=2.9, compile_s=4.1, capture=11, init=20.5))
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "timeline.py"), "--outputs", str(outputs),
         "--journal", str(journal)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "vLLM's start (its own log lines):" in run.stdout
    assert re.search(r"torch\.compile in total +4\.1 s$", run.stdout, re.M), run.stdout
    assert "every graph came from the compile cache" in run.stdout
    # 7.45 GiB in 2.9 s (the weights' own line): 2.76 GB/s.
    assert re.search(r"weights read at +2\.76 GB/s \(7\.5 GiB per GPU in 2\.9 s", run.stdout)
    missing = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "timeline.py"), "--outputs", str(outputs),
         "--journal", str(tmp_path / "nope.log")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "--journal" in missing.stderr
