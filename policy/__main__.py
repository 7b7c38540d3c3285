"""nemotron-droplet policy pack: `pulumi preview --policy-pack policy` runs it."""

import rules
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)


def _report(messages: list[str], report_violation: ReportViolation) -> None:
    for message in messages:
        report_violation(message, None)


def _no_vllm_port(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type == rules.FIREWALL:
        _report(rules.vllm_port_exposed(args.props), report)


def _tags(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type == rules.DROPLET:
        _report(rules.missing_tags(args.props, args.urn), report)


def _size(args: ResourceValidationArgs, report: ReportViolation) -> None:
    # A Kubernetes GPU pool's nodes are Droplets of its size: the same allowlist and ceiling.
    if args.resource_type in (rules.DROPLET, rules.NODE_POOL):
        budget = rules.budget_for(args.get_config(), args.urn)
        _report(rules.size_outside_budget(args.props, budget), report)


def _set_budget(args: StackValidationArgs, report: ReportViolation) -> None:
    resources = [(r.resource_type, r.props) for r in args.resources]
    urns = [r.urn for r in args.resources]
    config = args.get_config()
    budget = rules.budget_for(config, urns[0]) if urns else config
    _report(rules.set_outside_budget(resources, budget), report)


def _prod_access(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type == rules.FIREWALL:
        _report(rules.open_to_anywhere_in_prod(args.props, args.urn), report)


POLICIES = [
    ResourceValidationPolicy(
        name="no-public-vllm-port",
        description="No firewall rule may admit traffic to vLLM's internal port.",
        validate=_no_vllm_port,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
    ResourceValidationPolicy(
        name="droplet-project-and-stack-tags",
        description="Every droplet carries the project tag and its stack's tag.",
        validate=_tags,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
    ResourceValidationPolicy(
        name="droplet-size-within-budget",
        description="A droplet's size is allowlisted and lists at or under the hourly ceiling.",
        validate=_size,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema(
            properties={
                "allowedSizes": {"type": "array", "items": {"type": "string"}},
                "maxHourlyPriceUsd": {"type": "number"},
                # The Caddy balancer's CPU Droplet (replicas >= 2).
                "allowedBalancerSizes": {"type": "array", "items": {"type": "string"}},
                # A stack's own budget (allowedSizes, maxHourlyPriceUsd) over the default.
                "stacks": {"type": "object"},
            }
        ),
    ),
    StackValidationPolicy(
        name="stack-within-budget",
        description="Every replica and the balancer together list at or under the ceiling.",
        validate=_set_budget,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema(
            properties={
                "maxTotalHourlyPriceUsd": {"type": "number"},
                "stacks": {"type": "object"},
            }
        ),
    ),
    ResourceValidationPolicy(
        name="prod-access-not-open-to-anywhere",
        description="In the prod stack, SSH and the API should not be open to anywhere.",
        validate=_prod_access,
        enforcement_level=EnforcementLevel.ADVISORY,
    ),
]

if __name__ == "__main__":
    PolicyPack(name="nemotron-droplet-policy", policies=POLICIES)
