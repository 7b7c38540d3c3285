"""The vLLM service on the Droplet: its `vllm serve` command line, systemd unit and environment.

One place for each flag: the config and the catalog decide them here, and the service phase
writes what this module renders. vLLM listens on loopback only; the gateway is the way in.
"""

from __future__ import annotations

import hashlib
import json

from ..spec import catalog
from ..spec.schema import StackConfig

# What the service may run: the vLLM env's own tools first (FlashInfer's JIT calls ninja, Triton
# and torch.compile find their tools there), then the system's, where the C compiler Triton needs
# for its launcher lives (the vllm phase installs it).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def env_path(cfg: StackConfig) -> str:
    """The env this config's vLLM lives in, named by what it holds: the release (or the source
    ref) and the first 12 hex digits of the lock's sha256. A new lock is a new env, installed
    beside the one the service runs from; the unit names it, so the service phase switches.
    The one rule for the vllm phase's target, the unit's ExecStart and PATH, and the marker."""
    lock = hashlib.sha256(cfg.lock_file.read_bytes()).hexdigest()[:12]
    if cfg.vllm.install == "wheel":
        holds = cfg.vllm.version
    else:
        # A ref may hold "/" (a branch); "_" never appears in one (schema._REVISION): one name
        # per ref.
        holds = "src-" + cfg.vllm_git_ref.replace("/", "_")
    return f"{catalog.VLLM_ENV}-{holds}-{lock}"


def marker_path(cfg: StackConfig) -> str:
    """What the vllm phase installed in the env, written last (no marker: incomplete)."""
    return f"{env_path(cfg)}/{catalog.VLLM_MARKER}"


# The env the service was last started from, written by the service phase as it restarts it:
# never removed, whatever the unit names by then (a switch cut between the unit and the restart).
RUNS_ENV_FILE = f"{catalog.STATE_DIR}/vllm.runs-env"


def env_settings() -> dict[str, str]:
    """What the vllm and service phases read to tell the vLLM envs apart: ours are VLLM_ENV
    (earlier versions' one env) and VLLM_ENV-*; the one last started is in RUNS_ENV_FILE."""
    return {"NEMO_VLLM_ENV_PREFIX": catalog.VLLM_ENV, "NEMO_RUNS_ENV_FILE": RUNS_ENV_FILE}


def service_path(cfg: StackConfig) -> str:
    """The unit's PATH: the env's bin first, then the system's."""
    return f"{env_path(cfg)}/bin:{SYSTEM_PATH}"


