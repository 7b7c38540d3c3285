"""What each phase script reads: its NEMO_* settings, from the config and the catalog.

One function, `settings(cfg, phase, ...)`, names every setting of every phase (each script's
header lists the ones it reads); the values known only at deploy time (secrets, the address, the
reboot's result, the cache Volume's device) come in as arguments. bootstrap.py orders the phases
and sends each its settings; render.py writes them out for review.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import autodown, balancer, catalog, gateway, pool, vllm_service
from .schema import StackConfig

PHASES_DIR = Path(__file__).resolve().parent.parent / "scripts" / "phases"
SECRET_PLACEHOLDER = "<secret: set at deploy time>"  # noqa: S105 (a placeholder)

Setting = str | int | bool | Sequence[str]


def lock_sha256(cfg: StackConfig) -> str:
    return hashlib.sha256(cfg.lock_file.read_bytes()).hexdigest()


def remote_lock_path(cfg: StackConfig) -> str:
    return f"{catalog.LOCKS_DIR}/{cfg.lock_file.name}"


def settings(
    cfg: StackConfig,
    phase: str,
    *,
    hf_token: str = "",
    reboot_result: Mapping[str, Any] | None = None,
    api_key: str = "",
    host: str = "",
    dns_record: str = "",
    cache_device: str = "",
    replica: int | None = None,
    private_ip: str = "",
    peers: Sequence[Sequence[str]] = (),
    metrics_reader: str = "",
) -> dict[str, Setting]:
    """The NEMO_* settings each phase script reads (see the header of each script). With
    replicas (`replica`: which one), the gateway listens on `private_ip` for the balancer,
    updates drain first, and replica 0's autodown watches the `peers` too (the others' Droplet
    ids and private addresses, as autodown.Peer); `metrics_reader` (replica 0's private
    address) is the only source a replica's gateway lets read vLLM's /metrics."""
    pooled = cfg.pooled
    site = private_ip if pooled else host
    min_branch = catalog.min_driver_branch(cfg.vllm.version)
    cuda = catalog.wheel_cuda(cfg.vllm.version)
    common: dict[str, dict[str, Setting]] = {
        "preflight": {
            "NEMO_OS_RELEASES": " ".join(catalog.OS_RELEASES),
            "NEMO_DISK_NEED_GB": catalog.VLLM_ENV_DISK_GB + preflight_model_disk_gb(cfg),
            "NEMO_GPU_COUNT": cfg.size.gpu_count,
            "NEMO_WAIT_SECONDS": 600,
            "NEMO_FIRST_BOOTSTRAP_FILE": catalog.FIRST_BOOTSTRAP_FILE,
        },
        "driver": {
            "NEMO_DRIVER_MODE": cfg.bootstrap.driver.mode,
            "NEMO_DRIVER_BRANCH": cfg.bootstrap.driver.branch,
            "NEMO_MIN_DRIVER_BRANCH": min_branch,
            "NEMO_CUDA": cuda,
            # Ada and Hopper run NVIDIA's open kernel modules (the default since R560).
            "NEMO_DRIVER_OPEN": True,
            "NEMO_RUNFILE_URL": cfg.bootstrap.driver.runfile_url or "",
            "NEMO_RUNFILE_SHA256": cfg.bootstrap.driver.runfile_sha256 or "",
            # NVSwitch systems: CUDA starts only with Fabric Manager of the driver's version.
            "NEMO_FABRIC_MANAGER": cfg.size.nvswitch,
        },
        "cgroup": {"NEMO_CGROUP_MODE": cfg.bootstrap.cgroup.mode},
        "cache": {
            "NEMO_CACHE_DEVICE": cache_device,
            "NEMO_CACHE_MOUNT": catalog.CACHE_MOUNT,
            "NEMO_CACHE_LABEL": catalog.CACHE_LABEL,
            "NEMO_CACHE_BINDS": [f"{folder}:{path}" for folder, path in catalog.CACHE_BINDS],
            # DigitalOcean attaches in seconds; the device link follows once udev has seen it.
            "NEMO_CACHE_WAIT_SECONDS": 300,
            "NEMO_VLLM_UNIT": catalog.VLLM_UNIT,
            # The size asked for: a new cache.sizeGb re-runs the phase, which grows the
            # filesystem once DigitalOcean has grown the Volume (its size also triggers a run:
            # bootstrap.py, the "volume" step, for sizes the plan holds back).
            "NEMO_CACHE_SIZE_GB": (cfg.cache.size_gb or 0) if cache_device else 0,
            # Copying a live Droplet's folders in (the cache turned on later), each, within the
            # phase's 60 minutes.
            "NEMO_CACHE_COPY_SECONDS": 2400,
        },
        "reboot": {"NEMO_REBOOT_DELAY": 5, **drain_settings(cfg)},
        "reboot-wait": {
            "NEMO_REBOOTING": bool((reboot_result or {}).get("rebooting", False)),
            "NEMO_PREVIOUS_BOOT_ID": str((reboot_result or {}).get("boot_id", "")),
            "NEMO_MIN_DRIVER_BRANCH": min_branch,
            "NEMO_CUDA": cuda,
            "NEMO_CGROUP_MODE": cfg.bootstrap.cgroup.mode,
            "NEMO_FABRIC_MANAGER": cfg.size.nvswitch,
        },
        "conda": {
            "NEMO_CONDA_PREFIX": catalog.CONDA_PREFIX,
            "NEMO_MINIFORGE_URL": catalog.MINIFORGE_URL,
            "NEMO_MINIFORGE_SHA256": catalog.MINIFORGE_SHA256,
            "NEMO_PYTHON": cfg.bootstrap.python,
            "NEMO_VLLM_BASE_ENV": catalog.VLLM_BASE_ENV,
            "NEMO_HF_ENV": catalog.HF_ENV,
        },
        "vllm": {
            "NEMO_VLLM_INSTALL": cfg.vllm.install,
            "NEMO_VLLM_VERSION": cfg.vllm.version,
            # A new env beside the one the service runs from (never touched); the service
            # phase switches to it.
            "NEMO_VLLM_ENV": vllm_service.env_path(cfg),
            "NEMO_VLLM_MARKER": vllm_service.marker_path(cfg),
            "NEMO_CONDA_PREFIX": catalog.CONDA_PREFIX,
            "NEMO_VLLM_BASE_ENV": catalog.VLLM_BASE_ENV,
            "NEMO_UNIT": catalog.VLLM_UNIT,
            **vllm_service.env_settings(),
            "NEMO_LOCK_FILE": remote_lock_path(cfg),
            "NEMO_LOCK_SHA256": lock_sha256(cfg),
            "NEMO_VLLM_GIT_URL": catalog.VLLM_GIT_URL,
            "NEMO_VLLM_GIT_REF": cfg.vllm_git_ref,
            "NEMO_CUDA": cuda,
            "NEMO_CUDA_KEYRING_URL": catalog.CUDA_KEYRING_URL.format(distro="ubuntu2404"),
            "NEMO_CUDA_KEYRING_SHA256": "",
            "NEMO_RUNTIME_PACKAGES": " ".join(catalog.VLLM_RUNTIME_PACKAGES),
        },
        "model": {
            "NEMO_MODEL_ID": cfg.model.id,
            "NEMO_MODEL_REVISION": cfg.model.revision,
            "NEMO_MODEL_DISK_GB": cfg.model_disk_gb,
            "NEMO_MODEL_MARKER": catalog.MODEL_MARKER,
            "NEMO_DRAFT_ID": draft_id(cfg),
            "NEMO_DRAFT_DISK_GB": draft_disk_gb(cfg),
            "NEMO_HF_ENV": catalog.HF_ENV,
            "NEMO_HF_HOME": catalog.HF_HOME,
            "NEMO_HF_ENDPOINT": "",
            "NEMO_HF_TOKEN": hf_token,
        },
        "service": {
            "NEMO_VLLM_USER": catalog.VLLM_USER,
            "NEMO_HF_HOME": catalog.HF_HOME,
            "NEMO_ENV_FILE": catalog.VLLM_ENV_FILE,
            "NEMO_UNIT": catalog.VLLM_UNIT,
            "NEMO_UNIT_TEXT": vllm_service.unit_text(cfg, cached=bool(cache_device)),
            "NEMO_ENV_TEXT": vllm_service.env_text(api_key, cfg),
            # What the running service was started from: a change to any of them restarts it.
            "NEMO_RUNS_FROM": f"{vllm_service.marker_path(cfg)} {catalog.MODEL_MARKER}",
            # The env the unit runs from (complete: its marker), the others go once the
            # service runs from it.
            "NEMO_VLLM_ENV": vllm_service.env_path(cfg),
            "NEMO_VLLM_MARKER": vllm_service.marker_path(cfg),
            "NEMO_RUNS_ENV_FILE": vllm_service.RUNS_ENV_FILE,
            **drain_settings(cfg),
        },
        "gateway": {
            "NEMO_HOST": site,
            "NEMO_CADDYFILE": (
                gateway.caddyfile(
                    cfg,
                    site,
                    replica=gateway.ReplicaListener(
                        site,
                        # Replica 0's autodown reads every replica's /metrics; none else may.
                        metrics_reader=metrics_reader,
                        # Only the Caddy balancer retries a draining replica's 503 elsewhere;
                        # the managed one is served on through the drain's notice.
                        retry_elsewhere=cfg.balancer_kind == "caddy",
                    ),
                    admin_socket=catalog.CADDY_ADMIN_SOCKET,
                )
                if pooled
                else gateway.caddyfile(cfg, host)
            ),
            # A replica's gateway takes a new Caddyfile by graceful reload, as the balancer does.
            "NEMO_CADDY_UNIT_TEXT": gateway.caddy_unit(
                catalog.CADDY_ADMIN_SOCKET if pooled else None
            ),
            "NEMO_GATEWAY_ENV_FILE": gateway.GATEWAY_ENV_FILE,
            "NEMO_GATEWAY_ENV_TEXT": f"{gateway.API_KEY_ENV}={api_key}",
            "NEMO_CADDY_VERSION": catalog.CADDY_VERSION,
            "NEMO_CADDY_URL": catalog.CADDY_URL,
            "NEMO_CADDY_SHA256": catalog.CADDY_SHA256,
            "NEMO_CADDY_BIN": catalog.CADDY_BIN,
            "NEMO_CADDY_USER": catalog.CADDY_USER,
            "NEMO_CADDY_HOME": catalog.CADDY_HOME,
            "NEMO_CADDY_RELOAD": pooled,
            "NEMO_UPSTREAMS_DIR": "",
        },
        "autodown": {
            # With replicas, replica 0 watches the set; the others run no rule of their own.
            "NEMO_AUTODOWN_MODE": (cfg.autodown.mode if not replica else "off"),
            "NEMO_AUTODOWN_ENV_TEXT": autodown.env_text(
                cfg,
                "" if pooled else dns_record,
                [autodown.Peer(*peer) for peer in peers],
                api_key,
            ),
            "NEMO_AUTODOWN_ENV_FILE": autodown.ENV_FILE,
            "NEMO_AUTODOWN_SCRIPT": autodown.SCRIPT_PATH,
            "NEMO_AUTODOWN_SERVICE_TEXT": autodown.service_text(),
            "NEMO_AUTODOWN_TIMER_TEXT": autodown.timer_text(),
            "NEMO_AUTODOWN_PY": (PHASES_DIR / "autodown.py").read_text(),
        },
        "ready": {
            # Through the gateway, on the Droplet: its real TLS and routes, no DNS needed (a
            # replica's: its private listener).
            **(
                {
                    "NEMO_PROBE_URL": f"http://{site}:{catalog.REPLICA_PORT}/v1/chat/completions",
                    "NEMO_PROBE_RESOLVE": f"{site}:{catalog.REPLICA_PORT}:{site}",
                }
                if pooled
                else public_probe(cfg, host, Ports())
            ),
            "NEMO_PROBE_CA": "",
            "NEMO_KEY_VAR": "VLLM_API_KEY",
            "NEMO_SERVED_NAME": cfg.model.served_name,
            "NEMO_UNIT": catalog.VLLM_UNIT,
            "NEMO_ENV_FILE": catalog.VLLM_ENV_FILE,
            "NEMO_READY_TIMEOUT": cfg.bootstrap.ready_timeout_minutes * 60,
            # The gateway's certificate: a refusal that will not pass (a rate limit, a CAA
            # record) ends the wait at once; one Caddy may still get past (the CA unreachable,
            # a challenge that failed while DNS catches up) after this long.
            "NEMO_GATEWAY_UNIT": catalog.CADDY_UNIT,
            "NEMO_HOST": site,
            "NEMO_ACME_PATIENCE": ACME_PATIENCE_SECONDS if cfg.access.https and not pooled else 0,
            "NEMO_ACME_ISSUERS": 0 if pooled else acme_issuers(cfg, host),
            # A replica back from an update rejoins the pool before the next one starts.
            "NEMO_DRAIN_FILE": drain_settings(cfg)["NEMO_DRAIN_FILE"],
            "NEMO_REJOIN_SECONDS": pool.rejoin_seconds(cfg) if pooled else 0,
            # Once vLLM answered from the unit's env, the envs before it go.
            "NEMO_VLLM_ENV": vllm_service.env_path(cfg),
            **vllm_service.env_settings(),
        },
    }
    return common[phase]


@dataclass(frozen=True)
class Ports:
    """Where a public gateway listens: 80 and 443 on a Droplet. A test that cannot take those
    gives its own here, once, so the Caddyfile and the probe that reaches it never disagree."""

    http: int = gateway.HTTP_PORT
    https: int = gateway.HTTPS_PORT

    def api(self, cfg: StackConfig) -> int:
        return self.https if cfg.access.https else self.http


def public_probe(cfg: StackConfig, host: str, ports: Ports) -> dict[str, Setting]:
    """ready's probe through a public gateway, from its own host: the endpoint's name, its
    TLS and its gate, the name resolved to this host (no DNS needed)."""
    port = ports.api(cfg)
    default = port == gateway.api_port(cfg)
    base = gateway.endpoint(cfg, host if default else f"{host}:{port}")
    return {
        "NEMO_PROBE_URL": f"{base}/chat/completions",
        "NEMO_PROBE_RESOLVE": f"{host}:{port}:127.0.0.1",
    }


def acme_issuers(cfg: StackConfig, host: str) -> int:
    """How many ACME CAs a public gateway's Caddy tries for its certificate, in order: Let's
    Encrypt alone for an IP address (the site names its one issuer, for the IP profile), Let's
    Encrypt then ZeroSSL for a name, when an email is configured (FACTS.md: Caddy adds ZeroSSL
    only then; certmagic config.go tries the issuers in turn), so ready never calls a Let's
    Encrypt rate limit final while ZeroSSL is still to try."""
    if not cfg.access.https:
        return 0
    return 1 if gateway.is_ip(host) or not cfg.access.acme_email else 2


def drain_settings(cfg: StackConfig) -> dict[str, Setting]:
    """What lib.sh's drain reads: a replica leaves the balancer's pool before a vLLM restart or
    a reboot ("": a lone Droplet, nothing to leave)."""
    return {
        "NEMO_DRAIN_FILE": pool.drain_file() if cfg.pooled else "",
        "NEMO_DRAIN_NOTICE_SECONDS": pool.notice_seconds(cfg) if cfg.pooled else 0,
        "NEMO_DRAIN_SECONDS": pool.DRAIN_SECONDS,
        # Gauges up but no token moving this long: stuck gauges, not work (pool.stall_seconds).
        "NEMO_DRAIN_STALL_SECONDS": pool.stall_seconds(cfg),
        "NEMO_METRICS_URL": f"http://127.0.0.1:{catalog.VLLM_PORT}/metrics",
    }


def balancer_settings(
    cfg: StackConfig,
    phase: str,
    *,
    api_key: str = "",
    host: str = "",
    replica: int = 0,
    private_ip: str = "",
    droplet_id: str = "",
    ports: Ports = Ports(),
) -> dict[str, Setting]:
    """The settings of the Caddy balancer Droplet's phases: preflight (a CPU host), gateway (the
    public gate in front of the replicas' files), member (one per replica: it enters the pool
    once ready, and leaves it, drained, before it is replaced or removed), ready (a chat
    completion through its own public entry, as a client sees it)."""
    if phase == "preflight":
        return {
            **settings(cfg, "preflight"),
            "NEMO_DISK_NEED_GB": 1,
            "NEMO_GPU_COUNT": 0,
        }
    if phase == "gateway":
        return {
            **settings(cfg, "gateway", api_key=api_key, host=host),
            # The public name it serves (settings() gives a replica's private address).
            "NEMO_HOST": host,
            "NEMO_CADDYFILE": gateway.caddyfile(
                cfg,
                host,
                http_port=ports.http,
                https_port=ports.https,
                upstreams_glob=f"{catalog.BALANCER_UPSTREAMS_DIR}/*.caddy",
                admin_socket=catalog.CADDY_ADMIN_SOCKET,
            ),
            "NEMO_CADDY_UNIT_TEXT": gateway.caddy_unit(catalog.CADDY_ADMIN_SOCKET),
            # A new Caddyfile (a body limit, a route) must not cut the streams running
            # through the balancer: reload, never restart, while it runs.
            "NEMO_CADDY_RELOAD": True,
            "NEMO_UPSTREAMS_DIR": catalog.BALANCER_UPSTREAMS_DIR,
        }
    if phase == "member":
        up = pool.upstream(private_ip)
        return {
            "NEMO_REPLICA": replica,
            "NEMO_UPSTREAM": up.dial,
            "NEMO_UPSTREAM_FILE": pool.upstream_file(replica, droplet_id),
            "NEMO_UPSTREAM_LINE": balancer.upstream_line(up),
            "NEMO_UPSTREAMS_DIR": catalog.BALANCER_UPSTREAMS_DIR,
            "NEMO_ADMIN_SOCKET": catalog.CADDY_ADMIN_SOCKET,
            "NEMO_CADDY_UNIT": catalog.CADDY_UNIT,
            "NEMO_CADDY_BIN": catalog.CADDY_BIN,
            "NEMO_LEAVE_SECONDS": pool.DRAIN_SECONDS,
        }
    if phase == "ready":
        # A replica's ready probes its private listener; the balancer has none: its probe goes
        # through its own public entry (its certificate, with the patience a lone gateway's
        # has for an ACME failure that may pass), and it drains nothing.
        return {
            **settings(cfg, "ready", host=host),
            **public_probe(cfg, host, ports),
            "NEMO_HOST": host,
            "NEMO_ACME_PATIENCE": ACME_PATIENCE_SECONDS if cfg.access.https else 0,
            "NEMO_ACME_ISSUERS": acme_issuers(cfg, host),
            "NEMO_DRAIN_FILE": "",
            "NEMO_REJOIN_SECONDS": 0,
            "NEMO_VLLM_ENV": "",
            "NEMO_ENV_FILE": gateway.GATEWAY_ENV_FILE,
            "NEMO_KEY_VAR": gateway.API_KEY_ENV,
            # No vLLM here: the answer comes from a replica through the balancer.
            "NEMO_UNIT": "",
        }
    raise ValueError(f"the balancer has no phase {phase!r}")


# How long ready lets Caddy retry an ACME failure that may pass (certmagic retries after 1, 2, 2,
# 5 minutes...): three tries, time for a DNS record to reach the CA's resolvers.
ACME_PATIENCE_SECONDS = 600


def draft_id(cfg: StackConfig) -> str:
    """The speculative-decoding draft the model phase downloads ("": none)."""
    spec = cfg.vllm.speculative
    return spec.model if spec is not None and spec.model is not None else ""


def draft_disk_gb(cfg: StackConfig) -> int:
    """Disk for the draft: the catalog's figure, or a generous default for one it lacks."""
    if not draft_id(cfg):
        return 0
    known = cfg.catalog_model
    drafts = {d.repo_id: d.disk_gb for d in (known.drafts if known else ())}
    return drafts.get(draft_id(cfg), catalog.DRAFT_DISK_GB)


def preflight_model_disk_gb(cfg: StackConfig) -> int:
    """Disk preflight reserves for weights: the largest catalog model this size can serve (or
    the configured one, if larger). Sized by the droplet, not the model id, so that changing the
    model re-runs model, service and ready only; the model phase checks its own need again."""
    fitting = [
        m.disk_gb
        for m in catalog.MODELS.values()
        if m.vram_gb <= cfg.size.total_vram_gb and m.runs_on_arch(cfg.size)
    ]
    return max([*fitting, cfg.model_disk_gb])
