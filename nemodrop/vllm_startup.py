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
- `%sInitial profiling/warmup run took %.2f s` (compilation/monitor.py; 0.26 without the
  prefix) and, without AOT compile, `%storch.compile and initial profiling/warmup run together
  took %.2f s in total` (compilation/decorators.py): the first forward pass, which holds
- `Warming up Mamba2 SSD Triton kernels...` (model_executor/layers/mamba/mamba_mixer2.py, INFO
  once): the hybrid models' SSD kernels compiled and autotuned; vLLM logs no end, so it ends
  at the next line (the profiling run's); it took 68-97 s on an H100 when Triton's cache missed
  and 1-3 s when it hit (docs/cache.md)
- `Available KV cache memory: %s GiB` (v1/worker/gpu_worker.py) and `%s KV cache size: %s
  tokens` (v1/core/kv_cache_utils.py; 0.26: `GPU KV cache size: %s tokens`)
- a start begins at `Initializing a V1 LLM engine (v%s) with config: %s` (v1/engine/core.py),
  its API server a little earlier at `non-default args: %s`
  (entrypoints/common/startup.py; 0.26: entrypoints/serve/utils/api_utils.py), and it serves
  from `Starting vLLM server on %s` (0.33) or `Available routes are:` (0.26)
- `Resolved architecture: %s` (config/model.py), logged once the model's class is inspected:
  in a subprocess that imports it, 17 s on the GPU run, unless vLLM's cache of that inspection
  (`VLLM_CACHE_ROOT/modelinfos`, model_executor/models/registry.py) has it: under a second
- with `TRITON_PRINT_AUTOTUNING=1` (the unit sets it), Triton's own `Triton autotuning for
  function %s,` and `finished after %.2fs,` (triton/runtime/autotuner.py): each kernel a start
  benchmarked, and for how long; on the GPU run, 7 of them made 59.5 s of a 62 s warm-up
- systemd's `Started vllm.service ...` in the unit's journal (`journalctl --output short-iso`,
  what logs.py prints): the launch itself. What comes before vLLM's first line, Python's
  imports of vLLM and torch, is timed only from it (17-18 s on the GPU run): a log without it
  says so.

Each line carries the logger's time (`INFO 12-05 18:30:01 [file.py:12]`, to the second), so the
start is also a sequence of phases, each from one of these lines to the next (`timeline`):
everything between launch and serving is in one of them, and a phase whose line is missing is
named in the report, folded into the one after it.

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
    "profile_run_s": re.compile(rf"Initial profiling/warmup run took {NUMBER} s"),
    "compile_and_profile_s": re.compile(
        rf"torch\.compile and initial profiling/warmup run together took {NUMBER} s"
    ),
    "kv_cache_gib": re.compile(rf"Available KV cache memory: {NUMBER} GiB"),
}
KV_TOKENS = re.compile(r"KV cache size: ([0-9][0-9,]*) tokens")
# Triton's autotuner, when TRITON_PRINT_AUTOTUNING is set: one run per kernel and key.
AUTOTUNED = re.compile(r"Triton autotuning for function (\w+)")
AUTOTUNE_TOOK = re.compile(rf"finished after {NUMBER}s")
MAMBA_WARMUP = "Warming up Mamba2 SSD Triton kernels"
# The phase that ends at that line, and the one that follows it (vLLM logs no end: the next line).
MAMBA_MARK = "profiling run up to the Mamba2 warm-up"
MAMBA_PHASE = "Mamba2 SSD kernel warm-up (Triton compile, autotune)"
# vLLM's logger: level, then month-day and time to the second (vllm/logger.py, _DATE_FORMAT).
STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[")
# The API server's first line of a start (its arguments), before the engine's.
LAUNCH = re.compile(r"non-default args: ")
# systemd's line for the unit's launch, in `journalctl --output short-iso` (logs.py): its local
# time, as vLLM's logger prints its own.
SYSTEMD_STARTED = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\S*\s+\S+\s+systemd\[1\]: Started "
)
# The phase from that launch to vLLM's first line, and what the report says without it.
IMPORTS = "launch to vLLM's first line: Python's imports (torch, vLLM)"
NO_LAUNCH = (
    "  launch to vLLM's first line: not in this log (Python's imports, 17-18 s on an H100 "
    "host; a journal read with logs.py has systemd's launch line, which times it)"
)
# The phases of a start, each named for what happens between the line before and its own line,
# in the order vLLM prints them.
MARKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "API server: config, model class inspected (modelinfos)",
        re.compile(r"Resolved architecture: "),
    ),
    (
        "API server: the engine's process (its imports)",
        re.compile(r"Initializing a V1 LLM engine"),
    ),
    ("engine process: device and workers", re.compile(r"Starting to load model")),
    ("model load (weights included)", PATTERNS["model_load_s"]),
    (
        "torch.compile (Dynamo, Inductor or its cache)",
        re.compile(r"torch\.compile (?:took|and initial)"),
    ),
    (MAMBA_MARK, re.compile(re.escape(MAMBA_WARMUP))),
    ("profiling run", PATTERNS["profile_run_s"]),
    ("memory profiling", PATTERNS["kv_cache_gib"]),
    ("KV cache sized", KV_TOKENS),
    ("CUDA graph capture", PATTERNS["graph_capture_s"]),
    ("rest of the engine's warm-up", PATTERNS["init_engine_s"]),
    (
        "API server: routes, ready to serve",
        re.compile(r"Starting vLLM server on|Available routes are"),
    ),
)
# Engine init time that none of vLLM's timed lines covers, past which the report says so.
UNACCOUNTED_S = 5.0
CHECKPOINT = re.compile(rf"Filesystem type for checkpoints: (\S+?)\. Checkpoint size: {NUMBER} GiB")
CACHE_HIT = re.compile(r"Directly load the compiled graph\(s\) for compile range .* from the cache")
CACHE_MISS = re.compile(r"Compiling a graph for compile range .* takes")
# Where a new start begins: the last one in a journal counts.
START = re.compile(r"Initializing a V1 LLM engine")


def stamp(line: str) -> float | None:
    """The logger's time of a line, in seconds within a year (no year in vLLM's format), or None."""
    match = STAMP.search(line)
    if not match:
        return None
    return within_year(*(int(g) for g in match.groups()))


def within_year(month: int, day: int, hour: int, minute: int, second: int) -> float:
    """A local time as seconds within a year (only differences are used, within one start)."""
    # Days before each month of a leap year.
    before = (0, 31, 60, 91, 121, 152, 182, 213, 244, 274, 305, 335)
    return (((before[month - 1] + day) * 24 + hour) * 60 + minute) * 60.0 + second


def launched(line: str) -> float | None:
    """systemd's launch of the unit, in stamp()'s seconds, or None for any other line."""
    match = SYSTEMD_STARTED.search(line)
    if not match:
        return None
    return within_year(*(int(g) for g in match.groups()[1:]))


def this_start(lines: list[str]) -> list[str]:
    """The last start's lines: from systemd's launch of it, else its API server's arguments
    (or its engine's first line)."""
    starts = [i for i, line in enumerate(lines) if START.search(line)]
    if not starts:
        return lines
    first = starts[-1]
    earlier = starts[-2] if len(starts) > 1 else -1
    launches = [i for i in range(earlier + 1, first) if LAUNCH.search(lines[i])]
    begin = launches[-1] if launches else first
    systemd = [i for i in range(earlier + 1, begin) if launched(lines[i]) is not None]
    return lines[systemd[-1] if systemd else begin :]


def phases(lines: list[str]) -> tuple[list[tuple[str, float]], list[str], str | None]:
    """The start's phases from the logger's times: (name, seconds) in order, each from one
    marking line to the next; the phases whose line is missing before the last one seen (their
    time is in the phase after them); and the last phase reached."""
    timed = [(i, t) for i, line in enumerate(lines) if (t := stamp(line)) is not None]
    if not timed:
        return [], [], None
    launch = next((t for line in lines if (t := launched(line)) is not None), None)
    found: list[tuple[int, float, str]] = []
    for name, pattern in MARKS:
        hit = next(((i, t) for i, t in timed if pattern.search(lines[i])), None)
        if hit is not None:
            found.append((*hit, name))
    found.sort()
    out: list[tuple[str, float]] = []
    previous = timed[0][1]
    if launch is not None and launch <= previous:
        out.append((IMPORTS, previous - launch))
    after_mamba = False
    for _, t, name in found:
        out.append((MAMBA_PHASE if after_mamba else name, t - previous))
        after_mamba = name == MAMBA_MARK
        previous = t
    seen = {name for _, _, name in found}
    last = found[-1][2] if found else None
    order = [name for name, _ in MARKS]
    reached = order.index(last) if last else -1
    missing = [n for n in order[:reached] if n not in seen and n != MAMBA_MARK]
    return out, missing, last


def parse(text: str) -> dict[str, Any]:
    """The start's parts in seconds (None where vLLM printed no line: eager mode has no
    compile or graph capture), and `compile_cache`: "hit", "miss", "mixed" or None; `timeline`,
    `missing` and `reached` from the logger's times (phases())."""
    lines = this_start(text.splitlines())
    out: dict[str, Any] = dict.fromkeys(PATTERNS)
    out["model_load_gib"] = None  # the weights' size in GPU memory (per GPU)
    out["checkpoint_fs"] = None  # the filesystem the weights were read from (EXT4, NFS, ...)
    out["checkpoint_gib"] = None  # the checkpoint's files, on that filesystem
    out["kv_tokens"] = None  # the KV cache, in tokens
    out["mamba_warmup_s"] = None  # its line to the next timed line
    out["autotuned"] = 0  # Triton autotuning runs (printed with TRITON_PRINT_AUTOTUNING=1)
    out["autotune_s"] = None  # their seconds together
    hits = misses = 0
    for index, line in enumerate(lines):
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
        tokens = KV_TOKENS.search(line)
        if tokens:
            out["kv_tokens"] = int(tokens[1].replace(",", ""))
        if MAMBA_WARMUP in line and (began := stamp(line)) is not None:
            ended = next((t for x in lines[index + 1 :] if (t := stamp(x)) is not None), None)
            out["mamba_warmup_s"] = None if ended is None else ended - began
        out["autotuned"] += bool(AUTOTUNED.search(line))
        if took := AUTOTUNE_TOOK.search(line):
            out["autotune_s"] = (out["autotune_s"] or 0.0) + float(took[1])
        hits += bool(CACHE_HIT.search(line))
        misses += bool(CACHE_MISS.search(line))
    out["compile_cache"] = (
        None if not (hits or misses) else "hit" if not misses else "miss" if not hits else "mixed"
    )
    out["timeline"], out["missing"], out["reached"] = phases(lines)
    return out


def unaccounted(parts: dict[str, Any]) -> float | None:
    """Seconds of the engine's init that none of vLLM's own timed lines inside it covers
    (torch.compile, the profiling run, CUDA graphs), or None without the init's line."""
    init = parts.get("init_engine_s")
    if init is None:
        return None
    inside = parts.get("compile_and_profile_s")
    if inside is None:
        inside = (parts.get("compile_s") or 0.0) + (parts.get("profile_run_s") or 0.0)
    return float(init - inside - (parts.get("graph_capture_s") or 0.0))


def report(parts: dict[str, Any]) -> str:
    """The start as lines a user reads beside the phase timeline."""
    names = {
        "prefetch_s": "weights into the page cache (prefetch)",
        "weights_s": "weights loaded",
        "model_load_s": "model loaded (weights included)",
        "dynamo_s": "Dynamo transform",
        "compile_s": "torch.compile in total",
        "profile_run_s": "profiling run (the first forward pass)",
        "compile_and_profile_s": "torch.compile and the profiling run",
        "mamba_warmup_s": "of it: Mamba2 SSD kernel warm-up",
        "graph_capture_s": "CUDA graphs captured",
        "init_engine_s": "engine init (profile, KV cache, warm-up)",
    }
    rows = [f"  {label:<42} {parts[key]:8.1f} s" for key, label in names.items()
            if parts.get(key) is not None]  # fmt: skip
    if parts.get("autotune_s") is not None:
        runs = f"of it: Triton autotuning ({parts['autotuned']} kernels)"
        after = next((i + 1 for i, row in enumerate(rows) if "Mamba2" in row), len(rows))
        rows.insert(after, f"  {runs:<42} {parts['autotune_s']:8.1f} s")
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
    if parts.get("kv_cache_gib") is not None:
        tokens = parts.get("kv_tokens")
        held = f" ({tokens:,} tokens)" if tokens is not None else ""
        rows.append(f"  {'KV cache':<42} {parts['kv_cache_gib']:8.2f} GiB{held}")
    gap = unaccounted(parts)
    if gap is not None and gap > UNACCOUNTED_S:
        rows.append(f"  {'engine init in no timed line':<42} {gap:8.1f} s (KV cache allocation, "
                    "the sampler's warm-up, or a phase this vLLM does not time)")  # fmt: skip
    timeline = parts.get("timeline") or []
    if timeline:
        rows.append("  phases, from the log's times (to the second):")
        rows += [f"    {name:<54} {seconds:6.0f} s" for name, seconds in timeline]
        total = sum(s for _, s in timeline)
        span = "launch to the last line" if timeline[0][0] == IMPORTS else "first line to last"
        rows.append(f"    {span:<54} {total:6.0f} s")
        if timeline[0][0] != IMPORTS:
            rows.append(NO_LAUNCH)
    rows += [f"  no line for {name!r}: its time is in the phase after it"
             for name in parts.get("missing") or []]  # fmt: skip
    reached = parts.get("reached")
    if reached == MAMBA_MARK:
        rows.append("  the Mamba2 warm-up began and has no end in this log: still running, or "
                    "the engine stopped there (see the log's last lines)")  # fmt: skip
    elif reached is not None and reached != MARKS[-1][0]:
        rows.append(f"  the start ends after {reached!r}: still starting, or it stopped there "
                    "(see the log's last lines)")  # fmt: skip
    if not rows:
        return "vLLM's start: none of its timing lines in this text"
    return "vLLM's start (its own log lines):\n" + "\n".join(rows)
