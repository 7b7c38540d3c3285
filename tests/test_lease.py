"""scripts/ci/lease.py, the lease outside the Droplet, against the fake DigitalOcean API with the
API's contract (tests/support/stack/do_api.py: scopes from the OpenAPI, GPU Droplets only with
`type=gpus`, pages of at most 200, rate limits with Retry-After, 5xx, a Droplet deleted by
someone else between the list and the delete)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from fake_github_lease import FakeGitHub
from loopback import reply, serve, stop, url
from pulumi_harness import stack_config
from stack.do_api import Account, DigitalOceanAPI

from components.spec import catalog, config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ci" / "lease.py"
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
    assert "Saw 4 GPU Droplet(s) in the account" in text, "the balancer is not one of them"
    assert "Grace past a lease: 30 min." in text
    assert "1 deleted ($0.76/h stopped); 2 kept ($1.52/h still billing)" in text
    assert f"| nemotron-dev ({expired.id}) | dev | {GPU} | 0.76 |" in text
    assert "expired 1 h 00 min ago | deleted |" in text
    assert "expires in 6 h 00 min | kept |" in text
    assert "no lease (autodown.maxHours unset, or dryRun) | kept |" in text
    assert "training" not in text and "balancer" not in text


def test_after_a_failed_up_it_deletes_what_that_run_made_and_names_what_bounds_the_rest(
    api: DigitalOceanAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42: deploy.yml's clean-up after a failed `pulumi up` (a 3 a.m. wake whose driver
    phase failed): the stack's GPU Droplets made since the run began are deleted by id, the
    stack's older replica (it served; autodown and the lease bound it) and other stacks' stay,
    and each `billing:` line says which, for the front to relay."""
    account = api.account
    began = NOW - timedelta(minutes=20)
    failed = account.add_droplet("nemotron-dev-1", GPU, tags=ours("dev", 480),
                                 created_at=began + timedelta(minutes=1))  # fmt: skip
    # Its clock a little behind the runner's: still this run's.
    skewed = account.add_droplet("nemotron-dev-2", GPU, tags=ours("dev", 480),
                                 created_at=began - timedelta(seconds=30))  # fmt: skip
    older = account.add_droplet("nemotron-dev-0", GPU, tags=ours("dev", 480),
                                created_at=NOW - timedelta(hours=2))  # fmt: skip
    other = account.add_droplet("nemotron-prod", GPU, tags=ours("prod", 480),
                                created_at=began + timedelta(minutes=2))  # fmt: skip
    token = account.add_token("deploy", SCOPES)
    since = began.isoformat().replace("+00:00", "Z")
    code, _, text = run(api, token, "--failed-up", "dev", "--since", since, tmp_path=tmp_path)
    out = capsys.readouterr().out
    assert code == 0, out + text
    assert set(account.droplets) == {older.id, other.id}
    assert sorted(r.path for r in api.requests if r.method == "DELETE") == sorted(
        f"/v2/droplets/{d.id}" for d in (failed, skewed)
    ), "by id, never by tag"
    billing = [line for line in out.splitlines() if line.startswith("billing: ")]
    assert billing[0] == ("billing: the failed up of stack dev made 2 GPU Droplet(s); 2 deleted "
                          "($1.52/h stopped)")  # fmt: skip
    assert f"billing: nemotron-dev-1 ({failed.id}, $0.76/h): made by this run: deleted" in out
    assert (f"billing: nemotron-dev-0 ({older.id}, $0.76/h): older than this run, kept: its "
            "autodown rule and its lease bound it (expires in 6 h 00 min)") in out  # fmt: skip
    assert "nemotron-prod" not in out, "another stack's Droplets are not this run's"