def systemd_quote(arg: str) -> str:
    """One ExecStart argument: `$` and `%` are special to systemd, whitespace needs quotes."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and not any(c in escaped for c in " \t\"\\'"):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def load_strategy(cfg: StackConfig) -> str | None:
    """`--safetensors-load-strategy`: the one chosen; unset, `prefetch` where the weights live on
    the cache Volume, else none (vLLM's default: memory-mapped reads in the loader's order).

    A Volume is network block storage (docs/facts.md: 200-300 MB/s per Volume, DigitalOcean's
    figures), where one reader waits on the network for each page; `prefetch` reads the files
    into the page cache with 8 threads while the loader follows. vLLM turns it on by itself
    only for NFS and Lustre (model_loader/weight_utils.py, safetensors_weights_iterator: it
    reads the mount's type, and the Volume's is ext4). On a local disk it costs nothing
    measured (scripts/loader_bench.py: prefetch and the default at the same pace), so a Volume
    that turns out fast loses nothing either."""
    chosen = cfg.vllm.safetensors_load_strategy
    if chosen is not None or cfg.vllm.load_format != "auto" or cfg.vllm.multithread_load:
        # Chosen; or another loader, which reads the files its own way; or the multithreaded
        # one (scripts/loader_bench.py's `multithread`), which takes lazy only.
        return chosen
    # vLLM's own guard on prefetch (the checkpoint within 90% of the memory) applies only when
    # it chooses: asked for, it prefetches anyway. Where the catalog knows the size's memory,
    # weights past that bound are left to vLLM's default.
    memory = cfg.size.memory_gib
    if memory is not None and cfg.model_disk_gb > PREFETCH_MEMORY_SHARE * memory:
        return None
    # On the Kubernetes platform the weights are always on the server's Volume (kube/manifests).
    on_volume = cfg.cache.enabled or cfg.platform == "kubernetes"
    return "prefetch" if on_volume else None


# vLLM's bound for prefetching a checkpoint: 90% of the memory available
# (weight_utils.safetensors_weights_iterator, ram_threshold_pct).
PREFETCH_MEMORY_SHARE = 0.9


# Where vLLM listens on a Droplet: loopback, behind the gateway.
LOOPBACK = "127.0.0.1"


def serve_args(cfg: StackConfig, host: str = LOOPBACK) -> list[str]:
    """`vllm serve` arguments, from the config and the catalog: one place for each flag, for the
    Droplet's unit and the Kubernetes model server alike. `host`: where it listens, loopback on
    a Droplet; a pod's every address on Kubernetes, where the Service is the way in."""
    args = [
        "serve", cfg.model.id,
        "--revision", cfg.model.revision,
        "--served-model-name", cfg.model.served_name,
        "--host", host,
        "--port", str(catalog.VLLM_PORT),
        "--tensor-parallel-size", str(cfg.size.gpu_count),
        "--max-model-len", str(cfg.vllm.max_model_len),
        "--gpu-memory-utilization", str(cfg.vllm.gpu_memory_utilization),
    ]  # fmt: skip
    if cfg.vllm.max_num_seqs is not None:
        args += ["--max-num-seqs", str(cfg.vllm.max_num_seqs)]
    if cfg.vllm.enforce_eager:
        args.append("--enforce-eager")
    # Only when chosen: the default line stays vLLM's own (a new flag restarts every replica).
    if cfg.vllm.load_format != "auto":
        args += ["--load-format", cfg.vllm.load_format]
    strategy = load_strategy(cfg)
    if strategy is not None:
        args += ["--safetensors-load-strategy", strategy]
    if cfg.routing == "cache-aware":
        # The front's router asks every replica for each request's token ids on its render
        # route, which vLLM 0.33 registers only with --enable-scale-out (it also opens
        # /inference/v1/generate and /abort_requests, which the gateway's exact allowlist
        # refuses: entrypoints/common/cli_args.py, scale_out/factories.py; docs/facts.md). The
        # answers then report the prompt's cached tokens (usage.prompt_tokens_details), so
        # bench.py shows what the routing saves.
        args += ["--enable-scale-out", "--enable-prompt-tokens-details"]
    known = cfg.catalog_model
    if known is not None:
        args += list(known.vllm_flags)
    speculative = cfg.vllm.speculative
    if speculative is not None:
        tokens = speculative.num_speculative_tokens or (known.mtp_tokens if known else None) or 1
        spec: dict[str, object] = {"method": speculative.method}
        if speculative.model is not None:
            spec["model"] = speculative.model
        spec["num_speculative_tokens"] = tokens
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return args + list(cfg.vllm.extra_args)


