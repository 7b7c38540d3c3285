"""KEDA on the Kubernetes platform (components/cloud/kube/scaling.py, autoscaler.py) under
Pulumi's mocks: the pinned chart and its values against the chart's own values.yaml, the
ScaledObject and TriggerAuthentication against the CRD schemas the pinned chart installs
(tests/data/keda-2.20.2/, sources in their `$comment` and docs/facts.md), the reader's core
objects against Kubernetes 1.36, a broken copy of each refused; Pulumi's hands off
`spec.replicas` once KEDA owns it; the metric names in the pinned vLLM's source."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pulumi
import pytest
import yaml
from pulumi.runtime import settings as pulumi_settings
from pulumi_harness import DEFAULT_OFFERS, FAKE_API_KEY, PROJECT, ROOT, Registration, plain_strings
from test_kube import KubeCloud, KubeRecorder, platform, stack

from components.cloud.kube import autoscaler, cluster, manifests, model, scaling
from components.spec import catalog
from components.spec.kube import KUBERNETES_SCHEMA_VERSION, KubePlatformConfig
from components.spec.schema import StackConfig

DATA = ROOT / "tests" / "data" / "keda-2.20.2"
RELEASE = "kubernetes:helm.sh/v3:Release"
SCALED_OBJECT = "kubernetes:keda.sh/v1alpha1:ScaledObject"
TRIGGER_AUTH = "kubernetes:keda.sh/v1alpha1:TriggerAuthentication"
STATEFUL_SET = "kubernetes:apps/v1:StatefulSet"


class ScalingRecorder(KubeRecorder):
    """Also what each registration asks Pulumi to ignore (the harness keeps no options)."""

    def __init__(self, mocks):
        super().__init__(mocks)
        self.ignored: dict[str, list[str]] = {}

    def RegisterResource(self, request):  # noqa: N802 (the monitor's gRPC name)
        response = super().RegisterResource(request)
        self.ignored[response.urn] = list(request.ignoreChanges)
        return response


@dataclass
class Run:
    registrations: list[Registration]
    ignored: dict[str, list[str]]

    def one(self, type_: str) -> Registration:
        (found,) = [r for r in self.registrations if r.type == type_]
        return found

    def obj(self, type_: str) -> dict[str, Any]:
        return {k: v for k, v in self.one(type_).inputs.items() if not k.startswith("__")}


def run(cfg: StackConfig, kube: KubePlatformConfig) -> Run:
    cloud = KubeCloud(DEFAULT_OFFERS)
    monitor = ScalingRecorder(cloud)
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(cloud, project=PROJECT, stack="kube", preview=False, monitor=monitor)
    pulumi.runtime.set_all_config({}, [])

    @pulumi.runtime.test
    def program():
        doks = cluster.DoksCluster("nemotron-kube", kube)
        server = model.ModelServer(
            "vllm", cfg, kube, pulumi.Output.secret(FAKE_API_KEY), None, doks.provider
        )
        scaler = autoscaler.Autoscaler("vllm", kube, server.servers, doks.provider)
        return scaler.scaled_object.id

    program()
    return Run(monitor.registrations, monitor.ignored)


CASES = [(size, m) for size in ("gpu-h100x1-80gb", "gpu-l40sx1-48gb") for m in (0, 1)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-min{m}" for s, m in CASES])
def deployed(request: pytest.FixtureRequest) -> tuple[Run, KubePlatformConfig]:
    size, min_nodes = request.param
    kube = platform(size, min_nodes)
    return run(stack(size), kube), kube


# --- the contracts of the pinned release, offline -------------------------------------------


def crd_schema(kind: str) -> dict[str, Any]:
    """The CRD's openAPIV3Schema as a JSON schema that refuses what the API server refuses
    under server-side apply: a field the schema does not declare (unless the schema preserves
    unknown fields there), besides every type, enum and bound it states."""
    schema = json.loads((DATA / f"{kind.lower()}.schema.json").read_text())["schema"]

    def strict(node: Any) -> Any:
        if isinstance(node, dict):
            node = {k: strict(v) for k, v in node.items()}
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            return node
        if isinstance(node, list):
            return [strict(v) for v in node]
        return node

    return strict(schema)


def validate_custom(obj: dict[str, Any]) -> None:
    assert obj["apiVersion"] == "keda.sh/v1alpha1", obj["apiVersion"]
    jsonschema.validate(obj, crd_schema(obj["kind"]), cls=jsonschema.Draft7Validator)


def leaves(values: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple, Any]]:
    """Each key path we set, down to a value the chart takes whole (a scalar, or a map the
    chart's default leaves empty for the user to fill: nodeSelector, labels)."""
    for key, value in values.items():
        if isinstance(value, dict) and value and not path_is_open((*path, key)):
            yield from leaves(value, (*path, key))
        else:
            yield (*path, key), value


CHART_DEFAULTS = yaml.safe_load((DATA / "chart-values.yaml").read_text())


def default_at(path: tuple[str, ...]) -> Any:
    node: Any = CHART_DEFAULTS
    for key in path:
        if not isinstance(node, dict) or key not in node:
            raise KeyError(
                f"{'.'.join(path)}: not a value of the keda chart {scaling.KEDA_VERSION}"
            )
        node = node[key]
    return node


def path_is_open(path: tuple[str, ...]) -> bool:
    try:
        return default_at(path) == {}
    except KeyError:
        return False


def check_values(values: dict[str, Any]) -> None:
    """Every value we set is one the chart has, of the type of its default (the chart ships no
    values.schema.json at this tag: its values.yaml is the contract)."""
    for path, value in leaves(values):
        default = default_at(path)
        if not isinstance(value, type(default)):
            raise TypeError(f"{'.'.join(path)}: {value!r} is not a {type(default).__name__}")


def test_the_stored_contracts_are_the_pinned_release() -> None:
    for kind in ("ScaledObject", "TriggerAuthentication"):
        comment = json.loads((DATA / f"{kind.lower()}.schema.json").read_text())["$comment"]
        assert f"tag v{scaling.KEDA_VERSION}" in comment, kind
    assert (
        f"tag v{scaling.KEDA_VERSION}" in (DATA / "chart-values.yaml").read_text().splitlines()[0]
    )


def test_keda_is_the_pinned_chart_with_checked_values(deployed) -> None:
    result, _ = deployed
    release = result.one(RELEASE)
    assert release.inputs["chart"] == "keda"
    assert release.inputs["version"] == "2.20.2"
    assert release.inputs["repositoryOpts"] == {"repo": "https://kedacore.github.io/charts"}
    assert release.inputs["namespace"] == "keda" and release.inputs["createNamespace"] is True
    assert release.inputs["atomic"] is True
    values = release.inputs["values"]
    assert values == scaling.keda_values()
    check_values(values)
    # On the always-on CPU pool (the label cluster.py puts on it), never on a GPU node.
    assert values["nodeSelector"] == {manifests.GPU_POOL_LABEL: "cpu"}
    assert values["watchNamespace"] == catalog.PROJECT


@pytest.mark.parametrize(
    "broken",
    [{"nodeSelectors": {"a": "b"}}, {"crds": {"install": "yes"}}, {"operator": {"replica": 2}}],
    ids=["a key the chart lacks", "a bool as text", "a nested key the chart lacks"],
)
def test_the_values_check_refuses_what_the_chart_lacks(broken: dict[str, Any]) -> None:
    check_values(scaling.keda_values())
    with pytest.raises((KeyError, TypeError)):
        check_values({**scaling.keda_values(), **broken})


def test_the_custom_objects_are_valid_for_the_pinned_crds(deployed) -> None:
    result, kube = deployed
    declared = result.obj(SCALED_OBJECT)
    assert declared["spec"] == scaling.scaled_object(kube)["spec"]
    validate_custom(declared)
    validate_custom(result.obj(TRIGGER_AUTH))


def broken_scaled_objects() -> dict[str, dict[str, Any]]:
    good = scaling.scaled_object(platform())
    out = {}
    bad = copy.deepcopy(good)
    bad["spec"]["minReplicaCount"] = "zero"
    out["a count as text"] = bad
    bad = copy.deepcopy(good)
    bad["spec"]["maxReplicas"] = 2
    out["a field the CRD does not have"] = bad
    bad = copy.deepcopy(good)
    del bad["spec"]["triggers"][0]["type"]
    out["a trigger without a type"] = bad
    bad = copy.deepcopy(good)
    del bad["spec"]["scaleTargetRef"]
    out["no target"] = bad
    bad = copy.deepcopy(good)
    behavior = bad["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    behavior["scaleUp"] = {**behavior["scaleUp"], "stabilizationWindowSeconds": 4000}
    out["a window past the chart's bound"] = bad
    return out


@pytest.mark.parametrize("what", list(broken_scaled_objects()))
def test_the_crd_check_refuses_a_broken_scaled_object(what: str) -> None:
    """So that a pass above means something."""
    validate_custom(scaling.scaled_object(platform()))
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(broken_scaled_objects()[what])


def test_a_broken_trigger_authentication_is_refused() -> None:
    bad = scaling.trigger_authentication()
    bad["spec"]["secretTargetRef"][0]["secret"] = bad["spec"]["secretTargetRef"][0].pop("name")
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(bad)


def test_the_readers_core_objects_are_valid_for_the_pinned_version(deployed) -> None:
    result, _ = deployed
    kinds = ("ServiceAccount", "Secret", "ClusterRole", "ClusterRoleBinding")
    declared = [
        {k: v for k, v in r.inputs.items() if not k.startswith("__")}
        for r in result.registrations
        if r.name.startswith("vllm-reader")
    ]
    assert sorted(o["kind"] for o in declared) == sorted(kinds)
    for obj in declared:
        kubernetes_validate.validate(obj, KUBERNETES_SCHEMA_VERSION, strict=True)


# --- what the objects say -------------------------------------------------------------------


def test_the_scaled_object_moves_the_servers_between_min_and_max(deployed) -> None:
    result, kube = deployed
    spec = result.obj(SCALED_OBJECT)["spec"]
    servers = result.obj(STATEFUL_SET)
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": servers["metadata"]["name"],
    }
    assert result.obj(SCALED_OBJECT)["metadata"]["namespace"] == servers["metadata"]["namespace"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (kube.replicas.min, 2)
    # llm-d's KEDA guide's cadence and damping (docs/facts.md).
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (15, 300)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert {w["stabilizationWindowSeconds"] for w in behavior.values()} == {300}


def test_the_router_queue_wakes_and_each_trigger_reads_a_real_endpoint(deployed) -> None:
    result, _ = deployed
    triggers = {t["name"]: t for t in result.obj(SCALED_OBJECT)["spec"]["triggers"]}
    assert set(triggers) == {"router-queue", "router-running", "vllm-waiting"}
    assert all(t["type"] == "metrics-api" and t["metricType"] == "AverageValue"
               for t in triggers.values())  # fmt: skip
    meta = {name: t["metadata"] for name, t in triggers.items()}
    # Anything queued in the router wakes a sleeping model; targets per server.
    assert meta["router-queue"]["activationTargetValue"] == "0"
    assert [meta[n]["targetValue"] for n in triggers] == ["1", "16", "1"]
    assert [meta[n]["valueLocation"] for n in triggers] == [
        "llm_d_epp_flow_control_queue_size",
        "llm_d_epp_request_running",
        "vllm:num_requests_waiting",
    ]
    # The router's page, with the reader's token: the auth names the token Secret of the
    # account the ClusterRole binding lets GET /metrics.
    auth = result.obj(TRIGGER_AUTH)
    for name in ("router-queue", "router-running"):
        assert triggers[name]["authenticationRef"] == {"name": auth["metadata"]["name"]}
        assert meta[name]["authModes"] == "bearer"
        url = urlsplit(meta[name]["url"])
        assert (url.hostname, url.port, url.path) == (
            f"router-epp.{catalog.PROJECT}.svc",
            9090,
            "/metrics",
        )
    (ref,) = auth["spec"]["secretTargetRef"]
    assert ref["parameter"] == "bearerToken" and ref["key"] == "token"
    token = next(r for r in result.registrations if r.name == "vllm-reader-token").inputs
    assert token["metadata"]["name"] == ref["name"]
    assert token["type"] == "kubernetes.io/service-account-token"
    assert "data" not in token and "stringData" not in token  # Kubernetes fills it
    account = token["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    role = next(r for r in result.registrations if r.name == "vllm-reader-role").inputs
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = next(r for r in result.registrations if r.name == "vllm-reader-binding").inputs
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": catalog.PROJECT}
    ]
    # vLLM's page on every server: its Service's endpoints, at the container's own port
    # (KEDA dials each pod at the URL's port), summed.
    url = urlsplit(meta["vllm-waiting"]["url"])
    svc = next(r for r in result.registrations if r.type == "kubernetes:core/v1:Service").inputs
    assert url.hostname == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    (port,) = result.obj(STATEFUL_SET)["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert url.port == port["containerPort"] and url.path == "/metrics"
    assert meta["vllm-waiting"]["aggregateFromKubeServiceEndpoints"] == "true"
    assert meta["vllm-waiting"]["aggregationType"] == "sum"


def test_pulumi_leaves_the_count_to_keda(deployed) -> None:
    """The StatefulSet is created at `min` (no GPU bills at min 0 before a request), and from
    then on Pulumi ignores `spec.replicas` (pulumi-kubernetes drops an ignored field another
    manager owns from its server-side apply patch, else sends the live value: docs/facts.md)."""
    result, kube = deployed
    servers = result.one(STATEFUL_SET)
    assert servers.inputs["spec"]["replicas"] == kube.replicas.min
    assert result.ignored[servers.urn] == ["spec.replicas"]
    # Nothing else of ours is ignored: every other field stays Pulumi's.
    assert [u for u, fields in result.ignored.items() if fields] == [servers.urn]


def test_the_scaled_object_waits_for_keda_and_the_servers(deployed) -> None:
    result, _ = deployed
    deps = result.one(SCALED_OBJECT).dependencies
    assert result.one(RELEASE).urn in deps and result.one(STATEFUL_SET).urn in deps
    assert result.one(TRIGGER_AUTH).urn in deps
    assert result.one(RELEASE).urn in result.one(TRIGGER_AUTH).dependencies


def test_no_secret_in_any_plain_input(deployed) -> None:
    result, _ = deployed
    for r in result.registrations:
        for path, text in plain_strings(r.raw):
            assert FAKE_API_KEY not in text, (r.type, r.name, path)


def _pinned_vllm_source() -> Path:
    found = sorted(
        (ROOT / ".vllm-venv").glob("lib/python*/site-packages/vllm/v1/metrics/loggers.py")
    )
    if not found:
        pytest.skip("no .vllm-venv: ./check installs the pinned vLLM")
    return found[0]


def test_vllms_metric_is_a_gauge_of_the_pinned_vllm() -> None:
    """The name the trigger reads, as the pinned vLLM declares it (a rename fails here)."""
    source = _pinned_vllm_source().read_text()
    assert f'name="{scaling.VLLM_WAITING}"' in source
    declared = source[source.index(f'name="{scaling.VLLM_WAITING}"') - 200 :]
    assert "_gauge_cls(" in declared.split("name=", 1)[0]
