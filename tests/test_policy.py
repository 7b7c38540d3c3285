"""The policy pack's rules on resources that pass and resources that violate, and on the
program's own resources for both shipped stacks."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from pulumi_harness import ROOT, run_program, stack_config
from pulumi_policy import (
    EnforcementLevel,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

sys.path.insert(0, str(ROOT / "policy"))
_spec = importlib.util.spec_from_file_location("policy_pack", ROOT / "policy" / "__main__.py")
assert _spec and _spec.loader
pack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pack)  # the guard keeps it from serving
size_outside_budget = pack.rules.size_outside_budget
POLICIES: dict[str, ResourceValidationPolicy] = {
    p.name: p for p in pack.POLICIES if isinstance(p, ResourceValidationPolicy)
}
STACK_POLICIES: dict[str, StackValidationPolicy] = {
    p.name: p for p in pack.POLICIES if isinstance(p, StackValidationPolicy)
}
CONFIG = json.loads((ROOT / "policy" / "config.json").read_text())

DROPLET = "digitalocean:index/droplet:Droplet"
FIREWALL = "digitalocean:index/firewall:Firewall"


def urn(stack: str, type_: str) -> str:
    return f"urn:pulumi:{stack}::nemotron-droplet::{type_}::gpu"


def check(policy: str, type_: str, props: dict[str, Any], resource_urn: str) -> list[str]:
    """Run one policy of the real pack on one resource; return what it reported."""
    found: list[str] = []
    args = ResourceValidationArgs(
        type_,
        props,
        resource_urn,
        "gpu",
        None,
        None,  # type: ignore[arg-type]
        config=CONFIG.get(policy, {}),
    )
    validate = POLICIES[policy].validate
    for fn in validate if isinstance(validate, list) else [validate]:
        fn(args, lambda message, _urn=None: found.append(message))
    return found


def violations(policy: str, type_: str, props: dict[str, Any], stack: str = "dev") -> list[str]:
    return check(policy, type_, props, urn(stack, type_))


def rule(port: str, sources: list[str]) -> dict[str, Any]:
    return {"protocol": "tcp", "portRange": port, "sourceAddresses": sources}


def check_stack(policy: str, run: Any) -> list[str]:
    """Run one stack policy of the real pack on everything a run declared."""
    found: list[str] = []
    resources = [
        SimpleNamespace(resource_type=r.type, props=r.inputs, urn=r.urn) for r in run.registrations
    ]
    args = StackValidationArgs(resources, config=CONFIG.get(policy, {}))  # type: ignore[arg-type]
    validate = STACK_POLICIES[policy].validate
    assert validate is not None
    validate(args, lambda message, _urn=None: found.append(message))
    return found


def test_enforcement_levels() -> None:
    levels = {p.name: p.enforcement_level for p in pack.POLICIES}
    assert levels == {
        "no-public-vllm-port": EnforcementLevel.MANDATORY,
        "droplet-project-and-stack-tags": EnforcementLevel.MANDATORY,
        "droplet-size-within-budget": EnforcementLevel.MANDATORY,
        "stack-within-budget": EnforcementLevel.MANDATORY,
        "prod-access-not-open-to-anywhere": EnforcementLevel.ADVISORY,
    }


@pytest.mark.parametrize(
    ("rules", "bad"),
    [
        ([rule("22", ["0.0.0.0/0"]), rule("443", ["0.0.0.0/0"])], False),
        ([rule("8000", ["10.0.0.0/8"])], True),
        ([rule("7000-9000", ["0.0.0.0/0"])], True),
        ([{"protocol": "tcp", "portRange": "all", "sourceAddresses": ["0.0.0.0/0"]}], True),
        ([{"protocol": "udp", "portRange": "8000", "sourceAddresses": ["0.0.0.0/0"]}], False),
    ],
)
def test_no_public_vllm_port(rules: list[dict[str, Any]], bad: bool) -> None:
    found = violations("no-public-vllm-port", FIREWALL, {"inboundRules": rules})
    assert bool(found) is bad, found
    if bad:
        assert "vLLM's internal port 8000" in found[0]


def test_droplet_tags() -> None:
    assert (
        violations(
            "droplet-project-and-stack-tags",
            DROPLET,
            {"tags": ["nemotron-droplet", "stack:dev", "env:dev"]},
        )
        == []
    )
    found = violations(
        "droplet-project-and-stack-tags",
        DROPLET,
        {"tags": ["nemotron-droplet", "stack:prod"]},
        stack="dev",
    )
    assert found == [
        "droplet lacks the tag(s) ['stack:dev']; every droplet carries "
        "['nemotron-droplet', 'stack:dev']"
    ]


@pytest.mark.parametrize(
    ("size", "problem"),
    [
        ("gpu-h100x1-80gb", None),
        ("gpu-h100x8-640gb", "is not in the allowlist"),
        ("gpu-h200x1-141gb", "is not in the allowlist"),
    ],
)
def test_size_allowlist_and_price_ceiling(size: str, problem: str | None) -> None:
    found = violations("droplet-size-within-budget", DROPLET, {"size": size})
    assert (found == []) if problem is None else any(problem in f for f in found), found


def test_a_stack_may_have_its_own_budget() -> None:
    """super's budget admits eight H100s; the same size in dev is still refused."""
    assert (
        violations("droplet-size-within-budget", DROPLET, {"size": "gpu-h100x8-640gb"}, "super")
        == []
    )
    assert violations(
        "droplet-size-within-budget", DROPLET, {"size": "gpu-h100x1-80gb"}, "super"
    ) == [
        "size gpu-h100x1-80gb is not in the allowlist ['gpu-h100x8-640gb'] (policy/config.json: "
        'allowedSizes, or its entry under "stacks" for this stack alone)'
    ]
    dev = violations("droplet-size-within-budget", DROPLET, {"size": "gpu-h100x8-640gb"}, "dev")
    assert any("is not in the allowlist" in f for f in dev), dev


