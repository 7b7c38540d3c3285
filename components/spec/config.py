"""The stack configuration, validated before any resource is declared.

`parse()` checks each section against its model (schema.py), then the rules that span sections,
and reports every bad field at once, each by its path (`droplet.size: ...`) with what is
accepted. Nothing here knows Pulumi: components/cloud/stack_config.py reads the running stack's
keys from the engine, calls `parse()`, and raises before anything is created or billed.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from . import apikey, catalog
from .kube import KubePlatformConfig, edge_sources
from .schema import (
    KUBERNETES_SECTION,
    LOCKS_DIR,
    NAMESPACE,
    PLATFORMS,
    RETIRED_KEYS,
    SECRET_KEYS,
    SECTIONS,
    AccessConfig,
    BalancerConfig,
    BootstrapConfig,
    DropletConfig,
    ModelConfig,
    SpeculativeConfig,
    StackConfig,
    VllmConfig,
    WakeConfig,
    _Section,
    is_pooled,
    resolved_balancer_kind,
    set_secret,
)

__all__ = ["NAMESPACE", "SECTIONS", "ConfigError", "StackConfig", "parse"]


class ConfigError(Exception):
    """Bad stack configuration. Raised before any resource is declared (the cloud package
    raises it to the engine as its RunError: components/cloud/stack_config.py)."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"the stack configuration has {len(problems)} problem(s); nothing was created:\n{lines}"
        )


# ---- loading and reporting ------------------------------------------------------------------


