"""What scales the model servers, as plain dicts (no Pulumi): KEDA's Helm values at the pinned
chart, and the objects that tell KEDA when to run more or fewer servers (a ScaledObject on the
StatefulSet, and the credential it reads the router's metrics with). autoscaler.py declares them.

Every outside fact here is in docs/facts.md ("KEDA"), with its source; tests/data/keda-2.20.2/
holds the pinned chart's values and CRD schemas the tests validate these objects against.
"""

from __future__ import annotations

from typing import Any

from ...spec import catalog
from ...spec.kube import KubePlatformConfig
from . import manifests

# KEDA, pinned: the chart and the release it installs share one version (kedacore/charts v2.20.2
# keda/Chart.yaml: version and appVersion 2.20.2), from KEDA's own chart repository.
KEDA_CHART = "keda"
KEDA_VERSION = "2.20.2"
KEDA_REPO = "https://kedacore.github.io/charts"
KEDA_NAMESPACE = "keda"

# The router's metrics, as llm-d's router chart serves them: its Service is `<release>-epp` with
# the port `http-metrics` on 9090 (llm-d/llm-d-router config/charts/routerlib/templates/
# _service.yaml and _helpers.tpl), /metrics behind a Kubernetes bearer token by default
# (`--metrics-endpoint-auth`, default true). The router's own step declares that release.
ROUTER_RELEASE = "router"
ROUTER_SERVICE = f"{ROUTER_RELEASE}-epp"
ROUTER_METRICS_PORT = 9090
ROUTER_METRICS_URL = (
    f"http://{ROUTER_SERVICE}.{manifests.NAMESPACE}.svc:{ROUTER_METRICS_PORT}/metrics"
)
# vLLM's own /metrics on every server, through its Service's endpoints (KEDA reads each pod at
# the URL's port); vLLM's key guards only /v1 and the like, not /metrics (docs/facts.md).
VLLM_METRICS_URL = f"http://{manifests.NAME}.{manifests.NAMESPACE}.svc:{catalog.VLLM_PORT}/metrics"

# Who reads the router's metrics: a service account whose token KEDA presents (a
# TriggerAuthentication from a service-account-token Secret, as llm-d's KEDA guide does on
# OpenShift), allowed nothing but GET /metrics.
METRICS_READER = "keda-metrics-reader"
METRICS_TOKEN_SECRET = f"{METRICS_READER}-token"
TRIGGER_AUTH = "router-metrics"

# When and how far: llm-d's KEDA guide (guides/workload-autoscaling/keda-epp,
# optimized-baseline/overlays/k8s/queue/scaledobject.yaml): the router's flow-control queue,
# per-server target 1, and its running requests, per-server target 16; polled every 15 s;
# 300 s before the last server goes, and 300 s stabilization windows both ways so that a
# server still loading (its demand unmet) does not buy a second one, nor its arrival drop one.
ROUTER_QUEUE = "llm_d_epp_flow_control_queue_size"
ROUTER_RUNNING = "llm_d_epp_request_running"
QUEUE_TARGET = 1
RUNNING_TARGET = 16
# vLLM's own queue, summed over the servers: with the router's flow control requests wait in
# the router, so this one fires when a server queues what the router let through (its
# preemptions show as waiting): one waiting request per server, as the router's queue.
VLLM_WAITING = "vllm:num_requests_waiting"
WAITING_TARGET = 1
POLLING_SECONDS = 15
COOLDOWN_SECONDS = 300
STABILIZATION_SECONDS = 300


def keda_values() -> dict[str, Any]:
    """The chart's values we set (each key checked against the chart's own values.yaml at the
    pinned tag): KEDA on the CPU pool, watching only the model's namespace."""
    return {
        "crds": {"install": True},
        "watchNamespace": manifests.NAMESPACE,
        "nodeSelector": {manifests.GPU_POOL_LABEL: manifests.CPU_POOL_VALUE},
    }