def test_price_ceiling_alone() -> None:
    assert size_outside_budget(
        {"size": "gpu-h100x8-640gb"},
        {"allowedSizes": ["gpu-h100x8-640gb"], "maxHourlyPriceUsd": 10},
    ) == [
        "size gpu-h100x8-640gb lists at $23.92/h, above the ceiling $10/h (policy/config.json: "
        'maxHourlyPriceUsd, or its entry under "stacks" for this stack alone)'
    ]
    assert size_outside_budget(
        {"size": "gpu-h200x1-141gb"},
        {"allowedSizes": ["gpu-h200x1-141gb"], "maxHourlyPriceUsd": 10},
    ) == ["size gpu-h200x1-141gb has no known list price to compare with $10/h"]


def test_port_80_beside_https_is_the_acme_port_not_the_api() -> None:
    acme = {"inboundRules": [rule("443", ["203.0.113.0/24"]), rule("80", ["0.0.0.0/0"])]}
    assert violations("prod-access-not-open-to-anywhere", FIREWALL, acme, stack="prod") == []
    plain = {"inboundRules": [rule("80", ["0.0.0.0/0"])]}
    assert violations("prod-access-not-open-to-anywhere", FIREWALL, plain, stack="prod") != []


def test_open_access_is_advised_against_only_in_prod() -> None:
    props = {"inboundRules": [rule("22", ["0.0.0.0/0", "::/0"]), rule("443", ["203.0.113.0/24"])]}
    assert violations("prod-access-not-open-to-anywhere", FIREWALL, props, stack="dev") == []
    found = violations("prod-access-not-open-to-anywhere", FIREWALL, props, stack="prod")
    assert found == [
        "port 22 is open to anywhere (0.0.0.0/0, ::/0) in prod; narrow "
        "access.sshCidrs / access.apiCidrs"
    ]


@pytest.mark.parametrize(
    ("stack", "replicas"), [("dev", 1), ("prod", 1), ("super", 1), ("dev", 3), ("prod", 2)]
)
def test_the_programs_own_resources_pass_every_mandatory_policy(stack: str, replicas: int) -> None:
    run = run_program({**stack_config(stack), "replicas": replicas}, stack=stack)
    assert run.error is None
    assert check_stack("stack-within-budget", run) == []
    for reg in run.registrations:
        for name, policy in POLICIES.items():
            if policy.enforcement_level != EnforcementLevel.MANDATORY:
                continue
            found = check(name, reg.type, reg.inputs, reg.urn)
            assert found == [], (stack, reg.type, name, found)


