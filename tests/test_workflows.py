"""The GitHub workflows: actionlint (with shellcheck on run: blocks) and the properties we rely on."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi_harness import ROOT
from test_runner import Expr

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def actionlint(*files: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("actionlint", path=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    assert exe, "actionlint is installed by requirements-dev.txt"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}  # shellcheck too
    return subprocess.run(
        [exe, *map(str, files)], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    return data


# A Kubernetes stack's refresh and destroy run the program (docs/kubernetes.md, "Day 2"): the
# CLI's own switch, set from the stack file's platform, and a CLI whose `up --refresh` honours it.
RUN_PROGRAM = "${{ steps.platform.outputs.platform == 'kubernetes' }}"
PULUMI_VERSION = "^3.172.0"
KUBE_REFRESH = "Refresh a Kubernetes stack through its program before its destroy"


def platform_step(steps: list[dict[str, Any]]) -> dict[str, Any]:
    [step] = [s for s in steps if s.get("id") == "platform"]
    return step


def deploy_step(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """deploy.yml's `pulumi up` or `destroy`: the pulumi/actions step without a name."""
    [step] = [s for s in steps if "pulumi/actions@" in str(s.get("uses")) and "name" not in s]
    return step


def evaluate(text: Any, platform: str, command: str) -> Any:
    """A step's `if:` or input as GitHub evaluates it, for a stack of `platform` and a dispatch
    of `command` ('' for a push)."""
    cond = str(text).strip()
    cond = cond[3:-2] if cond.startswith("${{") else cond
    ctx = {"inputs": {"command": command} if command else {},
           "steps": {"platform": {"outputs": {"platform": platform}}}}  # fmt: skip
    return Expr(cond, ctx).value()


def test_actionlint_passes_on_every_workflow() -> None:
    names = ["deploy.yml", "lease.yml", "preview.yml", "real-run.yml", "stack-long.yml"]
    assert [w.name for w in WORKFLOWS] == names
    proc = actionlint(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("break_it", "complaint"),
    [
        (
            lambda s: s.replace("matrix.stack }}", "matrix.stak }}"),
            'property "stak" is not defined',
        ),
        (
            lambda s: s.replace("backend: ${{ vars", "backnd: ${{ vars"),
            'input "backnd" is not defined',
        ),
        (lambda s: s.replace('echo "names=$names"', "echo names=$names"), "SC2086"),
    ],
)
def test_actionlint_catches_a_broken_workflow(
    tmp_path: Path, break_it: Any, complaint: str
) -> None:
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    # actionlint resolves local actions from the repository root it finds.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    broken = tmp_path / ".github" / "workflows" / "preview.yml"
    text = broken.read_text()
    broken.write_text(break_it(text))
    assert broken.read_text() != text
    proc = actionlint(broken, cwd=tmp_path)
    assert proc.returncode == 1
    assert complaint in proc.stdout


# The jobs whose GITHUB_TOKEN may do more than read the code, and exactly what more: preview
# comments on its pull request; deploy.yml's `tested` lists the workflow's runs for the commit
# and their jobs (scripts/ci/tested.py), which is `actions: read`, nothing that writes.
EXTRA_PERMISSIONS = {
    ("preview.yml", "preview"): {"contents": "read", "pull-requests": "write"},
    ("deploy.yml", "tested"): {"contents": "read", "actions": "read"},
    # lease.py --keepalive renews lease.yml's own schedule: PUT .../enable.
    ("lease.yml", "lease"): {"contents": "read", "actions": "write"},
}


def test_least_privilege_permissions() -> None:
    for name in (w.name for w in WORKFLOWS):
        wf = load(name)
        assert wf["permissions"] == {"contents": "read"}, name
        for job_name, job in wf["jobs"].items():
            extra = job.get("permissions", {})
            assert extra in ({}, EXTRA_PERMISSIONS.get((name, job_name))), (name, job_name, extra)
    for (name, job_name), wanted in EXTRA_PERMISSIONS.items():
        assert load(name)["jobs"][job_name]["permissions"] == wanted, (name, job_name)


