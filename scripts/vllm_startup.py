"""Where vLLM's start went, read from its own log lines: weights, model load, torch.compile (and
whether its cache hit), CUDA graph capture, memory profiling, the engine's whole init.

The lines are the pinned vLLM's (0.33; tests/test_vllm_startup.py formats each from that
release's own source and reads it back):
- `Filesystem type for checkpoints: %s. Checkpoint size: %.2f GiB. Available RAM: %.2f GiB.`
  and `Prefetching checkpoint files into page cache finished in %.2fs`
  (model_executor/model_loader/weight_utils.py): where the weights were read from, and how
  long `--safetensors-load-strategy prefetch` took to read them all into the page cache
- `Loading weights took %.2f seconds` (model_executor/model_loader/default_loader.py)
- `Model loading took %s GiB memory and %.6f seconds` (v1/worker/gpu_model_runner.py)
- `%sDynamo bytecode transform time: %.2f s` (compilation/backends.py)
- `%sDirectly load the compiled graph(s) for compile range %s from the cache, took %.3f s`
  and `%sCompiling a graph for compile range %s takes %.2f s` (compilation/backends.py): a
  graph from the compile cache, or compiled now
- `%storch.compile took %.2f s in total` (compilation/monitor.py)
- `Graph capturing finished in %.0f secs, took %.2f GiB` (v1/worker/gpu_model_runner.py)
- `init engine (profile, create kv cache, warmup model) took %.2f s` (v1/engine/core.py): the
  memory profiling, the KV cache and the warm-up (the profile's own line is logged at DEBUG
  only: v1/worker/gpu_worker.py)
- a start begins at `Initializing a V1 LLM engine (v%s) with config: %s` (v1/engine/core.py)

Any prefix (the journal's, the logger's, a worker's `(EngineCore_DP0 pid=…)`) is ignored; the
last start in the text counts (a journal may hold several).
"""

from __future__ import annotations

import re
from typing import Any

NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
PATTERNS: dict[str, re.Pattern[str]] = {
    "prefetch_s": re.compile(
        rf"Prefetching checkpoint files into page cache finished in {NUMBER}s"
    ),
    "weights_s": re.compile(rf"Loading weights took {NUMBER} seconds"),
    "model_load_s": re.compile(rf"Model loading took {NUMBER} GiB memory and {NUMBER} seconds"),
    "dynamo_s": re.compile(rf"Dynamo bytecode transform time: {NUMBER} s"),
    "compile_s": re.compile(rf"torch\.compile took {NUMBER} s in total"),
    "graph_capture_s": re.compile(rf"Graph capturing finished in {NUMBER} secs"),
    "init_engine_s": re.compile(
        rf"init engine \(profile, create kv cache, warmup model\) took {NUMBER} s"
    ),
}
CHECKPOINT = re.compile(rf"Filesystem type for checkpoints: (\S+?)\. Checkpoint size: {NUMBER} GiB")
CACHE_HIT = re.compile(r"Directly load the compiled graph\(s\) for compile range .* from the cache")
CACHE_MISS = re.compile(r"Compiling a graph for compile range .* takes")
# Where a new start begins: the last one in a journal counts.
START = re.compile(r"Initializing a V1 LLM engine")


def parse(text: str) -> dict[str, Any]:
    """The start's parts in seconds (None where vLLM printed no line: eager mode has no
    compile or graph capture), and `compile_cache`: "hit", "miss", "mixed" or None."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if START.search(line)]
    lines = lines[starts[-1] :] if starts else lines
    out: dict[str, Any] = dict.fromkeys(PATTERNS)
    out["model_load_gib"] = None  # the weights' size in GPU memory (per GPU)
    out["checkpoint_fs"] = None  # the filesystem the weights were read from (EXT4, NFS, ...)
    out["checkpoint_gib"] = None  # the checkpoint's files, on that filesystem
    hits = misses = 0
    for line in lines:
        for key, pattern in PATTERNS.items():
            match = pattern.search(line)
            if match:
                # Model loading's first number is GiB; its seconds come second.
                out[key] = float(match.group(2 if key == "model_load_s" else 1))
                if key == "model_load_s":
                    out["model_load_gib"] = float(match.group(1))
        checkpoint = CHECKPOINT.search(line)
        if checkpoint:
            out["checkpoint_fs"], out["checkpoint_gib"] = checkpoint[1], float(checkpoint[2])
        hits += bool(CACHE_HIT.search(line))
        misses += bool(CACHE_MISS.search(line))
    out["compile_cache"] = (
        None if not (hits or misses) else "hit" if not misses else "miss" if not hits else "mixed"
    )
    return out


def report(parts: dict[str, Any]) -> str:
    """The start as lines a user reads beside the phase timeline."""
    names = {
        "prefetch_s": "weights into the page cache (prefetch)",
        "weights_s": "weights loaded",
        "model_load_s": "model loaded (weights included)",
        "dynamo_s": "Dynamo transform",
        "compile_s": "torch.compile in total",
        "graph_capture_s": "CUDA graphs captured",
        "init_engine_s": "engine init (profile, KV cache, warm-up)",
    }
    rows = [f"  {label:<42} {parts[key]:8.1f} s" for key, label in names.items()
            if parts.get(key) is not None]  # fmt: skip
    if parts.get("checkpoint_fs") is not None:
        rows.insert(0, f"  {'weights read from':<42} {parts['checkpoint_gib']:.1f} GiB on "
                       f"{parts['checkpoint_fs']}")  # fmt: skip
    cache = parts.get("compile_cache")
    if cache is not None:
        said = {
            "hit": "every graph came from the compile cache",
            "miss": "compiled now (no cache, or a new vLLM or new flags)",
            "mixed": "some graphs from the cache, some compiled now",
        }[cache]
        rows.append(f"  {'compile cache':<42} {said}")
    if not rows:
        return "vLLM's start: none of its timing lines in this text"
    return "vLLM's start (its own log lines):\n" + "\n".join(rows)