def test_the_shipped_prod_stack_is_advised_to_narrow_its_access() -> None:
    """prod ships open to anywhere so that its first `pulumi up` works (a placeholder range
    would be refused, rightly); the advisory policy is what asks for the user's own ranges."""
    run = run_program(stack_config("prod"), stack="prod")
    firewall = run.one("digitalocean:index/firewall:Firewall")
    found = check("prod-access-not-open-to-anywhere", firewall.type, firewall.inputs, firewall.urn)
    assert [f.split(" is ")[0] for f in found] == ["port 22", "port 443"]


def test_a_set_over_its_stacks_ceiling_is_refused_and_the_balancer_size_is_allowlisted() -> None:
    run = run_program({**stack_config("prod"), "replicas": 5}, stack="prod")
    assert run.error is None
    assert check_stack("stack-within-budget", run) == [
        "the stack lists at $16.95/h (5 GPU Droplet(s) and the balancer), above the ceiling "
        "$16.0/h: fewer replicas, a smaller size, or a larger maxTotalHourlyPriceUsd in "
        "policy/config.json"
    ]
    assert violations("droplet-size-within-budget", DROPLET, {"size": "s-1vcpu-1gb"}) == []
    assert violations("droplet-size-within-budget", DROPLET, {"size": "c-32"}) == [
        "size c-32 is not in the balancer's allowlist ['s-1vcpu-1gb', 's-1vcpu-2gb', "
        "'s-2vcpu-2gb'] (policy/config.json: allowedBalancerSizes, or its entry under \"stacks\" "
        "for this stack alone)"
    ]


def _kube_run(max_nodes: int) -> Any:
    """The Kubernetes example (test_plan_snapshot's) with its GPU pool's ceiling at max_nodes."""
    from test_kube_edge import EdgeCloud  # noqa: PLC0415 (the Kubernetes fakes, here alone)
    from test_plan_snapshot import STACKS  # noqa: PLC0415

    config, secrets, _ = STACKS["kube-h100-min0"]
    kube = config["kubernetes"]
    config = {**config, "kubernetes": {**kube, "gpuPool": {**kube["gpuPool"],
                                                           "maxNodes": max_nodes}}}  # fmt: skip
    run = run_program(config, secrets=secrets, cloud_type=EdgeCloud, stack="kube")
    assert run.error is None, run.error
    return run


def test_a_kubernetes_gpu_pool_is_held_to_the_sizes_and_the_stacks_ceiling() -> None:
    """A GPU pool's nodes are Droplets of its size: the allowlist and the per-size ceiling apply
    to it, and the stack's ceiling counts the most nodes its autoscaler may add."""
    run = _kube_run(2)
    assert check_stack("stack-within-budget", run) == []
    for reg in run.registrations:
        for name, policy in POLICIES.items():
            if policy.enforcement_level == EnforcementLevel.MANDATORY:
                assert check(name, reg.type, reg.inputs, reg.urn) == [], (reg.type, name)
    assert check_stack("stack-within-budget", _kube_run(5)) == [
        "the stack lists at $16.95/h (5 GPU node(s), the most the cluster autoscaler may add), "
        "above the ceiling $16.0/h: a lower kubernetes.gpuPool.maxNodes, a smaller size, or a "
        "larger maxTotalHourlyPriceUsd in policy/config.json"
    ]
    pool = "digitalocean:index/kubernetesNodePool:KubernetesNodePool"
    assert violations("droplet-size-within-budget", pool, {"size": "gpu-h100x8-640gb"}) == [
        "size gpu-h100x8-640gb is not in the allowlist ['gpu-4000adax1-20gb', "
        "'gpu-6000adax1-48gb', 'gpu-l40sx1-48gb', 'gpu-h100x1-80gb'] (policy/config.json: "
        'allowedSizes, or its entry under "stacks" for this stack alone)',
        "size gpu-h100x8-640gb lists at $23.92/h, above the ceiling $4.0/h "
        '(policy/config.json: maxHourlyPriceUsd, or its entry under "stacks" for this stack '
        "alone)",
    ]
