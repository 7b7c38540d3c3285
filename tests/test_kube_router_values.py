"""llm-d's router's values (components/cloud/kube/router_values.py, plain dicts): the EPP's config
against the pinned release's config types (strict, as the EPP loads it), broken copies refused;
the hold limit from the wake budget and below the chart's Envoy limit; the EPP's metrics role
against the cluster's schema; the docs' hold limit. The release that carries them, its chart
and the deployment under Pulumi's mocks are test_kube_router.py's."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pulumi_harness import ROOT
from test_kube import kubernetes_object, stack
from test_kube_router import BINDING, DATA, DEFAULTS, RELEASE, ROLE, Run, deployed

from components.cloud.kube import router_values
from components.spec import catalog
from components.spec.kube import KUBERNETES_SCHEMA_VERSION

__all__ = ["deployed"]  # the fixture, used by name


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


def test_the_docs_state_the_hold_limit() -> None:
    """docs/kubernetes.md states the prod model's hold limit as the code computes it."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    assert f"{router_values.hold_seconds(stack())} s" in text
