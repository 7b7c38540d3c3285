"""vLLM's start read from its journal (nemodrop/vllm_startup.py, timeline.py --journal), with the
log lines the pinned vLLM itself prints: each is formatted here from that release's own source
(.vllm-venv, which ./check installs from the lock), so a vLLM that rewords one fails this test
before it silently drops out of the timeline."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
from pathlib import Path

import nemodrop_cli
import pytest

from nemodrop import vllm_startup

ROOT = Path(__file__).resolve().parent.parent

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
        # Not in this start's lines: the lines that time a hybrid model's start.
        "profile_run_s": None,
        "compile_and_profile_s": None,
        "kv_cache_gib": None,
        "kv_tokens": None,
        "mamba_warmup_s": None,
        "autotuned": 0,
        "autotune_s": None,
        # Every line at one second: phases of 0 s, and the lines it lacks named.
        "timeline": [
            ("API server: the engine's process (its imports)", 0.0),
            ("model load (weights included)", 0.0),
            ("torch.compile (Dynamo, Inductor or its cache)", 0.0),
            ("CUDA graph capture", 0.0),
            ("rest of the engine's warm-up", 0.0),
        ],
        "missing": [
            "API server: config, model class inspected (modelinfos)",
            "engine process: device and workers",
            "profiling run",
            "memory profiling",
            "KV cache sized",
        ],
        "reached": "rest of the engine's warm-up",
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
        [*nemodrop_cli.argv("timeline"), "--outputs", str(outputs),
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
        [*nemodrop_cli.argv("timeline"), "--outputs", str(outputs),
         "--journal", str(tmp_path / "nope.log")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "--journal" in missing.stderr


# A cold start of the prod flags' nano30b geometry on an H100 (vLLM 0.26.0, ../shared/gpu's kit,
# 2026-12-05): the seconds from each marking line to the next, as the logger timed them.
COLD_NANO30B = (
    ("API server: config, model class inspected (modelinfos)", 17),
    ("API server: the engine's process (its imports)", 27),
    ("engine process: device and workers", 21),
    ("model load (weights included)", 3),
    ("torch.compile (Dynamo, Inductor or its cache)", 17),
    ("profiling run up to the Mamba2 warm-up", 1),
    ("Mamba2 SSD kernel warm-up (Triton compile, autotune)", 97),
    ("memory profiling", 1),
    ("KV cache sized", 1),
    ("CUDA graph capture", 15),
    ("rest of the engine's warm-up", 17),
    ("API server: routes, ready to serve", 3),
)


def timed_start(gaps: tuple[tuple[str, int], ...] = COLD_NANO30B, drop: str = "") -> str:
    """One start in the pinned vLLM's words with the logger's times: each line `gaps[i]` seconds
    after the one before (`drop`: leave out the line that contains it)."""
    runner = "v1/worker/gpu_model_runner.py"
    monitor = "compilation/monitor.py"
    seconds = dict(gaps)
    lines = [
        ("APIServer", fmt("entrypoints/common/startup.py", "non-default args") % "{...}"),
        ("APIServer", fmt("config/model.py", "Resolved architecture") % "NemotronHForCausalLM"),
        ("EngineCore", fmt("v1/engine/core.py", "Initializing a V1 LLM engine") % ("0.33.0", "")),
        ("EngineCore", fmt(runner, "Starting to load model") % "/models/nano30b"),
        ("EngineCore", fmt(runner, "Model loading took") % ("58.95", 2.6)),
        ("EngineCore", fmt(monitor, "torch.compile took") % ("", 16.3)),
        ("EngineCore", fmt("model_executor/layers/mamba/mamba_mixer2.py", "Warming up Mamba2")),
        ("EngineCore", fmt(monitor, "Initial profiling/warmup run took") % ("", 98.4)),
        ("EngineCore", fmt("v1/worker/gpu_worker.py", "Available KV cache memory") % "12.13"),
        (
            "EngineCore",
            fmt("v1/core/kv_cache_utils.py", "KV cache size: ")
            % ("GPU", "3,695,502", "131,072", 28.19),
        ),
        ("EngineCore", fmt(runner, "Graph capturing finished") % (15, 0.62)),
        (
            "EngineCore",
            fmt("v1/engine/core.py", "took %.2f s (compilation: %.2f s)") % (149.2, 16.3),
        ),
        (
            "APIServer",
            fmt("entrypoints/launchers/api_server/entry.py", "Starting vLLM server on")
            % "http://127.0.0.1:8000",
        ),
    ]
    # The seconds before each line after the first: the phase that ends at it.
    befores = [0, *seconds.values()]
    clock, out = 17 * 3600 + 59 * 60, []
    for (process, message), before in zip(lines, befores, strict=True):
        clock += before
        if drop and drop in message:
            continue
        hms = f"{clock // 3600:02d}:{clock // 60 % 60:02d}:{clock % 60:02d}"
        out.append(f"({process} pid=4300) INFO 12-05 {hms} [x.py:1] {message}")
    return "\n".join(out)


def test_every_phase_of_a_start_is_timed_from_the_logs_own_clock() -> None:
    """launch to serving is the sum of its phases, the Mamba2 warm-up one of them: vLLM logs
    only its beginning, and the profiling run's line ends it."""
    parts = vllm_startup.parse(timed_start())
    assert parts["timeline"] == [(name, float(s)) for name, s in COLD_NANO30B]
    assert parts["missing"] == [] and parts["reached"] == COLD_NANO30B[-1][0]
    assert parts["mamba_warmup_s"] == 97.0 and parts["profile_run_s"] == 98.4
    assert parts["kv_cache_gib"] == 12.13 and parts["kv_tokens"] == 3_695_502
    report = vllm_startup.report(parts)
    assert re.search(r"Mamba2 SSD kernel warm-up \(Triton compile, autotune\) +97 s$", report, re.M)
    # No systemd line in a log alone: the span is the log's own, and the report says what it
    # cannot see.
    assert re.search(r"first line to last +220 s$", report, re.M), report
    assert "launch to vLLM's first line: not in this log" in report
    assert re.search(r"KV cache +12\.13 GiB \(3,695,502 tokens\)$", report, re.M), report
    # compile 16.3 + profiling run 98.4 + graphs 15 of 149.2: 19.5 s in no timed line.
    assert re.search(r"engine init in no timed line +19\.5 s", report), report


