#!/usr/bin/env python3
"""How fast the pinned vLLM's weight loaders read a checkpoint from this machine's disk into CPU
memory, side by side, in GB/s (1 GB = 10^9 bytes).

    .vllm-venv/bin/python scripts/loader_bench.py --gb 8 --runs 3 --json loaders.json

What it measures. A sharded safetensors checkpoint is generated (bf16, random bytes, shards of at
most `--shard-gb`, 5 GB like Hugging Face's default `max_shard_size`) whose tensors follow
NVIDIA-Nemotron-3-Nano-4B-BF16 (the project's default model, about 7.9 GB): its NemotronH
config as transcribed in public code (hidden 3136, vocab 131072, 42 layers of pattern
`M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-`: 21 Mamba-2, 4 attention, 17 MLP), named as in
the Hub's checkpoint. An approximation, not the checkpoint: a big embedding and lm_head, then per
layer a norm and mid-size matrices (in_proj/out_proj, q/k/v/o, up/down) with small vectors
(conv1d, A_log, D, dt_bias); everything bf16; for another `--gb` every width (vocab, hidden,
intermediate, head dims, SSM state) is scaled by one factor, so the tensor count stays 263.
Every tensor is read through vLLM's own iterator for each loader (the function its
DefaultModelLoader or RunaiModelStreamerLoader calls) and copied into one preallocated CPU
buffer, so a lazily memory-mapped tensor's bytes are really read (and its first and last bytes
checked against what was written). A run is timed from the iterator's creation to its last
tensor:
- cold: before the run the files are fsync'd and evicted from the page cache
  (posix_fadvise DONTNEED), and the share still resident is measured (mincore) and reported;
- warm: every page of the files is in the page cache (read once before the warm runs).
Loaders run round-robin, `--runs` times each; median, min and max are reported, with a plain
read of the files (no vLLM, 16 MiB blocks into one buffer) for reference: cold, the disk's pace;
warm, the page cache's copy to user memory.

What it does not measure. Loading onto a GPU (no H2D copy, no weight_loader, no
quantization): fastsafetensors and instanttensor load into CUDA memory only, so they are named
with that reason, not timed. runai_streamer is timed when `runai_model_streamer` imports (the
extra `vllm[runai]`, not in the lock). Caches below this kernel (a hypervisor's under a virtual
disk, a drive's own) are out of reach: on a VM, cold can be faster than the disk. The page cache
is never dropped globally (no /proc/sys/vm/drop_caches).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import math
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GB = 1e9
BLOCK = 16 * 1024 * 1024  # the plain read's block, vLLM's DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE
# DefaultModelLoader.DEFAULT_NUM_THREADS (default_loader.py): num_threads when unset.
DEFAULT_THREADS = 8
# NVIDIA-Nemotron-3-Nano-4B-BF16's config.json (model_type nemotron_h), as transcribed in public
# code (not fetched here). "M" Mamba-2, "*" attention, "-" MLP (relu2: up and down only).
NANO_4B = {
    "vocab_size": 131_072,
    "hidden_size": 3136,
    "intermediate_size": 12_544,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "mamba_num_heads": 96,
    "mamba_head_dim": 80,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
}
PATTERN = "M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-"
SCALED = ("vocab_size", "hidden_size", "intermediate_size", "head_dim", "mamba_head_dim",
          "ssm_state_size")  # fmt: skip

Shape = tuple[int, ...]


class BenchError(Exception):
    """A failure to report in one line (exit status 1)."""


@dataclass(frozen=True)
class Runtime:
    """torch, numpy, safetensors and vLLM's weight_utils, imported at run time: they live in
    .vllm-venv, not in the .venv that lints and type-checks scripts/."""

    torch: Any
    numpy: Any
    save_file: Any
    weight_utils: Any


@dataclass(frozen=True)
class Written:
    """What the generated checkpoint holds: the reads are checked against it."""

    files: list[Path]
    heads: dict[str, tuple[int, bytes, bytes]]  # name: (bytes, first 8 bytes, last 8 bytes)

    @property
    def tensor_bytes(self) -> int:
        return sum(n for n, _, _ in self.heads.values())


@dataclass(frozen=True)
class Loader:
    key: str
    label: str
    flags: str  # what selects it on `vllm serve`
    read: Callable[[list[str]], Iterator[tuple[str, Any]]] | None  # None: not measured
    reason: str = ""  # why it is not measured


@dataclass
class Run:
    seconds: float
    bytes: int
    tensors: int
    resident_before: float  # the files' share in the page cache when the run started
    gbps: float = 0.0

    def __post_init__(self) -> None:
        self.gbps = self.bytes / self.seconds / GB


@dataclass
class Row:
    key: str
    label: str
    flags: str
    measured: bool
    reason: str = ""
    cold: list[Run] = field(default_factory=list)
    warm: list[Run] = field(default_factory=list)


def import_runtime() -> Runtime:
    """The run-time modules, offline and with vLLM's logging at warnings."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return Runtime(
            torch=importlib.import_module("torch"),
            numpy=importlib.import_module("numpy"),
            save_file=importlib.import_module("safetensors.torch").save_file,
            weight_utils=importlib.import_module("vllm.model_executor.model_loader.weight_utils"),
        )
    except ImportError as e:
        raise BenchError(
            f"{e}: run this with .vllm-venv/bin/python (./check installs the pinned vLLM there)"
        ) from e