def test_a_failed_up_that_made_nothing_deletes_nothing(
    api: DigitalOceanAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run refused before anything was created (a size sold out): nothing of the stack's is
    touched, and the log says the run made nothing."""
    older = api.account.add_droplet("nemotron-dev", GPU, tags=ours("dev", 480),
                                    created_at=NOW - timedelta(hours=2))  # fmt: skip
    token = api.account.add_token("deploy", SCOPES)
    since = NOW.isoformat()
    code, _, _ = run(api, token, "--failed-up", "dev", "--since", since, tmp_path=tmp_path)
    out = capsys.readouterr().out
    assert code == 0 and set(api.account.droplets) == {older.id}
    assert "billing: the failed up of stack dev made 0 GPU Droplet(s); 0 deleted" in out


@pytest.mark.parametrize(
    "args",
    [["--failed-up", "dev"], ["--since", "2026-12-05T03:00:00Z"],
     ["--failed-up", "dev", "--since", "2026-12-05T03:00:00"],  # no zone: whose 03:00?
     ["--failed-up", "dev", "--since", "yesterday"]],
)  # fmt: skip
def test_a_failed_up_clean_up_needs_the_stack_and_a_start_with_its_zone(
    api: DigitalOceanAPI, tmp_path: Path, args: list[str]
) -> None:
    token = api.account.add_token("deploy", SCOPES)
    with pytest.raises(SystemExit) as exit_:
        run(api, token, *args, tmp_path=tmp_path)
    assert exit_.value.code == 2
    assert api.requests == [], "nothing asked, nothing deleted"


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
    assert "The list of GPU Droplets failed: nothing was seen, nothing deleted." in text


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


DAYS_PER_MONTH = 365.25 / 12
FREE_PLAN_MINUTES = 2000  # GitHub Free: Actions minutes a month for private repositories


def _matches(spec: str, value: int) -> bool:
    """One cron field of the forms lease.yml's header uses: `*`, `*/N`, `N`."""
    if spec == "*":
        return True
    if spec.startswith("*/"):
        return value % int(spec[2:]) == 0
    return value == int(spec)


def runs_a_month(cron: str) -> float:
    minute, hour, day, month, weekday = cron.split()
    assert (day, month, weekday) == ("*", "*", "*"), "every day: the count below assumes it"
    per_day = sum(_matches(minute, m) and _matches(hour, h) for h in range(24) for m in range(60))
    return per_day * DAYS_PER_MONTH


def test_the_schedule_is_hourly_off_the_hour_and_fits_the_free_plan() -> None:
    flow = workflow()
    on = flow[True]  # PyYAML reads the key `on` as True
    [schedule] = on["schedule"]
    assert schedule == {"cron": "17 * * * *"}, "hourly, off the top of the hour GitHub is busiest"
    # Each run bills at least a minute on a private repository (one job: lease.yml has one).
    assert list(flow["jobs"]) == ["lease"]
    assert runs_a_month(schedule["cron"]) == pytest.approx(730, abs=1)
    assert runs_a_month(schedule["cron"]) < FREE_PLAN_MINUTES / 2, "room for deploys and tests"


def test_the_header_prices_each_cron_it_offers() -> None:
    """Every `cron "..."  ~N` line of lease.yml's header is that cron's runs a month."""
    offers = re.findall(r'cron "([^"]+)"\s+~([\d,]+)', WORKFLOW.read_text())
    assert len(offers) == 4 and workflow()[True]["schedule"][0]["cron"] in dict(offers)
    for cron, minutes in offers:
        assert runs_a_month(cron) == pytest.approx(int(minutes.replace(",", "")), rel=0.01), cron
    assert runs_a_month("*/15 * * * *") > FREE_PLAN_MINUTES, "the old schedule: over the plan"


def test_the_workflow_runs_by_hand_with_read_only_repo_access() -> None:
    flow = workflow()
    on = flow[True]
    assert on["workflow_dispatch"]["inputs"]["dry_run"]["type"] == "boolean"
    assert flow["permissions"] == {"contents": "read"}
    assert flow["concurrency"]["cancel-in-progress"] is False, "never two leases at once"


def test_the_token_reaches_only_the_lease_step_and_only_through_its_environment() -> None:
    text = WORKFLOW.read_text()
    uses = [line.strip() for line in text.splitlines() if "secrets." in line]
    assert uses == [
        "HAS_TOKEN: ${{ secrets.DIGITALOCEAN_LEASE_TOKEN != '' }}",
        "DIGITALOCEAN_TOKEN: ${{ secrets.DIGITALOCEAN_LEASE_TOKEN }}",
        "GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}",
    ]
    steps = workflow()["jobs"]["lease"]["steps"]
    with_token = [s for s in steps if "DIGITALOCEAN_TOKEN" in (s.get("env") or {})]
    assert len(with_token) == 1 and "scripts/ci/lease.py" in with_token[0]["run"]
    # The run's own GITHUB_TOKEN goes to the keepalive alone, which needs no DigitalOcean token.
    [keep] = [s for s in steps if "GITHUB_TOKEN" in (s.get("env") or {})]
    assert "--keepalive" in keep["run"] and "DIGITALOCEAN_TOKEN" not in keep["env"]
    assert keep["continue-on-error"] is True, "a renewal that fails never fails the lease"


@pytest.mark.parametrize(("dry_run", "expected"), [("true", ["--dry-run"]), ("false", [])])
def test_the_lease_step_passes_its_inputs_to_the_script(
    tmp_path: Path, dry_run: str, expected: list[str]
) -> None:
    """The step's own shell, run under bash with `python` a stand-in that records its args."""
    step = next(s for s in workflow()["jobs"]["lease"]["steps"] if "scripts/ci/lease.py" in
                s.get("run", ""))  # fmt: skip
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/args\n')
    shim.chmod(0o755)
    env = {"PATH": f"{shim.parent}:/usr/bin:/bin", "DRY_RUN": dry_run, "GRACE_MINUTES": "45"}
    subprocess.run(["bash", "-euo", "pipefail", "-c", step["run"]], env=env, check=True,
                   timeout=30)  # fmt: skip
    args = (tmp_path / "args").read_text().split()
    assert args == ["scripts/ci/lease.py", "--grace-minutes", "45", *expected]


def test_a_run_installs_nothing_and_checks_out_only_what_lease_py_reads() -> None:
    steps = workflow()["jobs"]["lease"]["steps"]
    assert not [s for s in steps if "setup-python" in str(s.get("uses", ""))]
    assert not [s for s in steps if "pip" in str(s.get("run", ""))], "no install on a lease run"
    [checkout] = [s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert checkout["uses"] == "actions/checkout@v5"
    wanted = checkout["with"]
    assert wanted["fetch-depth"] == 1 and wanted["persist-credentials"] is False
    assert wanted["sparse-checkout-cone-mode"] is False, "the files themselves, not their folders"
    assert wanted["sparse-checkout"].split() == SPARSE
    assert workflow()["jobs"]["lease"]["timeout-minutes"] <= 5
    assert lease.MAX_WAIT_SECONDS + 2 * lease.TIMEOUT_SECONDS < 5 * 60, "waits fit the timeout"


SPARSE = [
    "scripts/ci/lease.py",
    "components/__init__.py",
    "components/spec/__init__.py",
    "components/spec/catalog.py",
    "scripts/clients/__init__.py",
    "scripts/clients/digitalocean.py",
    "scripts/clients/github.py",
    "scripts/clients/transport.py",
]


def test_the_sparse_checkout_runs_with_the_standard_library_alone(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    """The files the job checks out, run by a Python without site-packages (-S: no
    requests, nothing installed) and without this checkout on its path (-I): it still leases."""
    for name in SPARSE:
        (tmp_path / "repo" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / "repo" / name)
    expired = past_lease(api)
    token = api.account.add_token("lease", SCOPES)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "scripts/ci/lease.py", "--api-url", api.url],
        cwd=tmp_path / "repo", env={"PATH": os.environ["PATH"], "DIGITALOCEAN_TOKEN": token},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert expired.id not in api.account.droplets and "deleted" in done.stdout


def test_a_redirect_is_not_followed_so_the_token_stays_home(tmp_path: Path) -> None:
    """urllib would follow a 302 with the Authorization header: lease.py follows none."""
    elsewhere: list[str] = []

    class Catcher(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            elsewhere.append(self.headers.get("Authorization", ""))
            reply(self, 200, b'{"droplets": []}', "application/json")

    catcher = serve(Catcher)

    class Redirector(Catcher):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"{url(catcher)}/v2/droplets")
            self.send_header("Content-Length", "0")
            self.end_headers()

    redirector = serve(Redirector)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("DIGITALOCEAN_TOKEN", "dop_v1_secret")
            code = lease.main(["--api-url", url(redirector), "--summary",
                               str(tmp_path / "s.md")], sleep=lambda _: None)  # fmt: skip
    finally:
        stop(redirector)
        stop(catcher)
    assert elsewhere == [] and code == 1
    assert "HTTP 302" in (tmp_path / "s.md").read_text()


def test_the_step_status_reads_is_the_step_that_leases() -> None:
    steps = workflow()["jobs"]["lease"]["steps"]
    [named] = [s for s in steps if s.get("name") == lease.LEASE_STEP]
    assert "scripts/ci/lease.py" in named["run"] and "DIGITALOCEAN_TOKEN" in named["env"]


# ---- --status: is the schedule alive? (a fake GitHub with GitHub's own field names) ----------------


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as fake:
        yield fake


def status(github: FakeGitHub, token: str, *args: str, tmp_path: Path) -> tuple[int, str, str, str]:
    """lease.main --status in this process: its code, stdout, stderr and the summary."""
    summary = tmp_path / "status.md"
    summary.unlink(missing_ok=True)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GITHUB_TOKEN", token)
        env.delenv("GITHUB_ACTIONS", raising=False)
        env.delenv("GITHUB_STEP_SUMMARY", raising=False)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = lease.main(["--status", "--repo", github.repo, "--github-api-url", github.url,
                               "--summary", str(summary), *args],
                              clock=NOW.timestamp, sleep=lambda _: None)  # fmt: skip
    return code, out.getvalue(), err.getvalue(), summary.read_text() if summary.exists() else ""


def test_status_passes_when_the_schedule_ran_within_the_day_and_leased(
    github: FakeGitHub, tmp_path: Path
) -> None:
    github.add_run(NOW - timedelta(hours=30), has_token=True)
    github.add_run(NOW - timedelta(minutes=50), has_token=True)
    github.add_run(NOW - timedelta(minutes=5), event="workflow_dispatch")  # by hand: not the cron
    token = github.add_token("reader")
    code, out, err, text = status(github, token, tmp_path=tmp_path)
    assert code == 0, out + err
    assert "lease.yml on someone/nemotron-droplet: state `active`" in out
    assert "last scheduled run: lease (schedule)" in out and "50 min ago" in out
    assert "The schedule runs and does the lease's work." in text and err == ""
    base = f"/repos/{github.repo}/actions"
    assert [(r.method, r.path) for r in github.requests] == [
        ("GET", f"{base}/workflows/lease.yml"),
        ("GET", f"/repos/{github.repo}"),
        ("GET", f"{base}/workflows/lease.yml/runs"),
        ("GET", f"{base}/runs/{github.runs[1]['id']}/jobs"),
    ]
    assert github.requests[2].query == {"event": ["schedule"], "per_page": ["1"]}
    assert all(r.headers["x-github-api-version"] == "2022-11-28" for r in github.requests)
    assert all(r.headers["accept"] == "application/vnd.github+json" for r in github.requests)


@pytest.mark.parametrize(("private", "days", "warned"),
                         [(False, 52, True), (False, 30, False), (True, 200, False)])  # fmt: skip
def test_status_warns_before_github_disables_a_quiet_public_repositorys_schedule(
    github: FakeGitHub, tmp_path: Path, private: bool, days: int, warned: bool
) -> None:
    """GitHub disables a public repository's schedules after 60 days without activity: from 50
    days after the last push --status says so, while the schedule still runs. A private
    repository has no such rule."""
    github.private, github.pushed_at = private, NOW - timedelta(days=days)
    github.add_run(NOW - timedelta(minutes=50), has_token=True)
    code, out, err, _ = status(github, github.add_token("reader"), tmp_path=tmp_path)
    assert code == (1 if warned else 0), out + err
    said = f"no push to {github.repo} for {days} days: GitHub disables"
    assert (said in err) == warned, err
    assert (f"last push to {github.repo}: {days} day(s) ago" in out) == (not private), out


def test_keepalive_renews_an_active_schedule_and_leaves_a_persons_choice_alone(
    github: FakeGitHub,
) -> None:
    """Each lease run renews its own schedule (PUT .../enable, actions: write), the call the
    keepalive actions make so that a quiet repository's schedule is not disabled; a schedule a
    person disabled stays off."""
    writer = github.add_token("writer", actions="write")
    env = {"GITHUB_TOKEN": writer, "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, str(SCRIPT), "--keepalive", "--repo", github.repo,
            "--github-api-url", github.url]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0 and "enabled again" in done.stdout, done.stdout + done.stderr
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in github.requests] == [
        ("GET", "lease.yml"), ("PUT", "enable")]  # fmt: skip
    github.state = "disabled_manually"
    left = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=60)
    assert (
        left.returncode == 0 and "left alone" in left.stdout and github.state == "disabled_manually"
    )
    reader = {**env, "GITHUB_TOKEN": github.add_token("reader")}
    github.state = "active"
    refused = subprocess.run(argv, env=reader, capture_output=True, text=True, check=False,
                             timeout=60)  # fmt: skip
    assert refused.returncode != 0 and writer not in refused.stdout + refused.stderr


