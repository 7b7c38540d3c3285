"""The Kubernetes platform's foundation (components/spec/kube.py, components/cloud/kube/) under
Pulumi's mocks: every resource and input for two GPU sizes and min 0 / min 1; every Kubernetes
object validated offline against the pinned cluster version's OpenAPI schema (kubernetes-validate),
with a broken copy that must fail; the platform config's refusals. The container's `vllm serve`
arguments go through the pinned vLLM's parser in test_vllm_serve_parser.py (kube_cases)."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pulumi
import pytest
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi_harness import (
    DEFAULT_OFFERS,
    FAKE_API_KEY,
    PROJECT,
    FakeCloud,
    Recorder,
    Registration,
    plain_strings,
    stack_config,
)
from pydantic import BaseModel, ValidationError
from test_droplet import merged

from components.cloud.kube import cluster, manifests, model
from components.host import vllm_service
from components.spec import catalog, config
from components.spec.kube import KUBERNETES_SCHEMA_VERSION, KubePlatformConfig
from components.spec.schema import StackConfig

CLUSTER = "digitalocean:index/kubernetesCluster:KubernetesCluster"
NODE_POOL = "digitalocean:index/kubernetesNodePool:KubernetesNodePool"
PROVIDER = "pulumi:providers:kubernetes"
VERSIONS_TOKEN = "digitalocean:index/getKubernetesVersions:getKubernetesVersions"
CLUSTER_TOKEN = "digitalocean:index/getKubernetesCluster:getKubernetesCluster"
# What the versions data source answers for the pinned minor: the newest patch slug first.
LATEST = "1.36.2-do.1"
FAKE_KUBECONFIG = "apiVersion: v1\nusers:\n- user: {token: FAKE-DOKS-TOKEN-d0d0d0d0}\n"
FAKE_HF_TOKEN = "hf_FAKEtokenFAKEtokenFAKEtoken01"
DIGEST = "sha256:" + "ab" * 32
EDGE_DIGEST = "sha256:" + "cd" * 32
EPP_DIGEST = "sha256:" + "ef" * 32
PROXY_DIGEST = "sha256:" + "01" * 32
SIZES = ("gpu-h100x1-80gb", "gpu-l40sx1-48gb")


class KubeRecorder(Recorder):
    """The registrations, and the provider each names (the harness keeps no provider)."""

    def __init__(self, mocks: pulumi_mocks.Mocks):
        super().__init__(mocks)
        self.providers: dict[str, str] = {}

    def RegisterResource(self, request):  # noqa: N802 (the monitor's gRPC name)
        response = super().RegisterResource(request)
        self.providers[response.urn] = request.provider
        return response


class KubeCloud(FakeCloud):
    """The account, with DOKS: its versions, a cluster's kubeconfig (as the data source and the
    resource give it)."""

    def call(self, args: pulumi_mocks.MockCallArgs):
        if args.token == VERSIONS_TOKEN:
            self.calls.append(args)
            prefix = args.args.get("versionPrefix", "")
            valid = [v for v in (LATEST, "1.36.1-do.0", "1.35.4-do.2") if v.startswith(prefix)]
            return {"latestVersion": valid[0], "validVersions": valid, "id": "versions"}, []
        if args.token == CLUSTER_TOKEN:
            self.calls.append(args)
            kube_config = {"rawConfig": FAKE_KUBECONFIG, "token": "FAKE-DOKS-TOKEN-d0d0d0d0"}
            return {"name": args.args["name"], "kubeConfigs": [kube_config], "id": "c-1"}, []
        return super().call(args)

    def new_resource(self, args: pulumi_mocks.MockResourceArgs):
        if args.typ == CLUSTER:
            outs = {**args.inputs, "kubeConfigs": [{"rawConfig": FAKE_KUBECONFIG}]}
            return "doks-uuid-0001", outs
        if args.typ == SECRET:
            # The API server gives the Secret a resourceVersion that moves with its data.
            meta = {**args.inputs.get("metadata", {}), "resourceVersion": secret_version(args)}
            id_, outs = super().new_resource(args)
            return id_, {**outs, "metadata": meta}
        return super().new_resource(args)


SECRET = "kubernetes:core/v1:Secret"


def secret_version(args: Any) -> str:
    """The emulated resourceVersion of a Secret: a digest of what it holds."""
    data = json.dumps(args.inputs.get("stringData", {}), sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:12]


@dataclass
class Run:
    registrations: list[Registration]
    cloud: KubeCloud
    providers: dict[str, str]
    error: BaseException | None = None

    def of(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def one(self, type_: str) -> Registration:
        (found,) = self.of(type_)
        return found


def platform(size: str = SIZES[0], min_nodes: int = 0, **over: Any) -> KubePlatformConfig:
    raw = merged(
        {
            "ha": False,
            "imageDigest": DIGEST,
            "edge": {"imageDigest": EDGE_DIGEST},
            "router": {"eppImageDigest": EPP_DIGEST, "proxyImageDigest": PROXY_DIGEST},
            "gpuPool": {"size": size, "minNodes": min_nodes, "maxNodes": 2},
            "replicas": {"min": min_nodes, "max": 2},
        },
        over,
    )
    return KubePlatformConfig.model_validate(raw)


def stack(size: str = SIZES[0]) -> StackConfig:
    raw = merged(stack_config("prod"), {"droplet": {"size": size, "image": None}})
    raw["droplet"] = {k: v for k, v in raw["droplet"].items() if v is not None}
    return config.parse(raw, "prod")


def mock(cloud: FakeCloud, monitor: Recorder) -> None:
    """Pulumi's mocks for one program of the platform: `cloud` answers, `monitor` records."""
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(cloud, project=PROJECT, stack="kube", preview=False, monitor=monitor)
    pulumi.runtime.set_all_config({}, [])


