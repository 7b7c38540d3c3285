"""scripts/ci/realrun/cleanup.py through `real_run.py cleanup`, against a fake `pulumi`: destroy
then stack rm, a stack under its qualified name, nothing to do, a failed destroy refreshed and
retried, kept when it fails again; on Kubernetes, the last resort for a cluster `pulumi destroy`
left, against the fake DigitalOcean API (tests/support/stack/do_api.py). Nothing reaches a cloud.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from fake_pulumi import FakePulumi
from stack.do_api import Account, DigitalOceanAPI
from test_real_run import read_outputs, real_run


def cleanup(
    fake: FakePulumi, tmp_path: Path, stack: str = "rr-1"
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], dict[str, str]]:
    github_output = tmp_path / "cleanup-output"
    run_dir = tmp_path / "run"
    proc = real_run(
        "cleanup", "--stack", stack, "--minutes", "3", "--out-dir", str(run_dir),
        env=fake.env(GITHUB_OUTPUT=str(github_output)),
    )  # fmt: skip
    result = json.loads((run_dir / "cleanup.json").read_text())
    return proc, result, read_outputs(github_output)


def test_cleanup_destroys_then_removes_the_stack(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path)
    fake.add_stack("rr-1")
    proc, result, out = cleanup(fake, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert fake.calls() == ["stack ls", "destroy", "stack rm"]
    assert result["found"] and result["destroyed"] and result["removed"]
    assert "ended" in out
    assert fake.data["stacks"] == {}


def test_cleanup_finds_a_stack_under_its_qualified_name(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path, qualify="organization/nemotron-droplet/")
    fake.add_stack("rr-1")
    proc, result, _ = cleanup(fake, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert result["removed"]


def test_cleanup_with_nothing_created_has_nothing_to_do(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path)
    proc, result, out = cleanup(fake, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert fake.calls() == ["stack ls"]
    assert result["found"] is False
    assert "nothing to destroy: stack rr-1 was never created" in proc.stdout
    assert "ended" in out
    other = tmp_path / "no-plan"
    other.mkdir()
    proc, result, _ = cleanup(FakePulumi(other), other, stack="")
    assert proc.returncode == 0
    assert result["message"] == "no stack name: the plan did not run, so nothing was created"


def test_cleanup_refreshes_and_retries_a_failed_destroy(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path, rc={"destroy": [255]})
    fake.add_stack("rr-1")
    proc, result, _ = cleanup(fake, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert fake.calls() == ["stack ls", "destroy", "refresh", "destroy", "stack rm"]
    assert result["removed"]


def test_cleanup_keeps_the_stack_when_destroy_fails_and_says_what_to_do(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path, rc={"destroy": [255, 255]})
    fake.add_stack("rr-1")
    proc, result, out = cleanup(fake, tmp_path)
    assert proc.returncode == 1
    # Never `stack rm` (let alone --force): the state is what knows what still bills.
    assert fake.calls() == ["stack ls", "destroy", "refresh", "destroy"]
    assert not any("--force" in c["argv"] for c in fake.data["calls"])
    assert "rr-1" in fake.data["stacks"]
    assert result["destroyed"] is False
    assert "ended" not in out
    assert "`pulumi destroy --stack rr-1` then `pulumi stack rm rr-1`" in proc.stderr


def test_cleanup_that_cannot_list_the_stacks_fails_loudly(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path, rc={"stack ls": [255]})
    proc, result, _ = cleanup(fake, tmp_path)
    assert proc.returncode == 1
    assert fake.calls() == ["stack ls"]
    assert "cannot list the stacks (error: fake stack ls failure)" in result["message"]


DO_TOKEN = "dop_v1_fake_cleanup_token_0123456789abcdef"


def cleanup_cluster(
    fake: FakePulumi, tmp_path: Path, api: DigitalOceanAPI, token: str, *more: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], dict[str, str]]:
    """`cleanup` of a run whose DigitalOcean API is the fake's (the last resort's)."""
    github_output = tmp_path / "cleanup-output"
    out = tmp_path / "run"
    proc = real_run(
        "cleanup", "--stack", "rr-1", "--minutes", "3", "--out-dir", str(out), "--api-url",
        api.url, *more,
        env=fake.env(GITHUB_OUTPUT=str(github_output), DIGITALOCEAN_TOKEN=token),
    )  # fmt: skip
    return proc, json.loads((out / "cleanup.json").read_text()), read_outputs(github_output)


def test_a_cluster_destroy_left_is_deleted_through_the_api_with_its_lb_and_volumes(
    tmp_path: Path,
) -> None:
    fake = FakePulumi(tmp_path, rc={"destroy": [255, 255]})
    fake.add_stack("rr-1")
    account = Account()
    ours = account.add_cluster("nemotron-rr-1", ["nemotron-droplet"])
    other_stack = account.add_cluster("nemotron-rr-2", ["nemotron-droplet"])
    not_ours = account.add_cluster("nemotron-rr-1", ["someone-else"])
    token = account.add_token("cleanup", ["kubernetes:read", "kubernetes:delete"],
                              secret=DO_TOKEN)  # fmt: skip
    with DigitalOceanAPI(account) as api:
        proc, result, out = cleanup_cluster(
            fake, tmp_path, api, token, "--cluster", "nemotron-rr-1"
        )
        asked = [(r.method, r.path) for r in api.requests]
    assert proc.returncode == 1  # destroy failed: the step says so
    assert set(account.clusters) == {other_stack, not_ours}
    assert asked == [
        ("GET", "/v2/kubernetes/clusters"),
        ("DELETE", f"/v2/kubernetes/clusters/{ours}/destroy_with_associated_resources/dangerous"),
    ]
    assert result["cluster_deleted"] is True and result["destroyed"] is False
    assert "ended" in out  # the bill stopped: the summary counts up to here
    assert f"cluster nemotron-rr-1 ({ours}) deleted through the DigitalOcean API" in proc.stderr
    assert "`pulumi stack rm --force rr-1`" in proc.stderr
    # The stack is kept; never forced by the script itself.
    assert not any("--force" in c["argv"] for c in fake.data["calls"])
    assert DO_TOKEN not in proc.stdout + proc.stderr + json.dumps(result)


def test_a_token_that_cannot_delete_clusters_is_named_and_the_cluster_said_to_bill(
    tmp_path: Path,
) -> None:
    fake = FakePulumi(tmp_path, rc={"destroy": [255, 255]})
    fake.add_stack("rr-1")
    account = Account()
    account.add_cluster("nemotron-rr-1", ["nemotron-droplet"])
    token = account.add_token("cleanup", ["kubernetes:read"], secret=DO_TOKEN)
    with DigitalOceanAPI(account) as api:
        proc, result, out = cleanup_cluster(
            fake, tmp_path, api, token, "--cluster", "nemotron-rr-1"
        )
    assert proc.returncode == 1
    assert len(account.clusters) == 1
    assert result["cluster_deleted"] is False and "ended" not in out
    assert "the token needs the scope kubernetes:delete" in proc.stderr
    assert "**Nothing else deletes a cluster left behind**: delete nemotron-rr-1" in proc.stderr


def test_a_droplet_run_or_a_clean_destroy_never_calls_the_api(tmp_path: Path) -> None:
    account = Account()
    account.add_cluster("nemotron-rr-1", ["nemotron-droplet"])
    token = account.add_token("cleanup", ["kubernetes:read", "kubernetes:delete"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with DigitalOceanAPI(account) as api:
        failed = FakePulumi(tmp_path / "a", rc={"destroy": [255, 255]})
        failed.add_stack("rr-1")
        # A Droplet run: no --cluster.
        proc, _, _ = cleanup_cluster(failed, tmp_path / "a", api, token)
        assert proc.returncode == 1
        clean = FakePulumi(tmp_path / "b")
        clean.add_stack("rr-1")
        proc, result, _ = cleanup_cluster(
            clean, tmp_path / "b", api, token, "--cluster", "nemotron-rr-1"
        )
        assert proc.returncode == 0 and result["removed"]
        assert api.requests == []
    assert len(account.clusters) == 1