def _path(section: str, loc: tuple[Any, ...]) -> str:
    return ".".join([section, *(str(p) for p in loc)])


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the field at `loc` (for naming the accepted keys)."""
    current: type[BaseModel] = model
    for part in loc:
        field = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
        if field is None or not (
            isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        ):
            return None
        current = field.annotation
    return current


def _accepted_keys(model: type[BaseModel]) -> str:
    return ", ".join(f.alias or n for n, f in model.model_fields.items())


def _secret_at(model: type[BaseModel], loc: tuple[Any, ...]) -> bool:
    """Whether the field at `loc` holds a secret (a SecretStr): its value is never quoted."""
    holder = _model_at(model, loc[:-1]) if loc else None
    fields = holder.model_fields.items() if holder is not None else []
    field = next((f for n, f in fields if loc[-1] in (n, f.alias)), None)
    return field is not None and "SecretStr" in str(field.annotation)


# A value quoted in a refusal: repr() of a YAML alias bomb (one list shared a million times,
# a few hundred bytes of file) is gigabytes; reprlib stops at a depth and a count, then a cut.
_QUOTE = reprlib.Repr()  # its limits as attributes: Python 3.11 takes no keyword arguments
_QUOTE.maxlevel, _QUOTE.maxlist, _QUOTE.maxdict, _QUOTE.maxstring, _QUOTE.maxother = 2, 4, 4, 60, 60


def shown(value: object) -> str:
    """A value from the stack file, quoted short (repr's form)."""
    text = _QUOTE.repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _number_for_text(given: float, secret: bool) -> str:
    """An unquoted `version: 0.33` or `branch: 580` is a number to YAML, and stays one through
    Pulumi's JSON: say to quote it. A float has already lost what it was written as (0.30 is
    0.3 by now), so the user is told to write the digits they meant. A secret's value (a
    token of digits) is never quoted: this line goes to `pulumi up`'s output."""
    if secret:
        return "a number here, and this field takes text: quote it (a secret: not shown)"
    message = f"{given!r} is a number here, and this field takes text: write it quoted: '{given}'"
    if isinstance(given, float):
        message += " (an unquoted 0.30 reads as 0.3 in YAML: quote the digits you meant)"
    return message


def _section_problems(name: str, model: type[BaseModel], err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            holder = _model_at(model, loc[:-1])
            accepted = _accepted_keys(holder) if holder else "see the README"
            problems.append(f"{_path(name, loc)}: unknown key; accepted: {accepted}")
            continue
        message = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        if e["type"] == "string_type" and type(given) in (int, float):
            message = _number_for_text(given, _secret_at(model, loc))
        if e["type"] == "list_type":
            # `regions: nyc2` in YAML is a string: say what a list looks like, with theirs.
            given = e.get("input")
            example = f"[{given}]" if isinstance(given, str) and given else "[nyc2, tor1]"
            message = f"{shown(given)} is not a list; accepted: a YAML list such as {example}"
        problems.append(f"{_path(name, loc)}: {message}")
    return problems


def _hardware_rules(parsed: Mapping[str, Any], ok: Callable[..., bool]) -> list[str]:
    """Image against size, model against VRAM."""
    droplet: DropletConfig = parsed["droplet"]
    model: ModelConfig = parsed["model"]
    vllm: VllmConfig = parsed["vllm"]
    size = catalog.SIZES.get(droplet.size)
    known_model = catalog.MODELS.get(model.id)
    problems: list[str] = []

    if ok("droplet.size", "droplet.image") and size and droplet.image:
        image = catalog.IMAGES[droplet.image]
        if image.vendor == "amd":
            problems.append(
                f"droplet.image: {image.slug} is the AMD (ROCm) image; {size.slug} is NVIDIA: "
                f"use {catalog.default_image(size)} (or leave image unset)"
            )
        elif image.gpu_count is not None and image.gpu_count != size.gpu_count:
            problems.append(
                f"droplet.image: {image.slug} is the {image.gpu_count}-GPU image and "
                f"{size.slug} has {size.gpu_count} GPU(s): use {catalog.default_image(size)} "
                "(or leave image unset)"
            )

    near = catalog.nearest_model(model.id) if known_model is None else None
    if ok("model.id", "model.vramGb") and near and model.vram_gb is None:
        problems.append(
            f"model.id: {model.id} is not in the catalog; did you mean {near}? (A model of "
            "your own: set model.vramGb, the GB of VRAM it needs, to let the program check "
            "that it fits)"
        )
    elif ok("model.id", "model.vramGb") and known_model is None and model.vram_gb is None:
        problems.append(
            f"model.vramGb: {model.id} is not in the catalog, so set model.vramGb (GB of VRAM "
            f"it needs) to let the program check that it fits; known models: "
            f"{', '.join(catalog.MODELS)}"
        )

    if (
        ok("model.id", "droplet.size")
        and known_model
        and size
        and not known_model.runs_on_arch(size)
    ):
        # Started on Ada or Hopper it would only crash at load, after the bill began.
        others = [
            m.repo_id
            for m in catalog.MODELS.values()
            if m.family == known_model.family and m.runs_on_arch(size)
        ]
        problems.append(
            f"model.id: {model.id} holds NVFP4 weights, which run only on Blackwell GPUs; "
            f"{catalog.BLACKWELL_NOTE}. Serve "
            + (" or ".join(others) if others else "another checkpoint")
            + " instead"
        )
        return problems

    need = model.vram_gb or (known_model.vram_gb if known_model else None)
    fit_fields = ("model.id", "model.vramGb", "droplet.size", "vllm.gpuMemoryUtilization")
    if ok(*fit_fields) and size and need:
        usable = size.total_vram_gb * vllm.gpu_memory_utilization
        if need > usable:
            fitting = [
                s.slug
                for s in catalog.SIZES.values()
                if s.vendor == "nvidia" and need <= s.total_vram_gb * vllm.gpu_memory_utilization
            ]
            problems.append(
                f"model.id: {model.id} needs about {need} GB of VRAM; {size.slug} has "
                f"{size.total_vram_gb} GB, {usable:.0f} GB usable at "
                f"vllm.gpuMemoryUtilization {vllm.gpu_memory_utilization}; sizes that fit: "
                f"{', '.join(fitting) or 'none that DigitalOcean sells'}"
            )
    return problems


def _version_rules(parsed: Mapping[str, Any], ok: Callable[..., bool]) -> list[str]:
    """Context length, vLLM version, driver branch."""
    model: ModelConfig = parsed["model"]
    vllm: VllmConfig = parsed["vllm"]
    bootstrap: BootstrapConfig = parsed["bootstrap"]
    known_model = catalog.MODELS.get(model.id)
    problems: list[str] = []

    longest = (known_model.long_context or known_model.max_context) if known_model else 0
    if ok("model.id", "vllm.maxModelLen") and known_model and vllm.max_model_len > longest:
        problems.append(
            f"vllm.maxModelLen: {vllm.max_model_len} is more than {known_model.repo_id} "
            f"supports; accepted: 1 to {longest}"
        )
    speculative = vllm.speculative
    if ok("model.id", "vllm.speculative") and speculative is not None:
        problems += _speculative_problems(speculative, known_model)
    too_old = known_model and (
        catalog.parse_version(vllm.version) < catalog.parse_version(known_model.min_vllm)
    )
    if ok("model.id", "vllm.version") and known_model and too_old:
        problems.append(
            f"vllm.version: {known_model.repo_id} needs vLLM >= {known_model.min_vllm}; "
            f"got {vllm.version}"
        )

    if ok("vllm.install", "vllm.version", "bootstrap.driver.branch") and vllm.install == "wheel":
        need_branch = catalog.min_driver_branch(vllm.version)
        if int(bootstrap.driver.branch) < need_branch:
            problems.append(
                f"bootstrap.driver.branch: vLLM {vllm.version} wheels bring CUDA "
                f"{catalog.wheel_cuda(vllm.version)}, which needs driver branch >= "
                f"{need_branch}; got {bootstrap.driver.branch}"
            )
    return problems


def _speculative_problems(spec: SpeculativeConfig, target: catalog.Model | None) -> list[str]:
    """MTP needs the model's own heads; a draft must be one trained for the model."""
    if spec.method == "mtp":
        if spec.model is not None:
            return [
                "vllm.speculative.model: mtp uses the model's own heads, not a draft; unset "
                "vllm.speculative.model, or set vllm.speculative.method to the draft's method"
            ]
        if target is not None and target.mtp_tokens is None:
            with_mtp = [m.repo_id for m in catalog.MODELS.values() if m.mtp_tokens]
            return [
                f"vllm.speculative.method: mtp uses the model's own Multi-Token Prediction "
                f"heads and {target.repo_id} has none; models with them: "
                f"{', '.join(with_mtp)}. Unset vllm.speculative for this model"
            ]
        return []
    problems: list[str] = []
    drafts = [d for d in (target.drafts if target else ()) if d.method == spec.method]
    known = ", ".join(d.repo_id for d in drafts) or "none in the catalog"
    if spec.model is None:
        problems.append(
            f"vllm.speculative.model: method {spec.method} needs a draft model; drafts for "
            f"{target.repo_id if target else 'model.id'}: {known}"
        )
    elif target is not None and spec.model not in [d.repo_id for d in drafts]:
        # A draft trained for another model proposes tokens the target rejects: slower, not
        # faster (and vLLM may refuse its shapes at load, after the bill began).
        problems.append(
            f"vllm.speculative.model: {spec.model} is not a {spec.method} draft trained for "
            f"{target.repo_id}; drafts for it: {known}"
        )
    if spec.num_speculative_tokens is None:
        problems.append(
            f"vllm.speculative.numSpeculativeTokens: required with method {spec.method} (vLLM "
            "needs it for a draft model); accepted: 1 to 16"
        )
    return problems


def _install_rules(parsed: Mapping[str, Any], ok: Callable[..., bool]) -> list[str]:
    """What the driver and vLLM installs need."""
    droplet: DropletConfig = parsed["droplet"]
    vllm: VllmConfig = parsed["vllm"]
    bootstrap: BootstrapConfig = parsed["bootstrap"]
    size = catalog.SIZES.get(droplet.size)
    problems: list[str] = []

    runfile = bootstrap.driver.mode == "runfile"
    if (
        ok("bootstrap.driver")
        and runfile
        and not (bootstrap.driver.runfile_url and bootstrap.driver.runfile_sha256)
    ):
        problems.append(
            "bootstrap.driver.mode: runfile needs bootstrap.driver.runfileUrl and "
            "bootstrap.driver.runfileSha256 (NVIDIA publishes both for each driver release)"
        )

    # On Kubernetes the official image brings vLLM: no lock file is installed from.
    wheel = vllm.install == "wheel" and parsed.get("platform") != "kubernetes"
    lock = LOCKS_DIR / catalog.lock_name(vllm.version, bootstrap.python)
    if ok("vllm.version", "vllm.install", "bootstrap.python") and wheel and not lock.exists():
        problems.append(
            f"vllm.version: no lock file for vLLM {vllm.version} on Python {bootstrap.python} "
            f"({catalog.LOCKS_PATH}/{lock.name}); write it with "
            f"`scripts/lock-vllm.sh {vllm.version} {bootstrap.python}` and commit it"
        )

    loader, strategy = vllm.load_format, vllm.safetensors_load_strategy
    if ok("vllm.loadFormat", "vllm.safetensorsLoadStrategy") and (
        loader != "auto" and strategy is not None
    ):
        problems.append(
            f"vllm.safetensorsLoadStrategy: applies to vllm.loadFormat: auto only; {loader} "
            "reads the files its own way: unset one of the two"
        )
    if ok("vllm.safetensorsLoadStrategy", "vllm.extraArgs") and (
        vllm.multithread_load and strategy not in (None, "lazy")
    ):
        problems.append(
            f"vllm.safetensorsLoadStrategy: {strategy} with the multithreaded loader "
            "(enable_multithread_load in vllm.extraArgs): vLLM takes lazy only there; unset it"
        )
    preinstalled = bootstrap.driver.mode == "preinstalled"
    if ok("droplet.size", "droplet.image", "bootstrap.driver.mode") and size and preinstalled:
        image = catalog.IMAGES[droplet.image or catalog.default_image(size)]
        if not image.ships_nvidia_driver:
            problems.append(
                f"bootstrap.driver.mode: preinstalled needs an image that ships the NVIDIA "
                f"driver and {image.slug} has none; use auto or apt"
            )
    return problems


def _access_rules(parsed: Mapping[str, Any], ok: Callable[..., bool]) -> list[str]:
    """The name the gateway serves and what its certificate needs."""
    access: AccessConfig = parsed["access"]
    problems: list[str] = []
    if ok("access.domain", "access.sslip") and access.domain and access.sslip:
        problems.append(
            "access.sslip: true serves <ip-with-dashes>.sslip.io instead of access.domain; "
            "set one of the two"
        )
    zone = access.dns_zone
    if ok("access.domain", "access.dnsZone") and zone:
        if not access.domain:
            problems.append(
                f"access.dnsZone: {zone} holds the record of access.domain, which is unset; "
                "set access.domain (a name in that zone)"
            )
        elif access.domain != zone and not access.domain.endswith(f".{zone}"):
            problems.append(
                f"access.dnsZone: {access.domain} is not in {zone}; accepted: the zone that "
                f"holds access.domain (for {access.domain}: one of its parent domains)"
            )
    named = access.domain or access.sslip
    if ok("access.domain", "access.sslip", "access.acmeEmail", "access.https") and (
        access.https and named and not access.acme_email
    ):
        which = "access.domain" if access.domain else "access.sslip"
        problems.append(
            f"access.acmeEmail: {which} takes its certificate from Let's Encrypt, then ZeroSSL, "
            "which issues only to an ACME account with an email: pulumi config set --path "
            "access.acmeEmail you@example.com"
        )
    return problems


def _model_disk_gb(model: ModelConfig) -> int:
    """The model's files on disk, in GB: given, else the catalog's, else its VRAM as a bound."""
    known = catalog.MODELS.get(model.id)
    return model.disk_gb or (known.disk_gb if known else model.vram_gb or 0)


def _cache_rules(parsed: Mapping[str, Any], ok: Callable[..., bool]) -> list[str]:
    """The cache Volume must hold what it is for, or it only adds a bill."""
    size_gb = parsed["cache"].size_gb
    if size_gb is None or not ok("cache.sizeGb", "model", "vllm", "bootstrap"):
        return []
    model = parsed["model"]
    disk = _model_disk_gb(model)
    # Two vLLM envs: an upgrade installs the new release beside the running one (vllm.sh).
    envs = 2 * catalog.VLLM_ENV_DISK_GB
    need = disk + envs + catalog.CACHE_OVERHEAD_GB
    if size_gb < need:
        return [
            f"cache.sizeGb: {size_gb} GiB cannot hold {model.id} (about {disk} GB), two vLLM "
            f"envs ({envs} GB: an upgrade installs beside the running one) and the compile "
            f"caches ({catalog.CACHE_OVERHEAD_GB} GB); accepted: {need} to "
            f"{catalog.VOLUME_MAX_GIB}, or unset for no cache"
        ]
    return []


def _pool_rules(parsed: Mapping[str, Any], ok: Callable[..., bool]) -> list[str]:
    """What replicas behind one balancer need (several, or one behind the waking front)."""
    replicas, wake = parsed["replicas"], parsed["wake"]
    if replicas is None or wake is None or not is_pooled(replicas, wake):
        return []
    access: AccessConfig = parsed["access"]
    balancer: BalancerConfig = parsed["balancer"]
    problems: list[str] = []
    if ok("access.apiCidrs") and not access.api_cidrs:
        problems.append(
            f"access.apiCidrs: [] closes the API port, and with replicas: {replicas}"
            f"{' and wake.enabled' if wake.enabled else ''} the balancer is the only "
            "way in (the replicas are reachable only from it); list who may connect, or set "
            "replicas: 1 (without wake) and use an SSH tunnel"
        )
    if ok("balancer.kind", "access.https", "access.domain", "access.dnsZone") and (
        balancer.kind == "managed"
    ):
        if not access.https:
            problems.append(
                "balancer.kind: managed terminates HTTPS with a DigitalOcean-managed Let's "
                "Encrypt certificate; it needs access.https: true (or use balancer.kind: caddy)"
            )
        if not (access.domain and access.dns_zone):
            problems.append(
                "balancer.kind: managed needs a DigitalOcean-managed certificate, which "
                "DigitalOcean issues only for a domain in its DNS: set access.domain and "
                "access.dnsZone (the zone in this account), or use balancer.kind: caddy"
            )
    if (
        ok("balancer.kind", "balancer.routing")
        and balancer.kind == "managed"
        and (balancer.routing != "auto")
    ):
        how = {
            "cache-aware": "on the prompt's cached prefix",
            "least-conn": "by requests in flight",
        }
        problems.append(
            f"balancer.routing: {balancer.routing} routes {how[balancer.routing]}, which "
            "DigitalOcean's Load Balancer cannot do (it spreads requests round robin); use "
            "balancer.kind: caddy, or leave balancer.routing: auto with the managed one"
        )
    managed = resolved_balancer_kind(balancer, access, wake) == "managed"
    ipv4 = [c for c in access.api_cidrs if ":" not in c]
    if ok("balancer.kind", "access.apiCidrs") and managed and access.api_cidrs and not ipv4:
        problems.append(
            "access.apiCidrs: DigitalOcean's Load Balancer is IPv4-only and its allow list "
            f"takes IPv4 ranges; {access.api_cidrs} has none, so no client could connect: "
            "add your clients' IPv4 ranges, or use balancer.kind: caddy"
        )
    return problems


def _wake_rules(parsed: Mapping[str, Any], ok: Callable[..., bool]) -> list[str]:
    """What the waking front needs: a front that can hold requests, and a pipeline to call."""
    wake: WakeConfig = parsed["wake"]
    if not wake.enabled or not ok("wake"):
        return []
    problems: list[str] = []
    # `auto` resolves to Caddy with wake on (resolved_balancer_kind): only a managed choice is
    # refused.
    if ok("balancer.kind") and parsed["balancer"].kind == "managed":
        problems.append(
            "wake.enabled: the front that holds requests and wakes the set is the Caddy "
            "balancer; DigitalOcean's Load Balancer can do neither: set balancer.kind: caddy "
            "(or auto)"
        )
    if wake.token is None:
        problems.append(
            f"wake.token: the pipeline's token is unset: {set_secret('wake.token')}, a "
            "fine-grained GitHub token (Actions: read and write) or the webhook's secret"
        )
    if wake.trigger == "github" and not wake.github_repo:
        problems.append(
            "wake.githubRepo: the repository whose workflow deploys this stack is unset "
            "(owner/name); or set wake.trigger: webhook and wake.webhookUrl"
        )
    if wake.trigger == "webhook" and not wake.webhook_url:
        problems.append("wake.webhookUrl: wake.trigger: webhook needs the https:// URL to POST")
    return problems


def _kube_rules(parsed: Mapping[str, Any], ok: Callable[..., bool]) -> list[str]:
    """What the Kubernetes platform's edge admits, and a weights Volume that holds the model."""
    kube: KubePlatformConfig | None = parsed.get(KUBERNETES_SECTION)
    if parsed.get("platform") != "kubernetes" or kube is None:
        return []
    problems: list[str] = []
    access: AccessConfig = parsed["access"]
    if ok("access.apiCidrs", "access.https"):
        try:
            edge_sources(access.api_cidrs, access.https)
        except ValueError as err:
            problems.append(str(err))
    model: ModelConfig = parsed["model"]
    disk = _model_disk_gb(model)
    need = disk + catalog.CACHE_OVERHEAD_GB
    if ok("model", "kubernetes.weights") and kube.weights.size_gb < need:
        problems.append(
            f"kubernetes.weights.sizeGb: {kube.weights.size_gb} GiB cannot hold {model.id} "
            f"(about {disk} GB) and vLLM's compile caches ({catalog.CACHE_OVERHEAD_GB} GB); "
            f"accepted: {need} to {catalog.VOLUME_MAX_GIB}"
        )
    return problems


def _cross_check(parsed: Mapping[str, Any], bad: set[str]) -> list[str]:
    """Rules that span sections. A rule runs only when every field it reads is valid, so one bad
    value gives one message, not a cascade; the other rules still run."""

    def ok(*paths: str) -> bool:
        """True when no field read, nor any object holding it, failed validation."""
        prefixes = {".".join(p.split(".")[:i]) for p in paths for i in range(1, p.count(".") + 2)}
        return not prefixes & bad

    rules = (
        _kube_rules,
        _hardware_rules,
        _version_rules,
        _install_rules,
        _access_rules,
        _cache_rules,
        _pool_rules,
        _wake_rules,
    )
    return [problem for rule in rules for problem in rule(parsed, ok)]


def _validate_section(
    name: str, model: type[_Section], value: Mapping[str, Any], problems: list[str], bad: set[str]
) -> _Section:
    """Validate one section; on errors, record them and return it with the bad fields at their
    defaults so that the rules which do not read them can still run."""
    try:
        return model.model_validate(value)
    except ValidationError as err:
        problems.extend(_section_problems(name, model, err))
        failed = set()
        for e in err.errors():
            loc = [str(p) for p in e["loc"]]
            failed.add(loc[0])
            bad.add(".".join([name, *loc]))
            if len(loc) > 1:
                bad.add(f"{name}.{loc[0]}")
        kept = {k: v for k, v in value.items() if k not in failed}
        try:
            return model.model_validate(kept)
        except ValidationError:
            bad.add(name)
            return model()


def parse(
    raw: Mapping[str, Any],
    stack: str,
    secret_keys: frozenset[str] = frozenset(),
    secret_values: Mapping[str, str] | None = None,
) -> StackConfig:
    """Validate raw config values (already JSON-decoded) and return the stack's config.

    `raw` maps top-level keys without the namespace (`droplet`, `model`, ...) to values;
    `secret_values` holds the plain text of the secret top-level keys, to check their form
    (never quoted in a message).
    """
    problems: list[str] = []
    given_key = (secret_values or {}).get("apiKey")
    if given_key is not None and "apiKey" in secret_keys:
        problems.extend(f"apiKey: {p}" for p in apikey.problems(given_key))
    for key in sorted(set(raw) - KNOWN_KEYS):
        if key in RETIRED_KEYS:
            problems.append(f"{key}: {RETIRED_KEYS[key]}")
            continue
        accepted = ", ".join(["platform", *SECTIONS, KUBERNETES_SECTION, "replicas", *SECRET_KEYS])
        problems.append(f"{key}: unknown key; accepted: {accepted}")
    bad: set[str] = set()
    platform, kube, raw = _platform(raw, problems, bad)
    replicas = _replicas(raw.get("replicas", 1), problems)
    for section in ("autodown", "wake"):
        value = raw.get(section)
        if isinstance(value, Mapping) and "token" in value and section not in secret_keys:
            problems.append(
                f"{section}.token: stored in plain text; set it as a secret: "
                f"{set_secret(f'{section}.token')}"
            )
    for key in SECRET_KEYS:
        if key in raw and key not in secret_keys:
            problems.append(f"{key}: stored in plain text; set it as a secret: {set_secret(key)}")

    parsed: dict[str, Any] = {"platform": platform, KUBERNETES_SECTION: kube}
    for name, model in SECTIONS.items():
        value = raw.get(name, {})
        if not isinstance(value, Mapping):
            problems.append(f"{name}: expected an object (a YAML mapping); got {shown(value)}")
            bad.add(name)
            value = {}
        parsed[name] = _validate_section(name, model, value, problems, bad)

    parsed["replicas"] = replicas
    if replicas is None:
        bad.add("replicas")
    problems.extend(_cross_check(parsed, bad))
    if "wake" not in bad and isinstance(parsed.get("wake"), WakeConfig):
        problems.extend(wake_pipeline_problems(parsed["wake"], stack))
    if problems:
        raise ConfigError(problems)
    return StackConfig(stack=stack, **parsed)


WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"
# What a wake dispatches (scripts/phases/wake/pipeline.py dispatch_github): the workflow must
# declare these inputs, and GitHub answers 422 to a `choice` value outside its options.
WAKE_INPUTS = {"stack": None, "command": "up", "refresh": "true"}


def wake_pipeline_problems(wake: WakeConfig, stack: str, workflows: Path = WORKFLOWS) -> list[str]:
    """Whether the deploy workflow in this repository takes the wake's dispatch for this stack,
    before the first wake finds out with GitHub's 422. Only a workflow this repository holds is
    read (another repository's is checked by `validate` with a GitHub token)."""
    if not wake.enabled or wake.trigger != "github":
        return []
    path = workflows / wake.github_workflow
    if not path.is_file():
        return []
    try:
        on = (yaml.safe_load(path.read_text()) or {}).get(True) or {}  # YAML reads `on` as True
    except yaml.YAMLError:
        return [f"wake.githubWorkflow: {path.name} is not YAML"]
    dispatch = on.get("workflow_dispatch") if isinstance(on, dict) else None
    if not isinstance(dispatch, dict):
        return [f"wake.githubWorkflow: {path.name} has no workflow_dispatch trigger to wake by"]
    inputs = dispatch.get("inputs") or {}
    problems = []
    for name, value in {**WAKE_INPUTS, "stack": stack}.items():
        spec = inputs.get(name)
        if not isinstance(spec, dict):
            problems.append(f"wake.githubWorkflow: {path.name} declares no input `{name}`, "
                            "which a wake sends (GitHub would answer 422)")  # fmt: skip
        elif spec.get("type") == "choice" and str(value) not in (
            options_given := [str(o) for o in spec.get("options") or []]
        ):
            options = ", ".join(options_given)
            what = f"the stack `{stack}`" if name == "stack" else f"`{name}: {value}`"
            problems.append(
                f"wake: {path.name} does not offer {what} (its `{name}` options: {options}); "
                "add it there, or GitHub refuses the wake with 422"
            )
    return problems


# The sections and keys that mean something on Droplets only, and what does their work on
# Kubernetes: each is refused there by name, so nothing a stack says is silently dropped.
_NO_SSH = "no SSH reaches the cluster's nodes; kubectl does, with the kubeconfig output"
_IMAGE = (
    "the model server runs the official vLLM image of vllm.version, pinned by "
    "kubernetes.imageDigest: nothing is installed"
)
DROPLET_ONLY = {
    "droplet": "the nodes are the cluster's: the GPU size is kubernetes.gpuPool.size, the "
    "region kubernetes.region",
    "replicas": "KEDA keeps the count between kubernetes.replicas.min and max",
    "bootstrap": "nothing is bootstrapped over SSH: " + _IMAGE,
    "autodown": "nothing deletes a node: at kubernetes.replicas.min 0 KEDA takes the model to "
    "zero and the cluster autoscaler removes its GPU node",
    "cache": "each model server keeps its weights on a Volume of its own: kubernetes.weights",
    "balancer": "the entry is the edge, Caddy behind a DigitalOcean Load Balancer, always",
    "wake": "a keyed request wakes a sleeping model through the router's queue and KEDA "
    "(kubernetes.replicas.min 0)",
    "access.sshCidrs": _NO_SSH,
    "access.sshKeyFingerprints": _NO_SSH,
    "vllm.install": _IMAGE,
    "vllm.gitRef": _IMAGE,
}
KNOWN_KEYS = {"platform", *SECTIONS, KUBERNETES_SECTION, "replicas", *SECRET_KEYS}


def _platform(
    raw: Mapping[str, Any], problems: list[str], bad: set[str]
) -> tuple[str, KubePlatformConfig | None, dict[str, Any]]:
    """The stack's platform, its Kubernetes section, and the raw keys its sections read: on
    Kubernetes the Droplet-only keys are refused by name and dropped, and `droplet.size` is the
    GPU pool's (the serve flags read it), so the model's fit is checked against that size."""
    out = dict(raw)
    platform = raw.get("platform", "droplet")
    if platform not in PLATFORMS:
        problems.append(f"platform: {shown(platform)}: accepted: {', '.join(PLATFORMS)}")
        bad.add("platform")
        out.pop(KUBERNETES_SECTION, None)
        return "droplet", None, out
    section = out.pop(KUBERNETES_SECTION, None)
    if platform == "droplet":
        if section is not None:
            problems.append(
                f"{KUBERNETES_SECTION}: read only with platform: kubernetes, and this stack's "
                "platform is droplet (the default): set platform: kubernetes, or remove it"
            )
        return platform, None, out
    for key, why in DROPLET_ONLY.items():
        top, _, sub = key.partition(".")
        held, path = out.get(top), key
        if sub and isinstance(held, Mapping) and sub in held:
            out[top] = {k: v for k, v in held.items() if k != sub}
        elif sub or top not in out:
            continue
        else:
            # A section by the keys it gives (droplet.regions, droplet.size), else by its name.
            keys = sorted(held) if isinstance(held, Mapping) and held else []
            path = ", ".join(f"{top}.{k}" for k in keys) or top
            del out[top]
        problems.append(f"{path}: means nothing with platform: kubernetes ({why}); remove it")
    kube = None
    if not isinstance(section, Mapping):
        problems.append(
            f"{KUBERNETES_SECTION}: platform: kubernetes needs this section (a YAML mapping with "
            "at least ha, imageDigest and edge.imageDigest: docs/kubernetes.md); got "
            f"{shown(section)}"
        )
    else:
        try:
            kube = KubePlatformConfig.model_validate(section)
        except ValidationError as err:
            problems.extend(_section_problems(KUBERNETES_SECTION, KubePlatformConfig, err))
    if kube is None:
        bad.update({KUBERNETES_SECTION, "droplet.size"})
    else:
        out["droplet"] = {"size": kube.gpu_pool.size}
    return platform, kube, out


def _replicas(value: Any, problems: list[str]) -> int | None:
    """The top-level `replicas` count; None (and a problem) when it is not one."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)  # `pulumi config set replicas 3` stores the text "3"
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (1 <= value <= catalog.MAX_REPLICAS)
    ):
        problems.append(
            f"replicas: {shown(value)}: accepted: a whole number from 1 (one Droplet) to "
            f"{catalog.MAX_REPLICAS}"
        )
        return None
    return value


class _StackFileLoader(yaml.SafeLoader):
    """PyYAML's safe loader, less its silence on a key given twice in one mapping: it keeps the
    last, so the value above it (a size, a CIDR list) is dropped without a word. YAML 1.2 says
    a mapping's keys are unique (yaml.org/spec/1.2.2, 3.2.1.1); Go's gopkg.in/yaml.v3 refuses
    a repeated one ("mapping key ... already defined at line N")."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice (lines {seen[key]} and {line})",
                    key_node.start_mark,
                )  # fmt: skip
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_stack_file(path: Path) -> dict[str, Any]:
    """A stack file's YAML; a ConfigError at `file:line:column` (where editors jump) when it is
    not YAML. What, not PyYAML's quote of the line: a value there may be a secret."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StackFileLoader)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError as err:
        problem = f"{path}: not UTF-8 text (byte {err.start}): save it as UTF-8"
        raise ConfigError([problem]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(err, "problem", None) or "unreadable"
        raise ConfigError([f"{where}: not YAML: {problem}"]) from None
    return data if isinstance(data, dict) else {}


def namespace_problems(keys: Iterable[str], where: str = "the stack") -> list[str]:
    """What is wrong with where a stack's keys are: none under this project's namespace (the
    defaults would plan a GPU Droplet nobody chose), or keys of ours under another namespace (a
    typo that would leave them unread). `keys` are full config keys, `namespace:key[.path]`."""
    ours = f"{NAMESPACE}:"
    known = KNOWN_KEYS
    problems = [
        f"{key}: {key.split(':', 1)[0]!r} is not this project's namespace: it reads "
        f"{ours}{key.split(':', 1)[1]} (pulumi config set {ours}{key.split(':', 1)[1]} ...)"
        for key in sorted(keys)
        if ":" in key
        and not key.startswith(ours)
        and re.split(r"[.\[]", key.split(":", 1)[1])[0] in known
    ]
    if not any(key.startswith(ours) for key in keys):
        problems.append(
            f"{where} sets no {ours} keys: nothing would say which GPU Droplet to pay for. "
            "Start from a shipped stack file (cp stacks/Pulumi.dev.yaml "
            f"stacks/Pulumi.<stack>.yaml) or set at least {ours}droplet with its size"
        )
    return problems
