"""The Kubernetes platform's config (components/spec/kube.py, `KubePlatformConfig`): its refusals,
each naming the field, and its required keys; and the fakes every test of the platform's
foundation runs on: DOKS under Pulumi's mocks, the cluster and the model server deployed for two
GPU sizes and min 0 / min 1 (`deployed`). What that deployment declares is tested by module:
test_kube_cluster.py, test_kube_model.py, test_kube_manifests.py; the container's `vllm serve`
arguments go through the pinned vLLM's parser in test_vllm_serve_parser.py (kube_cases)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

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
    stack_config,
)
from pydantic import BaseModel, ValidationError
from test_droplet import merged

from components.cloud.kube import cluster, model
from components.spec import config
from components.spec.kube import KubePlatformConfig
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
