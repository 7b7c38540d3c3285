"""llm-d's router as plain dicts (no Pulumi): the standalone chart's Helm values at the pinned
release, the endpoint picker's (EPP's) own config (flow control, its hold limit, prefix-aware
scoring), the cluster role its authenticated /metrics needs, and the wake budget the hold limit
comes from. router.py declares them.

The router runs the EPP with an Envoy sidecar on the CPU pool: the edge forwards to Envoy
(`router-epp:8081`), which asks the EPP which model server takes each request; the EPP holds a
request in its flow-control queue while no server is ready, and KEDA wakes a server on that
queue (scaling.py). Every outside fact here is in docs/facts.md ("llm-d's router"), with its
source; tests/data/llm-d-router-v0.10.0/ holds the pinned chart's values and config types.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from ...spec import catalog
from ...spec.kube import (
    EPP_REGISTRY,
    EPP_REPOSITORY,
    ROUTER_VERSION,
    KubePlatformConfig,
    epp_image_tag,
    proxy_image,
)
from ...spec.schema import StackConfig
from . import manifests, scaling

# The standalone chart (EPP + Envoy, no Gateway API), as the release's CI publishes it: an OCI
# artifact at oci://ghcr.io/llm-d/charts, its version the release tag (llm-d/llm-d-router
# v0.10.0 hack/push-chart.sh: `helm package --version ${EXTRA_TAG}`, `helm push ...
# oci://${IMAGE_REGISTRY}/charts`); a helm.v3.Release takes an `oci://` chart with its version
# and no repository (pulumi-kubernetes#1892). In the model's namespace: the EPP discovers the
# servers there (its Role reads pods in the release's namespace: routerlib templates/_rbac.yaml).
CHART = "oci://ghcr.io/llm-d/charts/llm-d-router-standalone"
CHART_VERSION = ROUTER_VERSION
NAMESPACE = manifests.NAMESPACE
# Envoy's listener, which the chart adds to the EPP's Service as the port named `http`
# (llm-d-router-standalone values.yaml: extraServicePorts http 8081 -> 8081): the edge's upstream.
PROXY_PORT = 8081
# The service account the chart runs the EPP as: the release's `<release>-epp` name
# (routerlib templates/_rbac.yaml, _helpers.tpl llm-d-router.name).
SERVICE_ACCOUNT = scaling.ROUTER_SERVICE
CONFIG_FILE = f"{catalog.PROJECT}-epp.yaml"

# --- the wake budget: how long a request may wait while a sleeping model wakes --------------
# docs/kubernetes.md "What a wake costs in time", each part sourced there and in docs/facts.md:
# - KEDA sees the queue: one Prometheus scrape, then one KEDA poll (scaling.py, 15 s each);
# - a GPU node joins: 3-5 min (llm-d's DOKS script), the upper end;
# - the image is pulled onto the new node: about 12 GB (vllm-project/vllm#27154, `docker pull
#   vllm/vllm-openai`), at the Volume's 200 MB/s floor as a stand-in (no DOKS pull rate is
#   published; the real run measures it);
# - the weights are read from the server's Volume at its 200 MB/s floor (manifests.py);
# - vLLM starts to /health: 221 s cold, measured on an H100 (manifests.ENGINE_COLD_SECONDS).
# Not in it: a server's very first start, which downloads the weights from the Hub first.
DETECT_SECONDS = 2 * scaling.POLLING_SECONDS
NODE_JOIN_SECONDS = 5 * 60
IMAGE_GB = 12
# The chart's Envoy waits this long for the EPP's answer to a request's headers (standalone
# values.yaml, the envoy preset's ext_proc `message_timeout: 1000s`); a request the EPP still
# holds then is cut by Envoy instead. The hold ends this much earlier, so the EPP's own
# answer, which names why, is what the client gets.
EXT_PROC_TIMEOUT_SECONDS = 1000
HOLD_MARGIN_SECONDS = 10


def _volume_seconds(gb: float) -> int:
    return math.ceil(gb * 1000 / manifests.VOLUME_READ_MB_S)


def wake_budget_seconds(cfg: StackConfig) -> int:
    """A wake from zero, the sum of the table's parts: the one place the hold limit comes from.
    The weights' part is this stack's model; the rest is the same for every stack."""
    return (
        DETECT_SECONDS
        + NODE_JOIN_SECONDS
        + _volume_seconds(IMAGE_GB)
        + _volume_seconds(cfg.model_disk_gb)
        + manifests.ENGINE_COLD_SECONDS
    )


def hold_seconds(cfg: StackConfig) -> int:
    """How long the router holds a request that no server can take: the wake budget, at most
    the chart's Envoy limit less a margin (a model whose wake takes longer sheds the first
    requests of a wake with the EPP's 503 while the server keeps starting)."""
    return min(wake_budget_seconds(cfg), EXT_PROC_TIMEOUT_SECONDS - HOLD_MARGIN_SECONDS)