def test_preview_runs_for_each_stack_with_the_policy_pack_and_comments() -> None:
    wf = load("preview.yml")
    assert wf[True] == {"pull_request": {"branches": ["main"]}}  # YAML reads `on:` as True
    assert wf["concurrency"]["group"] == "preview-${{ github.event.pull_request.number }}"
    job = wf["jobs"]["preview"]
    assert job["needs"] == ["test", "stacks"]
    assert job["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.stacks.outputs.names) }}"
    [pulumi] = [s for s in job["steps"] if str(s.get("uses", "")).startswith("pulumi/actions@")]
    assert pulumi["uses"] == "pulumi/actions@v7"
    assert pulumi["with"]["command"] == "preview"
    assert pulumi["with"]["comment-on-pr"] is True
    assert pulumi["with"]["policyPacks"] == "policy"
    test_steps = wf["jobs"]["test"]["steps"]
    assert any(s.get("run") == "scripts/ci/check-on-runner.sh" for s in test_steps)
    assert "if" not in wf["jobs"]["test"]  # a pull request's merge commit is always tested
    assert pulumi["with"]["refresh"] is True
    # A Kubernetes stack's refresh runs the program (its kubeconfig expires after 7 days).
    platform = job["steps"].index(platform_step(job["steps"]))
    assert platform < job["steps"].index(pulumi)
    assert pulumi["env"]["PULUMI_RUN_PROGRAM"] == RUN_PROGRAM
    assert pulumi["with"]["pulumi-version"] == PULUMI_VERSION


def test_deploy_offers_exactly_the_shipped_stacks_and_gates_them_by_environment() -> None:
    wf = load("deploy.yml")
    shipped = sorted(p.name.split(".")[1] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
    inputs = wf[True]["workflow_dispatch"]["inputs"]
    assert sorted(inputs["stack"]["options"]) == shipped
    assert inputs["command"]["options"] == ["up", "destroy"]
    # A wake from the front dispatches inputs deploy.yml must declare, or GitHub refuses the
    # dispatch (422): tests/test_wake.py's fake GitHub reads them from this file and refuses so.
    assert inputs["refresh"]["type"] == "boolean" and inputs["refresh"]["default"] is False
    pulumi = deploy_step(wf["jobs"]["deploy"]["steps"])
    # Every run of a Droplet stack refreshes (a push after autodown too), whatever `refresh` the
    # dispatch sent.
    for command in ("", "up", "destroy"):
        assert evaluate(pulumi["with"]["refresh"], "droplet", command) is True
    assert wf[True]["push"] == {"branches": ["main"]}
    job = wf["jobs"]["deploy"]
    assert job["environment"] == "${{ inputs.stack || 'dev' }}"
    assert job["concurrency"]["cancel-in-progress"] is False


CLEAN_UP = "Delete the GPU Droplets this failed up made"


def test_a_failed_or_cancelled_up_deletes_what_it_made_before_the_job_ends() -> None:
    """Issue 42: after an unattended up fails (a wake, a push), what it made must not bill
    until someone looks. The deploy job notes when it began, and its last step, on failure or
    cancellation (the job's timeout), runs lease.py's clean-up of what was made since, with
    the deploy's own token through its environment; never after a destroy."""
    steps = load("deploy.yml")["jobs"]["deploy"]["steps"]
    names = [s.get("name") or s.get("uses") for s in steps]
    began = names.index("Note when this run began")
    assert began < names.index("pulumi/actions@v7") < names.index(CLEAN_UP) == len(steps) - 1
    assert steps[began]["id"] == "began"
    assert steps[began]["run"] == 'echo "at=$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$GITHUB_OUTPUT"'
    step = steps[-1]
    assert step["if"] == (
        "(failure() || cancelled()) && (inputs.command || 'up') == 'up' && steps.began.outputs.at"
    )
    # Within the 5 minutes GitHub gives a cancelled job's remaining steps.
    assert step["timeout-minutes"] <= 5
    assert step["env"] == {
        "DIGITALOCEAN_TOKEN": "${{ secrets.DIGITALOCEAN_TOKEN }}",
        "STACK": "${{ inputs.stack || 'dev' }}",
        "SINCE": "${{ steps.began.outputs.at }}",
    }
    argv = step["run"].split()
    assert argv[:2] == ["python3", "scripts/ci/lease.py"]
    # The arguments lease.py's own parser takes, with what the step's variables would hold.
    values = {'"$STACK"': "dev", '"$SINCE"': "2026-12-05T03:00:00Z",
              '"$GITHUB_STEP_SUMMARY"': "summary.md"}  # fmt: skip
    spec = importlib.util.spec_from_file_location("lease", ROOT / "scripts" / "ci" / "lease.py")
    assert spec and spec.loader
    lease = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = lease  # dataclasses look their module up
    spec.loader.exec_module(lease)
    args = lease._parser().parse_args([values.get(a, a) for a in argv[2:]])
    assert (args.failed_up, args.since.isoformat()) == ("dev", "2026-12-05T03:00:00+00:00")


def test_secrets_only_reach_steps_through_env_or_inputs_never_a_run_line() -> None:
    files = [*WORKFLOWS, ROOT / ".github" / "actions" / "pulumi-setup" / "action.yml"]
    for path in files:
        for line in path.read_text().splitlines():
            if re.search(r"\$\{\{\s*(secrets|inputs|vars)\.", line):
                assert not line.strip().startswith(("run:", "echo", "- run:")), (path.name, line)


def test_both_workflows_create_a_stack_the_state_backend_does_not_have_yet() -> None:
    """A new bucket has no stacks: without `upsert` the first preview and the first deploy
    fail with "no stack named"."""
    for name, job in (("preview.yml", "preview"), ("deploy.yml", "deploy")):
        steps = load(name)["jobs"][job]["steps"]
        actions = [s for s in steps if str(s.get("uses", "")).startswith("pulumi/actions@")]
        assert actions and all(s["with"]["upsert"] is True for s in actions), name


def test_deploy_runs_the_suite_only_for_a_commit_that_has_not_passed_it() -> None:
    """The job graph tests/test_runner.py runs as GitHub would: `tested` asks, `test` runs when
    it says so, `deploy` after a pass now or before and never after a failure."""
    wf = load("deploy.yml")
    assert wf["run-name"] == "deploy ${{ inputs.stack || 'dev' }} ${{ inputs.command || 'up' }}"
    jobs = wf["jobs"]
    assert list(jobs) == ["tested", "test", "deploy"]
    assert "needs" not in jobs["tested"]
    ask, lease_look = [s for s in jobs["tested"]["steps"] if "run" in s]
    assert ask["id"] == "ask"
    # The lease's look (run for real in tests/test_runner.py) may fail and never stops a deploy.
    assert lease_look["run"] == 'python3 scripts/ci/lease.py --status --repo "$REPO"'
    assert lease_look["continue-on-error"] is True and lease_look["timeout-minutes"] == 1
    assert jobs["tested"]["permissions"] == {"contents": "read", "actions": "read"}
    assert "scripts/ci/tested.py --workflow deploy.yml --job test" in ask["run"]
    assert jobs["tested"]["outputs"]["run-tests"] == "${{ steps.ask.outputs.run-tests }}"
    assert jobs["test"]["needs"] == "tested"
    assert jobs["test"]["if"] == "needs.tested.outputs.run-tests == 'true'"
    assert jobs["deploy"]["needs"] == ["tested", "test"]
    assert jobs["deploy"]["if"].startswith("${{ !failure() && !cancelled() && ")


def test_a_wake_waits_for_a_deploy_of_its_stack_never_for_tests_and_none_is_dropped() -> None:
    """Issue 42: the stack's lock is on the `deploy` job alone. With the group on the workflow, a
    wake (the front's dispatch) waited for a push's whole run, its ./check of ~10 minutes
    included; and GitHub's default queue of one cancels a pending run when another queues, so
    a push could drop a waiting wake or destroy. Two deploys of one stack still never overlap
    (docs.github.com, "Control the concurrency of workflows and jobs": `queue: max`)."""
    wf = load("deploy.yml")
    assert "concurrency" not in wf, "a run-wide group holds a wake behind a push's tests"
    jobs = wf["jobs"]
    assert "concurrency" not in jobs["tested"] and "concurrency" not in jobs["test"]
    assert jobs["deploy"]["concurrency"] == {
        "group": "deploy-${{ inputs.stack || 'dev' }}",  # a push deploys dev: its group too
        "cancel-in-progress": False,  # never cut a pulumi up half-way
        "queue": "max",  # a pending wake or destroy is never replaced
    }
    # No other workflow takes a stack's group: real runs deploy throwaway stacks of their own.
    for name in ("preview.yml", "lease.yml", "real-run.yml"):
        group = str(load(name).get("concurrency", {}).get("group", ""))
        assert not group.startswith("deploy-"), (name, group)


def test_the_long_stack_scenarios_run_where_a_failure_is_seen() -> None:
    """Issue 42: ./check's default run leaves stack_long out (pyproject addopts); stack-long.yml
    runs them on every pull request and push to main, in a job nothing waits for."""
    assert "-m 'not stack_long'" in (ROOT / "pyproject.toml").read_text()
    wf = load("stack-long.yml")
    assert wf[True]["pull_request"] == {"branches": ["main"]}
    assert wf[True]["push"] == {"branches": ["main"]} and "workflow_dispatch" in wf[True]
    [job] = wf["jobs"].values()
    assert [s.get("run") for s in job["steps"] if "run" in s] == [
        "scripts/ci/check-on-runner.sh -m stack_long"
    ]
    assert job["timeout-minutes"] >= 45  # about 20 minutes of scenarios, 25 with the setup
    for other in ("deploy.yml", "preview.yml"):
        for name, other_job in load(other)["jobs"].items():
            assert "stack-long" not in str(other_job.get("needs", "")), (other, name)


@pytest.mark.parametrize("command", ["", "up", "destroy"])
@pytest.mark.parametrize("platform", ["droplet", "kubernetes"])
def test_a_kubernetes_stack_refreshes_and_destroys_through_its_program(
    platform: str, command: str
) -> None:
    """Issue 43: the provider's kubeconfig in the state expires after 7 days; a refresh or a
    destroy that does not run the program reads the cluster with it (401). The platform comes
    from the stack file before Pulumi runs; a Kubernetes stack sets PULUMI_RUN_PROGRAM (the
    default of the CLI's `--run-program`) on every pulumi/actions step, and since a destroy's
    own --refresh never runs the program, its refresh is a step of its own before it. A
    Droplet stack: one step, refresh always, PULUMI_RUN_PROGRAM false (the CLI's default).
    tests/test_runner.py runs these steps against a fake `pulumi`."""
    steps = load("deploy.yml")["jobs"]["deploy"]["steps"]
    names = [s.get("name") or s.get("uses") for s in steps]
    platform_at = names.index(platform_step(steps)["name"])
    assert names.index("Note when this run began") < platform_at
    ask = platform_step(steps)
    assert ask["run"] == 'python3 scripts/ci/which_platform.py "$STACK" >> "$GITHUB_OUTPUT"'
    assert ask["env"] == {"STACK": "${{ inputs.stack || 'dev' }}"}
    refresh, deploy = steps[platform_at + 1], steps[platform_at + 2]
    assert (refresh["name"], deploy) == (KUBE_REFRESH, deploy_step(steps))
    kube, destroy = platform == "kubernetes", command == "destroy"
    assert evaluate(refresh["if"], platform, command) is (kube and destroy)
    assert refresh["with"] == {
        "command": "refresh", "stack-name": "${{ inputs.stack || 'dev' }}",
        "cloud-url": "${{ steps.setup.outputs.backend-url }}", "upsert": True,
        "pulumi-version": PULUMI_VERSION,
    }  # fmt: skip
    assert evaluate(deploy["with"]["refresh"], platform, command) is not (kube and destroy)
    assert deploy["with"]["pulumi-version"] == PULUMI_VERSION
    # The same environment, PULUMI_RUN_PROGRAM with it, on both (one YAML anchor).
    assert refresh["env"] == deploy["env"] and deploy["env"]["PULUMI_RUN_PROGRAM"] == RUN_PROGRAM
    assert evaluate(RUN_PROGRAM, platform, command) is kube