def test_status_fails_when_github_disabled_the_schedule_for_inactivity(
    github: FakeGitHub, tmp_path: Path
) -> None:
    github.state = "disabled_inactivity"
    github.add_run(NOW - timedelta(days=3))
    token = github.add_token("reader")
    code, _, err, text = status(github, token, tmp_path=tmp_path)
    assert code == 1
    assert "60 days without activity" in err
    assert f"gh workflow enable lease.yml --repo {github.repo}" in err
    assert "72 h 00 min old, more than 24 h" in err, "and its last run is three days old"
    assert "Not guarding:" in text
    assert "PUT" not in {r.method for r in github.requests}, "without --enable it only reads"


def test_status_enable_re_enables_only_with_a_token_that_may_write(
    github: FakeGitHub, tmp_path: Path
) -> None:
    github.state = "disabled_inactivity"
    github.add_run(NOW - timedelta(days=3))
    reader = github.add_token("reader")
    code, _, err, _ = status(github, reader, "--enable", tmp_path=tmp_path)
    assert code == 2 and "needs the scope actions: write" in err
    assert github.state == "disabled_inactivity"
    writer = github.add_token("writer", actions="write")
    code, out, err, _ = status(github, writer, "--enable", tmp_path=tmp_path)
    assert code == 0, err
    assert github.state == "active" and "re-enabled it" in out
    assert [r.method for r in github.requests].count("PUT") == 2


