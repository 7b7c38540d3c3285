"""The Kubernetes objects of the model server, as plain dicts in the API's own shape (no Pulumi):
what the cluster runs, built from the stack config and the platform's, so that the tests validate
each against the cluster version's OpenAPI schema, and vLLM's arguments with vLLM's parser.
model.py declares them with pulumi-kubernetes unchanged.

The `vllm serve` arguments come from host/vllm_service.serve_args, the function the Droplet's
unit uses: one place for every flag.
"""

from __future__ import annotations

import math
from typing import Any

from ...host import vllm_service
from ...spec import catalog
from ...spec.kube import KubePlatformConfig, image
from ...spec.schema import StackConfig

NAMESPACE = catalog.PROJECT
NAME = "vllm"
LABELS = {
    "app.kubernetes.io/name": NAME,
    "app.kubernetes.io/component": "model-server",
    "app.kubernetes.io/part-of": catalog.PROJECT,
}
# The label the GPU pool's nodes carry (cluster.py sets it on the pool): the model server's
# nodeSelector, so a GPU pod never waits on a CPU node and the autoscaler knows which pool to grow.
GPU_POOL_LABEL = f"{catalog.PROJECT}/pool"
GPU_POOL_VALUE = "gpu"
# The same label on the always-on CPU pool: where KEDA, the router and the edge run.
CPU_POOL_VALUE = "cpu"
SECRET = "vllm-secrets"  # noqa: S105 (the Secret's name)
# The keys of the Secret: vLLM and hf read these variables by these names.
HF_TOKEN_KEY = "HF_TOKEN"  # noqa: S105 (a key's name)
API_KEY_KEY = "VLLM_API_KEY"
# The per-server Volume's claim template, and the storage class of DigitalOcean's block storage
# CSI driver on DOKS (digitalocean/csi-digitalocean, deploy/kubernetes/releases: the default
# class, ReadWriteOnce).
CLAIM = "weights"
STORAGE_CLASS = "do-block-storage"
# The Volume, mounted whole (subPath folders would be made by the kubelet as root, not writable
# by the server's user) where the Droplet keeps its state, so HF_HOME is the Droplet's own path;
# vLLM's home, with its compile caches (vllm_service.compile_cache_env), moves onto it.
VOLUME_MOUNT = catalog.STATE_DIR
DROPLET_VLLM_HOME = f"/var/lib/{catalog.VLLM_USER}"
VLLM_HOME = f"{VOLUME_MOUNT}/{catalog.VLLM_USER}"
# An unprivileged user that owns the Volume (fsGroup); the image runs as root unless told.
RUN_AS = 1000
# Shared memory for NCCL between the tensor-parallel workers (the container's default is 64 MiB).
SHM_LIMIT = "16Gi"

# The startup probe's budget: the engine's cold start measured on an H100 (../shared/gpu/
# README.md: launch to /health 220.5 s, vLLM 0.26, dummy weights read in 0.5 s), plus the real
# weights read from the Volume at its published floor (docs/facts.md: 200-300 MB/s), doubled:
# a probe that gives up restarts the whole start, a slow one costs nothing.
ENGINE_COLD_SECONDS = 221
VOLUME_READ_MB_S = 200
STARTUP_MARGIN = 2
PROBE_PERIOD = 10
LOOK = catalog.REPLICA_LOOK_TIMEOUT_SECONDS


def startup_seconds(cfg: StackConfig) -> int:
    """How long a model server may take from its container's start to /health."""
    weights = cfg.model_disk_gb * 1000 / VOLUME_READ_MB_S
    return STARTUP_MARGIN * math.ceil(ENGINE_COLD_SECONDS + weights)


# The pod templates carry the Secret's resourceVersion, so a new API key or HF token (a Secret
# updated in place) rolls the pods that read it as env: Kubernetes reads env from a Secret only
# when a container starts. The version changes with the Secret's data, and no secret is in it.
SECRET_VERSION = f"{catalog.PROJECT}/secret-version"


def with_secret_version(spec: dict[str, Any], version: str) -> dict[str, Any]:
    """A workload's spec whose pod template names the Secret's version (SECRET_VERSION)."""
    template = spec["template"]
    meta = template.get("metadata", {})
    annotations = {**meta.get("annotations", {}), SECRET_VERSION: version}
    return {**spec, "template": {**template, "metadata": {**meta, "annotations": annotations}}}


def secret_version(metadata: Any) -> str:
    """The resourceVersion of a declared Secret's metadata output ("" before it exists)."""
    if isinstance(metadata, dict):
        return str(metadata.get("resource_version") or metadata.get("resourceVersion") or "")
    return str(getattr(metadata, "resource_version", None) or "")


def namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def service() -> dict[str, Any]:
    """A ClusterIP Service only: nothing outside the cluster reaches vLLM (the way in is the
    edge's API-key gate, then llm-d's router, which picks a server by its pod's labels)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {
            "type": "ClusterIP",
            "selector": LABELS,
            "ports": [{"name": "http", "port": catalog.VLLM_PORT, "targetPort": "http"}],
        },
    }


def _secret_env(name: str, optional: bool) -> dict[str, Any]:
    ref = {"name": SECRET, "key": name, "optional": optional}
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def _env(cfg: StackConfig) -> list[dict[str, Any]]:
    """What the Droplet's env file and unit set (vllm_service.env_text, compile_cache_env), the
    key from the Secret instead of a file."""
    known = cfg.catalog_model
    plain = {
        **({"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
           if known and cfg.vllm.max_model_len > known.max_context else {}),
        "HOME": VLLM_HOME,
        "HF_HOME": catalog.HF_HOME,
        # The init containers downloaded the weights: never reach the Hub at run time.
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **compile_cache_env(),
    }  # fmt: skip
    return [{"name": k, "value": v} for k, v in plain.items()] + [_secret_env(API_KEY_KEY, False)]


def compile_cache_env() -> dict[str, str]:
    """The Droplet's compile-cache settings, their folders moved from vLLM's home there to its
    home on the Volume: every start of this server reads what the last one compiled."""
    return {
        k: v.replace(DROPLET_VLLM_HOME, VLLM_HOME, 1)
        for k, v in vllm_service.compile_cache_env().items()
    }


def _mounts() -> list[dict[str, Any]]:
    volume = [{"name": CLAIM, "mountPath": VOLUME_MOUNT}]
    shm = "/dev/shm"  # noqa: S108 (the pod's own emptyDir, not the node's)
    return [*volume, {"name": "shm", "mountPath": shm}]


def _security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
    }


def _downloads(cfg: StackConfig, kube: KubePlatformConfig) -> list[dict[str, Any]]:
    """One init container per repository the server reads (the model, a speculative draft):
    `hf download`, as the Droplet's model phase runs it; files already on the Volume are not
    fetched again. The HF token, when the stack has one, from the Secret."""
    repos = [(cfg.model.id, cfg.model.revision)]
    if cfg.vllm.speculative is not None and cfg.vllm.speculative.model is not None:
        repos.append((cfg.vllm.speculative.model, "main"))
    return [
        {
            "name": f"download-{i}",
            "image": image(kube, cfg.vllm.version),
            "command": ["hf", "download", repo, "--revision", revision],
            "env": [
                {"name": "HOME", "value": VLLM_HOME},
                {"name": "HF_HOME", "value": catalog.HF_HOME},
                _secret_env(HF_TOKEN_KEY, True),
            ],
            "volumeMounts": _mounts()[:-1],
            "securityContext": _security(),
        }
        for i, (repo, revision) in enumerate(repos)
    ]


def _probes(cfg: StackConfig) -> dict[str, Any]:
    """vLLM's /health (open without the key): startup covers the load; readiness takes a server
    out of the Service while it cannot answer; liveness restarts one that hangs after it was up."""
    health = {"path": "/health", "port": "http"}
    return {
        "startupProbe": {
            "httpGet": health,
            "periodSeconds": PROBE_PERIOD,
            "failureThreshold": math.ceil(startup_seconds(cfg) / PROBE_PERIOD),
        },
        # A busy vLLM answers /health late (the kubelet's default timeout is 1 s): a look
        # fails only past REPLICA_LOOK_TIMEOUT_SECONDS, as Caddy's and the router's do on a
        # Droplet, and a server leaves the router's candidates after 10 such looks (llm-d's
        # own fix for saturated servers dropping out: llm-d-benchmark#1734). Liveness is the
        # more patient: a restart costs a whole start.
        "readinessProbe": {
            "httpGet": health,
            "periodSeconds": 5,
            "timeoutSeconds": LOOK,
            "failureThreshold": 10,
        },
        "livenessProbe": {
            "httpGet": health,
            "periodSeconds": 15,
            "timeoutSeconds": LOOK,
            "failureThreshold": 8,
        },
    }


def container(cfg: StackConfig, kube: KubePlatformConfig) -> dict[str, Any]:
    gpus = str(kube.gpu_pool.gpus_per_node)
    return {
        "name": NAME,
        "image": image(kube, cfg.vllm.version),
        # The image's entrypoint differs between releases; `vllm` and serve_args' own `serve`.
        "command": ["vllm"],
        "args": vllm_service.serve_args(cfg, host="0.0.0.0"),  # noqa: S104 (the pod's Service)
        "ports": [{"name": "http", "containerPort": catalog.VLLM_PORT}],
        "env": _env(cfg),
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "volumeMounts": _mounts(),
        "securityContext": _security(),
        **_probes(cfg),
    }


def model_server(cfg: StackConfig, kube: KubePlatformConfig) -> dict[str, Any]:
    """A StatefulSet, not a Deployment: each server gets a Volume of its own from the claim
    template (block storage attaches to one node at a time, so servers cannot share one), and
    keeps it when scaled to zero (whenScaled: Retain), so its next start is warm. Replicas start
    at the platform's minimum (no GPU bills at min 0 before anything asked for one); from then
    on KEDA moves them between min and max (scaling.py), and model.py stops writing them."""
    weights = {
        "metadata": {"name": CLAIM},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": f"{kube.weights.size_gb}Gi"}},
        },
    }
    pod = {
        "metadata": {"labels": LABELS},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
            # DOKS taints its GPU nodes nvidia.com/gpu:NoSchedule (docs/facts.md): only pods that
            # tolerate it land there, and this one lands nowhere else.
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "nodeSelector": {GPU_POOL_LABEL: GPU_POOL_VALUE},
            "terminationGracePeriodSeconds": 120,
            "initContainers": _downloads(cfg, kube),
            "containers": [container(cfg, kube)],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_LIMIT}}],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {
            "replicas": kube.replicas.min,
            "serviceName": NAME,
            "selector": {"matchLabels": LABELS},
            "podManagementPolicy": "Parallel",
            "persistentVolumeClaimRetentionPolicy": {
                "whenScaled": "Retain",
                "whenDeleted": "Delete",
            },
            "template": pod,
            "volumeClaimTemplates": [weights],
        },
    }