def test_a_start_missing_a_line_says_which_and_where_its_time_went() -> None:
    parts = vllm_startup.parse(timed_start(drop="Model loading took"))
    assert parts["missing"] == ["model load (weights included)"]
    names = [name for name, _ in parts["timeline"]]
    assert "model load (weights included)" not in names
    # Its 3 s are in the phase after it: still 220 s from launch to serving.
    assert sum(s for _, s in parts["timeline"]) == 220
    report = vllm_startup.report(parts)
    assert (
        "no line for 'model load (weights included)': its time is in the phase after it" in report
    )


def test_a_log_cut_in_the_mamba2_warm_up_says_it_never_ended() -> None:
    text = timed_start()
    cut = text[: text.index("Initial profiling/warmup run took")].rsplit("\n", 1)[0]
    parts = vllm_startup.parse(cut)
    assert parts["mamba_warmup_s"] is None and parts["reached"] == vllm_startup.MAMBA_MARK
    assert "the Mamba2 warm-up began and has no end in this log" in vllm_startup.report(parts)


def test_a_warm_start_whose_triton_cache_hit_shows_a_short_warm_up() -> None:
    """The same start with Triton's kernels and autotune results found: 2 s of warm-up (the
    kit's fast starts), every other phase as it was."""
    warm = tuple((n, 2 if n.startswith("Mamba2") else s) for n, s in COLD_NANO30B)
    parts = vllm_startup.parse(timed_start(warm))
    assert parts["mamba_warmup_s"] == 2.0
    assert sum(s for _, s in parts["timeline"]) == 220 - 95
