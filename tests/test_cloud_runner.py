"""The machine that runs `pulumi up` must reach the Droplets over SSH (components/cloud/runner.py):
an up on a GitHub-hosted runner that `access.sshCidrs` would not admit is refused before
anything; a preview, a laptop or a self-hosted runner never is; a larger runner's static range
must be in the list, and deploy.yml hands that range to the program."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest
import yaml
from pulumi_harness import (
    ROOT,
    run_program,
    stack_config,
)
from test_droplet import DROPLET

from components.cloud import runner
from components.spec.config import ConfigError

HOSTED = {"GITHUB_ACTIONS": "true", "RUNNER_ENVIRONMENT": "github-hosted"}


NARROW = ["8.8.8.0/24"]  # a range someone connects from: not the runner's


def prod_with_ssh(ssh_cidrs: list[str]) -> dict[str, Any]:
    config = stack_config("prod")
    return {**config, "access": {**config["access"], "sshCidrs": ssh_cidrs}}


def test_an_up_on_a_hosted_runner_that_ssh_would_not_admit_is_refused_before_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prod stack's old advice (narrow sshCidrs to CI egress ranges) broke every wake and
    push: a hosted runner's address is none a user can list. Refused at once, naming the field
    and what works, instead of an SSH dial that times out."""
    for name, value in HOSTED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(runner.EGRESS_ENV, raising=False)
    result = run_program(prod_with_ssh(NARROW), stack="prod")
    assert isinstance(result.error, ConfigError), result.error
    message = str(result.error)
    assert "access.sshCidrs: ['8.8.8.0/24'] does not admit this GitHub-hosted runner" in message
    assert '["0.0.0.0/0", "::/0"]' in message and runner.EGRESS_ENV in message
    assert not [r for r in result.registrations if r.type == DROPLET]
    # The shipped prod stack (anywhere) is deployed from the same runner.
    assert run_program(stack_config("prod"), stack="prod").error is None


def test_a_preview_a_laptop_or_a_self_hosted_runner_is_never_refused_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(runner.EGRESS_ENV, raising=False)
    for env in ({}, {"GITHUB_ACTIONS": "true", "RUNNER_ENVIRONMENT": "self-hosted"}):
        monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
        monkeypatch.delenv("RUNNER_ENVIRONMENT", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert run_program(prod_with_ssh(NARROW), stack="prod").error is None, env
    for name, value in HOSTED.items():
        monkeypatch.setenv(name, value)
    # preview.yml previews every stack on hosted runners: a preview connects to nothing.
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: True)
    assert run_program(prod_with_ssh(NARROW), stack="prod").error is None


@pytest.mark.parametrize(
    ("egress", "problem"),
    [
        ("8.8.8.16/28", None),
        ("8.8.8.0/24 2001:4860::/32", "does not cover 2001:4860::/32 of RUNNER_EGRESS_CIDRS"),
        ("8.8.9.0/28", "does not cover 8.8.9.0/28 of RUNNER_EGRESS_CIDRS"),
        ("a lot", "RUNNER_EGRESS_CIDRS (a repository variable): 'a' does not appear"),
    ],
)
def test_a_larger_runner_with_a_static_range_needs_that_range_in_the_list(
    egress: str, problem: str | None
) -> None:
    found = runner.ssh_problem(NARROW, {**HOSTED, runner.EGRESS_ENV: egress})
    assert found == problem if problem is None else problem in str(found), found


def test_deploy_yml_hands_the_runners_static_range_to_the_program() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    # Every pulumi/actions step (a Kubernetes destroy's refresh before it too: one env).
    steps = [s for s in wf["jobs"]["deploy"]["steps"] if "pulumi/actions@" in str(s.get("uses"))]
    assert steps
    for pulumi_step in steps:
        assert pulumi_step["env"][runner.EGRESS_ENV] == "${{ vars.RUNNER_EGRESS_CIDRS }}"
