"""What each phase script reads: its NEMO_* settings, from the config and the catalog.

One function per phase names every setting its script reads (its `# Settings:` header lists
them: tests/test_phase_table.py); the values known only at deploy time (secrets, the address,
the reboot's result, the cache Volume's device) come in as `Inputs`. phases.py holds the table
that names each phase's function and inputs; bootstrap.py and entry.py send each its settings,
render.py writes them out for review.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..spec import catalog
from ..spec.schema import LOCKS_DIR, StackConfig
from . import autodown, balancer, gateway, pool, router, script_text, vllm_service, wake

PHASES_DIR = Path(__file__).resolve().parents[2] / "scripts" / "phases"


def shipped(name: str) -> str:
    """A file of scripts/phases/ as a host is sent it: its behaviour, not its comments
    (script_text: a fixed comment is no re-run on a live stack)."""
    text = (PHASES_DIR / name).read_text()
    return script_text.python(text) if name.endswith(".py") else script_text.bash(text)


# A shipped tree's file: a relative path of plain names (install_tree checks it again on the host).
TREE_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
# What a folder holds that is not shipped: what Python writes where it imports from.
TREE_SKIPPED = ("__pycache__", ".pyc")


def shipped_tree(folder: str, extra: Mapping[str, Path] | None = None, at: str = "") -> str:
    """A folder of scripts/phases/ (a daemon's package) as one setting: every file of it (under
    the sub-path `at`, when given: the package beside others in one folder), and each of
    `extra` at its own sub-path (another folder's modules shipped with it, as
    {"clients/github.py": SCRIPTS/clients/github.py}), each as `shipped` sends a file (its
    behaviour, not its comments). In path order, each file a line `file PATH LINES` and then
    its LINES lines: the same tree is the same bytes, and lib.sh install_tree writes it back."""
    root = PHASES_DIR / folder
    prefix = f"{at}/" if at else ""
    files = {
        prefix + path.relative_to(root).as_posix(): path
        for path in root.rglob("*")
        if path.is_file() and not any(part.endswith(TREE_SKIPPED) for part in path.parts)
    }
    for sub, source in (extra or {}).items():
        if sub in files:
            raise ValueError(f"{folder}: {sub} is in the folder already")
        files[sub] = source
    if not files:
        raise ValueError(f"{root}: no files to ship")
    parts = []
    for sub in sorted(files):
        if not TREE_PATH.fullmatch(sub) or ".." in sub.split("/"):
            raise ValueError(f"{folder}: {sub!r} is not a plain relative path")
        text = files[sub].read_text()
        if sub.endswith(".py"):
            text = script_text.python(text)
        elif sub.endswith(".sh"):
            text = script_text.bash(text)
        sent = text
        if sent and not sent.endswith("\n"):
            sent += "\n"
        parts.append(f"file {sub} {sent.count(chr(10))}\n{sent}")
    return "".join(parts).removesuffix("\n")


SECRET_PLACEHOLDER = "<secret: set at deploy time>"  # noqa: S105 (a placeholder)

Setting = str | int | bool | Sequence[str]


def lock_sha256(cfg: StackConfig) -> str:
    return hashlib.sha256(cfg.lock_file.read_bytes()).hexdigest()


def remote_lock_path(cfg: StackConfig) -> str:
    return f"{catalog.LOCKS_DIR}/{cfg.lock_file.name}"


def locked_version(cfg: StackConfig, package: str) -> str:
    """`package`'s version in the stack's lock (uv pip compile writes `name==version \\`)."""
    for line in cfg.lock_file.read_text().splitlines():
        name, sep, rest = line.partition("==")
        if sep and name.strip() == package:
            return rest.split()[0]
    raise ValueError(f"{cfg.lock_file.name} pins no {package}")


def hf_packages(cfg: StackConfig) -> list[str]:
    """The download env's packages (conda-forge specs), at the versions vLLM's lock has: the hf
    the model phase runs is the one the tests run (tests/test_model_download.py)."""
    return [
        f"{conda_name}=={locked_version(cfg, pypi_name)}"
        for conda_name, pypi_name in catalog.HF_ENV_PACKAGES
    ]


@dataclass(frozen=True)
class Ports:
    """Where a public gateway listens: 80 and 443 on a Droplet. A test that cannot take those
    gives its own here, once, so the Caddyfile and the probe that reaches it never disagree."""

    http: int = gateway.HTTP_PORT
    https: int = gateway.HTTPS_PORT

    def api(self, cfg: StackConfig) -> int:
        return self.https if cfg.access.https else self.http


@dataclass(frozen=True)
class Inputs:
    """What a phase's settings take besides the config: the values known only at deploy time
    (secrets, addresses, the reboot's result, the cache Volume's device) and, with replicas,
    which replica and what it knows of the set. Each phase's row names the ones it reads
    (phases.py); the rest keep these defaults."""

    hf_token: str = ""
    reboot_result: Mapping[str, Any] | None = None
    api_key: str = ""
    # The name the gateway serves and holds a certificate for (the balancer's: its public one).
    host: str = ""
    dns_record: str = ""
    cache_device: str = ""
    # With replicas: which one (None: a lone Droplet), its private address, the other
    # replicas (autodown.Peer: Droplet id, private address), and replica 0's private address,
    # the only source a replica's gateway lets read vLLM's /metrics.
    replica: int | None = None
    private_ip: str = ""
    peers: Sequence[Sequence[str]] = ()
    metrics_reader: str = ""
    # With the front's router (balancer.routing cache-aware): the front's private address, the
    # only source a replica's gateway lets render a prompt (vLLM's render routes).
    render_client: str = ""
    # The balancer's member phase: the replica's Droplet (its upstream file is named by it).
    droplet_id: str = ""
    # Where a public gateway listens (a test that cannot take 80 and 443 gives its own).
    ports: Ports = field(default_factory=Ports)


def preflight(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {
        "NEMO_OS_RELEASES": " ".join(catalog.OS_RELEASES),
        "NEMO_DISK_NEED_GB": cfg.boot_disk_need_gb,
        "NEMO_VOLUME_DEVICE_PREFIX": catalog.VOLUME_DEVICE_PREFIX,
        "NEMO_GPU_COUNT": cfg.size.gpu_count,
        "NEMO_WAIT_SECONDS": 600,
        "NEMO_FIRST_BOOTSTRAP_FILE": catalog.FIRST_BOOTSTRAP_FILE,
    }


def driver(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {
        "NEMO_DRIVER_MODE": cfg.bootstrap.driver.mode,
        "NEMO_DRIVER_BRANCH": cfg.bootstrap.driver.branch,
        "NEMO_MIN_DRIVER_BRANCH": catalog.min_driver_branch(cfg.vllm.version),
        "NEMO_CUDA": catalog.wheel_cuda(cfg.vllm.version),
        # Ada and Hopper run NVIDIA's open kernel modules (the default since R560).
        "NEMO_DRIVER_OPEN": True,
        "NEMO_RUNFILE_URL": cfg.bootstrap.driver.runfile_url or "",
        "NEMO_RUNFILE_SHA256": cfg.bootstrap.driver.runfile_sha256 or "",
        # NVSwitch systems: CUDA starts only with Fabric Manager of the driver's version.
        "NEMO_FABRIC_MANAGER": cfg.size.nvswitch,
    }


def cgroup(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {"NEMO_CGROUP_MODE": cfg.bootstrap.cgroup.mode}


def cache(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {
        "NEMO_CACHE_DEVICE": i.cache_device,
        "NEMO_CACHE_MOUNT": catalog.CACHE_MOUNT,
        "NEMO_CACHE_LABEL": catalog.CACHE_LABEL,
        "NEMO_CACHE_BINDS": [f"{folder}:{path}" for folder, path in catalog.CACHE_BINDS],
        # DigitalOcean attaches in seconds; the device link follows once udev has seen it.
        "NEMO_CACHE_WAIT_SECONDS": 300,
        "NEMO_VLLM_UNIT": catalog.VLLM_UNIT,
        # The size asked for: a new cache.sizeGb re-runs the phase, which grows the
        # filesystem once DigitalOcean has grown the Volume (its size also triggers a run:
        # bootstrap.py, the "volume" step, for sizes the plan holds back).
        "NEMO_CACHE_SIZE_GB": (cfg.cache.size_gb or 0) if i.cache_device else 0,
        # Copying a live Droplet's folders in (the cache turned on later), each, within the
        # phase's 60 minutes.
        "NEMO_CACHE_COPY_SECONDS": 2400,
    }


def reboot(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {"NEMO_REBOOT_DELAY": 5, **drain_settings(cfg)}


def reboot_wait(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    result = i.reboot_result or {}
    return {
        "NEMO_REBOOTING": bool(result.get("rebooting", False)),
        "NEMO_PREVIOUS_BOOT_ID": str(result.get("boot_id", "")),
        "NEMO_MIN_DRIVER_BRANCH": catalog.min_driver_branch(cfg.vllm.version),
        "NEMO_CUDA": catalog.wheel_cuda(cfg.vllm.version),
        "NEMO_CGROUP_MODE": cfg.bootstrap.cgroup.mode,
        "NEMO_FABRIC_MANAGER": cfg.size.nvswitch,
    }


def conda(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {
        "NEMO_CONDA_PREFIX": catalog.CONDA_PREFIX,
        "NEMO_MINIFORGE_URL": catalog.MINIFORGE_URL,
        "NEMO_MINIFORGE_SHA256": catalog.MINIFORGE_SHA256,
        "NEMO_PYTHON": cfg.bootstrap.python,
        "NEMO_VLLM_BASE_ENV": catalog.VLLM_BASE_ENV,
        "NEMO_HF_ENV": catalog.HF_ENV,
        "NEMO_HF_PACKAGES": hf_packages(cfg),
    }


def vllm(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {
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
        "NEMO_CUDA": catalog.wheel_cuda(cfg.vllm.version),
        "NEMO_CUDA_KEYRING_URL": catalog.CUDA_KEYRING_URL.format(distro="ubuntu2404"),
        "NEMO_CUDA_KEYRING_SHA256": "",
        "NEMO_RUNTIME_PACKAGES": " ".join(catalog.VLLM_RUNTIME_PACKAGES),
    }


def model(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {
        "NEMO_MODEL_ID": cfg.model.id,
        "NEMO_MODEL_REVISION": cfg.model.revision,
        "NEMO_MODEL_DISK_GB": cfg.model_disk_gb,
        "NEMO_MODEL_MARKER": catalog.MODEL_MARKER,
        "NEMO_DRAFT_ID": draft_id(cfg),
        "NEMO_DRAFT_DISK_GB": draft_disk_gb(cfg),
        "NEMO_HF_ENV": catalog.HF_ENV,
        "NEMO_HF_HOME": catalog.HF_HOME,
        "NEMO_HF_ENDPOINT": "",
        "NEMO_HF_TOKEN": i.hf_token,
    }


def service(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    return {
        "NEMO_VLLM_USER": catalog.VLLM_USER,
        "NEMO_HF_HOME": catalog.HF_HOME,
        "NEMO_ENV_FILE": catalog.VLLM_ENV_FILE,
        "NEMO_UNIT": catalog.VLLM_UNIT,
        "NEMO_UNIT_TEXT": vllm_service.unit_text(cfg, cached=bool(i.cache_device)),
        "NEMO_ENV_TEXT": vllm_service.env_text(i.api_key, cfg),
        # What the running service was started from: a change to any of them restarts it.
        "NEMO_RUNS_FROM": f"{vllm_service.marker_path(cfg)} {catalog.MODEL_MARKER}",
        # The env the unit runs from (complete: its marker), the others go once the
        # service runs from it.
        "NEMO_VLLM_ENV": vllm_service.env_path(cfg),
        "NEMO_VLLM_MARKER": vllm_service.marker_path(cfg),
        "NEMO_RUNS_ENV_FILE": vllm_service.RUNS_ENV_FILE,
        **drain_settings(cfg),
    }


def _gateway(
    i: Inputs, *, host: str, caddyfile: str, admin_socket: str | None, upstreams_dir: str
) -> dict[str, Setting]:
    """What every gateway phase reads (a lone Droplet's, a replica's, the balancer's): its
    site's Caddyfile, and the pinned Caddy with its unit and the key's env file."""
    return {
        "NEMO_HOST": host,
        "NEMO_CADDYFILE": caddyfile,
        "NEMO_CADDY_UNIT_TEXT": gateway.caddy_unit(admin_socket),
        "NEMO_GATEWAY_ENV_FILE": gateway.GATEWAY_ENV_FILE,
        "NEMO_GATEWAY_ENV_TEXT": f"{gateway.API_KEY_ENV}={i.api_key}",
        "NEMO_CADDY_VERSION": catalog.CADDY_VERSION,
        "NEMO_CADDY_URL": catalog.CADDY_URL,
        "NEMO_CADDY_SHA256": catalog.CADDY_SHA256,
        "NEMO_CADDY_BIN": catalog.CADDY_BIN,
        "NEMO_CADDY_USER": catalog.CADDY_USER,
        "NEMO_CADDY_HOME": catalog.CADDY_HOME,
        # A new Caddyfile must not cut the streams running through a gateway that others
        # send to (a replica's, the balancer's: those with an admin socket): reload, never
        # restart, while it runs.
        "NEMO_CADDY_RELOAD": admin_socket is not None,
        "NEMO_UPSTREAMS_DIR": upstreams_dir,
    }


def gateway_phase(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    """A GPU Droplet's gateway: a lone Droplet's public site, or a replica's private one."""
    if not cfg.pooled:
        return _gateway(
            i,
            host=i.host,
            caddyfile=gateway.lone_site(cfg, i.host),
            admin_socket=None,
            upstreams_dir="",
        )
    replica_site = gateway.replica_site(
        cfg,
        gateway.ReplicaListener(
            i.private_ip,
            # Replica 0's autodown reads every replica's /metrics; none else may.
            metrics_reader=i.metrics_reader,
            # Only the Caddy balancer retries a draining replica's 503 elsewhere; the managed
            # one is served on through the drain's notice.
            retry_elsewhere=cfg.balancer_kind == "caddy",
            # The front's router asks every replica for each prompt's token ids; none else may.
            render_client=i.render_client if cfg.routing == "cache-aware" else "",
        ),
    )
    return _gateway(
        i,
        host=i.private_ip,
        caddyfile=replica_site,
        admin_socket=catalog.CADDY_ADMIN_SOCKET,
        upstreams_dir="",
    )


def autodown_phase(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    from . import phases  # noqa: PLC0415 (its rows name this module's functions)

    # With replicas, replica 0 watches the set; the others run no rule of their own.
    mode = cfg.autodown.mode if not i.replica else "off"
    return {
        "NEMO_AUTODOWN_MODE": mode,
        "NEMO_AUTODOWN_ENV_TEXT": autodown.env_text(
            cfg,
            "" if cfg.pooled else i.dns_record,
            [autodown.Peer(*peer) for peer in i.peers],
            i.api_key,
            phases.bootstrap_minutes(cfg),
        ),
        "NEMO_AUTODOWN_ENV_FILE": autodown.ENV_FILE,
        "NEMO_AUTODOWN_DIR": autodown.TREE_DIR,
        "NEMO_AUTODOWN_OLD_SCRIPT": autodown.OLD_SCRIPT_PATH,
        "NEMO_AUTODOWN_SERVICE_TEXT": autodown.service_text(),
        "NEMO_AUTODOWN_TIMER_TEXT": autodown.timer_text(),
        # The package and the clients it imports, as one folder (autodown.TREE_DIR). Off, none:
        # a new rule changes nothing where none runs.
        "NEMO_AUTODOWN_TREE": (
            shipped_tree(autodown.PACKAGE, autodown.tree_extra(), at=autodown.PACKAGE)
            if mode != "off"
            else ""
        ),
    }


def _ready(
    cfg: StackConfig,
    probe: Mapping[str, Setting],
    *,
    host: str,
    acme_patience: int,
    acme_issuers: int,
    drain_file: str,
    rejoin_seconds: int,
    vllm_env: str,
    env_file: str,
    key_var: str,
    unit: str,
) -> dict[str, Setting]:
    """What every ready phase reads: a chat completion through `probe`, and what it checks
    while it waits."""
    return {
        **probe,
        "NEMO_PROBE_CA": "",
        "NEMO_KEY_VAR": key_var,
        "NEMO_SERVED_NAME": cfg.model.served_name,
        "NEMO_UNIT": unit,
        "NEMO_ENV_FILE": env_file,
        "NEMO_READY_TIMEOUT": cfg.bootstrap.ready_timeout_minutes * 60,
        # The gateway's certificate: a refusal that will not pass (a rate limit, a CAA
        # record) ends the wait at once; one Caddy may still get past (the CA unreachable,
        # a challenge that failed while DNS catches up) after this long.
        "NEMO_GATEWAY_UNIT": catalog.CADDY_UNIT,
        "NEMO_HOST": host,
        "NEMO_ACME_PATIENCE": acme_patience,
        "NEMO_ACME_ISSUERS": acme_issuers,
        # A replica back from an update rejoins the pool before the next one starts.
        "NEMO_DRAIN_FILE": drain_file,
        "NEMO_REJOIN_SECONDS": rejoin_seconds,
        # Once vLLM answered from the unit's env, the envs before it go.
        "NEMO_VLLM_ENV": vllm_env,
        **vllm_service.env_settings(),
    }


def ready(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    """A GPU Droplet's ready: through its gateway, on the Droplet (its real TLS and routes, no
    DNS needed; a replica's: its private listener)."""
    pooled = cfg.pooled
    site = i.private_ip if pooled else i.host
    probe = (
        {
            "NEMO_PROBE_URL": f"http://{site}:{catalog.REPLICA_PORT}/v1/chat/completions",
            "NEMO_PROBE_RESOLVE": f"{site}:{catalog.REPLICA_PORT}:{site}",
        }
        if pooled
        else public_probe(cfg, i.host, Ports())
    )
    return _ready(
        cfg,
        probe,
        host=site,
        acme_patience=ACME_PATIENCE_SECONDS if cfg.access.https and not pooled else 0,
        acme_issuers=0 if pooled else acme_issuers(cfg, i.host),
        drain_file=pool.drain_file() if pooled else "",
        rejoin_seconds=pool.rejoin_seconds(cfg) if pooled else 0,
        vllm_env=vllm_service.env_path(cfg),
        env_file=catalog.VLLM_ENV_FILE,
        key_var="VLLM_API_KEY",
        unit=catalog.VLLM_UNIT,
    )


# ---- the Caddy balancer's phases -----------------------------------------------------------


def balancer_preflight(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    """A CPU host: no GPU, the disk Caddy needs."""
    return {**preflight(cfg, i), "NEMO_DISK_NEED_GB": 1, "NEMO_GPU_COUNT": 0}


def balancer_gateway(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    """The public gate in front of the replicas' upstream files."""
    listen = gateway.Listen(http_port=i.ports.http, https_port=i.ports.https)
    site = gateway.balancer_site(cfg, i.host, listen)
    return _gateway(
        i,
        host=i.host,
        caddyfile=site,
        admin_socket=catalog.CADDY_ADMIN_SOCKET,
        upstreams_dir=catalog.BALANCER_UPSTREAMS_DIR,
    )


def balancer_member(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    """One replica in the pool: it enters once ready, and leaves, drained, before it is
    replaced or removed."""
    up = pool.upstream(i.private_ip)
    return {
        "NEMO_REPLICA": i.replica or 0,
        "NEMO_UPSTREAM": up.dial,
        "NEMO_UPSTREAM_FILE": pool.upstream_file(i.replica or 0, i.droplet_id),
        "NEMO_UPSTREAM_LINE": balancer.upstream_line(up),
        "NEMO_UPSTREAM_JOINED_FILE": pool.joined_file(i.replica or 0, i.droplet_id),
        "NEMO_UPSTREAMS_DIR": catalog.BALANCER_UPSTREAMS_DIR,
        "NEMO_ADMIN_SOCKET": catalog.CADDY_ADMIN_SOCKET,
        "NEMO_CADDY_UNIT": catalog.CADDY_UNIT,
        "NEMO_CADDY_BIN": catalog.CADDY_BIN,
        "NEMO_LEAVE_SECONDS": pool.DRAIN_SECONDS,
        # With the front's router (cache-aware): the replica joins and leaves it too, and the
        # leave waits on its gauge (Caddy sees only the router).
        "NEMO_ROUTER": "on" if cfg.routing == "cache-aware" else "off",
        "NEMO_ROUTER_ADDRESS": router.ADDRESS,
        "NEMO_ROUTER_METRICS": router.METRICS_ADDRESS,
        "NEMO_ROUTER_UNIT": catalog.ROUTER_UNIT,
        "NEMO_ROUTER_GAUGE": router.RUNNING_GAUGE,
        "NEMO_WORKER_URL": router.worker_url(up.dial),
        # add_worker's own wait for the replica's /health, and a little more.
        "NEMO_ROUTER_JOIN_SECONDS": router.WORKER_STARTUP_SECONDS + 10,
    }


def balancer_wake(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    """The front's waker (wake.enabled): its package, settings, token and unit. Off: it removes
    one an earlier run installed, and carries none of their text, so a new waker changes
    nothing on a stack that does not run one."""
    on = cfg.wake.enabled
    token = cfg.wake.token.get_secret_value() if on and cfg.wake.token is not None else ""
    return {
        "NEMO_WAKE_MODE": wake.mode(cfg),
        # The package and the clients it imports, as one folder (wake.TREE_DIR).
        "NEMO_WAKE_TREE": (
            shipped_tree(wake.PACKAGE, wake.tree_extra(), at=wake.PACKAGE) if on else ""
        ),
        "NEMO_WAKE_DIR": wake.TREE_DIR,
        # The single-file waker of earlier releases: removed wherever a front still has it.
        "NEMO_WAKE_OLD_SCRIPT": wake.OLD_SCRIPT_PATH,
        "NEMO_WAKE_ENV_FILE": wake.ENV_FILE,
        "NEMO_WAKE_ENV_TEXT": wake.env_text(cfg) if on else "",
        "NEMO_WAKE_TOKEN_FILE": wake.TOKEN_FILE,
        "NEMO_WAKE_TOKEN": token,
        "NEMO_WAKE_OLD_KEY_FILE": wake.OLD_KEY_FILE,
        "NEMO_WAKE_UNIT": wake.UNIT,
        "NEMO_WAKE_UNIT_TEXT": wake.unit_text() if on else "",
        # Replicas that joined before join marks existed are marked once (wake.sh).
        "NEMO_UPSTREAMS_DIR": catalog.BALANCER_UPSTREAMS_DIR,
        "NEMO_JOINED_SUFFIX": catalog.BALANCER_JOINED_SUFFIX,
        "NEMO_CADDY_UNIT": catalog.CADDY_UNIT,
        "NEMO_WAKE_ADDRESS": wake.ADDRESS,
        "NEMO_WAKE_PYTHON": wake.PYTHON,
        "NEMO_WAKE_PACKAGE": wake.APT_PACKAGE,
    }


def router_lock_text() -> str:
    """The router's committed lock, as the front's copy holds it (printf adds the last newline
    back): shipped whole, so a new lock re-runs the router phase."""
    return (LOCKS_DIR / catalog.router_lock_name()).read_text().removesuffix("\n")


def balancer_router(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    """The front's cache-aware router (balancer.routing: cache-aware): uv from PyPI's wheel, the
    router from its lock into a venv of Ubuntu's python3, its start script and unit. Off: it
    removes one an earlier run installed, and carries none of their text, so a new router or
    lock changes nothing on a stack that does not run one."""
    on = cfg.routing == "cache-aware"
    return {
        "NEMO_ROUTER_MODE": "on" if on else "off",
        "NEMO_UV_VERSION": catalog.UV_VERSION,
        "NEMO_UV_WHEEL_URL": catalog.UV_WHEEL_URL if on else "",
        "NEMO_UV_WHEEL_SHA256": catalog.UV_WHEEL_SHA256 if on else "",
        "NEMO_UV_BIN": catalog.UV_BIN,
        "NEMO_ROUTER_LOCK_TEXT": router_lock_text() if on else "",
        "NEMO_ROUTER_LOCK_PATH": catalog.ROUTER_LOCK_PATH,
        "NEMO_ROUTER_PREFIX": catalog.ROUTER_PREFIX,
        # Ubuntu 24.04's own python3 (catalog.ROUTER_PYTHON, the lock's): the venv's base.
        "NEMO_ROUTER_PYTHON": "/usr/bin/python3",
        "NEMO_ROUTER_PYTHON_VERSION": catalog.ROUTER_PYTHON,
        "NEMO_ROUTER_BIN": router.BIN,
        "NEMO_ROUTER_START_TEXT": router.start_script() if on else "",
        "NEMO_ROUTER_START_SCRIPT": router.START_SCRIPT,
        "NEMO_ROUTER_UNIT": catalog.ROUTER_UNIT,
        "NEMO_ROUTER_UNIT_TEXT": router.unit_text() if on else "",
        "NEMO_ROUTER_ADDRESS": router.ADDRESS,
        "NEMO_ROUTER_METRICS_ADDRESS": router.METRICS_ADDRESS,
    }


def balancer_ready(cfg: StackConfig, i: Inputs) -> dict[str, Setting]:
    """A chat completion through the balancer's own public entry, as a client sees it (its
    certificate, with the patience a lone gateway's has for an ACME failure that may pass);
    the answer comes from a replica, and it drains nothing."""
    return _ready(
        cfg,
        public_probe(cfg, i.host, i.ports),
        host=i.host,
        acme_patience=ACME_PATIENCE_SECONDS if cfg.access.https else 0,
        acme_issuers=acme_issuers(cfg, i.host),
        drain_file="",
        rejoin_seconds=0,
        vllm_env="",
        env_file=gateway.GATEWAY_ENV_FILE,
        key_var=gateway.API_KEY_ENV,
        unit="",
    )


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
    Encrypt then ZeroSSL for a name, when an email is configured (docs/facts.md: Caddy adds ZeroSSL
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
