"""scripts/lease.py, the lease outside the Droplet, against the fake DigitalOcean API with the
API's contract (tests/support/stack/do_api.py: scopes from the OpenAPI, GPU Droplets only with
`type=gpus`, pages of at most 200, rate limits with Retry-After, 5xx, a Droplet deleted by
someone else between the list and the delete)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pulumi_harness import stack_config
from stack.do_api import Account, DigitalOceanAPI

from components import catalog, config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "lease.py"
# What the README and lease.yml tell users to give the lease's token: exactly these.
SCOPES = ["droplet:read", "droplet:delete"]
GPU = "gpu-4000adax1-20gb"  # $0.76/h in the catalog
# The lease's clock in these tests (lease.main takes it): the Droplets' ages are exact.
NOW = datetime.now(UTC).replace(microsecond=0)


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lease", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["lease"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


lease = load()


def ours(stack: str, minutes: int | None) -> list[str]:
    """The tags the program gives a GPU Droplet of `stack` with autodown.maxHours of `minutes`
    (StackConfig.tags, from a parsed stack: what the lease reads is what the program writes)."""
    raw = stack_config("dev")
    raw["droplet"] = {**raw["droplet"], "tags": []}
    raw["autodown"] = {"maxHours": minutes / 60} if minutes else {}
    return config.parse(raw, stack, frozenset({"autodown"})).tags


def past_lease(api: DigitalOceanAPI, name: str = "nemotron-dev", stack: str = "dev") -> Any:
    """One of our GPU Droplets whose one-hour lease ended four hours ago."""
    return api.account.add_droplet(name, GPU, tags=ours(stack, 60),
                                   created_at=NOW - timedelta(hours=5))  # fmt: skip


@pytest.fixture
def api() -> Iterator[DigitalOceanAPI]:
    with DigitalOceanAPI(Account()) as fake:
        yield fake


def run(
    api: DigitalOceanAPI, token: str, *args: str, tmp_path: Path
) -> tuple[int, list[float], str]:
    """lease.main in this process, its sleeps recorded instead of slept; the summary's text."""
    slept: list[float] = []
    summary = tmp_path / "summary.md"
    summary.unlink(missing_ok=True)
    with pytest.MonkeyPatch.context() as env:  # a token the caller had set comes back after
        env.setenv("DIGITALOCEAN_TOKEN", token)
        code = lease.main(["--api-url", api.url, "--summary", str(summary), *args],
                          clock=NOW.timestamp, sleep=slept.append)  # fmt: skip
    return code, slept, summary.read_text() if summary.exists() else ""


