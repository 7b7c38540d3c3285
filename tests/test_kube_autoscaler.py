"""components/cloud/kube/autoscaler.py under Pulumi's mocks: what the Autoscaler declares. KEDA
and Prometheus as pinned Helm Releases (chart, version, repository, namespace, rolled back when
they fail) with scaling.py's values, checked against each chart's own; the ScaledObject waits
for both releases and for the model's servers. What the values and the ScaledObject say, and
the contracts they are checked against: test_kube_scaling.py (scaling.py's), whose run of the
program under the mocks this file shares."""

from __future__ import annotations

import pytest
from test_kube_scaling import (
    CASES,
    KEDA_DEFAULTS,
    PROMETHEUS_DEFAULTS,
    SCALED_OBJECT,
    STATEFUL_SET,
    Run,
    check_prometheus_values,
    check_values,
    deploy,
)

from components.cloud.kube import manifests, scaling
from components.spec import catalog
from components.spec.kube import KubePlatformConfig


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-min{m}" for s, m in CASES])
def deployed(request: pytest.FixtureRequest) -> tuple[Run, KubePlatformConfig]:
    """autoscaler.Autoscaler declared with the model's servers, one case of CASES each."""
    return deploy(request.param)


def test_keda_is_the_pinned_chart_with_checked_values(deployed) -> None:
    result, kube = deployed
    release = result.release("keda")
    assert release.inputs["version"] == "2.20.2"
    assert release.inputs["repositoryOpts"] == {"repo": "https://kedacore.github.io/charts"}
    assert release.inputs["namespace"] == "keda" and release.inputs["createNamespace"] is True
    assert release.inputs["atomic"] is True
    values = release.inputs["values"]
    assert values == scaling.keda_values(kube)
    check_values(values, KEDA_DEFAULTS)
    # On the always-on CPU pool (the label cluster.py puts on it), never on a GPU node.
    assert values["nodeSelector"] == {manifests.GPU_POOL_LABEL: "cpu"}
    assert values["watchNamespace"] == catalog.PROJECT


def test_prometheus_is_the_pinned_server_alone_scraping_two_jobs(deployed) -> None:
    result, kube = deployed
    release = result.release("prometheus")
    assert release.inputs["version"] == "29.27.0"
    assert release.inputs["repositoryOpts"] == {
        "repo": "https://prometheus-community.github.io/helm-charts"
    }
    assert release.inputs["namespace"] == "monitoring" and release.inputs["atomic"] is True
    values = release.inputs["values"]
    assert values == scaling.prometheus_values(kube)
    check_prometheus_values(values)
    for sub in ("alertmanager", "kube-state-metrics", "prometheus-node-exporter",
                "prometheus-pushgateway"):  # fmt: skip
        assert values[sub] == {"enabled": False}, sub
    assert values["server"]["nodeSelector"] == {manifests.GPU_POOL_LABEL: "cpu"}
    # Every job the chart scrapes by default is off (a new default in a chart bump fails
    # here): only the router's page and the model servers' are read.
    jobs = values["scrapeConfigs"]
    assert set(PROMETHEUS_DEFAULTS["scrapeConfigs"]) <= set(jobs)
    enabled = {name for name, job in jobs.items() if job.get("enabled", True)}
    assert enabled == {"llm-d-router", "vllm"}
    # Scraped as often as KEDA polls.
    assert values["server"]["global"]["scrape_interval"] == "15s"


def test_the_scaled_object_waits_for_keda_prometheus_and_the_servers(deployed) -> None:
    result, _ = deployed
    deps = result.one(SCALED_OBJECT).dependencies
    for dep in (result.release("keda"), result.release("prometheus"), result.one(STATEFUL_SET)):
        assert dep.urn in deps, dep.name
