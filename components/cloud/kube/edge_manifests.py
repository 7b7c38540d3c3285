"""The edge's Kubernetes objects as plain dicts (no Pulumi): the API-key gate of every other
entry (host/gateway.py's lone site: the same routes table, the same key check, the same
certificate choice) run by the official Caddy image on the CPU pool, behind a DigitalOcean Load
Balancer that passes TCP through, so Caddy terminates TLS and owns the certificate. edge.py
declares them with pulumi-kubernetes unchanged.

The upstream is llm-d's router (router_values.py: its Envoy on the `router-epp` Service), which
holds a request while a model server wakes and picks the server; `Upstream` is the one seam, and
nothing else here differs from the Droplet's gate.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from ...host import gateway
from ...spec import catalog
from ...spec.kube import KubePlatformConfig, caddy_image, edge_sources
from ...spec.schema import StackConfig
from . import manifests, router_values, scaling

NAME = "edge"
LABELS = {
    "app.kubernetes.io/name": NAME,
    "app.kubernetes.io/component": "gateway",
    "app.kubernetes.io/part-of": catalog.PROJECT,
}
CONFIG = "edge-caddyfile"
CLAIM = "edge-data"
CADDYFILE_DIR = "/etc/caddy"
# The official image's own folders for Caddy's data (certificates, ACME account) and its
# autosaved config (caddy-docker's Dockerfile: XDG_DATA_HOME=/data, XDG_CONFIG_HOME=/config),
# said here rather than trusted to the image.
DATA_DIR = "/data"
CONFIG_DIR = "/config"
# The pod's annotation with the Caddyfile's digest: a new Caddyfile rolls the pod (Caddy reads
# its file only at start, and a ConfigMap change restarts nothing by itself).
CADDYFILE_SHA = f"{catalog.PROJECT}/caddyfile-sha256"
# Caddy runs unprivileged and listens on unprivileged ports; the Service maps 80 and 443 to them.
# Caddy's http_port is the port its ACME HTTP challenge answers on, so the challenge the CA sends
# to the Load Balancer's port 80 reaches it.
HTTP_PORT = 8080
HTTPS_PORT = 8443
RUN_AS = 1000
# Caddy's requests on the CPU pool (capacity.py sums them with the others there).
RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}


@dataclasses.dataclass(frozen=True)
class Upstream:
    """What the gate forwards to: a Service's cluster DNS name and port."""

    host: str
    port: int


# The gate's upstream: the router's Envoy, on the port the chart adds to the EPP's Service
# (`router-epp`, 8081); the model servers' own Service (manifests.service) is reached by the
# router alone.
ROUTER = Upstream(
    f"{scaling.ROUTER_SERVICE}.{router_values.NAMESPACE}.svc.cluster.local",
    router_values.PROXY_PORT,
)

# The edge's listener: the container's ports, no admin API (nothing in the cluster may
# reconfigure the gate but its ConfigMap), the public CAs and the IP profile as on a Droplet.
LISTEN = gateway.Listen(
    http_port=HTTP_PORT,
    https_port=HTTPS_PORT,
    upstream_host=ROUTER.host,
    upstream_port=ROUTER.port,
    admin_socket=None,
    written_by="Pulumi (the edge ConfigMap)",
)


def caddyfile(
    cfg: StackConfig, host: str, upstream: Upstream = ROUTER, listen: gateway.Listen = LISTEN
) -> str:
    """The edge's Caddyfile: gateway.lone_site, the Droplet's own site, for `host` (the Load
    Balancer's IPv4 address or access.domain: gateway.hostname decides, as on a Droplet) in
    front of `upstream`. A test gives its own ports and CA through `listen`."""
    edge = dataclasses.replace(listen, upstream_host=upstream.host, upstream_port=upstream.port)
    return gateway.lone_site(cfg, host, edge)


def config_map(text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG, "namespace": manifests.NAMESPACE, "labels": LABELS},
        "data": {"Caddyfile": text},
    }