def test_status_enable_leaves_a_person_s_choice_alone(github: FakeGitHub, tmp_path: Path) -> None:
    github.state = "disabled_manually"
    github.add_run(NOW - timedelta(minutes=30))
    token = github.add_token("writer", actions="write")
    code, _, err, _ = status(github, token, "--enable", tmp_path=tmp_path)
    assert code == 1 and "someone disabled it" in err and github.state == "disabled_manually"
    assert "PUT" not in {r.method for r in github.requests}


def test_status_fails_when_the_last_scheduled_run_is_older_than_the_threshold(
    github: FakeGitHub, tmp_path: Path
) -> None:
    github.add_run(NOW - timedelta(hours=30))
    token = github.add_token("reader")
    code, _, err, _ = status(github, token, tmp_path=tmp_path)
    assert code == 1 and "30 h 00 min old, more than 24 h" in err
    assert "only autodown on the Droplet stops a forgotten one" in err
    code, _, err, _ = status(github, token, "--max-age-hours", "36", tmp_path=tmp_path)
    assert code == 0, err


def test_status_fails_when_the_runs_skip_the_lease_for_want_of_the_secret(
    github: FakeGitHub, tmp_path: Path
) -> None:
    """A run without DIGITALOCEAN_LEASE_TOKEN succeeds, and deletes nothing: its lease step is
    `skipped` (the fake's steps are lease.yml's own, decided by their `if:`)."""
    github.add_run(NOW - timedelta(minutes=20), has_token=False)
    token = github.add_token("reader")
    code, _, err, _ = status(github, token, tmp_path=tmp_path)
    assert code == 1
    assert f"the lease is off: that run skipped '{lease.LEASE_STEP}'" in err
    assert "DIGITALOCEAN_LEASE_TOKEN is not set" in err