def metrics_reader() -> list[dict[str, Any]]:
    """The service account KEDA reads the router's /metrics as, its token Secret (filled by
    Kubernetes, never by us), and the one permission it has: GET /metrics."""
    meta = {"name": METRICS_READER, "namespace": manifests.NAMESPACE, "labels": manifests.LABELS}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                **meta,
                "name": METRICS_TOKEN_SECRET,
                "annotations": {"kubernetes.io/service-account.name": METRICS_READER},
            },
            "type": "kubernetes.io/service-account-token",
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": METRICS_READER, "labels": manifests.LABELS},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": METRICS_READER, "labels": manifests.LABELS},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": METRICS_READER,
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": METRICS_READER,
                    "namespace": manifests.NAMESPACE,
                }
            ],
        },
    ]


def trigger_authentication() -> dict[str, Any]:
    """The bearer token KEDA sends to the router, from the reader's token Secret."""
    token = {"parameter": "bearerToken", "name": METRICS_TOKEN_SECRET, "key": "token"}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": {"name": TRIGGER_AUTH, "namespace": manifests.NAMESPACE},
        "spec": {"secretTargetRef": [token]},
    }


def _metrics_api(name: str, url: str, series: str, target: int, **more: str) -> dict[str, Any]:
    """A metrics-api trigger reading a Prometheus text page directly (KEDA's `format:
    prometheus`): no Prometheus server in the cluster to run, pay for or keep up. It reads the
    first series named `series`; the router and vLLM each write one per model, and a server
    serves one model. AverageValue: the target is per server, so the HPA asks for
    ceil(value / target) servers."""
    return {
        "type": "metrics-api",
        "name": name,
        "metricType": "AverageValue",
        "metadata": {
            "url": url,
            "format": "prometheus",
            "valueLocation": series,
            "targetValue": str(target),
            **more,
        },
    }


def triggers() -> list[dict[str, Any]]:
    """The router's queue wakes a sleeping model (activation: anything above 0 queued) and
    adds servers; its running requests and vLLM's own queue add servers under load. Only a
    request that passed the edge's key gate reaches the router, so only a keyed request
    queues: a request without the key wakes nothing."""
    router = {"authModes": "bearer"}
    auth = {"authenticationRef": {"name": TRIGGER_AUTH}}
    return [
        {
            **_metrics_api(
                "router-queue",
                ROUTER_METRICS_URL,
                ROUTER_QUEUE,
                QUEUE_TARGET,
                activationTargetValue="0",
                **router,
            ),
            **auth,
        },
        {
            **_metrics_api(
                "router-running", ROUTER_METRICS_URL, ROUTER_RUNNING, RUNNING_TARGET, **router
            ),
            **auth,
        },
        _metrics_api(
            "vllm-waiting",
            VLLM_METRICS_URL,
            VLLM_WAITING,
            WAITING_TARGET,
            aggregateFromKubeServiceEndpoints="true",
            aggregationType="sum",
        ),
    ]


def _behavior() -> dict[str, Any]:
    policy = {"type": "Percent", "value": 100, "periodSeconds": POLLING_SECONDS}
    window = {"stabilizationWindowSeconds": STABILIZATION_SECONDS, "policies": [policy]}
    return {"scaleUp": window, "scaleDown": window}


def scaled_object(kube: KubePlatformConfig) -> dict[str, Any]:
    """KEDA's ScaledObject on the model servers' StatefulSet, between the platform's min and
    max. With it, KEDA (through the HPA it makes) owns `spec.replicas`: model.py stops
    writing it after the StatefulSet's creation."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": manifests.NAME,
            "namespace": manifests.NAMESPACE,
            "labels": manifests.LABELS,
        },
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": manifests.NAME,
            },
            "pollingInterval": POLLING_SECONDS,
            "cooldownPeriod": COOLDOWN_SECONDS,
            "minReplicaCount": kube.replicas.min,
            "maxReplicaCount": kube.replicas.max,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior()}},
            "triggers": triggers(),
        },
    }
