"""KEDA on the Kubernetes platform (components/cloud/kube/scaling.py) under Pulumi's mocks, the
program declaring it through autoscaler.py (whose own tests, the releases and what the
ScaledObject waits for, are test_kube_autoscaler.py's): KEDA's and Prometheus' values against
each chart's own values.yaml (and Prometheus' values.schema.json), the ScaledObject against the
CRD schema the pinned KEDA chart installs (tests/data/, sources in tests/data/README.md and
docs/facts.md), a broken copy of each refused; the triggers ask the server the chart makes for
the jobs it scrapes; Pulumi's hands off `spec.replicas` once KEDA owns it; vLLM's metric name in
the pinned vLLM's source."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pulumi
import pytest
import yaml
from pulumi_harness import DEFAULT_OFFERS, FAKE_API_KEY, ROOT, Registration, plain_strings
from test_kube import KubeCloud, KubeRecorder, cluster_and_server, mock, platform, stack

from components.cloud.kube import autoscaler, router_values, scaling
from components.spec import catalog
from components.spec import kube as kube_spec
from components.spec.kube import KubePlatformConfig, ScalingConfig
from components.spec.schema import StackConfig

# The router's hold for the test stack (the prod model): the last server's cooldown floor.
HOLD = router_values.hold_seconds(stack())

DATA = ROOT / "tests" / "data" / "keda-2.20.2"
PROMETHEUS_DATA = ROOT / "tests" / "data" / "prometheus-29.27.0"
RELEASE = "kubernetes:helm.sh/v3:Release"
SCALED_OBJECT = "kubernetes:keda.sh/v1alpha1:ScaledObject"
STATEFUL_SET = "kubernetes:apps/v1:StatefulSet"


class ScalingRecorder(KubeRecorder):
    """Also what each registration asks Pulumi to ignore (the harness keeps no options)."""

    def __init__(self, mocks):
        super().__init__(mocks)
        self.ignored: dict[str, list[str]] = {}
        self.delete_first: set[str] = set()

    def RegisterResource(self, request):  # noqa: N802 (the monitor's gRPC name)
        response = super().RegisterResource(request)
        self.ignored[response.urn] = list(request.ignoreChanges)
        if request.deleteBeforeReplace:
            self.delete_first.add(response.urn)
        return response


@dataclass
class Run:
    registrations: list[Registration]
    ignored: dict[str, list[str]]
    delete_first: set[str]

    def one(self, type_: str) -> Registration:
        (found,) = [r for r in self.registrations if r.type == type_]
        return found

    def release(self, chart: str) -> Registration:
        (found,) = [
            r for r in self.registrations if r.type == RELEASE and r.inputs["chart"] == chart
        ]
        return found

    def obj(self, type_: str) -> dict[str, Any]:
        return {k: v for k, v in self.one(type_).inputs.items() if not k.startswith("__")}


def run(cfg: StackConfig, kube: KubePlatformConfig) -> Run:
    cloud = KubeCloud(DEFAULT_OFFERS)
    monitor = ScalingRecorder(cloud)
    mock(cloud, monitor)

    @pulumi.runtime.test
    def program():
        doks, server = cluster_and_server(cfg, kube, hf_token=None)
        scaler = autoscaler.Autoscaler("vllm", kube, HOLD, server.servers, doks.provider)
        return scaler.scaled_object.id

    program()
    return Run(monitor.registrations, monitor.ignored, monitor.delete_first)


CASES = [(size, m) for size in ("gpu-h100x1-80gb", "gpu-l40sx1-48gb") for m in (0, 1)]


def deploy(case: tuple[str, int]) -> tuple[Run, KubePlatformConfig]:
    """One of CASES under the mocks (test_kube_autoscaler.py's `deployed` runs them too)."""
    size, min_nodes = case
    kube = platform(size, min_nodes)
    return run(stack(size), kube), kube


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-min{m}" for s, m in CASES])
def deployed(request: pytest.FixtureRequest) -> tuple[Run, KubePlatformConfig]:
    return deploy(request.param)


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


def leaves(
    values: dict[str, Any], defaults: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each key path we set, down to a value the chart takes whole (a scalar, or a map the
    chart's default leaves empty for the user to fill: nodeSelector)."""
    for key, value in values.items():
        if isinstance(value, dict) and value and not is_open(defaults, (*path, key)):
            yield from leaves(value, defaults, (*path, key))
        else:
            yield (*path, key), value


def default_at(defaults: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = defaults
    for key in path:
        if not isinstance(node, dict) or key not in node:
            raise KeyError(f"{'.'.join(path)}: not a value of the chart")
        node = node[key]
    return node


def is_open(defaults: dict[str, Any], path: tuple[str, ...]) -> bool:
    try:
        return default_at(defaults, path) == {}
    except KeyError:
        return False


def check_values(values: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Every value we set is one the chart has, of the type of its default (KEDA's chart ships
    no values.schema.json at its tag: its values.yaml is the contract)."""
    for path, value in leaves(values, defaults):
        default = default_at(defaults, path)
        if not isinstance(value, type(default)):
            raise TypeError(f"{'.'.join(path)}: {value!r} is not a {type(default).__name__}")


KEDA_DEFAULTS = yaml.safe_load((DATA / "chart-values.yaml").read_text())
PROMETHEUS_DEFAULTS = yaml.safe_load((PROMETHEUS_DATA / "chart-values.yaml").read_text())
PROMETHEUS_SCHEMA = json.loads((PROMETHEUS_DATA / "values.schema.json").read_text())


def check_prometheus_values(values: dict[str, Any]) -> None:
    """The chart's own values.schema.json, and its values.yaml's keys and types for all but
    scrapeConfigs, a map of jobs by name (the chart: "Further scrapeConfigs can be added as
    new keys")."""
    # Its `$schema` names no draft; draft 7 reads every keyword it uses.
    jsonschema.validate(values, PROMETHEUS_SCHEMA, cls=jsonschema.Draft7Validator)
    check_values({k: v for k, v in values.items() if k != "scrapeConfigs"}, PROMETHEUS_DEFAULTS)


def test_the_stored_contracts_are_the_pinned_releases() -> None:
    comment = json.loads((DATA / "scaledobject.schema.json").read_text())["$comment"]
    assert f"tag v{kube_spec.KEDA_VERSION}" in comment
    assert f"tag v{kube_spec.KEDA_VERSION}" in (DATA / "chart-values.yaml").read_text()
    first = (PROMETHEUS_DATA / "chart-values.yaml").read_text().splitlines()[0]
    assert f"tag prometheus-{scaling.PROMETHEUS_VERSION}" in first


# --- every image either chart runs, by digest (issue 43) ------------------------------------
# The image line of each container the pinned charts can run, as their templates write it, and
# when they run it: kedacore/charts v2.20.2 keda/templates/manager/deployment.yaml (and
# metrics-server/, webhooks/: `{{ $registry }}/{{ repository }}:{{ tag | default
# .Chart.AppVersion }}`, the registry from global.image.registry, else the image's own; the
# webhooks' Deployment only with webhooks.enabled); prometheus-community/helm-charts
# prometheus-29.27.0 charts/prometheus/templates/deploy.yaml (`repository@digest` when digest is
# set, else `repository:tag`, the server's tag defaulting to the chart's appVersion and
# `-distroless` when asked; the reloader only with configmapReload.prometheus.enabled), and its
# four dependencies, each with images of its own, only when enabled (Chart.yaml).
KEDA_APP_VERSION = "2.20.2"  # keda/Chart.yaml appVersion
PROMETHEUS_APP_VERSION = "v3.14.0"  # charts/prometheus/Chart.yaml appVersion
PROMETHEUS_DEPENDENCIES = ("alertmanager", "kube-state-metrics", "prometheus-node-exporter",
                           "prometheus-pushgateway")  # fmt: skip
PINNED = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def merged(defaults: Any, values: Any) -> Any:
    """Helm's values: ours over the chart's, maps merged key by key."""
    if isinstance(defaults, dict) and isinstance(values, dict):
        return {k: merged(defaults.get(k), values[k]) if k in values else defaults[k]
                for k in {**defaults, **values}}  # fmt: skip
    return copy.deepcopy(values)


def image_blocks(defaults: Any, path: tuple[str, ...] = ()) -> Iterator[str]:
    """The path of every image block in a chart's values (a map with a `repository`)."""
    if isinstance(defaults, dict):
        if "repository" in defaults:
            yield ".".join(path)
        for key, value in defaults.items():
            yield from image_blocks(value, (*path, str(key)))


def keda_images(values: dict[str, Any]) -> dict[str, str | None]:
    """Each image block's line in the rendered Deployments; None: its Deployment is off."""
    v = merged(KEDA_DEFAULTS, values)

    def line(block: dict[str, Any]) -> str:
        registry = v["global"]["image"]["registry"] or block["registry"] or ""
        ref = f"{block['repository']}:{block['tag'] or KEDA_APP_VERSION}"
        return f"{registry}/{ref}" if registry else ref

    images = v["image"]
    return {
        "image.keda": line(images["keda"]),
        "image.metricsApiServer": line(images["metricsApiServer"]),
        "image.webhooks": line(images["webhooks"]) if v["webhooks"]["enabled"] else None,
    }


def prometheus_images(values: dict[str, Any]) -> dict[str, str | None]:
    v = merged(PROMETHEUS_DEFAULTS, values)

    def line(block: dict[str, Any], default_tag: str = "") -> str:
        if block.get("digest"):
            return f"{block['repository']}@{block['digest']}"
        suffix = "-distroless" if block.get("distroless") else ""
        return f"{block['repository']}:{block['tag'] or default_tag}{suffix}"

    reload = v["configmapReload"]["prometheus"]
    return {
        "server.image": line(v["server"]["image"], PROMETHEUS_APP_VERSION),
        "configmapReload.prometheus.image": line(reload["image"]) if reload["enabled"] else None,
    }


def test_every_image_block_of_the_pinned_charts_is_one_the_check_renders() -> None:
    """A chart bump that adds an image block fails here until its line is rendered above."""
    assert set(image_blocks(KEDA_DEFAULTS)) == set(keda_images({}))
    assert set(image_blocks(PROMETHEUS_DEFAULTS)) == set(prometheus_images({}))
    # The images and tags spec/kube.py describes are the charts' own.
    assert kube_spec.KEDA_VERSION == KEDA_APP_VERSION
    assert {f"image.{k}": f"{KEDA_DEFAULTS['image'][k]['registry']}/"
            f"{KEDA_DEFAULTS['image'][k]['repository']}" for k in KEDA_DEFAULTS["image"]
            if k != "pullPolicy"} == {f"image.{k}": v for k, v in kube_spec.KEDA_IMAGES.items()}  # fmt: skip
    reload = PROMETHEUS_DEFAULTS["configmapReload"]["prometheus"]["image"]
    assert reload["repository"] == kube_spec.CONFIG_RELOADER_IMAGE
    assert reload["tag"] == kube_spec.CONFIG_RELOADER_TAG
    assert PROMETHEUS_DEFAULTS["server"]["image"]["repository"] == kube_spec.PROMETHEUS_IMAGE
    assert kube_spec.PROMETHEUS_APP_VERSION == PROMETHEUS_APP_VERSION
    # The renderings read the defaults as the templates do: a tag, at the pinned release.
    assert keda_images({})["image.keda"] == f"ghcr.io/kedacore/keda:{KEDA_APP_VERSION}"
    assert prometheus_images({})["server.image"] == (
        f"quay.io/prometheus/prometheus:{PROMETHEUS_APP_VERSION}"
    )


def test_every_image_either_chart_runs_is_pinned_by_digest(deployed) -> None:
    """Issue 43: KEDA's three Deployments and Prometheus' server and config reloader pulled by
    tag alone (a tag can move; the model server, edge and router are pinned by digest). Each
    image line the pinned templates render from the release's values is the chart's own
    image at its release, pinned by a digest; nothing else of either chart runs."""
    result, _ = deployed
    keda = keda_images(result.release("keda").inputs["values"])
    assert None not in keda.values(), "KEDA's admission webhooks run (its default)"
    for line in keda.values():
        assert PINNED.match(str(line)) and f":{KEDA_APP_VERSION}@" in str(line), line
    assert {str(line).split(":")[0] for line in keda.values()} == {
        "ghcr.io/kedacore/keda", "ghcr.io/kedacore/keda-metrics-apiserver",
        "ghcr.io/kedacore/keda-admission-webhooks",
    }  # fmt: skip
    values = result.release("prometheus").inputs["values"]
    prometheus = prometheus_images(values)
    assert None not in prometheus.values(), "the config reloader runs (its default)"
    for line in prometheus.values():
        assert PINNED.match(str(line)), line
    assert {str(line).split("@")[0] for line in prometheus.values()} == {
        "quay.io/prometheus/prometheus", "quay.io/prometheus-operator/prometheus-config-reloader"
    }  # fmt: skip
    # Nothing else: no dependency, no sidecar or init container of our own.
    everything = merged(PROMETHEUS_DEFAULTS, values)
    assert not any(everything[sub]["enabled"] for sub in PROMETHEUS_DEPENDENCIES)
    assert not everything["server"]["sidecarContainers"]
    assert not everything["server"]["extraInitContainers"]
    keda_values = merged(KEDA_DEFAULTS, result.release("keda").inputs["values"])
    assert not keda_values["operator"]["extraContainers"]
    assert not keda_values["operator"]["extraInitContainers"]
    assert not keda_values["extraObjects"]


def test_a_stack_may_override_each_image_digest() -> None:
    """The digests are sourced defaults (spec/kube.py; docs/facts.md): a stack's
    `kubernetes.scaling` replaces each one, and each release pulls exactly that."""
    digests = {field.alias: f"sha256:{n}" + "0" * 63
               for n, field in enumerate(ScalingConfig.model_fields.values(), 1)}  # fmt: skip
    assert set(digests) == {"kedaDigest", "kedaMetricsApiServerDigest", "kedaWebhooksDigest",
                            "prometheusDigest", "configReloaderDigest"}  # fmt: skip
    result = run(stack(), platform(scaling=digests))
    assert keda_images(result.release("keda").inputs["values"]) == {
        "image.keda": f"ghcr.io/kedacore/keda:2.20.2@{digests['kedaDigest']}",
        "image.metricsApiServer": "ghcr.io/kedacore/keda-metrics-apiserver:2.20.2@"
        + digests["kedaMetricsApiServerDigest"],
        "image.webhooks": "ghcr.io/kedacore/keda-admission-webhooks:2.20.2@"
        + digests["kedaWebhooksDigest"],
    }
    assert prometheus_images(result.release("prometheus").inputs["values"]) == {
        "server.image": f"quay.io/prometheus/prometheus@{digests['prometheusDigest']}",
        "configmapReload.prometheus.image": "quay.io/prometheus-operator/"
        f"prometheus-config-reloader@{digests['configReloaderDigest']}",
    }


VALUE_BREAKS = {
    "a key the chart lacks": {"nodeSelectors": {"a": "b"}},
    "a bool as text": {"crds": {"install": "yes"}},
    "a nested key the chart lacks": {"operator": {"replica": 2}},
}


@pytest.mark.parametrize("what", list(VALUE_BREAKS))
def test_the_values_check_refuses_what_the_chart_lacks(what: str) -> None:
    check_values(scaling.keda_values(platform()), KEDA_DEFAULTS)
    with pytest.raises((KeyError, TypeError)):
        check_values({**scaling.keda_values(platform()), **VALUE_BREAKS[what]}, KEDA_DEFAULTS)


PROMETHEUS_BREAKS = {
    "a key the chart lacks": {"servers": {"retention": "1d"}},
    "a bool as text": {"alertmanager": {"enabled": "no"}},
    "a scrape interval as a number": {"server": {"global": {"scrape_interval": 15}}},
}


@pytest.mark.parametrize("what", list(PROMETHEUS_BREAKS))
def test_the_prometheus_values_check_refuses_a_broken_copy(what: str) -> None:
    values = scaling.prometheus_values(platform())
    check_prometheus_values(values)
    with pytest.raises((KeyError, TypeError, jsonschema.ValidationError)):
        check_prometheus_values({**values, **PROMETHEUS_BREAKS[what]})


def test_the_scaled_object_is_valid_for_the_pinned_crd(deployed) -> None:
    result, kube = deployed
    declared = result.obj(SCALED_OBJECT)
    assert declared["spec"] == scaling.scaled_object(kube, HOLD)["spec"]
    validate_custom(declared)


def broken_scaled_objects() -> dict[str, dict[str, Any]]:
    good = scaling.scaled_object(platform(), HOLD)
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
    bad = copy.deepcopy(good)
    bad["spec"]["triggers"][0]["metadata"]["ignoreNullValues"] = True
    out["a trigger's value not text"] = bad
    return out


@pytest.mark.parametrize("what", list(broken_scaled_objects()))
def test_the_crd_check_refuses_a_broken_scaled_object(what: str) -> None:
    """So that a pass above means something."""
    validate_custom(scaling.scaled_object(platform(), HOLD))
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(broken_scaled_objects()[what])


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
    # llm-d's KEDA guide's cadence and damping (docs/facts.md); the last server's cooldown
    # never shorter than the router's hold, so a wake whose clients left is not undone halfway.
    assert spec["pollingInterval"] == 15
    assert spec["cooldownPeriod"] == HOLD > 300
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert {w["stabilizationWindowSeconds"] for w in behavior.values()} == {300}


def test_the_triggers_ask_the_charts_server_for_the_jobs_it_scrapes(deployed) -> None:
    result, _ = deployed
    triggers = {t["name"]: t for t in result.obj(SCALED_OBJECT)["spec"]["triggers"]}
    assert list(triggers) == ["router-queue", "router-running", "vllm-waiting"]
    meta = {name: t["metadata"] for name, t in triggers.items()}
    assert all(t["type"] == "prometheus" and t["metricType"] == "AverageValue"
               for t in triggers.values())  # fmt: skip
    # Anything queued in the router wakes a sleeping model; targets per server; no series is 0.
    assert meta["router-queue"]["activationThreshold"] == "0"
    assert [m["threshold"] for m in meta.values()] == ["1", "16", "1"]
    assert {m["ignoreNullValues"] for m in meta.values()} == {"true"}
    assert [m["query"] for m in meta.values()] == [
        'sum(llm_d_epp_flow_control_queue_size{job="llm-d-router"})',
        'sum(llm_d_epp_request_running{job="llm-d-router"})',
        'sum(vllm:num_requests_waiting{job="vllm"})',
    ]
    # The server the Prometheus release makes: `<release>-server` (its name holds the chart's),
    # in the release's namespace, on the chart's service port.
    prometheus = result.release("prometheus").inputs
    assert prometheus["name"] == "prometheus"
    port = PROMETHEUS_DEFAULTS["server"]["service"]["servicePort"]
    url = urlsplit(meta["router-queue"]["serverAddress"])
    assert (url.scheme, url.hostname, url.port) == (
        "http",
        f"prometheus-server.{prometheus['namespace']}.svc",
        port,
    )
    assert {m["serverAddress"] for m in meta.values()} == {meta["router-queue"]["serverAddress"]}
    jobs = prometheus["values"]["scrapeConfigs"]
    # The router's page: its Service and metrics port, with the server's own account token.
    router = jobs["llm-d-router"]
    assert router["static_configs"] == [{"targets": [f"router-epp.{catalog.PROJECT}.svc:9090"]}]
    assert router["authorization"] == {
        "credentials_file": "/var/run/secrets/kubernetes.io/serviceaccount/token"
    }
    # vLLM's page on every ready server: the model Service's endpoints, its named port.
    svc = next(r for r in result.registrations if r.type == "kubernetes:core/v1:Service").inputs
    vllm = jobs["vllm"]
    assert vllm["kubernetes_sd_configs"] == [
        {"role": "endpointslice", "namespaces": {"names": [svc["metadata"]["namespace"]]}}
    ]
    keep = {r["source_labels"][0]: r["regex"] for r in vllm["relabel_configs"]}
    assert all(r["action"] == "keep" for r in vllm["relabel_configs"])
    (svc_port,) = svc["spec"]["ports"]
    assert keep == {
        "__meta_kubernetes_service_name": svc["metadata"]["name"],
        "__meta_kubernetes_endpointslice_port_name": svc_port["name"],
    }


def test_pulumi_leaves_the_count_to_keda(deployed) -> None:
    """The StatefulSet is created at `min` (no GPU bills at min 0 before a request), and from
    then on Pulumi ignores `spec.replicas` (pulumi-kubernetes drops an ignored field another
    manager owns from its server-side apply patch, else sends the live value: docs/facts.md)."""
    result, kube = deployed
    servers = result.one(STATEFUL_SET)
    assert servers.inputs["spec"]["replicas"] == kube.replicas.min
    assert result.ignored[servers.urn] == ["spec.replicas"]
    # Nothing else of ours is ignored but the cluster's version, which auto_upgrade moves
    # after creation (cluster.py): every other field stays Pulumi's.
    cluster = result.one("digitalocean:index/kubernetesCluster:KubernetesCluster")
    assert {u: f for u, f in result.ignored.items() if f} == {
        servers.urn: ["spec.replicas"], cluster.urn: ["version"],
    }  # fmt: skip
    # A new GPU size replaces the pool under the same name: the old one goes first (never two
    # GPU pools billing, nor a name taken), and nothing else is replaced that way.
    pool = result.one("digitalocean:index/kubernetesNodePool:KubernetesNodePool")
    assert result.delete_first == {pool.urn}


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
