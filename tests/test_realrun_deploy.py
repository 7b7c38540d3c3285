"""scripts/ci/realrun/deploy.py through `real_run.py init`, `up` and `outputs`, against a fake
`pulumi` on PATH (tests/support/fake_pulumi.py): autodown's token through stdin only, the flags
after the separator and up's exit code, the outputs saved without the secret ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from fake_pulumi import FakePulumi
from test_real_run import AUTODOWN_TOKEN, KEY, SSH_KEY, read_outputs, real_run


def test_init_gives_autodown_its_token_through_stdin_only(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path)
    github_output = tmp_path / "out"
    proc = real_run(
        "init", "--stack", "rr-1",
        env=fake.env(AUTODOWN_TOKEN=AUTODOWN_TOKEN, GITHUB_OUTPUT=str(github_output)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    calls = fake.data["calls"]
    assert [c["argv"] for c in calls] == [
        ["stack", "init", "rr-1"],
        ["config", "set", "--secret", "--path", "autodown.token", "--stack", "rr-1"],
    ]
    assert calls[1]["stdin"] == AUTODOWN_TOKEN
    assert AUTODOWN_TOKEN not in proc.stdout + proc.stderr
    out = read_outputs(github_output)
    assert out["autodown"] == "delete"
    assert int(out["started"]) > 1_700_000_000


def test_init_without_a_token_says_autodown_is_a_dry_run(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path)
    github_output = tmp_path / "out"
    proc = real_run("init", "--stack", "rr-1", env=fake.env(GITHUB_OUTPUT=str(github_output)))
    assert proc.returncode == 0, proc.stderr
    assert fake.calls() == ["stack init"]
    assert "::warning::no AUTODOWN_TOKEN secret: autodown runs as a dry run" in proc.stdout
    assert read_outputs(github_output)["autodown"] == "dry-run"


def test_init_that_fails_still_reports_when_it_started(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path, rc={"stack init": [255]})
    github_output = tmp_path / "out"
    proc = real_run("init", "--stack", "rr-1", env=fake.env(GITHUB_OUTPUT=str(github_output)))
    assert proc.returncode == 1
    assert "pulumi stack init rr-1 failed" in proc.stderr
    assert "started" in read_outputs(github_output)


def test_up_passes_the_flags_after_the_separator_and_its_exit_code(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path)
    fake.add_stack("rr-1", resources=0)
    proc = real_run(
        "up", "--stack", "rr-1", "--minutes", "1", "--",
        "--policy-pack", "policy", "--policy-pack-config", "policy/config.json",
        env=fake.env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert fake.data["calls"][-1]["argv"] == [
        "up", "--yes", "--stack", "rr-1",
        "--policy-pack", "policy", "--policy-pack-config", "policy/config.json",
    ]  # fmt: skip
    second = tmp_path / "second"
    second.mkdir()
    failing = FakePulumi(second, rc={"up": [7]})
    failing.add_stack("rr-1", resources=0)
    assert real_run("up", "--stack", "rr-1", "--minutes", "1", env=failing.env()).returncode == 7


def test_outputs_are_saved_without_the_secret_ones(tmp_path: Path) -> None:
    outputs = {"endpoint": "https://203.0.113.7/v1", "apiKey": KEY, "sshPrivateKey": SSH_KEY}
    fake = FakePulumi(tmp_path, outputs=outputs)
    fake.add_stack("rr-1")
    out = tmp_path / "run" / "outputs.json"
    proc = real_run("outputs", "--stack", "rr-1", "--out", str(out), env=fake.env())
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == {"endpoint": "https://203.0.113.7/v1"}
    assert "--show-secrets" not in fake.data["calls"][-1]["argv"]


def test_outputs_pulumi_cannot_give_fail_the_step_saying_why(tmp_path: Path) -> None:
    """The step reads the outputs as the tools do (target.stack_outputs), without the secrets."""
    fake = FakePulumi(tmp_path, rc={"stack output": [255]})
    fake.add_stack("rr-1")
    out = tmp_path / "run" / "outputs.json"
    proc = real_run("outputs", "--stack", "rr-1", "--out", str(out), env=fake.env())
    assert proc.returncode == 1
    assert "error: pulumi stack output --stack rr-1 failed: error: fake stack output failure" in (
        proc.stderr
    )
    assert not out.exists()