def test_it_deletes_only_our_gpu_droplets_past_their_lease(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    account = api.account
    expired = account.add_droplet("nemotron-dev", GPU, tags=ours("dev", 480),
                                  created_at=NOW - timedelta(hours=9))  # fmt: skip
    fresh = account.add_droplet("nemotron-prod", GPU, tags=ours("prod", 480),
                                created_at=NOW - timedelta(hours=2))  # fmt: skip
    unleased = account.add_droplet("nemotron-big", GPU, tags=ours("big", None),
                                   created_at=NOW - timedelta(days=3))  # fmt: skip
    # Not ours: someone's own GPU Droplet, old and even tagged with a lease-looking tag.
    theirs = account.add_droplet("training", GPU, tags=[catalog.lease_tag(1)],
                                 created_at=NOW - timedelta(days=3))  # fmt: skip
    # The balancer: a CPU Droplet of ours, never listed with type=gpus, so never deleted.
    balancer = account.add_droplet("nemotron-dev-balancer", "s-1vcpu-1gb",
                                   tags=[*ours("dev", 1), "balancer:dev"],
                                   created_at=NOW - timedelta(days=3))  # fmt: skip
    volume = account.add_volume("nemotron-dev-cache", 200, droplet_id=expired.id)
    token = account.add_token("lease", SCOPES)

    code, _, text = run(api, token, tmp_path=tmp_path)

    assert code == 0, text
    assert set(account.droplets) == {fresh.id, unleased.id, theirs.id, balancer.id}
    assert volume.id in account.volumes, "a cache Volume is never deleted"
    assert [(s.method, s.path) for s in api.requests if s.method == "DELETE"] == [
        ("DELETE", f"/v2/droplets/{expired.id}")
    ], "by id, never by tag"
    assert "1 deleted ($0.76/h stopped); 2 kept ($1.52/h still billing)" in text
    assert f"| nemotron-dev ({expired.id}) | dev | {GPU} | 0.76 |" in text
    assert "expired 1 h 00 min ago | deleted |" in text
    assert "expires in 6 h 00 min | kept |" in text
    assert "no lease (autodown.maxHours unset, or dryRun) | kept |" in text
    assert "training" not in text and "balancer" not in text


def test_the_grace_gives_autodown_its_chance_first(api: DigitalOceanAPI, tmp_path: Path) -> None:
    droplet = api.account.add_droplet("nemotron-dev", GPU, tags=ours("dev", 60),
                                      created_at=NOW - timedelta(minutes=70))  # fmt: skip
    token = api.account.add_token("lease", SCOPES)
    code, _, text = run(api, token, tmp_path=tmp_path)  # default grace: 30 minutes
    assert code == 0 and droplet.id in api.account.droplets
    assert "expired 10 min ago | kept |" in text
    code, _, text = run(api, token, "--grace-minutes", "5", tmp_path=tmp_path)
    assert code == 0 and droplet.id not in api.account.droplets
    assert "| deleted |" in text


@pytest.mark.parametrize("grace", ["nan", "inf", "-1"])
def test_a_grace_it_cannot_count_to_is_refused(
    api: DigitalOceanAPI, tmp_path: Path, grace: str
) -> None:
    """A free-text workflow input: nan or inf would keep every Droplet past its lease."""
    past_lease(api)
    token = api.account.add_token("lease", SCOPES)
    with pytest.raises(SystemExit) as refused:
        run(api, token, "--grace-minutes", grace, tmp_path=tmp_path)
    assert refused.value.code == 2
    assert len(api.account.droplets) == 1


def test_a_dry_run_needs_only_read_and_deletes_nothing(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    droplet = past_lease(api, "nemotron-dev", "dev")
    token = api.account.add_token("reader", ["droplet:read"])
    code, _, text = run(api, token, "--dry-run", tmp_path=tmp_path)
    assert code == 0 and droplet.id in api.account.droplets
    assert "## Lease (dry run: nothing deleted)" in text and "would delete (dry run)" in text
    assert {s.method for s in api.requests} == {"GET"}


def test_a_token_without_delete_is_named_and_nothing_is_deleted(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    for name in ("nemotron-a", "nemotron-b"):
        api.account.add_droplet(name, GPU, tags=ours("dev", 60),
                                created_at=NOW - timedelta(hours=5))  # fmt: skip
    token = api.account.add_token("reader", ["droplet:read"])
    code, _, text = run(api, token, tmp_path=tmp_path)
    assert code == 2 and len(api.account.droplets) == 2
    assert "the token needs the scope droplet:delete" in text
    assert [s.status for s in api.requests if s.method == "DELETE"] == [403], "stops at one"


def test_a_token_without_read_is_named(api: DigitalOceanAPI, tmp_path: Path) -> None:
    token = api.account.add_token("deleter", ["droplet:delete"])
    code, _, text = run(api, token, tmp_path=tmp_path)
    assert code == 2 and "the token needs the scope droplet:read" in text


def test_it_reads_every_page(api: DigitalOceanAPI, tmp_path: Path) -> None:
    """More GPU Droplets than a page holds (200): the expired one is on the second page."""
    for i in range(204):
        api.account.add_droplet(f"other-{i:03d}", GPU, tags=["someone-else"])
    expired = past_lease(api, "nemotron-dev", "dev")
    token = api.account.add_token("lease", SCOPES)
    code, _, _ = run(api, token, tmp_path=tmp_path)
    assert code == 0 and expired.id not in api.account.droplets
    pages = [s.query.get("page", ["1"])[0] for s in api.requests if s.method == "GET"]
    assert pages == ["1", "2"]


def test_a_rate_limit_is_waited_out_not_counted_as_a_failure(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    expired = past_lease(api, "nemotron-dev", "dev")
    token = api.account.add_token("lease", SCOPES)
    api.throttle(4, retry_after=7)  # more 429s in a row than the 5xx tries
    code, slept, _ = run(api, token, tmp_path=tmp_path)
    assert code == 0 and expired.id not in api.account.droplets
    assert slept == [7.0] * 4, "each 429's Retry-After, exactly"


def test_server_errors_are_tried_again_then_reported(api: DigitalOceanAPI, tmp_path: Path) -> None:
    expired = past_lease(api, "nemotron-dev", "dev")
    token = api.account.add_token("lease", SCOPES)
    api.fail(2, status=503)
    code, slept, _ = run(api, token, tmp_path=tmp_path)
    assert code == 0 and expired.id not in api.account.droplets and slept == [2.0, 4.0]
    past_lease(api, "nemotron-prod", "prod")
    api.fail(3, status=500)
    code, _, text = run(api, token, tmp_path=tmp_path)
    assert code == 1 and "listing the GPU Droplets failed" in text


def test_a_droplet_deleted_between_list_and_delete_is_gone_not_failed(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    expired = past_lease(api, "nemotron-dev", "dev")
    token = api.account.add_token("lease", SCOPES)
    api.vanish_after_list(expired.id)  # autodown, or a person, got there first
    code, _, text = run(api, token, tmp_path=tmp_path)
    assert code == 0 and "| already gone |" in text and "0.76/h stopped" in text


def test_the_cli_never_prints_the_token_and_sends_it_over_https_only(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    past_lease(api, "nemotron-dev", "dev")
    token = api.account.add_token("lease", SCOPES)
    summary = tmp_path / "step-summary.md"
    env = {**os.environ, "DIGITALOCEAN_TOKEN": token, "GITHUB_STEP_SUMMARY": str(summary)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--api-url", api.url], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "nemotron-dev" in done.stdout and "deleted" in done.stdout
    assert "| deleted |" in summary.read_text(), "the job summary, from $GITHUB_STEP_SUMMARY"
    assert token not in done.stdout + done.stderr + summary.read_text()
    plain = subprocess.run([sys.executable, str(SCRIPT), "--api-url", "http://api.example.com"],
                           env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert plain.returncode == 2 and "HTTPS only" in plain.stderr
    unset = subprocess.run([sys.executable, str(SCRIPT)], env={"PATH": os.environ["PATH"]},
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert unset.returncode == 2 and "DIGITALOCEAN_TOKEN is not set" in unset.stderr


# ---- .github/workflows/lease.yml ------------------------------------------------------------------

WORKFLOW = ROOT / ".github" / "workflows" / "lease.yml"


def workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def test_the_workflow_runs_every_15_minutes_and_by_hand_with_read_only_repo_access() -> None:
    flow = workflow()
    on = flow[True]  # PyYAML reads the key `on` as True
    assert on["schedule"] == [{"cron": "*/15 * * * *"}]
    assert on["workflow_dispatch"]["inputs"]["dry_run"]["type"] == "boolean"
    assert flow["permissions"] == {"contents": "read"}
    assert flow["concurrency"]["cancel-in-progress"] is False, "never two leases at once"


def test_the_token_reaches_only_the_lease_step_and_only_through_its_environment() -> None:
    text = WORKFLOW.read_text()
    uses = [line.strip() for line in text.splitlines() if "secrets." in line]
    assert uses == [
        "HAS_TOKEN: ${{ secrets.DIGITALOCEAN_LEASE_TOKEN != '' }}",
        "DIGITALOCEAN_TOKEN: ${{ secrets.DIGITALOCEAN_LEASE_TOKEN }}",
    ]
    steps = workflow()["jobs"]["lease"]["steps"]
    with_token = [s for s in steps if "DIGITALOCEAN_TOKEN" in (s.get("env") or {})]
    assert len(with_token) == 1 and "scripts/lease.py" in with_token[0]["run"]


@pytest.mark.parametrize(("dry_run", "expected"), [("true", ["--dry-run"]), ("false", [])])
def test_the_lease_step_passes_its_inputs_to_the_script(
    tmp_path: Path, dry_run: str, expected: list[str]
) -> None:
    """The step's own shell, run under bash with `python` a stand-in that records its args."""
    step = next(s for s in workflow()["jobs"]["lease"]["steps"] if "scripts/lease.py" in
                s.get("run", ""))  # fmt: skip
    shim = tmp_path / "bin" / "python"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/args\n')
    shim.chmod(0o755)
    env = {"PATH": f"{shim.parent}:/usr/bin:/bin", "DRY_RUN": dry_run, "GRACE_MINUTES": "45"}
    subprocess.run(["bash", "-euo", "pipefail", "-c", step["run"]], env=env, check=True,
                   timeout=30)  # fmt: skip
    args = (tmp_path / "args").read_text().split()
    assert args == ["scripts/lease.py", "--grace-minutes", "45", *expected]
