"""The stack configuration's shape: one pydantic model per section, each field with its default
and a description (the README's reference is generated from them), and `StackConfig`, the whole
validated stack with what the catalog says about it. Validation across sections, reporting and
reading Pulumi's config live in config.py."""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import json
import math
import re
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic.alias_generators import to_camel

from . import catalog, cidrs
from .kube import KubePlatformConfig

NAMESPACE = catalog.PROJECT
LOCKS_DIR = Path(__file__).resolve().parents[2] / catalog.LOCKS_PATH


def set_secret(key: str) -> str:
    """How to set a secret key, its value off the command line (shell history, `ps`): with no
    value after the key, `pulumi config set` reads it from standard input, or asks for it
    without echo on a terminal (pulumi/pulumi pkg/cmd/pulumi/config/config.go, configSetCmd.Run;
    docs/facts.md)."""
    path = " --path" if "." in key else ""
    return (
        f"`pulumi config set --secret{path} {key}` (no value after it: Pulumi asks for it "
        "without echo, or reads it from a file: `... < FILE`)"
    )


_TAG = re.compile(r"^[A-Za-z0-9_:\-]{1,255}$")
RESERVED_TAG_PREFIXES = (f"{catalog.PROJECT}-", catalog.STACK_TAG_PREFIX)
_FINGERPRINT = re.compile(r"^([0-9a-f]{2}:){15}[0-9a-f]{2}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_BRANCH = re.compile(r"^[0-9]{3}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$")

# Flags the program sets itself: letting extraArgs set them would expose vLLM beyond loopback,
# put a secret on a command line, or contradict what the catalog and the size decide.
MANAGED_VLLM_FLAGS = (
    "--host",
    "--port",
    "--api-key",
    "--model",
    "--served-model-name",
    "--revision",
    "--tensor-parallel-size",
    "-tp",
    "--gpu-memory-utilization",
    "--max-model-len",
    "--max-num-seqs",
    "--enforce-eager",
    "--load-format",
    "--safetensors-load-strategy",
    "--download-dir",
    "--hf-token",
    "--speculative-config",
)


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


def _cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as err:
        loose = None
        with contextlib.suppress(ValueError):
            loose = ipaddress.ip_network(value, strict=False)
        hint = f" (did you mean {loose}?)" if loose else ""
        raise ValueError(
            f"{value!r} is not a CIDR{hint}: {err}; accepted: an IPv4/IPv6 address or network "
            f"such as {', '.join(cidrs.EXAMPLES)}"
        ) from None
    return value


def _nearest(region: str) -> str:
    """' (did you mean tor1?)' for a slug one slip from a region, GPU regions first."""
    for choices in (catalog.GPU_REGIONS, catalog.REGIONS):
        near = difflib.get_close_matches(region.strip().lower(), choices, n=1, cutoff=0.7)
        if near:
            return f" (did you mean {near[0]}?)"
    return ""


class DropletConfig(_Section):
    size: str = Field(
        catalog.DEFAULT_SIZE,
        description="GPU Droplet size slug (NVIDIA only); the default is the cheapest that "
        "serves the default model well. Accepted: " + ", ".join(catalog.NVIDIA_SIZES) + ".",
    )
    regions: list[str] = Field(
        default_factory=lambda: ["tor1", "nyc2", "ams3"],
        description="Region preference list for a new Droplet: the first one where DigitalOcean "
        "offers the size at deploy time is used. An existing Droplet of the same size stays in "
        "its region, whatever availability says later. A slug that is not a DigitalOcean "
        "region is refused before anything is created; GPU Droplets have been sold in "
        + ", ".join(catalog.GPU_REGIONS)
        + ".",
    )
    image: str | None = Field(
        None,
        description="Image slug. Unset picks the NVIDIA GPU base image that matches the size's "
        "GPU count (gpu-h100x1-base or gpu-h100x8-base). Accepted: "
        + ", ".join(catalog.IMAGES)
        + ".",
    )
    name: str | None = Field(None, description="Droplet name. Unset: `nemotron-<stack>`.")
    tags: list[str] = Field(
        default_factory=list,
        description="Extra Droplet tags (letters, digits, `_`, `-`, `:`). The project and stack "
        "tags are always added.",
    )
    monitoring: bool = Field(True, description="Install the DigitalOcean metrics agent.")

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        known = catalog.SIZES.get(v)
        if (known and known.vendor == "amd") or v.startswith(catalog.AMD_SIZE_PREFIX):
            raise ValueError(
                f"{v!r} is an AMD (ROCm) size; the vLLM install here is CUDA, so only NVIDIA "
                f"sizes work; accepted: {', '.join(catalog.NVIDIA_SIZES)}"
            )
        if known is None:
            raise ValueError(
                f"{v!r} is not a known GPU size; accepted: {', '.join(catalog.NVIDIA_SIZES)}"
            )
        return v

    @field_validator("regions")
    @classmethod
    def _regions(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("the list is empty; give at least one region slug, e.g. [tor1, nyc2]")
        unknown = [r for r in v if r not in catalog.REGIONS]
        if unknown:
            raise ValueError(
                "; ".join(f"{r!r} is not a DigitalOcean region{_nearest(r)}" for r in unknown)
                + f"; accepted: a region slug ({', '.join(catalog.REGIONS)}); GPU Droplets "
                f"have been sold in {', '.join(catalog.GPU_REGIONS)}"
            )
        if len(set(v)) != len(v):
            raise ValueError("a region is listed twice")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and v not in catalog.IMAGES:
            raise ValueError(
                f"{v!r} is not a known image; accepted: {', '.join(catalog.IMAGES)} "
                "(or leave it unset)"
            )
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError(f"{v!r}: accepted: letters, digits, '.', '-', at most 63 characters")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        bad = [t for t in v if not _TAG.match(t)]
        if bad:
            raise ValueError(f"{bad}: tags accept letters, digits, '_', '-', ':' (1-255 chars)")
        # The program's own: a user's could set a Droplet's lease (scripts/ci/lease.py reads it),
        # or file it under another stack.
        reserved = [t for t in v if t.startswith(RESERVED_TAG_PREFIXES)]
        if reserved:
            raise ValueError(
                f"{reserved}: tags starting with {' or '.join(RESERVED_TAG_PREFIXES)} are the "
                "program's (the lease, the stack); choose another"
            )
        return v


class AccessConfig(_Section):
    api_cidrs: list[str] = Field(
        default_factory=lambda: list(catalog.ANYWHERE),
        description="Who may reach the API port. Every API route requires the key. `[]` closes "
        "the port (reach the API through an SSH tunnel). Documentation, private, loopback and "
        "other ranges no client connects from are refused.",
    )
    ssh_cidrs: list[str] = Field(
        default_factory=lambda: list(catalog.ANYWHERE),
        description="Who may reach SSH (key-only). Must include the public address of the "
        "machine that runs `pulumi up`: the bootstrap runs over SSH. A GitHub-hosted runner "
        "(deploy.yml: pushes, wakes) connects from no address you can list: a "
        "stack CI deploys keeps anywhere, and an `up` there with a narrower list is refused "
        "(docs/ci.md). Documentation, private, loopback and other ranges no client connects "
        "from are refused.",
    )
    ssh_key_fingerprints: list[str] = Field(
        default_factory=list,
        description="MD5 fingerprints of SSH keys already in your DigitalOcean account to add "
        "to the Droplet, besides the key generated for the stack.",
    )
    https: bool = Field(
        True,
        description="Serve the API over HTTPS with a certificate from a public ACME CA (port "
        "443; port 80 stays open to anyone for the CA's challenge and redirects). `false`: "
        "plain HTTP on port 80 (the key then crosses the network in clear text).",
    )
    domain: str | None = Field(
        None,
        description="Your hostname for the endpoint (`https://<domain>/v1`); point its DNS A "
        "record at the Droplet. Certificates from Let's Encrypt, then ZeroSSL (needs "
        "`acmeEmail`). Unset: a certificate for the Droplet's IPv4 address itself "
        "(`https://<ipv4>/v1`; Let's Encrypt's six-day `shortlived` profile, renewed by the "
        "gateway), with no DNS at all.",
    )
    dns_zone: str | None = Field(
        None,
        description="A domain in this DigitalOcean account (Networking > Domains) that holds "
        "`domain`: the program creates `domain`'s A record there (TTL 60 s) and keeps it "
        "pointing at the Droplet, also when it is re-created. Unset: point the record yourself.",
    )
    sslip: bool = Field(
        False,
        description="Opt-in: serve at `<ip-with-dashes>.sslip.io` instead of the bare IP. Every "
        "sslip.io certificate in the world counts against one Let's Encrypt limit, which runs "
        "out, and whoever answers sslip.io's DNS decides where the name points. Needs "
        "`acmeEmail` (ZeroSSL is the second CA); not with `domain`.",
    )
    acme_email: str | None = Field(
        None,
        description="ACME account email. Required with `domain` or `sslip` (ZeroSSL, the "
        "second CA, issues only to an account with one); optional for the IP certificate.",
    )
    max_request_body_mb: int = Field(
        16,
        ge=1,
        le=1024,
        description="Largest request body the gateway accepts, in MB (1,000,000 bytes); a "
        "larger declared body gets 413 before it is read, a larger chunked one is cut.",
    )

    @field_validator("domain", "dns_zone")
    @classmethod
    def _domain(cls, v: str | None) -> str | None:
        label = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
        if v is not None and not re.fullmatch(rf"({label}\.)+[a-z]{{2,63}}", v):
            raise ValueError(f"{v!r}: accepted: a lowercase DNS name like api.example.com")
        return v

    @field_validator("acme_email")
    @classmethod
    def _email(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", v):
            raise ValueError(f"{v!r}: accepted: an email address")
        return v

    @field_validator("api_cidrs", "ssh_cidrs")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        problems = []
        for item in v:
            try:
                _cidr(item)
            except ValueError as err:
                problems.append(str(err))
                continue
            why = cidrs.unreachable(item)
            if why:
                problems.append(why)
        if problems:
            if any("connects from it" in p for p in problems):
                problems.append(f"accepted: {cidrs.FIX}")
            raise ValueError("; ".join(problems))
        return v

    @field_validator("ssh_cidrs")
    @classmethod
    def _ssh_not_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(
                "the list is empty; the bootstrap runs over SSH from the machine running "
                f"`pulumi up`, so include its address (e.g. {cidrs.EXAMPLE_ADDRESS}/32)"
            )
        return v

    @field_validator("ssh_key_fingerprints")
    @classmethod
    def _fingerprints(cls, v: list[str]) -> list[str]:
        bad = [f for f in v if not _FINGERPRINT.match(f)]
        if bad:
            raise ValueError(
                f"{bad}: accepted: MD5 fingerprints as DigitalOcean shows them, like "
                "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"
            )
        return v


class ModelConfig(_Section):
    id: str = Field(
        catalog.DEFAULT_MODEL,
        description="Hugging Face repo id. Known: " + ", ".join(catalog.MODELS) + ".",
    )
    served_name: str = Field(
        "nemotron", description="Model name clients send and `/v1/models` lists."
    )
    revision: str = Field("main", description="Branch, tag or commit of the repo to serve.")
    vram_gb: int | None = Field(
        None,
        gt=0,
        description="VRAM the model needs, in GB. Required for a model not in the catalog; "
        "overrides the catalog otherwise.",
    )
    disk_gb: int | None = Field(
        None,
        gt=0,
        description="Disk the weights need, in GB. Unset: the catalog's value, or vramGb.",
    )

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _REPO_ID.match(v):
            raise ValueError(f"{v!r}: accepted: a Hugging Face repo id like owner/name")
        return v

    @field_validator("served_name")
    @classmethod
    def _served_name(cls, v: str) -> str:
        if not _SERVED_NAME.match(v):
            raise ValueError(f"{v!r}: accepted: letters, digits, '.', '_', ':', '/', '-'")
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        if not _REVISION.match(v):
            raise ValueError(f"{v!r}: accepted: a branch, tag or commit hash")
        return v


class SpeculativeConfig(_Section):
    method: Literal["mtp", "dflash", "eagle3"] = Field(
        "mtp",
        description="`mtp`: the model's own Multi-Token Prediction heads propose tokens that "
        "one forward pass checks (Nemotron 3 Super and Ultra have them; no extra download). "
        "`dflash`, `eagle3`: a draft model (`model`) proposes them.",
    )
    model: str | None = Field(
        None,
        description="The draft model's Hugging Face repo id (dflash, eagle3), downloaded by the "
        "model phase beside the weights; it must be a draft trained for model.id.",
    )
    num_speculative_tokens: int | None = Field(
        None,
        ge=1,
        le=16,
        description="Tokens proposed per step. Unset: the recipe's value for mtp (Super 3, "
        "Ultra 5); required with a draft model.",
    )

    @field_validator("model")
    @classmethod
    def _draft(cls, v: str | None) -> str | None:
        if v is not None and not _REPO_ID.match(v):
            raise ValueError(f"{v!r}: accepted: a Hugging Face repo id like owner/name")
        return v


class VllmConfig(_Section):
    version: str = Field(catalog.DEFAULT_VLLM_VERSION, description="vLLM release to install.")
    install: Literal["wheel", "source"] = Field(
        "wheel",
        description="`wheel`: install the pinned release's wheels (minutes). `source`: build "
        "it with the CUDA toolkit (much longer).",
    )
    gpu_memory_utilization: float = Field(
        0.90,
        gt=0,
        le=1,
        description="Share of each GPU's memory vLLM may use for weights, activations and KV "
        "cache; accepted: (0, 1].",
    )
    max_model_len: int = Field(
        32768, gt=0, description="Longest context (prompt + output) served, in tokens."
    )
    max_num_seqs: int | None = Field(
        None, gt=0, description="Most sequences batched at once. Unset: vLLM's default for the GPU."
    )
    enforce_eager: bool = Field(
        False,
        description="Disable CUDA graphs. Slows decoding 1.7-4.3x; if graph capture runs out of "
        "memory, lower gpuMemoryUtilization or maxNumSeqs instead.",
    )
    load_format: Literal["auto", "fastsafetensors", "instanttensor"] = Field(
        "auto",
        description="How vLLM reads the weights (`--load-format`; each is in the pinned "
        "release and its lock). `auto`: safetensors, memory-mapped (vLLM's default). "
        "`fastsafetensors`, `instanttensor`: straight into GPU memory, in parallel. Measured "
        "here (scripts/loader_bench.py, CPU side only): every CPU loader reads at the disk's "
        "pace, so `auto` stays the default until a real run measures one faster.",
    )
    safetensors_load_strategy: Literal["lazy", "eager", "prefetch"] | None = Field(
        None,
        description="`auto` only (`--safetensors-load-strategy`): `prefetch` reads the files "
        "into the page cache first, in parallel (vLLM: for network storage); `lazy`: "
        "memory-mapped, in the loader's order; `eager` reads each file whole (measured 7x "
        "slower here). Unset: `prefetch` when the weights are on the cache Volume (network "
        "block storage, which vLLM does not detect by itself; measured here, prefetch costs "
        "nothing on a local disk) and fit 90% of the size's memory where the catalog knows "
        "it, else vLLM's default (memory-mapped; prefetch on NFS and "
        "Lustre only).",
    )
    git_ref: str | None = Field(
        None,
        description="`source` only: the git ref of vLLM to build. Unset: `v<version>`.",
    )
    speculative: SpeculativeConfig | None = Field(
        None,
        description="Speculative decoding, as vLLM's `--speculative-config`. Unset: off.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="More `vllm serve` arguments. Flags the program manages are refused: "
        + ", ".join(MANAGED_VLLM_FLAGS)
        + ".",
    )

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not _VERSION.match(v):
            raise ValueError(
                f"{v!r}: accepted: a release number like {catalog.DEFAULT_VLLM_VERSION}"
            )
        return v

    @field_validator("git_ref")
    @classmethod
    def _git_ref(cls, v: str | None) -> str | None:
        if v is not None and not _REVISION.match(v):
            raise ValueError(f"{v!r}: accepted: a git branch, tag or commit")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, v: list[str]) -> list[str]:
        managed = [a for a in v if a.split("=", 1)[0] in MANAGED_VLLM_FLAGS]
        if managed:
            raise ValueError(
                f"{managed} are set by the program (from model, vllm and the size); use the "
                "matching config field instead"
            )
        return v

    @property
    def multithread_load(self) -> bool:
        """Whether extraArgs turn on vLLM's multithreaded loader (--model-loader-extra-config
        '{"enable_multithread_load": true}'), which refuses every safetensors strategy but lazy
        (model_executor/model_loader/default_loader.py). A value that is not JSON: vLLM says."""
        args = self.extra_args
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if flag != "--model-loader-extra-config":
                continue
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            try:
                loaded = json.loads(value)
            except ValueError:
                return False
            return isinstance(loaded, dict) and loaded.get("enable_multithread_load") is True
        return False


class DriverConfig(_Section):
    mode: Literal["auto", "preinstalled", "apt", "runfile"] = Field(
        "auto",
        description="`auto`: keep the image's driver if it can run the vLLM wheels' CUDA, else "
        "install `branch` from packages and reboot once. `preinstalled`: check only. `apt`: "
        "install `branch` from packages. `runfile`: NVIDIA's .run installer.",
    )
    branch: str = Field(
        "580",
        description="NVIDIA driver branch to install when one is needed. Must be new enough for "
        "the vLLM wheels' CUDA (CUDA 13: >= 580).",
    )

    runfile_url: str | None = Field(
        None,
        description="`runfile` only: URL of NVIDIA's `NVIDIA-Linux-x86_64-<version>.run` for "
        "`branch`.",
    )
    runfile_sha256: str | None = Field(
        None, description="`runfile` only: SHA-256 of that file; the install refuses any other."
    )

    @field_validator("branch")
    @classmethod
    def _branch(cls, v: str) -> str:
        if not _BRANCH.match(v):
            raise ValueError(f'{v!r}: accepted: a driver branch number like "580"')
        return v

    @field_validator("runfile_url")
    @classmethod
    def _runfile_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://\S+\.run$", v):
            raise ValueError(f"{v!r}: accepted: an http(s) URL ending in .run")
        return v

    @field_validator("runfile_sha256")
    @classmethod
    def _runfile_sha256(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[0-9a-f]{64}$", v):
            raise ValueError(f"{v!r}: accepted: 64 lowercase hex digits")
        return v


class CgroupConfig(_Section):
    mode: Literal["unified", "legacy"] = Field(
        "unified",
        description="`unified`: verify cgroup v2 with the memory controller (nothing needs v1). "
        "`legacy`: switch to cgroup v1 and reboot (removed in systemd >= 256).",
    )


class BootstrapConfig(_Section):
    driver: DriverConfig = Field(default_factory=DriverConfig, description="The driver phase.")
    cgroup: CgroupConfig = Field(default_factory=CgroupConfig, description="The cgroup phase.")
    python: Literal["3.10", "3.11", "3.12", "3.13"] = Field(
        "3.12", description="Python of the conda env vLLM runs in."
    )
    ready_timeout_minutes: int = Field(
        30,
        ge=1,
        le=240,
        description="How long the ready phase waits for a 1-token chat completion (model load "
        "and CUDA graph capture included).",
    )


class AutodownConfig(_Section):
    idle_minutes: int | None = Field(
        None,
        ge=5,
        le=10080,
        description="Delete the Droplet after this many minutes with no request running, "
        "waiting or finishing. Unset: no idle rule.",
    )
    max_hours: float | None = Field(
        None,
        gt=0,
        le=720,
        description="Delete the Droplet this many hours after the bootstrap first ran, busy or "
        "not. Unset: no ceiling.",
    )
    bootstrap_minutes: int | None = Field(
        None,
        ge=10,
        le=1440,
        description="Delete a Droplet that does not serve this many minutes after its first "
        "bootstrap began (a driver, a download or vLLM that failed), and count a replica whose "
        "metrics cannot be read as busy for this long at most. Unset: the longest the "
        "bootstrap's phases may take by their own bounds (the `autodown` output says it).",
    )
    token: SecretStr | None = Field(
        None,
        description="DigitalOcean token that may delete Droplets, set as a secret: "
        f"{set_secret('autodown.token')}. Unset while a rule is on: the rule runs as a dry run "
        "(logs only) and `pulumi up` warns.",
    )
    dry_run: bool = Field(False, description="Log what the rule would do; delete nothing.")

    @property
    def enabled(self) -> bool:
        return self.idle_minutes is not None or self.max_hours is not None

    @property
    def lease_minutes(self) -> int | None:
        """The outside lease: maxHours in whole minutes, rounded up; none without maxHours, or
        with dryRun (which asks that nothing be deleted)."""
        if self.max_hours is None or self.dry_run:
            return None
        return math.ceil(round(self.max_hours * 60, 6))

    @property
    def mode(self) -> str:
        if not self.enabled:
            return "off"
        return "dry-run" if self.dry_run or self.token is None else "delete"


class CacheConfig(_Section):
    size_gb: int | None = Field(
        None,
        ge=1,
        le=catalog.VOLUME_MAX_GIB,
        description="GiB of a block-storage Volume that keeps the weights, the conda envs (vLLM's "
        "keyed by its lock) and vLLM's compile caches across Droplets: a re-created Droplet "
        "finds them and skips the downloads. Billed while it exists, at "
        f"${catalog.VOLUME_PRICE_GIB_MONTH:.2f} per GiB per month (the `cache` output shows the "
        "price). Can grow, never shrink. Unset: no cache, everything on the Droplet's disk.",
    )
    keep_on_destroy: bool = Field(
        False,
        description="Keep the Volume when `pulumi destroy` runs (still billed); the next "
        "`pulumi up` of the stack adopts it, warm. Default: destroy deletes it. Autodown never "
        "deletes it.",
    )

    @property
    def enabled(self) -> bool:
        return self.size_gb is not None


_CPU_SIZE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)+$")


class BalancerConfig(_Section):
    """The one endpoint in front of the replicas (read only with `replicas` >= 2)."""

    kind: Literal["auto", "managed", "caddy"] = Field(
        "auto",
        description="`managed`: DigitalOcean's Load Balancer with a DigitalOcean-managed Let's "
        "Encrypt certificate (needs `access.domain` in `access.dnsZone`, HTTPS on); it spreads "
        "requests without regard to load. `caddy`: Caddy's load balancing on a small CPU "
        "Droplet with a Reserved IP and the same certificate choices as one Droplet; it sends "
        "each request to the replica with the fewest in flight, or, with `routing`, to the one "
        "that holds its prompt's prefix. `auto`: managed when `access.dnsZone` is set (and wake "
        "is off and `routing` is `auto`: only Caddy holds requests and routes on the prompt), "
        "else caddy.",
    )
    size: str = Field(
        catalog.BALANCER_SIZE,
        description="`caddy` only: the balancer Droplet's size slug (a CPU size; proxying needs "
        "little).",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=catalog.LB_MAX_NODES,
        description=f"`managed` only: Load Balancer nodes, 1 to {catalog.LB_MAX_NODES} (each "
        f"adds 10,000 connections; ${catalog.LB_NODE_PRICE_MONTH:.0f} per node per month). In "
        f"{', '.join(f'`{r}`' for r in catalog.LB_SIZE_SLUG_REGIONS)} DigitalOcean sizes a Load "
        f"Balancer by slug only, so there {', '.join(map(str, catalog.LB_SIZE_SLUGS))} nodes "
        "(`lb-small`, `lb-medium`, `lb-large`); another count is refused before anything is "
        "created. DigitalOcean changes a Load Balancer's node count at most once an hour.",
    )
    routing: Literal["auto", "cache-aware", "least-conn"] = Field(
        "auto",
        description="`caddy` only: how the front picks a replica for each request. "
        "`cache-aware`: vLLM's own router (vllm-router, on the front's loopback behind Caddy) "
        "sends a request to the replica whose prefix cache already holds the most of its "
        "prompt (a conversation's earlier turns, a shared system prompt), within a bound on "
        "how uneven the load may get; each replica's vLLM answers its render route for it. "
        "`least-conn`: Caddy alone, to the replica with the fewest requests in flight. `auto`: "
        "least-conn. Cache-aware halves multi-turn TTFT p95 (docs/routing.md) but vllm-router "
        "0.1.17 rewrites tool definitions (drops `strict`, refuses a tool without `parameters`), "
        "so it is yours to turn on. DigitalOcean's Load Balancer does neither (it spreads "
        "requests round robin): with `kind: managed` leave this `auto`.",
    )

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not _CPU_SIZE.match(v) or v.startswith("gpu-"):
            raise ValueError(
                f"{v!r}: accepted: a CPU Droplet size slug like {catalog.BALANCER_SIZE} or "
                "s-2vcpu-2gb (no GPU size: the balancer only proxies)"
            )
        return v


_GITHUB_REPO = re.compile(r"^[A-Za-z0-9-]{1,39}/[A-Za-z0-9._-]{1,100}$")
_WORKFLOW = re.compile(r"^[A-Za-z0-9._-]{1,100}\.ya?ml$")
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")


class WakeConfig(_Section):
    """Scale to zero and back: the front keeps the endpoint's address while autodown has
    deleted the GPU set, and a keyed request starts its re-deploy through your pipeline."""

    enabled: bool = Field(
        False,
        description="Keep a small always-on front (the Caddy balancer: a CPU Droplet with the "
        "endpoint's Reserved IP, the same gate and certificate), also with `replicas: 1`. When "
        "no replica exists, a request with the API key starts a re-deploy and is held until a "
        "replica answers it. Requests without the key wake nothing.",
    )
    trigger: Literal["github", "webhook"] = Field(
        "github",
        description="`github`: GitHub Actions' workflow_dispatch of `githubWorkflow` with the "
        "inputs stack, command: up and refresh: true (a fine-grained token with Actions: read "
        "and write on `githubRepo` alone). `webhook`: a POST to `webhookUrl` with the token in "
        "the header `webhookHeader` and a JSON body `{stack, event: wake}`, for any other CI.",
    )
    github_repo: str | None = Field(
        None, description="`github`: the repository whose workflow deploys: `owner/name`."
    )
    github_workflow: str = Field(
        "deploy.yml", description="`github`: the workflow file under .github/workflows/."
    )
    github_ref: str = Field("main", description="`github`: the branch the workflow runs from.")
    webhook_url: str | None = Field(None, description="`webhook`: the URL (https://) to POST.")
    webhook_header: str = Field(
        "X-Wake-Token", description="`webhook`: the header that carries the token."
    )
    token: SecretStr | None = Field(
        None,
        description=f"The pipeline's token, set as a secret: {set_secret('wake.token')}. It "
        "lives in Pulumi's secrets and a root-only file on the front, never in a log line.",
    )
    hold_seconds: int = Field(
        540,
        ge=30,
        le=3600,
        description="How long the front holds a request while the set wakes, then answers 503 "
        "with Retry-After. The default stays under the OpenAI clients' 600 s read timeout.",
    )
    cooldown_minutes: float = Field(
        10, ge=1, le=1440, description="After a failed wake, none starts for this long."
    )
    max_per_day: int = Field(
        6, ge=1, le=96, description="Most wakes in any 24 hours; then keyed requests get 503."
    )
    deadline_minutes: int = Field(
        45,
        ge=5,
        le=240,
        description="A wake that brings no replica up within this long has failed.",
    )

    @field_validator("github_repo")
    @classmethod
    def _repo(cls, v: str | None) -> str | None:
        if v is not None and not _GITHUB_REPO.match(v):
            raise ValueError(f"{v!r}: accepted: owner/name, like octo-org/llm-infra")
        return v

    @field_validator("github_workflow")
    @classmethod
    def _workflow(cls, v: str) -> str:
        if not _WORKFLOW.match(v):
            raise ValueError(
                f"{v!r}: accepted: a file name under .github/workflows/, like deploy.yml"
            )
        return v

    @field_validator("github_ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        if not _REVISION.match(v):
            raise ValueError(f"{v!r}: accepted: a branch or tag name")
        return v

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, v: str | None) -> str | None:
        # The value is not quoted back: a trigger URL may carry a CI's token in its query.
        if v is not None and not re.match(r"^https://[^\s/@]+(/\S*)?$", v):
            raise ValueError(
                "accepted: an https:// URL with no user:password@ (the token goes in a header: "
                "wake.token)"
            )
        return v

    @field_validator("webhook_header")
    @classmethod
    def _header(cls, v: str) -> str:
        if not _HEADER.match(v):
            raise ValueError(f"{v!r}: accepted: a header name (letters, digits, dashes)")
        return v


SECTIONS: dict[str, type[_Section]] = {
    "droplet": DropletConfig,
    "access": AccessConfig,
    "model": ModelConfig,
    "vllm": VllmConfig,
    "bootstrap": BootstrapConfig,
    "autodown": AutodownConfig,
    "cache": CacheConfig,
    "balancer": BalancerConfig,
    "wake": WakeConfig,
}
# Top-level plain values (not sections): name, description. `replicas` is checked in config.py.
REPLICAS_DESCRIPTION = (
    f"How many GPU Droplets serve the model (1 to {catalog.MAX_REPLICAS}). 1: one Droplet is "
    "the endpoint, as without this key. 2 or more: that many Droplets of `droplet.size` in one "
    "region and its VPC, each bootstrapped alike, behind one endpoint (`balancer`) whose "
    "address does not change as replicas come and go; updates roll one replica at a time."
)
SECRET_KEYS = ("hfToken", "apiKey")
# Where the endpoint runs: the top-level `platform` and, for Kubernetes, its own section.
Platform = Literal["droplet", "kubernetes"]
PLATFORMS: tuple[str, ...] = get_args(Platform)
PLATFORM_DESCRIPTION = (
    "Where the endpoint runs. `droplet`: GPU Droplets, everything above. `kubernetes`: a DOKS "
    "cluster whose GPU pool the cluster autoscaler takes from 0 to N nodes, with the same "
    "`model`, `vllm` (not `install`, `gitRef`: the official image runs), `access` (not SSH), "
    "`apiKey` and `hfToken`; its own settings are the `kubernetes` section below "
    "(docs/kubernetes.md). The Droplet-only sections are refused there, naming each."
)
KUBERNETES_SECTION = "kubernetes"
# Keys a Droplet stack no longer takes, each refused with what replaces it (config.parse).
RETIRED_KEYS = {
    "autoscale": (
        "the Droplet autoscaler is retired: a Droplet stack serves a fixed `replicas: N`, and "
        "sleeps at zero with wake.enabled (and its pipeline: wake.githubRepo and wake.token, "
        "or a webhook) and autodown.idleMinutes, the whole set woken by a keyed request. "
        "Capacity that follows the load is `platform: kubernetes` (KEDA and the cluster "
        "autoscaler: docs/kubernetes.md). Remove the key: pulumi config rm autoscale"
    ),
}


class StackConfig(BaseModel):
    """The validated configuration of one stack, with what the catalog says about it."""

    model_config = ConfigDict(frozen=True)

    stack: str
    droplet: DropletConfig
    access: AccessConfig
    model: ModelConfig
    vllm: VllmConfig
    bootstrap: BootstrapConfig
    autodown: AutodownConfig
    cache: CacheConfig
    balancer: BalancerConfig
    wake: WakeConfig = WakeConfig()
    # The count, fixed: autodown deletes the whole set and a wake brings the whole set back.
    replicas: int = 1
    # `platform: kubernetes`: the cluster's section (config.py sets `droplet.size` to its GPU
    # pool's size, which the serve flags read: tensor parallelism, the batch default).
    platform: Platform = "droplet"
    kubernetes: KubePlatformConfig | None = None

    @property
    def kube(self) -> KubePlatformConfig:
        """The Kubernetes section of a `platform: kubernetes` stack."""
        assert self.kubernetes is not None, "validated: platform kubernetes has its section"
        return self.kubernetes

    @property
    def size(self) -> catalog.GpuSize:
        return catalog.SIZES[self.droplet.size]

    @property
    def image(self) -> str:
        return self.droplet.image or catalog.default_image(self.size)

    @property
    def droplet_name(self) -> str:
        return self.droplet.name or f"nemotron-{_slug(self.stack)}"

    @property
    def stack_tag(self) -> str:
        """The tag that finds this stack's Droplet (with its name) among the account's."""
        return catalog.stack_tag(self.stack)

    @property
    def tags(self) -> list[str]:
        """A GPU Droplet's tags: the project's, the stack's, its lease (the outside guard that
        deletes it past autodown.maxHours should the Droplet's own timer not), the user's."""
        base = [catalog.PROJECT, self.stack_tag]
        if (minutes := self.autodown.lease_minutes) is not None:
            base.append(catalog.lease_tag(minutes))
        return base + [t for t in self.droplet.tags if t not in base]

    @property
    def pooled(self) -> bool:
        return is_pooled(self.replicas, self.wake)

    @property
    def balancer_kind(self) -> Literal["managed", "caddy"]:
        return resolved_balancer_kind(self.balancer, self.access, self.wake)

    @property
    def routing(self) -> Literal["cache-aware", "least-conn", "round-robin"]:
        """How the entry picks a replica (resolved_routing); cache-aware runs the front's
        router and the replicas' render route."""
        return resolved_routing(self.balancer, self.balancer_kind, self.replicas)

    def replica_name(self, index: int) -> str:
        """Replica 0 keeps the one-Droplet name, so growing a stack keeps its Droplet."""
        return self.droplet_name if index == 0 else f"{self.droplet_name}-{index}"

    @property
    def replica_tag(self) -> str:
        """The tag every GPU replica of this stack carries, and nothing else: the balancer's
        pool, the firewall's sources and autodown's one deletion."""
        return f"{_slug(self.droplet_name)}:replica"

    @property
    def balancer_tag(self) -> str:
        return f"{_slug(self.droplet_name)}:balancer"

    @property
    def balancer_name(self) -> str:
        return f"{self.droplet_name}-lb"

    @property
    def lock_file(self) -> Path:
        return LOCKS_DIR / catalog.lock_name(self.vllm.version, self.bootstrap.python)

    @property
    def vllm_git_ref(self) -> str:
        return self.vllm.git_ref or f"v{self.vllm.version}"

    @property
    def catalog_model(self) -> catalog.Model | None:
        return catalog.MODELS.get(self.model.id)

    @property
    def model_vram_gb(self) -> int:
        known = self.catalog_model
        if self.model.vram_gb is not None:
            return self.model.vram_gb
        assert known is not None, "validated: unknown models carry vramGb"
        return known.vram_gb

    @property
    def model_disk_gb(self) -> int:
        known = self.catalog_model
        if self.model.disk_gb is not None:
            return self.model.disk_gb
        return known.disk_gb if known else self.model_vram_gb

    @property
    def boot_disk_need_gb(self) -> int:
        """What preflight asks of the boot disk: the vLLM env and room for weights, the largest
        catalog model this size can serve (or the configured one, if larger). Sized by the
        droplet, not the model id, so that changing the model re-runs model, service and ready
        only; the model phase checks its own need again."""
        fitting = [
            m.disk_gb
            for m in catalog.MODELS.values()
            if m.vram_gb <= self.size.total_vram_gb and m.runs_on_arch(self.size)
        ]
        return catalog.VLLM_ENV_DISK_GB + max([*fitting, self.model_disk_gb])


def resolved_balancer_kind(
    balancer: BalancerConfig, access: AccessConfig, wake: WakeConfig
) -> Literal["managed", "caddy"]:
    """`auto`: DigitalOcean's Load Balancer when its certificate can be had (a domain in
    DigitalOcean DNS, HTTPS on) and nothing asks more of the entry than it does, else Caddy
    (the front that wakes the set holds requests, which the Load Balancer cannot)."""
    if balancer.kind != "auto":
        return balancer.kind
    asks_caddy = wake.enabled or balancer.routing != "auto"
    return "managed" if access.dns_zone and access.https and not asks_caddy else "caddy"


def resolved_routing(
    balancer: BalancerConfig, kind: Literal["managed", "caddy"], replicas: int
) -> Literal["cache-aware", "least-conn", "round-robin"]:
    """How the entry picks a replica: the managed Load Balancer's own round robin; Caddy's
    least_conn; or the router's cache-aware choice, which needs two replicas to choose from."""
    if kind == "managed":
        return "round-robin"
    if replicas < 2:
        return "least-conn"
    # Not the default: the router re-serializes tool definitions and loses `strict` (an
    # agent SDK's default, which constrains a tool's arguments in vLLM) and refuses a tool
    # without `parameters` (docs/routing.md, tests/test_router_attacks.py).
    return "cache-aware" if balancer.routing == "cache-aware" else "least-conn"


def is_pooled(replicas: int, wake: WakeConfig) -> bool:
    """The replicas behind a balancer: replicas >= 2, or one behind the front that wakes the
    set (wake.enabled)."""
    return replicas > 1 or wake.enabled


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)
