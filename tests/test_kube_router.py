"""llm-d's router on the Kubernetes platform (components/cloud/kube/router.py, router_values.py,
capacity.py) under Pulumi's mocks: the pinned standalone chart and each of its values against the
chart's own values.yaml (tests/data/llm-d-router-v0.10.0/, sources in tests/data/README.md), the
EPP's config against the pinned release's config types (strict, as the EPP loads it), broken
copies of each refused; the hold limit from the wake budget and below the chart's Envoy limit;
the servers it selects are the model's; the edge forwards to it; the CPU pool holds it."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
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
from test_kube_scaling import check_values, default_at

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
from components.spec.kube import KUBERNETES_SCHEMA_VERSION, KubePlatformConfig
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


# --- the EPP's config against the pinned config types ---------------------------------------

GO = (DATA / "endpointpickerconfig_types.go").read_text()
STRUCTS = {
    name: {
        tag: gotype
        for _, gotype, tag in re.findall(r"^\t(\w+)\s+(\S+)\s+`json:\"([^,\"]*)[^`]*`", body, re.M)
        if tag
    }
    for name, body in re.findall(r"^type (\w+) struct \{\n(.*?)^\}", GO, re.S | re.M)
}
ALIASES = dict(re.findall(r"^type (\w+) (\[\]\w+)$", GO, re.M))
GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")


def check_go(value: Any, gotype: str, path: str = "") -> None:
    """`value` as the EPP's strict decoder reads it into `gotype`: unknown fields refused, each
    scalar of its field's type (metav1.Duration a Go duration, resource.Quantity a quantity)."""
    gotype = ALIASES.get(gotype.lstrip("*"), gotype.lstrip("*"))
    if gotype.startswith("[]"):
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            check_go(item, gotype[2:], f"{path}[{i}]")
    elif gotype in STRUCTS:
        assert isinstance(value, dict), path
        fields = {**STRUCTS[gotype]}
        if gotype == "EndpointPickerConfig":  # metav1.TypeMeta, inline
            fields.update(apiVersion="string", kind="string")
        for key, item in value.items():
            if key not in fields:
                raise KeyError(f"{path}.{key}: not a field of {gotype}")
            check_go(item, fields[key], f"{path}.{key}")
    elif gotype == "metav1.Duration":
        assert isinstance(value, str) and GO_DURATION.match(value), (path, value)
    elif gotype == "resource.Quantity":
        assert isinstance(value, str) and QUANTITY.match(value), (path, value)
    elif gotype == "string":
        assert isinstance(value, str), (path, value)
    elif gotype in ("int", "float64"):
        assert isinstance(value, int | float) and not isinstance(value, bool), (path, value)
    elif gotype == "bool":
        assert isinstance(value, bool), (path, value)
    elif gotype != "json.RawMessage":
        raise TypeError(f"{path}: {gotype} is not read here")


def deployed_epp_config(result: Run) -> dict[str, Any]:
    epp = result.one(RELEASE).inputs["values"]["router"]["epp"]
    return yaml.safe_load(epp["pluginsCustomConfig"][epp["pluginsConfigFile"]])


def test_the_epp_config_is_valid_for_the_pinned_types(deployed) -> None:
    result, cfg, _ = deployed
    config = deployed_epp_config(result)
    assert config == router_values.epp_config(cfg)
    check_go(config, "EndpointPickerConfig")
    assert config["apiVersion"] == "llm-d.ai/v1alpha1" and config["kind"] == "EndpointPickerConfig"


def test_flow_control_is_on_with_the_hold_limit_and_prefix_scoring(deployed) -> None:
    result, cfg, _ = deployed
    config = deployed_epp_config(result)
    # Without the gate the queue KEDA wakes on does not exist (docs/facts.md).
    assert config["featureGates"] == ["flowControl"]
    flow = config["flowControl"]
    assert flow["defaultRequestTTL"] == f"{router_values.hold_seconds(cfg)}s"
    assert flow["maxBytes"] == "256Mi"
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p["weight"] for p in profile["plugins"]}
    assert weights == {
        "queue-scorer": 2,
        "kv-cache-utilization-scorer": 2,
        "prefix-cache-scorer": 3,
        "no-hit-lru-scorer": 2,
    }
    assert {p["type"] for p in config["plugins"]} == set(weights)


def broken_configs() -> dict[str, dict[str, Any]]:
    good = router_values.epp_config(stack())
    out = {}
    bad = copy.deepcopy(good)
    # The split budget is not in v0.10.0 (llm-d-router#2284 came after the tag): the EPP would
    # refuse it at start, which is why the pin holds both regimes with one TTL.
    bad["flowControl"]["noEndpointRequestTTL"] = "786s"
    out["the empty-pool TTL of a later release"] = bad
    bad = copy.deepcopy(good)
    bad["flowControl"]["defaultRequestTTL"] = 786
    out["a TTL without a unit"] = bad
    bad = copy.deepcopy(good)
    bad["featureGate"] = ["flowControl"]
    out["a misspelled field"] = bad
    bad = copy.deepcopy(good)
    bad["schedulingProfiles"][0]["plugins"][0]["weight"] = "2"
    out["a weight as text"] = bad
    bad = copy.deepcopy(good)
    bad["flowControl"]["maxBytes"] = "256MB!"
    out["a bad quantity"] = bad
    return out