def claim(kube: KubePlatformConfig) -> dict[str, Any]:
    """Caddy's certificate storage on a Volume: a restarted or rescheduled edge finds its
    certificate and ACME account instead of asking the CA again (Let's Encrypt allows 5
    certificates for the same names per 7 days: docs/facts.md)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": manifests.NAMESPACE, "labels": LABELS},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": manifests.STORAGE_CLASS,
            "resources": {"requests": {"storage": f"{kube.edge.storage_gb}Gi"}},
        },
    }


def _security() -> dict[str, Any]:
    """Non-root, read-only root filesystem, no privilege escalation, every capability dropped
    but NET_BIND_SERVICE in the bounding set: the official image's caddy binary carries the file
    capability cap_net_bind_service=+ep, and the kernel refuses to exec such a binary when the
    bounding set lacks it ("exec /usr/bin/caddy: operation not permitted": caddyserver/
    caddy-docker#396, #466). With it there, the binary does get that one capability, even as
    uid 1000 with no_new_privs (measured: docs/facts.md); nothing needs it, as the listeners are
    on unprivileged ports, and it is the one capability the Pod Security Standards' restricted
    profile lets a container add back."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
    }


def deployment(kube: KubePlatformConfig, text: str) -> dict[str, Any]:
    """One Caddy on the CPU pool, the key from the model's Secret (the variable the gate reads,
    never a literal), its Caddyfile from the ConfigMap, its data on the Volume. `Recreate`: the
    Volume attaches to one node at a time, so a rolling update's new pod would wait forever for
    the old one's Volume."""
    key = {"name": manifests.SECRET, "key": manifests.API_KEY_KEY, "optional": False}
    env = [
        {"name": gateway.API_KEY_ENV, "valueFrom": {"secretKeyRef": key}},
        {"name": "HOME", "value": DATA_DIR},
        {"name": "XDG_DATA_HOME", "value": DATA_DIR},
        {"name": "XDG_CONFIG_HOME", "value": CONFIG_DIR},
    ]
    caddy = {
        "name": "caddy",
        "image": caddy_image(kube),
        "command": ["caddy", "run", "--config", f"{CADDYFILE_DIR}/Caddyfile",
                    "--adapter", "caddyfile"],
        "ports": [{"name": "http", "containerPort": HTTP_PORT},
                  {"name": "https", "containerPort": HTTPS_PORT}],
        "env": env,
        "volumeMounts": [
            {"name": "caddyfile", "mountPath": CADDYFILE_DIR, "readOnly": True},
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "config", "mountPath": CONFIG_DIR},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 (the pod's own emptyDir)
        ],
        "resources": RESOURCES,
        # The port, not /health: /health goes through to the model, which may be asleep.
        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 15,
                          "failureThreshold": 4},
        "securityContext": _security(),
    }  # fmt: skip
    pod = {
        "metadata": {
            "labels": LABELS,
            "annotations": {CADDYFILE_SHA: hashlib.sha256(text.encode()).hexdigest()},
        },
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
            "nodeSelector": {manifests.GPU_POOL_LABEL: manifests.CPU_POOL_VALUE},
            "containers": [caddy],
            "volumes": [
                {"name": "caddyfile", "configMap": {"name": CONFIG}},
                {"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}},
                {"name": "config", "emptyDir": {}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": manifests.NAMESPACE, "labels": LABELS},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": LABELS},
            "template": pod,
        },
    }


# DigitalOcean's cloud controller reads these (digitalocean/digitalocean-cloud-controller-manager
# docs/controllers/services/annotations.md, 70d527e3): `tcp` forwards the connections as they
# are, so Caddy terminates TLS and owns the certificate (not the Load Balancer's own); the values
# are strings, as the doc asks (kubernetes/kubernetes#59113 drops non-string annotations).
LB_ANNOTATIONS = {
    "service.beta.kubernetes.io/do-loadbalancer-name": f"{catalog.PROJECT}-edge",
    "service.beta.kubernetes.io/do-loadbalancer-protocol": "tcp",
}


def source_ranges(cfg: StackConfig) -> list[str]:
    """Who the Load Balancer admits (none: everyone): spec/kube.py's edge_sources, which the
    config's validation already asked (a refusal comes before anything is declared)."""
    return edge_sources(cfg.access.api_cidrs, cfg.access.https)


def service(cfg: StackConfig) -> dict[str, Any]:
    """The Load Balancer: 80 and 443 to Caddy's ports, for the sources source_ranges admits."""
    ranges = source_ranges(cfg)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": NAME,
            "namespace": manifests.NAMESPACE,
            "labels": LABELS,
            "annotations": LB_ANNOTATIONS,
        },
        "spec": {
            "type": "LoadBalancer",
            "selector": LABELS,
            **({"loadBalancerSourceRanges": ranges} if ranges else {}),
            "ports": [
                {"name": "http", "port": gateway.HTTP_PORT, "targetPort": "http",
                 "protocol": "TCP"},
                {"name": "https", "port": gateway.HTTPS_PORT, "targetPort": "https",
                 "protocol": "TCP"},
            ],
        },
    }  # fmt: skip
