"""The CPU pool holds what runs on it (components/cloud/kube/capacity.py): KEDA's and Prometheus'
requests are their charts' defaults, the default pool holds every pod of the platform, a pool too
small is refused naming the field, and the router chart's own requests would not fit (why the
router's are ours). The charts' stored values are test_kube_router.py's and test_kube_scaling.py's."""

from __future__ import annotations

import pytest
import yaml
from pulumi_harness import ROOT
from test_kube import platform
from test_kube_router import DEFAULTS
from test_kube_scaling import default_at

from components.cloud.kube import capacity, router_values, scaling


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