def compile_cache_env() -> dict[str, str]:
    """Where vLLM and Triton keep what a start compiles, set by the unit so that every start
    reads and writes the same folders (on the cache Volume when there is one: catalog.CACHE_BINDS).

    - VLLM_CACHE_ROOT: torch.compile's artifacts (vLLM's default, ~/.cache/vllm, made explicit).
    - TRITON_CACHE_DIR: every Triton kernel, the Mamba2 SSD kernels' included. Unset, the
      process's Triton cache moves: torch's Inductor sets the variable (to its own
      inductor_cache/triton/0) when it compiles a graph, and not when it loads one from vLLM's
      compile cache (torch/_inductor/runtime/triton_heuristics.py: CachingAutotuner.__init__
      sets it, __setstate__ does not), so the kernels a cold start built are not where the
      next start looks, and its Mamba2 warm-up compiles and autotunes them all again.
    - TRITON_CACHE_AUTOTUNING=1: Triton keeps each autotuned kernel's timings beside it and
      reads them back instead of benchmarking every config again. vLLM sets it itself (0.26
      and 0.33: env_override.py, setdefault); said here so that a release that stops doing so
      does not silently bring the benchmarks back.
    - TRITON_PRINT_AUTOTUNING=1: Triton logs each kernel it benchmarks and for how long, three
      lines a kernel and only when it benchmarks, so the journal says why a start's warm-up
      was long (on the lent H100, 7 autotuned kernels made 59.5 s of a 62 s warm-up) and
      nemodrop/vllm_startup.py adds them up.

    Measured on the lent H100 (docs/cache.md, "vLLM's start on a GPU"): with these set, the
    first warm start after a cold one took 54.9 s to /health (warm-up 1 s); with
    TRITON_CACHE_DIR unset, 132.1 s (warm-up 62 s)."""
    return {
        "VLLM_CACHE_ROOT": catalog.VLLM_CACHE_ROOT,
        "TRITON_CACHE_DIR": catalog.TRITON_CACHE_DIR,
        "TRITON_CACHE_AUTOTUNING": "1",
        "TRITON_PRINT_AUTOTUNING": "1",
    }


def unit_text(cfg: StackConfig, cached: bool = False) -> str:
    """The unit. `cached`: vLLM, the weights and its compile caches are on the cache Volume,
    bound from fstab with nofail, so the unit waits for those mounts (and does not start from
    the empty folders beneath them when the Volume is missing)."""
    exec_start = " ".join(systemd_quote(a) for a in [f"{env_path(cfg)}/bin/vllm", *serve_args(cfg)])
    mounts = " ".join(path for _, path in catalog.CACHE_BINDS)
    requires_mounts = f"RequiresMountsFor={mounts}\n" if cached else ""
    caches = "\n".join(f"Environment={k}={v}" for k, v in compile_cache_env().items())
    return f"""[Unit]
Description=vLLM OpenAI-compatible server for {cfg.model.id} (nemotron-droplet)
After=network-online.target
Wants=network-online.target
{requires_mounts}
[Service]
Type=simple
User={catalog.VLLM_USER}
Group={catalog.VLLM_USER}
WorkingDirectory=/var/lib/{catalog.VLLM_USER}
# Secrets and settings live in a root-only file, never on this command line.
EnvironmentFile={catalog.VLLM_ENV_FILE}
Environment=PATH={service_path(cfg)}
# The compile caches, in one place for every start (compile_cache_env says why).
{caches}
{catalog.METADATA_DENY}
ExecStart={exec_start}
Restart=on-failure
RestartSec=10
# vLLM's ZMQ sockets run out of descriptors under load with the default limit.
LimitNOFILE=1048576
# Type=simple is "started" at once; the ready phase waits for the model, this bounds a stop.
TimeoutStartSec=30min
TimeoutStopSec=120

[Install]
WantedBy=multi-user.target"""


def env_text(api_key: str, cfg: StackConfig) -> str:
    # A context past the model's default needs vLLM's explicit consent (the model card allows
    # it: catalog long_context).
    known = cfg.catalog_model
    long_context = bool(known and cfg.vllm.max_model_len > known.max_context)
    return "\n".join([
        *(["VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"] if long_context else []),
        # vLLM checks the key too (defence in depth behind the gateway).
        f"VLLM_API_KEY={api_key}",
        f"HF_HOME={catalog.HF_HOME}",
        # The weights were downloaded by the model phase: never reach the Hub at run time.
        "HF_HUB_OFFLINE=1",
        "VLLM_NO_USAGE_STATS=1",
        "DO_NOT_TRACK=1",
    ])  # fmt: skip