def layout(scale: float) -> list[tuple[str, Shape]]:
    """The checkpoint's tensors in the Hub's order, every width scaled by `scale` (1: the 4B)."""
    c = {k: max(1, round(v * scale)) if k in SCALED else v for k, v in NANO_4B.items()}
    vocab, hidden, inter = c["vocab_size"], c["hidden_size"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    heads = c["mamba_num_heads"]
    d_inner = heads * c["mamba_head_dim"]
    conv_dim = d_inner + 2 * c["n_groups"] * c["ssm_state_size"]  # x, B, C
    tensors: list[tuple[str, Shape]] = [("backbone.embeddings.weight", (vocab, hidden))]
    for i, kind in enumerate(PATTERN):
        tensors.append((f"backbone.layers.{i}.norm.weight", (hidden,)))
        m = f"backbone.layers.{i}.mixer."
        if kind == "M":
            tensors += [
                (m + "in_proj.weight", (d_inner + conv_dim + heads, hidden)),  # z, xBC, dt
                (m + "conv1d.weight", (conv_dim, 1, c["conv_kernel"])),
                (m + "conv1d.bias", (conv_dim,)),
                (m + "dt_bias", (heads,)),
                (m + "A_log", (heads,)),
                (m + "D", (heads,)),
                (m + "norm.weight", (d_inner,)),
                (m + "out_proj.weight", (hidden, d_inner)),
            ]
        elif kind == "*":
            tensors += [
                (m + "q_proj.weight", (q, hidden)),
                (m + "k_proj.weight", (kv, hidden)),
                (m + "v_proj.weight", (kv, hidden)),
                (m + "o_proj.weight", (hidden, q)),
            ]
        else:
            tensors += [(m + "up_proj.weight", (inter, hidden)),
                        (m + "down_proj.weight", (hidden, inter))]  # fmt: skip
    return [*tensors, ("backbone.norm_f.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def nbytes(shape: Shape) -> int:
    return 2 * math.prod(shape)  # bf16


def scale_for(total_bytes: float) -> float:
    """The width factor whose layout comes closest to `total_bytes` (matrices grow as its
    square; a few refinements absorb the rounding and the vectors)."""
    scale = 1.0
    for _ in range(4):
        scale *= math.sqrt(total_bytes / sum(nbytes(s) for _, s in layout(scale)))
    return scale


def plan_shards(
    tensors: list[tuple[str, Shape]], max_bytes: float
) -> list[list[tuple[str, Shape]]]:
    """Hugging Face's sharding: tensors in order, a new shard when the next would overflow."""
    shards: list[list[tuple[str, Shape]]] = [[]]
    size = 0
    for name, shape in tensors:
        if shards[-1] and size + nbytes(shape) > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes(shape)
    return shards


def evict(files: list[Path]) -> None:
    """Write back, then drop the files' pages from the page cache (this file's pages only)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def write_checkpoint(rt: Runtime, folder: Path, shards: list[list[tuple[str, Shape]]]) -> Written:
    """The shards as model-0000i-of-0000n.safetensors, random bf16 bits, out of the page cache."""
    torch, rng = rt.torch, rt.numpy.random.default_rng(0)
    files, heads = [], {}
    for i, shard in enumerate(shards, 1):
        tensors = {}
        for name, shape in shard:
            t = torch.empty(shape, dtype=torch.bfloat16)
            raw = t.view(-1).view(torch.uint8).numpy()
            raw[:] = rng.bit_generator.random_raw(-(-raw.size // 8)).view("uint8")[: raw.size]
            heads[name] = (raw.size, raw[:8].tobytes(), raw[-8:].tobytes())
            tensors[name] = t
        path = folder / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        rt.save_file(tensors, str(path), metadata={"format": "pt"})
        del tensors
        files.append(path)
        evict([path])
    return Written(files, heads)


def resident_fraction(files: list[Path]) -> float:
    """The share of the files' pages in the page cache now: mincore(2) on a private mapping,
    which reads nothing."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    resident = total = 0
    for path in files:
        size = path.stat().st_size
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
            anchor = ctypes.c_char.from_buffer(mm)
            status = libc.mincore(ctypes.addressof(anchor), size, vec)
            del anchor  # the mapping closes only once nothing points into it
        if status != 0:
            raise BenchError(f"mincore on {path}: {os.strerror(ctypes.get_errno())}")
        resident += pages - bytes(vec).count(0)
        total += pages
    return resident / total


def plain_read(files: list[Path]) -> int:
    """The files read front to back in 16 MiB blocks into one reused buffer: the bytes read."""
    block = memoryview(bytearray(BLOCK))
    done = 0
    for path in files:
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(block):
                done += n
    return done


def timed_plain_read(files: list[Path]) -> Run:
    resident = resident_fraction(files)
    start = time.perf_counter()
    done = plain_read(files)
    return Run(time.perf_counter() - start, done, 0, resident)


def timed_load(rt: Runtime, loader: Loader, written: Written, sink: Any) -> Run:
    """One pass of `loader` over the checkpoint: each tensor copied into `sink` (a lazy mmap'd
    tensor is read then), its size and end bytes checked; the time excludes the check and any
    background thread the loader leaves running (prefetch's), which is joined after."""
    assert loader.read is not None
    resident = resident_fraction(written.files)
    before = set(threading.enumerate())
    seen: dict[str, tuple[int, bytes, bytes]] = {}
    checking = 0.0
    start = time.perf_counter()
    for name, tensor in loader.read([str(p) for p in written.files]):
        raw = tensor.reshape(-1).view(rt.torch.uint8)
        n = raw.numel()
        sink[:n].copy_(raw)
        mark = time.perf_counter()
        if name in seen:
            raise BenchError(f"{loader.label}: tensor {name} came twice")
        got = sink[:n].numpy()
        seen[name] = (n, got[:8].tobytes(), got[-8:].tobytes())
        checking += time.perf_counter() - mark
        del tensor, raw
    seconds = time.perf_counter() - start - checking
    # vLLM's prefetch thread (weight_utils._prefetch_all_checkpoints: Thread(target=_run_prefetch),
    # named after its target) may outlive the iterator: the next run must not share the disk.
    for thread in set(threading.enumerate()) - before:
        if thread.name.endswith("(_run_prefetch)"):
            thread.join()
    if seen != written.heads:
        wrong = sorted(k for k in written.heads.keys() | seen.keys()
                       if seen.get(k) != written.heads.get(k))  # fmt: skip
        raise BenchError(f"{loader.label}: {len(wrong)} tensors differ from the written ones, "
                         f"first {wrong[0]}")  # fmt: skip
    return Run(seconds, sum(n for n, _, _ in seen.values()), len(seen), resident)


def extra_requirement(extra: str) -> str:
    """vLLM's own requirement line for `pip install vllm[extra]`."""
    for req in importlib.metadata.requires("vllm") or []:
        spec, _, marker = req.partition(";")
        if f'extra == "{extra}"' in marker:
            return spec.strip()
    return "?"


def loaders(rt: Runtime, threads: int) -> list[Loader]:
    """The safetensors loaders of the pinned vLLM, each through the iterator its loader calls."""
    wu = rt.weight_utils
    cuda_only = (
        "loads into CUDA memory (cuda:N in weight_utils), no CUDA device here: not measured"
        if not rt.torch.cuda.is_available()
        else "loads into CUDA memory: this tool measures disk to CPU memory only"
    )
    runai = (
        None
        if importlib.util.find_spec("runai_model_streamer") is None
        else lambda files: wu.runai_safetensors_weights_iterator(files, False, is_distributed=False)
    )

    def installed(dist: str) -> str:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{dist} {importlib.metadata.version(dist)} installed; "
        return f"{dist} not installed; "

    return [
        Loader("lazy", "lazy (default)", "(none: the default)",
               lambda files: wu.safetensors_weights_iterator(files, False, None)),
        Loader("eager", "eager", "--safetensors-load-strategy eager",
               lambda files: wu.safetensors_weights_iterator(files, False, "eager")),
        Loader("prefetch", "prefetch", "--safetensors-load-strategy prefetch",
               lambda files: wu.safetensors_weights_iterator(files, False, "prefetch")),
        Loader("multithread", f"multithread ({threads} threads)",
               "--model-loader-extra-config "
               f"'{{\"enable_multithread_load\": true, \"num_threads\": {threads}}}'",
               lambda files: wu.multi_thread_safetensors_weights_iterator(
                   files, False, max_workers=threads)),
        Loader("runai_streamer", "runai_streamer", "--load-format runai_streamer", runai,
               "" if runai else "runai-model-streamer not installed: pip install 'vllm[runai]' "
               f"({extra_requirement('runai')})"),
        Loader("fastsafetensors", "fastsafetensors", "--load-format fastsafetensors", None,
               installed("fastsafetensors") + cuda_only),
        Loader("instanttensor", "instanttensor", "--load-format instanttensor", None,
               installed("instanttensor") + cuda_only),
    ]  # fmt: skip


def mount_of(folder: Path) -> dict[str, str]:
    """The device, filesystem and mount point serving `folder` (/proc/mounts, the longest
    mount point that prefixes it; the last mounted wins a tie)."""
    path = os.path.realpath(folder)
    best = {"device": "?", "fstype": "?", "mount": ""}
    with open("/proc/mounts") as f:
        for line in f:
            device, mount, fstype = line.split()[:3]
            mount = mount.replace("\\040", " ")
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best["mount"]):
                best = {"device": device, "fstype": fstype, "mount": mount}
    return best


def summary(runs: list[Run]) -> dict[str, float] | None:
    if not runs:
        return None
    rates = [r.gbps for r in runs]
    return {"median_gbps": statistics.median(rates), "min_gbps": min(rates),
            "max_gbps": max(rates)}  # fmt: skip


def cell(runs: list[Run]) -> str:
    s = summary(runs)
    if s is None:
        return ""
    return f"{s['median_gbps']:6.2f} [{s['min_gbps']:.2f}, {s['max_gbps']:.2f}]"


def out_of_state(phase: str, run: Run) -> bool:
    """Whether a run did not start as its phase says: cold with over 1% of the pages cached,
    warm with under 99%."""
    return run.resident_before > 0.01 if phase == "cold" else run.resident_before < 0.99


def table(result: dict[str, Any], rows: list[Row], baseline: Row) -> str:
    ck, machine = result["checkpoint"], result["machine"]
    disk = machine["disk"]
    lines = [
        f"checkpoint: {ck['shards']} shards, {ck['tensor_bytes'] / GB:.2f} GB in "
        f"{ck['tensors']} bf16 tensors (Nemotron 3 Nano 4B shapes, widths x{ck['scale']:.3f})",
        f"disk: {disk['device']} {disk['fstype']} on {disk['mount']} | {machine['cpus']} CPUs, "
        f"{machine['ram_gib']:.1f} GiB RAM | vLLM {machine['vllm']} | {result['runs']} runs each",
        "load average (1 min) at start and end: {:.2f}, {:.2f} (other work on the machine shares "
        "its CPUs and disk)".format(*machine["loadavg"]),
        "cold: evicted from the page cache before each run (posix_fadvise DONTNEED); "
        "warm: all in the page cache",
        "",
        f"{'loader':<26} {'cold GB/s median [min, max]':<30} {'warm GB/s median [min, max]':<30}",
    ]
    for row in [baseline, *rows]:
        if row.measured:
            lines.append(f"{row.label:<26} {cell(row.cold):<30} {cell(row.warm):<30}")
        else:
            lines.append(f"{row.label:<26} not measured: {row.reason}")
    # A run that did not start in its phase's cache state is named, not hidden.
    off = [f"{row.label} {phase} ({run.resident_before:.0%} cached)"
           for row in [baseline, *rows] for phase in ("cold", "warm")
           for run in getattr(row, phase)
           if out_of_state(phase, run)]  # fmt: skip
    if off:
        lines.append("runs not in their phase's cache state: " + "; ".join(off))
    lines += ["", "selected on `vllm serve` by:"]
    lines += [f"  {row.label:<24} {row.flags}" for row in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--gb",
        type=float,
        default=8.0,
        help="the checkpoint's size in GB (default 8: Nemotron 3 Nano 4B BF16)",
    )
    p.add_argument("--runs", type=int, default=3, help="timed runs per loader, cold and warm")
    p.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="the multithread loader's num_threads (vLLM's default 8)",
    )
    p.add_argument("--shard-gb", type=float, default=5.0, help="max shard size in GB (5)")
    p.add_argument(
        "--dir",
        type=Path,
        help="where to write the checkpoint (a folder made "
        "inside it and removed after; default: the system's temp folder)",
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)  # fmt: skip
    for name in ("gb", "runs", "threads", "shard_gb"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def bench(rt: Runtime, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Generate the checkpoint in `folder`, time every loader round-robin, cold then warm."""
    scale = scale_for(args.gb * GB)
    tensors = layout(scale)
    total = sum(nbytes(s) for _, s in tensors)
    free = shutil.disk_usage(folder).free
    if total * 1.05 > free:
        raise BenchError(f"{total / GB:.2f} GB needed in {folder}, {free / GB:.2f} GB free")
    disk = mount_of(folder)
    if disk["fstype"] in ("tmpfs", "ramfs"):
        raise BenchError(f"{folder} is in memory ({disk['fstype']}): choose --dir on a disk")
    shards = plan_shards(tensors, args.shard_gb * GB)
    load_start = os.getloadavg()[0]
    print(f"writing {total / GB:.2f} GB in {len(shards)} shards to {folder}", file=sys.stderr)
    written = write_checkpoint(rt, folder, shards)
    sink = rt.torch.zeros(max(n for n, _, _ in written.heads.values()), dtype=rt.torch.uint8)
    measured = {ld.key: ld for ld in loaders(rt, args.threads)}
    rows = [Row(ld.key, ld.label, ld.flags, ld.read is not None, ld.reason)
            for ld in measured.values()]  # fmt: skip
    baseline = Row("plain_read", "plain read() (no vLLM)", "", True)
    for phase in ("cold", "warm"):
        if phase == "warm":
            plain_read(written.files)
        for run in range(1, args.runs + 1):
            for row in [baseline, *(r for r in rows if r.measured)]:
                gc.collect()  # the last run's tensors (a mapping keeps its pages cached)
                if phase == "cold":
                    evict(written.files)
                print(f"{phase} run {run}/{args.runs}: {row.label}", file=sys.stderr)
                timed = (timed_plain_read(written.files) if row is baseline
                         else timed_load(rt, measured[row.key], written, sink))  # fmt: skip
                getattr(row, phase).append(timed)
    with open("/proc/meminfo") as f:
        ram_kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    result: dict[str, Any] = {
        "checkpoint": {
            "dir": str(folder),
            "files": [p.name for p in written.files],
            "shards": len(written.files),
            "tensors": len(written.heads),
            "tensor_bytes": written.tensor_bytes,
            "file_bytes": sum(p.stat().st_size for p in written.files),
            "scale": scale,
            "model": "NVIDIA-Nemotron-3-Nano-4B-BF16 (approximated)",
        },
        "machine": {
            "disk": disk,
            "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)),
            "torch_threads": rt.torch.get_num_threads(),
            "ram_gib": ram_kib / 2**20,
            "vllm": importlib.metadata.version("vllm"),
            "loadavg": [load_start, os.getloadavg()[0]],
        },
        "runs": args.runs,
        "baseline": with_summaries(baseline),
        "loaders": [with_summaries(r) for r in rows],
    }
    result["table"] = table(result, rows, baseline)
    return result


def with_summaries(row: Row) -> dict[str, Any]:
    return {**asdict(row), "cold_summary": summary(row.cold), "warm_summary": summary(row.warm)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rt = import_runtime()
        if args.dir is not None:
            args.dir.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="loader-bench-", dir=args.dir))
        try:
            result = bench(rt, args, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    except (BenchError, OSError) as e:
        print(f"loader_bench: {e}", file=sys.stderr)
        return 1
    print(result["table"])
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