# --- the EPP's config ----------------------------------------------------------------------
# v0.10.0 has one queue-wait budget, `flowControl.defaultRequestTTL` (default 60 s), for an
# empty pool and a saturated one alike: the split (`noEndpointRequestTTL`, llm-d-router#2284,
# bba90136) came after the tag and is in no release the pin can reach. So the hold limit is the
# wake budget for both: a saturated pool also holds a request that long before its 503.
# The buffered bodies are bounded under the EPP's memory limit, as the sizing guide asks
# (llm-d-router v0.10.0 docs/operations.md, "Flow Control Queues": the global maxBytes is
# unlimited by default; "set a global maxBytes under the container memory limit").
FLOW_CONTROL_MAX_BYTES = "256Mi"
# Prefix-aware scoring as llm-d's KEDA guide configures the router with flow control on
# (llm-d/llm-d guides/workload-autoscaling/keda-epp/optimized-baseline/router.values.yaml):
# the chart's own default scorers (routerlib templates/_config.yaml default-plugins.yaml:
# queue 2, KV-cache utilization 2, prefix cache 3) and the no-hit LRU scorer, which spreads
# requests that hit no cached prefix.
SCORERS = (
    ("queue-scorer", 2),
    ("kv-cache-utilization-scorer", 2),
    ("prefix-cache-scorer", 3),
    ("no-hit-lru-scorer", 2),
)


def epp_config(cfg: StackConfig) -> dict[str, Any]:
    """The EndpointPickerConfig the EPP loads (strictly: an unknown field stops it; llm-d-router
    v0.10.0 pkg/epp/config/loader/configloader.go, serializer.EnableStrict). Flow control is a
    feature gate; without it the queue metric KEDA wakes on does not exist."""
    return {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": [{"type": name} for name, _ in SCORERS],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": name, "weight": weight} for name, weight in SCORERS],
            }
        ],
        "flowControl": {
            "maxBytes": FLOW_CONTROL_MAX_BYTES,
            "defaultRequestTTL": f"{hold_seconds(cfg)}s",
        },
    }


# --- the Helm values -----------------------------------------------------------------------
# Requests below the chart's defaults (EPP 8 CPU / 8 GiB, Envoy 4 CPU / 8 GiB: more than the
# default CPU pool's two 2-vCPU nodes have), from llm-d's own sizing guide (llm-d-router v0.10.0
# docs/operations.md, measured on 0.9.0 images): the EPP peaked at 1.19 cores and 0.26 GiB at
# 5 requests/s of 100k-token prompts (0.65 GiB with a large prefix match), Envoy at 1.2 cores
# and 1.3-1.4 GiB at 10 requests/s ("allocate at least 2 GiB"). One model server per GPU node
# serves a few requests a second, so the requests are a scheduling floor for that, with no CPU
# limit (the chart's own choice: "CPU limits unset for burst capacity"), and each memory limit
# at the guide's figure, so a peak like its own is not killed.
EPP_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
PROXY_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}


def _on_cpu_pool() -> dict[str, Any]:
    """The chart's EPP pod takes an affinity, not a nodeSelector (routerlib templates/
    _deployment.yaml): required, on the CPU pool's label (cluster.py)."""
    term = {"key": manifests.GPU_POOL_LABEL, "operator": "In", "values": [manifests.CPU_POOL_VALUE]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def values(cfg: StackConfig, kube: KubePlatformConfig) -> dict[str, Any]:
    """The chart's values we set, each checked against the pinned chart's values.yaml. No
    InferencePool (its CRD is not installed: standalone mode selects the servers by label,
    `--endpoint-selector`, on vLLM's port); the EPP and Envoy images by digest."""
    return {
        "router": {
            "modelServers": {
                "matchLabels": dict(manifests.LABELS),
                "targetPorts": [{"number": catalog.VLLM_PORT}],
            },
            "inferencePool": {"create": False},
            "epp": {
                "image": {
                    "registry": EPP_REGISTRY,
                    "repository": EPP_REPOSITORY,
                    "tag": epp_image_tag(kube),
                    "pullPolicy": "IfNotPresent",
                },
                "pluginsConfigFile": CONFIG_FILE,
                "pluginsCustomConfig": {CONFIG_FILE: yaml.safe_dump(epp_config(cfg))},
                "resources": EPP_RESOURCES,
                "affinity": _on_cpu_pool(),
            },
            "proxy": {"image": proxy_image(kube), "resources": PROXY_RESOURCES},
        }
    }


def metrics_auth_role() -> dict[str, Any]:
    """The EPP checks each /metrics caller's token with a TokenReview and a SubjectAccessReview
    (`--metrics-endpoint-auth`, default on; controller-runtime's WithAuthenticationAndAuthorization
    filter, llm-d-router v0.10.0 cmd/epp/runner/runner.go). The chart grants those two only with
    `monitoring.prometheus.enabled`, which also renders a Prometheus-Operator ServiceMonitor
    this cluster has no CRD for (routerlib templates/_rbac.yaml, _servicemonitor.yaml): so the
    grant is ours, the chart's own rules for those two, and Prometheus' token keeps working."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"{catalog.PROJECT}-{SERVICE_ACCOUNT}-metrics-auth"},
        "rules": [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
             "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
             "verbs": ["create"]},
        ],
    }  # fmt: skip


def metrics_auth_binding() -> dict[str, Any]:
    role = metrics_auth_role()["metadata"]["name"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": role},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
    }
