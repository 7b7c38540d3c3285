"""scripts/ci/real_run.py and .github/workflows/real-run.yml: the real run on a user's account.

Nothing here reaches a cloud. The command line (its platforms, spelt as the config's), the
workflow (its inputs, its order, its secrets, its `run:` blocks) and the workflow's own `run:`
lines, in order, against a fake `pulumi` on PATH and the fake OpenAI server (the real smoke,
bench and timeline tools). Each step's module has its own file, which imports the helpers here:
test_realrun_plan.py, test_realrun_kubeplan.py, test_realrun_deploy.py, test_realrun_runner.py,
test_realrun_cleanup.py, test_realrun_summary.py. Everything is written under tmp_path.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_pulumi import FakePulumi, clean_env
from test_tools import fake_server

from components.spec.schema import PLATFORMS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ci" / "real_run.py"
WORKFLOW = ROOT / ".github" / "workflows" / "real-run.yml"
KEY = "sk-real-run-test-0123456789"
AUTODOWN_TOKEN = "dop_v1_fake_autodown_token_0123456789"
SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKEKEYMATERIALabcdef\n-----END OPENSSH..."


def real_run(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def read_outputs(path: Path) -> dict[str, str]:
    """A $GITHUB_OUTPUT file's `key=value` lines."""
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_the_command_line_offers_the_programs_platforms() -> None:
    """real_run.py spells the platforms out (the plan job imports no pydantic before a
    Kubernetes plan): the same as the stack config's."""
    spelt = re.search(r"^PLATFORMS = (\(.*\))$", SCRIPT.read_text(), re.M)
    assert spelt is not None and ast.literal_eval(spelt[1]) == PLATFORMS


# A complete run's outputs (the summary's tests write them too: test_realrun_summary.py).
TIMELINE = {
    "driver": {"start": 1000.0, "end": 1300.0, "after": []},
    "conda": {"start": 1000.0, "end": 1060.0, "after": []},
    "model": {
        "start": 1060.0,
        "end": 1200.0,
        "after": ["conda"],
        "download_bytes": 8_000_000_000,
        "download_seconds": 140.0,
    },
    "preflight": {
        "start": 990.0,
        "end": 1000.0,
        "after": [],
        "disks": [{"name": "vda", "gib": 720, "mounts": "/", "volume": False}],
    },
    "vllm": {"start": 1060.0, "end": 1100.0, "after": ["conda"]},
    "service": {"start": 1300.0, "end": 1420.0, "after": ["driver", "model", "vllm"]},
    "gateway": {"start": None, "end": None, "after": []},
}
OUTPUTS = {
    "endpoint": "https://203.0.113.7/v1",
    "apiKey": KEY,
    "sshPrivateKey": SSH_KEY,
    "size": "gpu-4000adax1-20gb",
    "region": "tor1",
    "servedModelName": "nemotron",
    "hourlyPriceUsd": 0.76,
    "bootstrapTimeline": TIMELINE,
    "autodown": {"mode": "delete", "idleMinutes": 30, "maxHours": 2.6666},
}


# ---- the workflow ----------------------------------------------------------------------------


def workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def steps_of(job: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = workflow()["jobs"][job]["steps"]
    return steps


def step(job: str, step_id: str) -> dict[str, Any]:
    [found] = [s for s in steps_of(job) if s.get("id") == step_id]
    return found


def test_actionlint_passes_on_the_real_run_workflow() -> None:
    bin_dir = Path(sys.executable).parent
    exe = shutil.which("actionlint", path=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert exe, "actionlint is installed by requirements-dev.txt"
    proc = subprocess.run(
        [exe, str(WORKFLOW)],
        cwd=ROOT,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_manual_with_a_cost_cap_and_a_schedule_left_to_the_user() -> None:
    wf = workflow()
    on = wf[True]  # YAML reads `on:` as True
    assert set(on) == {"workflow_dispatch"}  # the schedule is commented out
    inputs = on["workflow_dispatch"]["inputs"]
    assert inputs["cost_cap_usd"]["default"] == "5"
    assert inputs["size"]["required"] is False
    text = WORKFLOW.read_text()
    assert "remove the # in front of the next two lines" in text
    assert '#   - cron: "23 5 * * 1"' in text
    assert wf["permissions"] == {"contents": "read"}
    assert all("permissions" not in job for job in wf["jobs"].values())
    assert wf["concurrency"]["cancel-in-progress"] is False


def test_destroy_runs_whatever_came_before_then_the_summary_and_the_artifact() -> None:
    steps = steps_of("run")
    ids = [s.get("id") or s.get("uses") or s["name"] for s in steps]
    cleanup = step("run", "cleanup")
    assert cleanup["if"] == "always()"
    assert "scripts/ci/real_run.py cleanup" in cleanup["run"]
    at = ids.index("cleanup")
    # Everything that uses the Droplet comes before it; only the report comes after.
    for before in ("init", "up", "saved"):
        assert ids.index(before) < at
    for s in steps[ids.index("up") + 1 : at]:
        assert s["if"].startswith("${{ !cancelled() && steps."), s["name"]
    after = steps[at + 1 :]
    assert [s.get("uses", "").split("@")[0] or "summary" for s in after] == [
        "summary",
        "actions/upload-artifact",
    ]
    assert all(s["if"] == "always()" for s in after)
    assert "scripts/ci/real_run.py summary" in after[0]["run"]
    assert after[1]["with"]["path"].split() == ["run/*.json", "run/*.txt", "run/*.png"]


def walk(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, (*path, str(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, (*path, str(i)))
    elif isinstance(node, str):
        yield path, node


def test_secrets_reach_steps_only_through_env() -> None:
    seen = set()
    for path, value in walk(workflow()):
        for name in re.findall(r"secrets\.([A-Z_]+)", value):
            assert path[-2] == "env", (path, value)
            assert value == f"${{{{ secrets.{name} }}}}", value
            seen.add(name)
    assert seen == {
        "DIGITALOCEAN_TOKEN", "AUTODOWN_TOKEN", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_ACCESS_TOKEN",
        "SPACES_ACCESS_KEY_ID", "SPACES_SECRET_ACCESS_KEY",
    }  # fmt: skip
    # A step gets only the secrets it needs: the DigitalOcean token where Droplets are made or
    # deleted (and the read-only size check), the autodown token where it is stored.
    for job in ("plan", "run"):
        for s in steps_of(job):
            env = s.get("env", {})
            if "DIGITALOCEAN_TOKEN" in env:
                assert s.get("id") in ("up", "cleanup") or "components.validate" in s["run"]
            if "AUTODOWN_TOKEN" in env:
                assert s.get("id") == "init"


SHELL_LOGIC = re.compile(r"(^|[;&|\s])(if|then|for|while|case|until|function)\s|\$\(|`")


def test_run_blocks_call_scripts_instead_of_holding_logic() -> None:
    for job in ("plan", "run"):
        for s in steps_of(job):
            if "run" not in s:
                continue
            lines = [line for line in s["run"].splitlines() if line.strip()]
            assert len(lines) <= 2, s["name"]
            assert not SHELL_LOGIC.search(s["run"]), s["run"]
            assert s["run"].split()[0] in ("python", "venv/bin/python", "nemodrop"), s["run"]
            assert "${{" not in s["run"], s["run"]  # values come in through env


def test_same_action_versions_as_deploy() -> None:
    deploy = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    pinned = {
        s["uses"].split("@")[0]: s["uses"]
        for job in deploy["jobs"].values()
        for s in job["steps"]
        if "uses" in s
    }
    for job in ("plan", "run"):
        for s in steps_of(job):
            name = s.get("uses", "").split("@")[0]
            if name in pinned:
                assert s["uses"] == pinned[name]


# ---- the workflow's own lines, in order, against the fakes ----------------------------------


def fake_openai(*args: str) -> AbstractContextManager[str]:
    """The fake OpenAI-compatible server asking for this file's key (test_tools.fake_server)."""
    return fake_server(*args, key=KEY)


def resolve(text: str, values: dict[str, str]) -> str:
    """The `${{ }}` expressions the run job's env uses: a name, or `name || 'default'`."""

    def one(m: re.Match[str]) -> str:
        first, _, default = m[1].partition("||")
        value = values.get(first.strip(), "")
        default = default.strip()
        quoted = default.startswith("'")
        return value or (default.strip("'") if quoted else values.get(default, ""))

    return re.sub(r"\$\{\{\s*(.+?)\s*\}\}", one, text)


@pytest.mark.parametrize("platform", ["droplet", "kubernetes"])
def test_the_run_job_end_to_end_against_fakes(tmp_path: Path, platform: str) -> None:
    """Each `run:` line of the run job, in order, as the runner would run it, in a copy of the
    project: a fake `pulumi` and a fake OpenAI endpoint stand in for the cloud. On kubernetes
    the digests come from the repository variables, and the timeline step is skipped."""
    project = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("scripts", "components", "stacks", "locks", "nemodrop"):
        shutil.copytree(ROOT / folder, project / folder, ignore=ignore)
    wf = workflow()
    with fake_openai("--ttft", "0.01", "--itl", "0.001", "--thinking", "parsed", "--tools",
                     "parsed", "--model", "nemotron") as base:  # fmt: skip
        fake = FakePulumi(tmp_path, outputs={**OUTPUTS, "endpoint": base})
        values = {"inputs.size": "", "inputs.cost_cap_usd": "", "inputs.platform": platform}
        if platform == "kubernetes":
            values["inputs.cost_cap_usd"] = "10"
            for var in ("IMAGE", "EDGE_IMAGE", "EPP_IMAGE", "PROXY_IMAGE"):
                values[f"vars.KUBE_{var}_DIGEST"] = "sha256:" + "cd" * 32
        values |= {"github.run_id": "42", "github.run_attempt": "1"}
        # Secrets the fakes do not need are empty (components.validate then asks no cloud).
        values["secrets.AUTODOWN_TOKEN"] = AUTODOWN_TOKEN
        logs: list[str] = []
        job_env: dict[str, str] = {}

        def run_step(s: dict[str, Any], github_output: Path) -> subprocess.CompletedProcess[str]:
            env = {k: resolve(str(v), values) for k, v in (s.get("env") or {}).items()}
            command = re.sub(r"^(venv/bin/)?python\b", sys.executable, s["run"])
            # The command the tools' install step puts on PATH: the copy's package, run from it.
            command = re.sub(r"^nemodrop\b", f"{sys.executable} -m nemodrop", command)
            # What the runner runs: `shell: bash` adds pipefail, the default shell does not.
            flags = "-eo pipefail" if s.get("shell") == "bash" else "-e"
            proc = subprocess.run(
                ["bash", "--noprofile", "--norc", *flags.split(), "-c", command],
                cwd=project,
                env={**fake.env(GITHUB_OUTPUT=str(github_output)), **job_env, **env},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            logs.append(proc.stdout + proc.stderr)
            return proc

        # The plan job first (in its own checkout): its outputs are the run job's `needs`.
        plan_out = tmp_path / "plan-output"
        proc = run_step(step("plan", "plan"), plan_out)
        assert proc.returncode == 0, proc.stderr
        values |= {f"needs.plan.outputs.{k}": v for k, v in read_outputs(plan_out).items()}
        assert values["needs.plan.outputs.stack"] == "real-run-42-1"
        (project / "stacks" / "Pulumi.real-run-42-1.yaml").unlink()  # the plan job's checkout
        job_env = {k: resolve(v, values) for k, v in wf["jobs"]["run"]["env"].items()}
        summary_file = tmp_path / "step-summary.md"
        job_env["GITHUB_STEP_SUMMARY"] = str(summary_file)
        for s in steps_of("run"):
            if "run" not in s or "pip install" in s["run"]:
                continue  # actions, and installs into the runner's Python
            if "env.PLATFORM == 'droplet'" in s.get("if", "") and platform != "droplet":
                continue  # the step's condition, as the runner reads it
            github_output = tmp_path / f"output-{s.get('id') or len(logs)}"
            proc = run_step(s, github_output)
            assert proc.returncode == 0, (s["name"], proc.stdout, proc.stderr)
            sid = s.get("id")
            values |= {
                f"steps.{sid}.outputs.{k}": v for k, v in read_outputs(github_output).items()
            }
    token = ["config set"] if platform == "droplet" else []  # autodown's: none on Kubernetes
    assert fake.calls() == [
        "stack init", *token, "up", "stack output", "stack output", "stack output",
        "stack ls", "destroy", "stack rm",
    ]  # fmt: skip
    assert fake.data["stacks"] == {}  # `pulumi stack rm` ran (it removes the stack's file too)
    run = project / "run"
    timeline = ["timeline.png", "timeline.txt"] if platform == "droplet" else []
    assert sorted(p.name for p in run.iterdir()) == [
        "bench.json", "cleanup.json", "outputs.json", "plan.json", "smoke.txt", *timeline,
    ]  # fmt: skip
    text = summary_file.read_text()
    assert "## Real run: `real-run-42-1`" in text
    assert "all checks passed" in text
    assert "| 1 | 16/0 |" in text and "| 8 | 16/0 |" in text
    assert ("█" in text) is (platform == "droplet")  # the bootstrap chart: a Droplet's
    # Seconds of Droplet time, billed at least 60 s, up to the cent at the dev size's price.
    took = re.search(r"\*\*About \$([0-9.]+)\*\* of the \$[0-9.]+ cap: (\d+) min (\d+) s", text)
    assert took, text
    seconds = max(60, int(took[2]) * 60 + int(took[3]))
    price = 0.76 if platform == "droplet" else json.loads((run / "plan.json").read_text())["price"]
    assert float(took[1]) == math.ceil(round(price * seconds / 3600 * 100, 6)) / 100
    if platform == "kubernetes":
        assert "Autodown: none: no autodown on Kubernetes" in text
    assert "destroyed and removed stack real-run-42-1" in text
    everything = "\n".join([*logs, text, *(p.read_text(errors="replace") for p in run.iterdir())])
    for secret in (KEY, SSH_KEY, AUTODOWN_TOKEN):
        assert secret not in everything


def test_the_workflow_takes_a_platform_and_the_digests_from_inputs_or_variables() -> None:
    inputs = workflow()[True]["workflow_dispatch"]["inputs"]
    assert inputs["platform"]["options"] == ["droplet", "kubernetes"]
    assert inputs["platform"]["default"] == "droplet"
    for s in (step("plan", "plan"), *[x for x in steps_of("run") if "plan --cost-cap" in
                                      x.get("run", "")]):  # fmt: skip
        env = s["env"]
        for name, var in (("image_digest", "KUBE_IMAGE_DIGEST"),
                          ("edge_image_digest", "KUBE_EDGE_IMAGE_DIGEST"),
                          ("epp_image_digest", "KUBE_EPP_IMAGE_DIGEST"),
                          ("proxy_image_digest", "KUBE_PROXY_IMAGE_DIGEST")):  # fmt: skip
            assert env[name.upper()] == f"${{{{ inputs.{name} || vars.{var} }}}}"
            assert f'--{name.replace("_", "-")} "${name.upper()}"' in s["run"]
        assert '--platform "$PLATFORM"' in s["run"]
    run_env = workflow()["jobs"]["run"]["env"]
    assert run_env["CLUSTER"] == "${{ needs.plan.outputs.cluster }}"
    assert '--cluster "$CLUSTER"' in step("run", "cleanup")["run"]
    assert '--platform "$PLATFORM"' in step("run", "init")["run"]
    [timeline] = [s for s in steps_of("run") if "nemodrop timeline" in s.get("run", "")]
    assert timeline["if"].endswith("&& env.PLATFORM == 'droplet' }}")
    assert "KUBE_IMAGE_DIGEST" in WORKFLOW.read_text().split("name: real-run")[0]