def cluster_and_server(
    cfg: StackConfig,
    kube: KubePlatformConfig,
    hf_token: str | None = FAKE_HF_TOKEN,
    api_key: str = FAKE_API_KEY,
) -> tuple[cluster.DoksCluster, model.ModelServer]:
    """The cluster and the model server, as every program of the platform declares them."""
    doks = cluster.DoksCluster("nemotron-kube", kube)
    server = model.ModelServer(
        "vllm",
        cfg,
        kube,
        api_key=pulumi.Output.secret(api_key),
        hf_token=None if hf_token is None else pulumi.Output.secret(hf_token),
        provider=doks.provider,
    )
    return doks, server


def run(
    cfg: StackConfig,
    kube: KubePlatformConfig,
    hf_token: str | None = FAKE_HF_TOKEN,
    api_key: str = FAKE_API_KEY,
) -> Run:
    cloud = KubeCloud(DEFAULT_OFFERS)
    monitor = KubeRecorder(cloud)
    mock(cloud, monitor)
    result = Run(registrations=monitor.registrations, cloud=cloud, providers=monitor.providers)

    @pulumi.runtime.test
    def program():
        _, server = cluster_and_server(cfg, kube, hf_token, api_key)
        return server.service.id

    try:
        program()
    except BaseException as err:  # noqa: BLE001 (tests assert on it)
        result.error = err
    return result