@pytest.mark.parametrize("conclusion", ["failure", "timed_out", "cancelled", "startup_failure"])
def test_status_fails_when_the_last_scheduled_run_did_not_succeed(
    github: FakeGitHub, tmp_path: Path, conclusion: str
) -> None:
    run = github.add_run(NOW - timedelta(minutes=20), conclusion=conclusion)
    token = github.add_token("reader")
    code, _, err, _ = status(github, token, tmp_path=tmp_path)
    assert code == 1 and f"ended `{conclusion}`" in err and run["html_url"] in err


def test_status_of_a_run_still_going_is_not_a_failure(github: FakeGitHub, tmp_path: Path) -> None:
    github.add_run(NOW - timedelta(minutes=1), status="in_progress")
    token = github.add_token("reader")
    code, out, err, _ = status(github, token, tmp_path=tmp_path)
    assert code == 0, err
    assert "that run has not finished" in out
    assert not [r for r in github.requests if r.path.endswith("/jobs")]


def test_status_fails_when_the_schedule_never_ran(github: FakeGitHub, tmp_path: Path) -> None:
    github.add_run(NOW - timedelta(minutes=5), event="workflow_dispatch")
    token = github.add_token("reader")
    code, _, err, _ = status(github, token, tmp_path=tmp_path)
    assert code == 1 and "has never run on its schedule" in err
    assert f"gh workflow run lease.yml --repo {github.repo} -f dry_run=true" in err


