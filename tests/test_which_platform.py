"""scripts/ci/which_platform.py: deploy.yml's stdlib reading of a stack's platform, held equal to
the program's own reading (components/spec/config.py) for every shipped stack and each form a
stack file may write the key in; what it cannot read for sure it refuses, naming the line."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pulumi_harness import ROOT

from components.spec import catalog, config
from components.spec.schema import PLATFORMS

SCRIPT = ROOT / "scripts" / "ci" / "which_platform.py"
SHIPPED = sorted(p.name.split(".")[1] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))


def run(stack: str, stacks: Path = ROOT / "stacks") -> subprocess.CompletedProcess[str]:
    # The runner image's python3 alone: no venv, no PyYAML on its path.
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), stack, "--stacks", str(stacks)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def programs_platform(path: Path) -> str:
    data = config.read_stack_file(path)
    return str((data.get("config") or {}).get(f"{config.NAMESPACE}:platform", "droplet"))


def test_it_spells_the_programs_namespace_and_platforms() -> None:
    text = SCRIPT.read_text()
    for name, value in (("NAMESPACE", catalog.PROJECT), ("PLATFORMS", PLATFORMS)):
        spelt = re.search(rf"^{name} = (.*)$", text, re.M)
        assert spelt is not None and ast.literal_eval(spelt[1]) == value, name


@pytest.mark.parametrize("stack", SHIPPED)
def test_every_shipped_stack_reads_as_the_program_reads_it(stack: str) -> None:
    proc = run(stack)
    assert proc.returncode == 0, proc.stderr
    path = ROOT / "stacks" / f"Pulumi.{stack}.yaml"
    assert proc.stdout == f"platform={programs_platform(path)}\n"
    # The one Kubernetes stack, so that deploy.yml's branch is taken by a shipped stack.
    assert (proc.stdout == "platform=kubernetes\n") is (stack == "kube")


@pytest.mark.parametrize(
    "line",
    [
        "  nemotron-droplet:platform: kubernetes",
        '  nemotron-droplet:platform: "kubernetes"',
        "  nemotron-droplet:platform: 'kubernetes'  # past one machine",
        "    nemotron-droplet:platform:   droplet",
        "  # nemotron-droplet:platform: kubernetes",  # a comment: the default
        "",  # absent: the default
    ],
)
def test_each_form_reads_as_the_program_reads_it(tmp_path: Path, line: str) -> None:
    path = tmp_path / "Pulumi.x.yaml"
    pad = " " * (len(line) - len(line.lstrip(" ")) or 2)
    path.write_text(f"# a stack\nconfig:\n{line}\n{pad}nemotron-droplet:model:\n{pad}  id: m\n")
    proc = run("x", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"platform={programs_platform(path)}\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("  nemotron-droplet:platform: kubernetis\n", "'kubernetis': accepted: a plain droplet or"),
        ("  nemotron-droplet:platform: &p kubernetes\n", "Pulumi.x.yaml:3: nemotron-droplet:platform"),
        ("  nemotron-droplet:platform: >-\n    kubernetes\n", "'>-': accepted"),
        ("  nemotron-droplet:platform: droplet\n  nemotron-droplet:platform: kubernetes\n",
         "set more than once (lines 3, 4)"),
    ],
)  # fmt: skip
def test_what_it_cannot_read_for_sure_it_refuses_naming_the_line(
    tmp_path: Path, text: str, says: str
) -> None:
    (tmp_path / "Pulumi.x.yaml").write_text(f"# a stack\nconfig:\n{text}")
    proc = run("x", tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("::error::") and says in proc.stderr, proc.stderr


def test_a_stack_without_a_file_is_refused_naming_those_there(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.dev.yaml").write_text("config: {}\n")
    proc = run("nope", tmp_path)
    assert proc.returncode == 2
    assert "no stack file" in proc.stderr and "Pulumi.dev.yaml" in proc.stderr


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('config:\n  "nemotron-droplet:platform": kubernetes\n', 3),
        ("config: {nemotron-droplet:platform: kubernetes}\n", 2),
    ],
)
def test_the_key_in_a_form_it_does_not_take_is_refused_not_guessed(
    tmp_path: Path, text: str, line: int
) -> None:
    """The program reads both as kubernetes; a guess of droplet would skip a Kubernetes stack's
    refresh through its program (its kubeconfig a week old: 401). Refused, naming the line."""
    stack = tmp_path / "Pulumi.x.yaml"
    stack.write_text(f"# a stack\n{text}")
    assert programs_platform(stack) == "kubernetes"
    proc = run("x", tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert f"Pulumi.x.yaml:{line}: nemotron-droplet:platform in a form" in proc.stderr, proc.stderr