CASES = [(size, m) for size in SIZES for m in (0, 1)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-min{m}" for s, m in CASES])
def deployed(request: pytest.FixtureRequest) -> tuple[Run, StackConfig, KubePlatformConfig]:
    size, min_nodes = request.param
    cfg, kube = stack(size), platform(size, min_nodes)
    result = run(cfg, kube)
    assert result.error is None, result.error
    return result, cfg, kube


def kubernetes_object(r: Registration) -> dict[str, Any]:
    """A pulumi-kubernetes registration as the object the API server receives: its inputs
    (apiVersion, kind, metadata, spec or data) with the secrets' plain values."""
    return {k: v for k, v in r.inputs.items() if not k.startswith("__")}


def k8s(result: Run) -> list[Registration]:
    return [r for r in result.registrations if r.type.startswith("kubernetes:")]


def test_the_cluster_pins_its_version_ha_and_pools(deployed) -> None:
    result, _, kube = deployed
    doks = result.one(CLUSTER)
    # The version: the newest patch of the pinned minor, as DigitalOcean lists it on this run.
    (versions,) = [c for c in result.cloud.calls if c.token == VERSIONS_TOKEN]
    assert versions.args["versionPrefix"] == "1.36."
    assert doks.inputs == {
        "name": "nemotron-kube",
        "region": kube.region,
        "version": LATEST,
        "ha": False,
        "autoUpgrade": True,
        "surgeUpgrade": True,
        "nodePool": {
            "name": "nemotron-kube-cpu",
            "size": "s-2vcpu-4gb",
            "nodeCount": 2,
            "labels": {manifests.GPU_POOL_LABEL: "cpu"},
        },
        "tags": [catalog.PROJECT],
        # What the cluster's controllers made (its Load Balancer, the claims' Volumes) goes
        # with it: nothing bills after `pulumi destroy`.
        "destroyAllAssociatedResources": True,
        # Set, not left to the default that looks for GPU nodes a pool at 0 does not have.
        "nvidiaGpuDevicePlugin": {"enabled": True},
    }
    pool = result.one(NODE_POOL)
    assert pool.inputs == {
        "clusterId": "doks-uuid-0001",
        "name": "nemotron-kube-gpu",
        "size": kube.gpu_pool.size,
        "autoScale": True,
        "minNodes": kube.gpu_pool.min_nodes,
        "maxNodes": 2,
        "labels": {manifests.GPU_POOL_LABEL: manifests.GPU_POOL_VALUE},
        "tags": [catalog.PROJECT],
    }
    # No taint of ours (DOKS's own nvidia.com/gpu taint is the one its device plugin tolerates).
    assert "taints" not in pool.inputs


def test_the_provider_reads_a_fresh_kubeconfig_kept_secret(deployed) -> None:
    result, _, _ = deployed
    provider = result.one(PROVIDER)
    assert provider.inputs == {"kubeconfig": FAKE_KUBECONFIG, "enableServerSideApply": "true"}
    (fetched,) = [c for c in result.cloud.calls if c.token == CLUSTER_TOKEN]
    assert fetched.args["name"] == "nemotron-kube"
    # The provider waits for the GPU pool, and every Kubernetes object goes through it (not
    # through a default provider and whatever kubeconfig the machine running `pulumi up` has).
    assert result.one(NODE_POOL).urn in provider.dependencies
    for r in k8s(result):
        assert result.providers[r.urn].startswith(provider.urn + "::"), r.name


def test_no_secret_is_ever_a_plain_input(deployed) -> None:
    """The kubeconfig, the API key and the HF token are in Pulumi secrets only: in no plain
    input of any resource (the Secret's stringData is marked secret; the pods read it by
    reference)."""
    result, _, _ = deployed
    for r in result.registrations:
        for path, text in plain_strings(r.raw):
            for secret in (FAKE_KUBECONFIG, "FAKE-DOKS-TOKEN", FAKE_API_KEY, FAKE_HF_TOKEN):
                assert secret not in text, (r.type, r.name, path)
    secret = result.one("kubernetes:core/v1:Secret")
    assert secret.inputs["stringData"] == {"VLLM_API_KEY": FAKE_API_KEY, "HF_TOKEN": FAKE_HF_TOKEN}
    server = result.one("kubernetes:apps/v1:StatefulSet")
    every_env = [
        e
        for c in server.inputs["spec"]["template"]["spec"]["initContainers"]
        + server.inputs["spec"]["template"]["spec"]["containers"]
        for e in c["env"]
    ]
    by_ref = {e["name"] for e in every_env if "valueFrom" in e}
    assert by_ref == {"VLLM_API_KEY", "HF_TOKEN"}
    assert all("value" not in e for e in every_env if e["name"] in by_ref)


def test_without_an_hf_token_the_secret_holds_only_the_key() -> None:
    result = run(stack(), platform(), hf_token=None)
    assert result.error is None, result.error
    secret = result.one("kubernetes:core/v1:Secret")
    assert secret.inputs["stringData"] == {"VLLM_API_KEY": FAKE_API_KEY}


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


def pods_version(result: Run) -> str:
    spec = result.one("kubernetes:apps/v1:StatefulSet").inputs["spec"]
    return str(spec["template"]["metadata"]["annotations"][manifests.SECRET_VERSION])


def test_a_new_api_key_rolls_the_servers() -> None:
    """vLLM reads the key from env at start: a new key (the Secret updated in place) must roll
    the servers, or they keep the old one while the output shows the new. The same key twice
    changes nothing."""
    cfg, kube = stack(), platform()
    first, again = run(cfg, kube), run(cfg, kube)
    rotated = run(cfg, kube, api_key="b" * 48)
    assert pods_version(first) == pods_version(again)
    assert pods_version(rotated) != pods_version(first)
    assert "b" * 48 not in pods_version(rotated)


def test_only_a_cluster_ip_service(deployed) -> None:
    result, _, _ = deployed
    (svc,) = result.of("kubernetes:core/v1:Service")
    assert svc.inputs["spec"]["type"] == "ClusterIP"
    assert svc.inputs["spec"]["selector"] == manifests.LABELS
    kinds = {r.type for r in k8s(result)}
    assert kinds == {
        "kubernetes:core/v1:Namespace",
        "kubernetes:core/v1:Secret",
        "kubernetes:apps/v1:StatefulSet",
        "kubernetes:core/v1:Service",
    }


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


def test_a_size_mismatch_is_refused_before_anything_is_declared() -> None:
    result = run(stack("gpu-h100x1-80gb"), platform("gpu-l40sx1-48gb"))
    assert isinstance(result.error, ValueError)
    assert "droplet.size (gpu-h100x1-80gb) and gpuPool.size (gpu-l40sx1-48gb)" in str(result.error)
    assert not result.of("kubernetes:apps/v1:StatefulSet")


REFUSALS = {
    "gpuPool.size": ({"gpuPool": {"size": "gpu-h200x1-141gb"}}, "not a GPU size a DOKS node pool"),
    "gpuPool amd": ({"gpuPool": {"size": "gpu-mi300x1-192gb"}}, "accepted: gpu-4000adax1-20gb"),
    "gpuPool min > max": ({"gpuPool": {"minNodes": 3, "maxNodes": 2}}, "minNodes (3) is above"),
    "replicas min > max": ({"replicas": {"min": 2, "max": 1}}, "min (2) is above max (1)"),
    "replicas past nodes": ({"replicas": {"max": 3}}, "replicas.max (3) is above gpuPool.maxNodes"),
    "idle gpu nodes": (
        {"gpuPool": {"minNodes": 1}, "replicas": {"min": 0}},
        "gpuPool.minNodes (1) is above replicas.min (0)",
    ),
    "cpu size a gpu": ({"cpuPool": {"size": "gpu-h100x1-80gb"}}, "not a CPU Droplet size"),
    "digest": ({"imageDigest": "latest"}, "not an image digest"),
    "edge digest": ({"edge": {"imageDigest": "2.11.7"}}, "not an image digest"),
    "scaling digest": ({"scaling": {"kedaDigest": "2.20.2"}}, "not an image digest"),
    "region": ({"region": "Toronto"}, "not a region slug"),
    "unknown key": ({"platformFlavour": "x"}, "Extra inputs are not permitted"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_platform_input_is_refused_naming_the_field(case: str) -> None:
    override, message = REFUSALS[case]
    with pytest.raises(ValidationError) as err:
        platform(**override)
    assert message in str(err.value)
    # The field's own name (camelCase, as the stack file writes it) is in the message.
    field_name = next(iter(override))
    assert field_name in str(err.value) or field_name in json.dumps(err.value.errors(), default=str)


def test_ha_and_the_digests_are_required() -> None:
    with pytest.raises(ValidationError) as err:
        KubePlatformConfig.model_validate({})
    missing = {e["loc"][0] for e in err.value.errors() if e["type"] == "missing"}
    assert missing == {"ha", "imageDigest", "edge", "router"}
    with pytest.raises(ValidationError) as err:
        platform(edge={"imageDigest": None})
    assert "edge.imageDigest" in str(err.value).replace("\n", ".")


def test_every_platform_field_says_what_it_is() -> None:
    """As every stack config field does (the reference is generated from the descriptions)."""
    models = [KubePlatformConfig, *(f.annotation for f in KubePlatformConfig.model_fields.values()
                                    if isinstance(f.annotation, type)
                                    and issubclass(f.annotation, BaseModel))]  # fmt: skip
    assert len(models) == 8
    for m in models:
        for name, f in m.model_fields.items():
            assert f.description, f"{m.__name__}.{name}"