def test_status_names_a_bad_token_and_a_repository_it_cannot_see(
    github: FakeGitHub, tmp_path: Path
) -> None:
    code, _, err, _ = status(github, "ghs_not_a_token", tmp_path=tmp_path)
    assert code == 2 and "GITHUB_TOKEN: GitHub refused it (HTTP 401)" in err
    token = github.add_token("reader")
    # A repository the token cannot see, or one without lease.yml: GitHub's 404 either way.
    code, _, err, _ = status(github, token, "--repo", "someone/elsewhere", tmp_path=tmp_path)
    assert code == 2 and "GitHub answers 404 to both" in err


def test_the_status_cli_keeps_the_token_out_of_argv_and_output(
    github: FakeGitHub, tmp_path: Path
) -> None:
    github.add_run(NOW - timedelta(days=2), has_token=False)
    github.state = "disabled_inactivity"
    token = github.add_token("reader")
    summary = tmp_path / "step-summary.md"
    base = {"PATH": os.environ["PATH"], "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": github.repo}  # fmt: skip
    command = [sys.executable, str(SCRIPT), "--status", "--github-api-url", github.url]
    done = subprocess.run(command, env={**base, "GITHUB_TOKEN": token}, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "::warning title=lease::lease.yml is `disabled_inactivity`" in done.stdout
    assert "::warning title=lease::the lease is off" in done.stdout, "an annotation on the run"
    assert token not in done.stdout + done.stderr + summary.read_text()
    assert all(r.headers["authorization"] == f"Bearer {token}" for r in github.requests)
    unset = subprocess.run(command, env=base, capture_output=True, text=True, timeout=60,
                           check=False)  # fmt: skip
    assert unset.returncode == 2 and "GITHUB_TOKEN is not set" in unset.stderr
    plain = [sys.executable, str(SCRIPT), "--status", "--github-api-url", "http://api.github.com"]
    done = subprocess.run(plain, env={**base, "GITHUB_TOKEN": token}, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "HTTPS only" in done.stderr


@pytest.mark.parametrize(
    "args", [["--repo", "not a repo"], ["--max-age-hours", "nan"], ["--dry-run"]]
)
def test_status_refuses_arguments_it_cannot_use(
    github: FakeGitHub, tmp_path: Path, args: list[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        status(github, github.add_token("reader"), *args, tmp_path=tmp_path)
    assert refused.value.code == 2 and github.requests == []


def test_enable_is_only_for_status(api: DigitalOceanAPI, tmp_path: Path) -> None:
    token = api.account.add_token("lease", SCOPES)
    with pytest.raises(SystemExit) as refused:
        run(api, token, "--enable", tmp_path=tmp_path)
    assert refused.value.code == 2 and api.requests == []