@pytest.mark.parametrize("what", list(broken_configs()))
def test_the_config_check_refuses_a_broken_copy(what: str) -> None:
    """So that a pass above means something."""
    check_go(router_values.epp_config(stack()), "EndpointPickerConfig")
    with pytest.raises((KeyError, AssertionError)):
        check_go(broken_configs()[what], "EndpointPickerConfig")


# --- the hold limit ----------------------------------------------------------------------------


def test_the_hold_limit_is_the_wake_budget_from_its_table() -> None:
    """docs/kubernetes.md "What a wake costs in time", part by part, for the prod model."""
    cfg = stack()
    weights = math.ceil(cfg.model_disk_gb * 1000 / 200)
    budget = 2 * 15 + 5 * 60 + math.ceil(12 * 1000 / 200) + weights + 221
    assert router_values.wake_budget_seconds(cfg) == budget
    assert router_values.hold_seconds(cfg) == budget
    # A wake of a few minutes: KEDA's 60 s default would shed every request of it.
    assert 5 * 60 < budget < 20 * 60


def test_the_hold_ends_before_the_charts_envoy_gives_up() -> None:
    """Envoy waits `message_timeout` for the EPP's answer to a request's headers (the envoy
    preset in the stored values.yaml); the hold must end first, so the EPP's 503 is what the
    client gets. A model whose wake is longer (Super BF16's 250 GB from a Volume) is capped."""
    preset = DEFAULTS["router"]["proxy"]["presets"]["envoy"]["configMap"]["data"]["envoy.yaml"]
    (timeout,) = re.findall(r"message_timeout: ([0-9]+)s", preset)
    assert int(timeout) == router_values.EXT_PROC_TIMEOUT_SECONDS
    assert router_values.hold_seconds(stack()) < int(timeout)
    cfg = stack()
    big = cfg.model_copy(update={"model": cfg.model.model_copy(update={"disk_gb": 250})})
    assert router_values.wake_budget_seconds(big) > int(timeout)
    assert router_values.hold_seconds(big) == int(timeout) - router_values.HOLD_MARGIN_SECONDS


# --- the metrics' check, the edge, the names ------------------------------------------------


def test_the_epp_may_check_prometheus_token(deployed) -> None:
    """The EPP's /metrics wants a token it reviews itself; the grant is the chart's own two
    rules, bound to the account the chart runs the EPP as."""
    result, _, _ = deployed
    role, binding = kubernetes_object(result.one(ROLE)), kubernetes_object(result.one(BINDING))
    for obj in (role, binding):
        kubernetes_validate.validate(obj, KUBERNETES_SCHEMA_VERSION, strict=True)
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in role["rules"]} == {
        ("authentication.k8s.io", "tokenreviews", ("create",)),
        ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
    }
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "router-epp", "namespace": catalog.PROJECT}
    ]
    assert result.one(BINDING).urn in result.one(RELEASE).dependencies


def test_a_broken_role_is_refused_by_the_schema() -> None:
    bad = router_values.metrics_auth_binding()
    bad["roleRef"] = {**bad["roleRef"], "namespace": "x"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_SCHEMA_VERSION, strict=True)


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


# --- the CPU pool holds what runs on it ---------------------------------------------------------


def test_keda_and_prometheus_requests_are_their_charts_defaults() -> None:
    keda = yaml.safe_load((ROOT / "tests/data/keda-2.20.2/chart-values.yaml").read_text())
    for pod in capacity.KEDA_PODS:
        assert default_at(keda, ("resources", pod, "requests")) == capacity.KEDA_REQUEST
    prometheus = yaml.safe_load(
        (ROOT / "tests/data/prometheus-29.27.0/chart-values.yaml").read_text()
    )
    assert prometheus["server"]["resources"] == {}
    assert "resources" not in scaling.keda_values(platform())
    assert "resources" not in scaling.prometheus_values(platform())["server"]


def test_the_default_cpu_pool_holds_the_platforms_pods() -> None:
    kube = platform()
    assert (kube.cpu_pool.node_millicpu, kube.cpu_pool.node_memory_mib) == (2000, 4096)
    capacity.check_cpu_pool(kube)
    names = {p.name for p in capacity.cpu_pool_pods()}
    assert {"edge", "router", "prometheus-server"} <= names


def test_a_pool_too_small_is_refused_naming_the_field() -> None:
    small = platform(cpuPool={"size": "s-1vcpu-2gb", "count": 1})
    with pytest.raises(
        ValueError, match=r"kubernetes\.cpuPool\.count 1 x kubernetes\.cpuPool\.size s-1vcpu-2gb"
    ):
        capacity.check_cpu_pool(small)


def test_the_charts_default_requests_do_not_fit_a_default_node(monkeypatch) -> None:
    """Why the requests are ours: the chart's own would not schedule on the default pool."""
    chart = DEFAULTS["router"]
    monkeypatch.setattr(router_values, "EPP_RESOURCES", chart["epp"]["resources"])
    monkeypatch.setattr(router_values, "PROXY_RESOURCES", chart["proxy"]["resources"])
    with pytest.raises(
        ValueError, match=r"kubernetes\.cpuPool\.size s-2vcpu-4gb .* the router pod"
    ):
        capacity.check_cpu_pool(platform())


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


def test_the_docs_state_the_hold_limit() -> None:
    """docs/kubernetes.md states the prod model's hold limit as the code computes it."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    assert f"{router_values.hold_seconds(stack())} s" in text
