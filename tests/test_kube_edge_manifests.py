"""The edge's Kubernetes objects (components/cloud/kube/edge_manifests.py, plain dicts): the Load
Balancer's Service passing TCP to Caddy (and `apiCidrs` as its allow rules over plain HTTP),
Caddy unprivileged from its pinned image, rolled by a new Caddyfile or key, the certificate's
Volume, every object valid against Kubernetes' schema and broken copies refused. Declared under
Pulumi's mocks: the fakes and the deployment are test_kube_edge.py's."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import kubernetes_validate
import pytest
from test_kube import EDGE_DIGEST, platform, stack
from test_kube_edge import CLAIM, CONFIG_MAP, DEPLOYMENT, SERVICE, deployed, with_access

from components.cloud.kube import edge_manifests, manifests
from components.spec import catalog
from components.spec.kube import KUBERNETES_SCHEMA_VERSION

__all__ = ["deployed"]  # the fixture, used by name


def test_the_load_balancer_passes_tcp_to_caddy(deployed) -> None:
    result, _, _ = deployed
    svc = result.obj(SERVICE, "edge-lb")
    notes = svc["metadata"]["annotations"]
    assert notes["service.beta.kubernetes.io/do-loadbalancer-protocol"] == "tcp"
    assert notes["service.beta.kubernetes.io/do-loadbalancer-name"] == f"{catalog.PROJECT}-edge"
    # Pulumi waits for the address alone (the pod waits for the Caddyfile, which names it).
    assert notes["pulumi.com/waitFor"] == "jsonpath={.status.loadBalancer.ingress[0].ip}"
    assert all(isinstance(v, str) for v in notes.values())
    spec = svc["spec"]
    assert spec["type"] == "LoadBalancer"
    assert spec["selector"] == edge_manifests.LABELS
    assert [(p["port"], p["targetPort"], p["protocol"]) for p in spec["ports"]] == [
        (80, "http", "TCP"),
        (443, "https", "TCP"),
    ]
    # apiCidrs is everyone in the prod stack: no allow rules (the CA validates from anywhere).
    assert "loadBalancerSourceRanges" not in spec


def test_caddy_runs_unprivileged_from_its_pinned_image(deployed) -> None:
    result, _, _ = deployed
    dep = result.obj(DEPLOYMENT)
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    (caddy,) = spec["containers"]
    assert caddy["image"] == f"docker.io/library/caddy:{catalog.CADDY_VERSION}@{EDGE_DIGEST}"
    assert caddy["command"] == ["caddy", "run", "--config", "/etc/caddy/Caddyfile",
                                "--adapter", "caddyfile"]  # fmt: skip
    assert caddy["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
    }
    assert {p["name"]: p["containerPort"] for p in caddy["ports"]} == {"http": 8080, "https": 8443}
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["nodeSelector"] == {manifests.GPU_POOL_LABEL: manifests.CPU_POOL_VALUE}
    assert "tolerations" not in spec
    mounts = {m["mountPath"]: m["name"] for m in caddy["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/data"]]["persistentVolumeClaim"] == {"claimName": "edge-data"}
    assert volumes[mounts["/etc/caddy"]]["configMap"] == {"name": "edge-caddyfile"}
    scratch = "/tmp"  # noqa: S108 (the pod's own emptyDir)
    assert "emptyDir" in volumes[mounts["/config"]] and "emptyDir" in volumes[mounts[scratch]]
    env = {e["name"]: e for e in caddy["env"]}
    assert env["XDG_DATA_HOME"]["value"] == "/data"
    # A new Caddyfile rolls the pod.
    text = result.obj(CONFIG_MAP)["data"]["Caddyfile"]
    want = hashlib.sha256(text.encode()).hexdigest()
    # A new API key rolls it too: the gate reads the key from env at start, and the pod
    # template names the model Secret's version (the emulated API server's: test_kube).
    servers = result.obj("kubernetes:apps/v1:StatefulSet")["spec"]["template"]
    version = servers["metadata"]["annotations"][manifests.SECRET_VERSION]
    assert pod["metadata"]["annotations"] == {
        f"{catalog.PROJECT}/caddyfile-sha256": want, manifests.SECRET_VERSION: version,
    }  # fmt: skip


def test_the_certificate_storage_is_a_volume(deployed) -> None:
    result, _, _ = deployed
    pvc = result.obj(CLAIM)
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "do-block-storage",
        "resources": {"requests": {"storage": "1Gi"}},
    }


def test_every_edge_object_is_valid_for_the_pinned_version(deployed) -> None:
    result, cfg, kube = deployed
    objects = [result.obj(t) for t in (CONFIG_MAP, CLAIM, DEPLOYMENT)]
    objects.append(result.obj(SERVICE, "edge-lb"))
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_SCHEMA_VERSION, strict=True)
    text = objects[0]["data"]["Caddyfile"]
    version = objects[2]["spec"]["template"]["metadata"]["annotations"][manifests.SECRET_VERSION]
    built = edge_manifests.deployment(kube, text)["spec"]
    assert version and objects[2]["spec"] == manifests.with_secret_version(built, version)
    assert objects[3]["spec"] == edge_manifests.service(cfg)["spec"]


def broken(what: str) -> dict[str, Any]:
    cfg, kube = stack(), platform()
    dep = edge_manifests.deployment(kube, "x")
    svc = edge_manifests.service(cfg)
    if what == "capabilities as text":
        bad = copy.deepcopy(dep)
        bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"] = "ALL"
    elif what == "a field the API does not have":
        bad = copy.deepcopy(dep)
        bad["spec"]["template"]["spec"]["containers"][0]["readOnlyRoot"] = True
    elif what == "a strategy the API has not":
        bad = copy.deepcopy(dep)
        bad["spec"]["strategy"] = {"type": "Recreate", "recreate": {}}
    else:
        bad = copy.deepcopy(svc)
        bad["spec"]["ports"][0]["port"] = "80"
    return bad


@pytest.mark.parametrize("what", ["capabilities as text", "a field the API does not have",
                                  "a strategy the API has not", "a port as text"])  # fmt: skip
def test_the_validator_refuses_a_broken_edge_object(what: str) -> None:
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken(what), KUBERNETES_SCHEMA_VERSION, strict=True)


def test_narrow_api_cidrs_over_plain_http_are_the_allow_rules() -> None:
    cfg = with_access(apiCidrs=["81.2.69.0/24"], https=False)
    assert edge_manifests.service(cfg)["spec"]["loadBalancerSourceRanges"] == ["81.2.69.0/24"]
