"""llm-d's router on the Kubernetes platform (components/cloud/kube/router.py) under Pulumi's
mocks: the pinned standalone chart and each of its values against the chart's own values.yaml
(tests/data/llm-d-router-v0.10.0/, sources in tests/data/README.md), broken copies refused; the
servers it selects are the model's; its images; the edge forwards to it; the config's refusals.
The EPP's config, the hold limit and the metrics role are router_values.py's
(test_kube_router_values.py); the CPU pool that holds it, capacity.py's (test_kube_capacity.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pulumi
import pytest
import yaml
from pulumi_harness import DEFAULT_OFFERS, FAKE_API_KEY, ROOT, Registration, plain_strings
from pydantic import ValidationError
from test_kube import (
    EPP_DIGEST,
    PROXY_DIGEST,
    KubeRecorder,
    cluster_and_server,
    kubernetes_object,
    mock,
    platform,
    stack,
)
from test_kube_edge import EdgeCloud
from test_kube_scaling import check_values

from components.cloud.kube import (
    capacity,
    edge,
    edge_manifests,
    manifests,
    router,
    router_values,
    scaling,
)
from components.spec import catalog
from components.spec.kube import KubePlatformConfig
from components.spec.schema import StackConfig

DATA = ROOT / "tests" / "data" / "llm-d-router-v0.10.0"
RELEASE = "kubernetes:helm.sh/v3:Release"
STATEFUL_SET = "kubernetes:apps/v1:StatefulSet"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"


@dataclass
class Run:
    registrations: list[Registration]

    def of(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def one(self, type_: str) -> Registration:
        (found,) = self.of(type_)
        return found


def run(cfg: StackConfig, kube: KubePlatformConfig) -> Run:
    cloud = EdgeCloud(DEFAULT_OFFERS)
    monitor = KubeRecorder(cloud)
    mock(cloud, monitor)

    @pulumi.runtime.test
    def program():
        doks, server = cluster_and_server(cfg, kube)
        front = router.Router("router", cfg, kube, server, doks.provider)
        gate = edge.Edge("edge", cfg, kube, server.secret, doks.provider, front.upstream)
        return pulumi.Output.all(front.release.id, gate.deployment.id)

    program()
    return Run(monitor.registrations)


CASES = [(size, m) for size in ("gpu-h100x1-80gb", "gpu-l40sx1-48gb") for m in (0, 1)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-min{m}" for s, m in CASES])
def deployed(request: pytest.FixtureRequest) -> tuple[Run, StackConfig, KubePlatformConfig]:
    size, min_nodes = request.param
    cfg, kube = stack(size), platform(size, min_nodes)
    return run(cfg, kube), cfg, kube


# --- the pinned chart's contract, offline ----------------------------------------------------


def chart_defaults() -> dict[str, Any]:
    """The values the standalone chart renders with: its library chart's values under the
    alias `router` (llm-d-router-standalone Chart.yaml: dependency `router`, alias `router`),
    with the standalone chart's own `router:` values over them."""
    lib = yaml.safe_load((DATA / "routerlib-values.yaml").read_text())
    own = yaml.safe_load((DATA / "standalone-values.yaml").read_text())

    def merge(base: Any, over: Any) -> Any:
        # `modelServers:` with only comments under it is null: it is read as no override here
        # (every value under it is one we set ourselves).
        if over is None:
            return base
        if isinstance(base, dict) and isinstance(over, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
        return over

    return {"router": merge(lib, own["router"])}


DEFAULTS = chart_defaults()
# Keys the chart documents in comments rather than as defaults, each with the comment that says
# so in the stored values.yaml: the server selector, required in standalone mode, and the
# proxy's image, which replaces the preset's.
DOCUMENTED = {
    ("router", "modelServers", "matchLabels"): "# matchLabels: # REQUIRED",
    ("router", "proxy", "image"): "set proxy.image to replace the preset image",
}


def check_router_values(values: dict[str, Any]) -> None:
    """Each value we set is one the chart has, of its default's type; the keys the chart names
    only in its comments are checked apart (a map of labels, an image reference)."""
    plain = copy.deepcopy(values)
    for path in DOCUMENTED:
        node = plain
        for key in path[:-1]:
            node = node[key]
        documented = node.pop(path[-1], None)
        if path[-1] == "matchLabels" and documented is not None:
            assert all(isinstance(v, str) for v in documented.values()), documented
        if path[-1] == "image" and documented is not None:
            assert isinstance(documented, str), documented
    check_values(plain, DEFAULTS)


def test_the_stored_contracts_are_the_pinned_release() -> None:
    for name in (
        "standalone-values.yaml",
        "routerlib-values.yaml",
        "endpointpickerconfig_types.go",
    ):
        first = (DATA / name).read_text().splitlines()[0]
        assert f"tag {router_values.CHART_VERSION} (commit 71f4f099)" in first, name
    text = (DATA / "standalone-values.yaml").read_text() + (
        DATA / "routerlib-values.yaml"
    ).read_text()
    for comment in DOCUMENTED.values():
        assert comment in text, comment


def test_the_router_is_the_pinned_chart_with_checked_values(deployed) -> None:
    result, cfg, kube = deployed
    release = result.one(RELEASE)
    assert release.inputs["chart"] == "oci://ghcr.io/llm-d/charts/llm-d-router-standalone"
    assert release.inputs["version"] == "v0.10.0"
    # An OCI chart: no repository; the release's name makes the Service `router-epp`.
    assert "repositoryOpts" not in release.inputs
    assert release.inputs["name"] == "router" and release.inputs["atomic"] is True
    assert release.inputs["namespace"] == catalog.PROJECT
    values = release.inputs["values"]
    assert values == router_values.values(cfg, kube)
    check_router_values(values)


VALUE_BREAKS = {
    "a key the chart lacks": {"router": {"epp": {"replica": 2}}},
    "a bool as text": {"router": {"inferencePool": {"create": "false"}}},
    "the old top-level section": {"inferencePool": {"create": False}},
    "a port as text": {"router": {"epp": {"extProcPort": "9002"}}},
}


@pytest.mark.parametrize("what", list(VALUE_BREAKS))
def test_the_values_check_refuses_a_broken_copy(what: str) -> None:
    good = router_values.values(stack(), platform())
    check_router_values(good)

    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
        return over

    with pytest.raises((KeyError, TypeError)):
        check_router_values(merge(good, VALUE_BREAKS[what]))


def test_the_router_selects_the_model_servers_on_vllms_port(deployed) -> None:
    result, _, _ = deployed
    router_ = result.one(RELEASE).inputs["values"]["router"]
    servers = kubernetes_object(result.one(STATEFUL_SET))
    pod = servers["spec"]["template"]
    assert router_["modelServers"]["matchLabels"] == pod["metadata"]["labels"]
    (port,) = pod["spec"]["containers"][0]["ports"]
    assert (
        router_["modelServers"]["targetPorts"]
        == [{"number": port["containerPort"]}]
        == [{"number": 8000}]
    )
    # Standalone: no InferencePool, whose CRD the cluster does not have.
    assert router_["inferencePool"] == {"create": False}


def test_the_images_are_the_releases_pinned_by_digest(deployed) -> None:
    result, _, _ = deployed
    router_ = result.one(RELEASE).inputs["values"]["router"]
    image = router_["epp"]["image"]
    lib = DEFAULTS["router"]["epp"]["image"]
    assert (image["registry"], image["repository"]) == (lib["registry"], lib["repository"])
    assert image["tag"] == f"v0.10.0@{EPP_DIGEST}" and image["pullPolicy"] == "IfNotPresent"
    preset = DEFAULTS["router"]["proxy"]["presets"]["envoy"]["image"]
    assert router_["proxy"]["image"] == f"{preset}@{PROXY_DIGEST}"


def test_the_router_runs_on_the_cpu_pool_within_its_requests(deployed) -> None:
    result, _, _ = deployed
    router_ = result.one(RELEASE).inputs["values"]["router"]
    affinity = router_["epp"]["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {
        "matchExpressions": [{"key": manifests.GPU_POOL_LABEL, "operator": "In", "values": ["cpu"]}]
    }
    # Below the chart's defaults (8 and 4 CPUs: more than a default CPU node has), no CPU limit.
    for ours, chart in (
        (router_["epp"]["resources"], DEFAULTS["router"]["epp"]["resources"]),
        (router_["proxy"]["resources"], DEFAULTS["router"]["proxy"]["resources"]),
    ):
        assert capacity.millicpu(ours["requests"]["cpu"]) < capacity.millicpu(
            chart["requests"]["cpu"]
        )
        assert "cpu" not in ours["limits"]


# --- the edge, the names (the EPP's config, hold limit, metrics role: test_kube_router_values.py)


def test_the_edge_forwards_to_the_routers_envoy(deployed) -> None:
    result, _, _ = deployed
    (conf,) = [r for r in result.of(CONFIG_MAP) if r.name == "edge-caddyfile"]
    caddyfile = kubernetes_object(conf)["data"]["Caddyfile"]
    router_host = f"router-epp.{catalog.PROJECT}.svc.cluster.local"
    assert f"reverse_proxy {router_host}:8081" in caddyfile
    assert f"vllm.{catalog.PROJECT}.svc" not in caddyfile
    # The port is the one the chart adds to the EPP's Service for Envoy's listener.
    (http,) = [p for p in DEFAULTS["router"]["extraServicePorts"] if p["name"] == "http"]
    assert (http["port"], http["targetPort"]) == (router_values.PROXY_PORT, 8081)


def test_prometheus_scrapes_the_routers_service() -> None:
    """One name for the router's Service: the edge's upstream and KEDA's scrape target."""
    jobs = scaling.prometheus_values(platform())["scrapeConfigs"]
    target = jobs["llm-d-router"]["static_configs"]
    (host_port,) = target[0]["targets"]
    host, port = host_port.rsplit(":", 1)
    assert edge_manifests.ROUTER.host.startswith(host + ".")
    assert int(port) == 9090


def test_no_secret_in_any_plain_input(deployed) -> None:
    result, _, _ = deployed
    for r in result.registrations:
        for path, text in plain_strings(r.raw):
            assert FAKE_API_KEY not in text, (r.type, r.name, path)


# --- the config's refusals (the CPU pool that holds the router: test_kube_capacity.py) -------


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"cpuPool": {"size": "c-4"}}, "does not state its vCPUs and memory"),
        ({"router": {"eppImageDigest": "v0.10.0"}}, "not an image digest"),
        ({"router": {"proxyImageDigest": "sha256:abc"}}, "not an image digest"),
    ],
)
def test_the_config_refuses_what_the_router_cannot_use(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        platform(**over)


def test_the_router_section_is_required() -> None:
    raw = platform().model_dump(by_alias=True)
    del raw["router"]
    with pytest.raises(ValidationError, match="router"):
        KubePlatformConfig.model_validate(raw)
