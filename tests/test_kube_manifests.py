"""The model server's Kubernetes objects (components/cloud/kube/manifests.py, plain dicts): the
StatefulSet's container, its flags from the Droplet's own function, its probes and Volume, every
object valid against the pinned cluster version's OpenAPI schema (kubernetes-validate), and a
broken copy that must fail. Declared under Pulumi's mocks: the fakes and the deployment are
test_kube.py's."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from test_kube import DIGEST, deployed, k8s, kubernetes_object, platform, stack

from components.cloud.kube import manifests
from components.host import vllm_service
from components.spec import catalog
from components.spec.kube import KUBERNETES_SCHEMA_VERSION

__all__ = ["deployed"]  # the fixture, used by name


def test_the_model_server(deployed) -> None:
    result, cfg, kube = deployed
    server = result.one("kubernetes:apps/v1:StatefulSet")
    spec = server.inputs["spec"]
    assert server.inputs["metadata"]["namespace"] == catalog.PROJECT
    assert spec["replicas"] == kube.replicas.min
    pod = spec["template"]["spec"]
    (vllm,) = pod["containers"]
    # The same flags as the Droplet's unit, from the same function; only the address differs.
    assert vllm["command"] == ["vllm"]
    assert vllm["args"] == vllm_service.serve_args(cfg, host="0.0.0.0")
    droplet_line = vllm_service.serve_args(cfg)
    assert [a for a in vllm["args"] if a != "0.0.0.0"] == [
        a for a in droplet_line if a != "127.0.0.1"
    ]
    assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == str(
        catalog.SIZES[kube.gpu_pool.size].gpu_count
    )
    gpus = str(catalog.SIZES[kube.gpu_pool.size].gpu_count)
    assert vllm["resources"] == {
        "limits": {"nvidia.com/gpu": gpus},
        "requests": {"nvidia.com/gpu": gpus},
    }
    # Pinned by digest, at the stack's vLLM release.
    assert vllm["image"] == f"docker.io/vllm/vllm-openai:v{cfg.vllm.version}@{DIGEST}"
    assert {c["image"] for c in pod["initContainers"]} == {vllm["image"]}
    # Only on the GPU pool, tolerating DOKS's GPU taint.
    assert pod["nodeSelector"] == {manifests.GPU_POOL_LABEL: "gpu"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    # No privilege: non-root, no escalation, no capabilities, no host anything, no API token.
    for c in [*pod["initContainers"], vllm]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and "privileged" not in sc
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert pod["automountServiceAccountToken"] is False
    assert all("hostPath" not in v for v in pod["volumes"])
    # A Volume per server, kept when it scales to zero.
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "do-block-storage"
    assert claim["spec"]["resources"]["requests"]["storage"] == f"{kube.weights.size_gb}Gi"
    assert spec["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain"
    # The weights (at the Droplet's HF_HOME) and the compile caches on that Volume, mounted
    # whole (no subPath: the kubelet would make those folders root's).
    volume = [m for m in vllm["volumeMounts"] if m["name"] == "weights"]
    assert volume == [{"name": "weights", "mountPath": catalog.STATE_DIR}]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["HF_HOME"] == catalog.HF_HOME and env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"].startswith(catalog.STATE_DIR + "/")
    assert set(vllm_service.compile_cache_env()) <= set(env)
    assert env["TRITON_CACHE_AUTOTUNING"] == "1"
    assert env["HOME"] == catalog.STATE_DIR + "/vllm"
    for name in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert env[name].startswith(env["HOME"] + "/"), (name, env[name])
    # The download runs as the Droplet's model phase does: hf download ID --revision REV.
    assert pod["initContainers"][0]["command"] == [
        "hf", "download", cfg.model.id, "--revision", cfg.model.revision
    ]  # fmt: skip


def test_the_probes_wait_for_a_cold_start(deployed) -> None:
    """The startup probe covers the measured cold start (220.5 s on an H100, dummy weights) plus
    the weights read from a Volume at 200 MB/s, with margin; then /health every few seconds."""
    result, cfg, _ = deployed
    (vllm,) = result.one("kubernetes:apps/v1:StatefulSet").inputs["spec"]["template"]["spec"][
        "containers"
    ]
    startup = vllm["startupProbe"]
    allowed = startup["periodSeconds"] * startup["failureThreshold"]
    assert allowed >= 220.5 + cfg.model_disk_gb * 1000 / 200
    assert allowed <= 2 * (221 + cfg.model_disk_gb * 1000 / 200) + startup["periodSeconds"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}
    # A busy server answers late: a look fails only past the Droplet's bound (15 s), and it
    # takes 10 of them to leave the router's candidates, more to be restarted.
    ready, alive = vllm["readinessProbe"], vllm["livenessProbe"]
    assert (
        ready["timeoutSeconds"] == alive["timeoutSeconds"] == catalog.REPLICA_LOOK_TIMEOUT_SECONDS
    )
    assert ready["failureThreshold"] == 10
    assert alive["periodSeconds"] * alive["failureThreshold"] > (
        ready["periodSeconds"] * ready["failureThreshold"]
    )


def test_every_kubernetes_object_is_valid_for_the_pinned_version(deployed) -> None:
    result, cfg, kube = deployed
    objects = [kubernetes_object(r) for r in k8s(result)]
    assert len(objects) == 4
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_SCHEMA_VERSION, strict=True)
    # What manifests.py builds is what was declared, with the Secret's version on the pods.
    declared = {o["kind"]: o for o in objects}
    built = manifests.model_server(cfg, kube)
    version = declared["StatefulSet"]["spec"]["template"]["metadata"]["annotations"][
        manifests.SECRET_VERSION
    ]
    assert version and declared["StatefulSet"]["spec"] == manifests.with_secret_version(
        built["spec"], version
    )
    assert declared["Service"]["spec"] == manifests.service()["spec"]


def broken_copies(server: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    bad = copy.deepcopy(server)
    bad["spec"]["replicas"] = "two"
    out["replicas not a number"] = bad
    bad = copy.deepcopy(server)
    bad["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    out["a field the API does not have"] = bad
    bad = copy.deepcopy(server)
    del bad["spec"]["selector"]
    out["no selector"] = bad
    bad = copy.deepcopy(server)
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8000"
    out["a port as text"] = bad
    return out


@pytest.mark.parametrize("what", ["replicas not a number", "a field the API does not have",
                                  "no selector", "a port as text"])  # fmt: skip
def test_the_validator_refuses_a_broken_object(what: str) -> None:
    """So that a pass above means something: a broken copy of the model server fails."""
    server = manifests.model_server(stack(), platform())
    kubernetes_validate.validate(server, KUBERNETES_SCHEMA_VERSION, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            broken_copies(server)[what], KUBERNETES_SCHEMA_VERSION, strict=True
        )
