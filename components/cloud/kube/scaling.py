"""What scales the model servers, as plain dicts (no Pulumi): the Helm values of KEDA and of the
Prometheus server it asks, each at its pinned chart, and the ScaledObject that tells KEDA when to
run more or fewer servers. autoscaler.py declares them.

Every outside fact here is in docs/facts.md ("KEDA"), with its source; tests/data/ holds the
pinned charts' values and schemas the tests validate these objects against.
"""

from __future__ import annotations

from typing import Any

from ...spec.kube import KEDA_VERSION, KubePlatformConfig
from . import manifests

# KEDA, pinned: the chart and the release it installs share one version (kedacore/charts v2.20.2
# keda/Chart.yaml: version and appVersion 2.20.2), from KEDA's own chart repository. Its images
# and Prometheus', each by digest, are the stack's `kubernetes.scaling` (sourced defaults:
# spec/kube.py).
KEDA_CHART = "keda"
KEDA_REPO = "https://kedacore.github.io/charts"
KEDA_NAMESPACE = "keda"

# Prometheus, pinned (prometheus-community/helm-charts tag prometheus-29.27.0: chart 29.27.0,
# Prometheus v3.14.0): the server alone, which scrapes the router and the model servers and
# answers KEDA's queries. KEDA's prometheus scaler, as llm-d's KEDA guide uses it: a `sum()`
# over no series is an empty answer, read as 0 (`ignoreNullValues`, default true), where
# KEDA's metrics-api scaler, reading a page directly, errs on a missing series, and a trigger
# that errs keeps KEDA from scaling to zero (docs/facts.md): the router's queue gauge has a
# series per flow, dropped when the flow is collected.
PROMETHEUS_CHART = "prometheus"
PROMETHEUS_VERSION = "29.27.0"
PROMETHEUS_REPO = "https://prometheus-community.github.io/helm-charts"
PROMETHEUS_NAMESPACE = "monitoring"
# The chart's server Service: `<release>-server` when the release's name contains the chart's
# (templates/_helpers.tpl, prometheus.server.fullname), port 80 (server.service.servicePort).
PROMETHEUS_URL = f"http://{PROMETHEUS_CHART}-server.{PROMETHEUS_NAMESPACE}.svc:80"
# A history long enough for the 300 s windows below; metrics for scaling, not an archive, so
# no Volume: a restarted server starts empty and reads the next scrape.
PROMETHEUS_RETENTION = "1d"

# The router's metrics, as llm-d's router chart serves them: its Service is `<release>-epp`, port
# 9090 (llm-d/llm-d-router config/charts/routerlib/templates/_service.yaml and _helpers.tpl),
# /metrics behind a Kubernetes bearer token by default (`--metrics-endpoint-auth`): Prometheus
# presents its own service account's, which the chart allows GET /metrics (templates/
# clusterrole.yaml). router_values.py installs that release under this name: the names below
# are the one place both modules read.
ROUTER_RELEASE = "router"
ROUTER_SERVICE = f"{ROUTER_RELEASE}-epp"
ROUTER_METRICS_PORT = 9090
ROUTER_TARGET = f"{ROUTER_SERVICE}.{manifests.NAMESPACE}.svc:{ROUTER_METRICS_PORT}"
ROUTER_JOB = "llm-d-router"
# vLLM's own /metrics on every ready server (its Service's endpoints); vLLM's key guards only
# /v1 and the like, not /metrics (docs/facts.md).
VLLM_JOB = "vllm"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105

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


def keda_values(kube: KubePlatformConfig) -> dict[str, Any]:
    """The chart's values we set (each key checked against the chart's own values.yaml at the
    pinned tag): KEDA on the CPU pool, watching only the model's namespace, its three images
    by digest. The chart has no digest key: its templates write `<registry>/<repository>:<tag>`
    (kedacore/charts v2.20.2 keda/templates/{manager,metrics-server,webhooks}/deployment.yaml),
    so the tag carries it, `2.20.2@sha256:...`, and a reader still sees the release."""
    digests = kube.scaling
    return {
        "crds": {"install": True},
        "watchNamespace": manifests.NAMESPACE,
        "nodeSelector": {manifests.GPU_POOL_LABEL: manifests.CPU_POOL_VALUE},
        "image": {
            "keda": {"tag": f"{KEDA_VERSION}@{digests.keda_digest}"},
            "metricsApiServer": {"tag": f"{KEDA_VERSION}@{digests.keda_metrics_api_server_digest}"},
            "webhooks": {"tag": f"{KEDA_VERSION}@{digests.keda_webhooks_digest}"},
        },
    }


def _scrape_configs() -> dict[str, Any]:
    """Only the two pages scaling reads, every 15 s (KEDA's polling): the chart's own jobs
    (the API server, nodes, every annotated pod) are off."""
    defaults = (
        "prometheus", "kubernetes-api-servers", "kubernetes-nodes", "kubernetes-nodes-cadvisor",
        "kubernetes-service-endpoints", "kubernetes-service-endpoints-slow",
        "prometheus-pushgateway", "kubernetes-services", "kubernetes-pods", "kubernetes-pods-slow",
    )  # fmt: skip
    vllm_endpoints = {"role": "endpointslice", "namespaces": {"names": [manifests.NAMESPACE]}}
    return {
        **{job: {"enabled": False} for job in defaults},
        ROUTER_JOB: {
            "static_configs": [{"targets": [ROUTER_TARGET]}],
            "authorization": {"credentials_file": SERVICE_ACCOUNT_TOKEN},
        },
        VLLM_JOB: {
            "kubernetes_sd_configs": [vllm_endpoints],
            "relabel_configs": [
                {
                    "source_labels": ["__meta_kubernetes_service_name"],
                    "regex": manifests.NAME,
                    "action": "keep",
                },
                {
                    "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
                    "regex": "http",
                    "action": "keep",
                },
            ],
        },
    }


def prometheus_values(kube: KubePlatformConfig) -> dict[str, Any]:
    """The server only (no Alertmanager, exporters or push gateway), on the CPU pool, its two
    containers' images by digest: the chart pulls `<repository>@<digest>` when `digest` is set
    (prometheus-29.27.0 charts/prometheus/templates/deploy.yaml)."""
    digests = kube.scaling
    return {
        "alertmanager": {"enabled": False},
        "kube-state-metrics": {"enabled": False},
        "prometheus-node-exporter": {"enabled": False},
        "prometheus-pushgateway": {"enabled": False},
        "configmapReload": {"prometheus": {"image": {"digest": digests.config_reloader_digest}}},
        "server": {
            "image": {"digest": digests.prometheus_digest},
            "nodeSelector": {manifests.GPU_POOL_LABEL: manifests.CPU_POOL_VALUE},
            "retention": PROMETHEUS_RETENTION,
            "persistentVolume": {"enabled": False},
            "global": {"scrape_interval": f"{POLLING_SECONDS}s"},
        },
        "scrapeConfigs": _scrape_configs(),
    }


def _prometheus(name: str, query: str, target: int, **more: str) -> dict[str, Any]:
    """A prometheus trigger: AverageValue, so the target is per server and the HPA asks for
    ceil(sum / target) servers."""
    return {
        "type": "prometheus",
        "name": name,
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": PROMETHEUS_URL,
            "query": query,
            "threshold": str(target),
            "ignoreNullValues": "true",
            **more,
        },
    }


def triggers() -> list[dict[str, Any]]:
    """The router's queue wakes a sleeping model (activation: anything above 0 queued) and
    adds servers; its running requests and vLLM's own queue add servers under load. Only a
    request that passed the edge's key gate reaches the router, so only a keyed request
    queues: a request without the key wakes nothing."""
    return [
        _prometheus(
            "router-queue",
            f'sum({ROUTER_QUEUE}{{job="{ROUTER_JOB}"}})',
            QUEUE_TARGET,
            activationThreshold="0",
        ),
        _prometheus(
            "router-running", f'sum({ROUTER_RUNNING}{{job="{ROUTER_JOB}"}})', RUNNING_TARGET
        ),
        _prometheus("vllm-waiting", f'sum({VLLM_WAITING}{{job="{VLLM_JOB}"}})', WAITING_TARGET),
    ]


def _behavior() -> dict[str, Any]:
    policy = {"type": "Percent", "value": 100, "periodSeconds": POLLING_SECONDS}
    window = {"stabilizationWindowSeconds": STABILIZATION_SECONDS, "policies": [policy]}
    return {"scaleUp": window, "scaleDown": window}


def scaled_object(kube: KubePlatformConfig, hold_seconds: int) -> dict[str, Any]:
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
            # Never shorter than the router's hold: a wake whose held clients gave up would
            # otherwise see its half-started server taken back to zero (the queue then reads 0).
            "cooldownPeriod": max(COOLDOWN_SECONDS, hold_seconds),
            "minReplicaCount": kube.replicas.min,
            "maxReplicaCount": kube.replicas.max,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior()}},
            "triggers": triggers(),
        },
    }
