"""scripts/ci/real_run.py and .github/workflows/real-run.yml: the real run on a user's account.

Nothing here reaches a cloud: the plan's arithmetic and the stack file it writes (checked by
components.validate), the Pulumi steps against a fake `pulumi` on PATH that keeps a stack's state
in a file, the summary from every combination of missing inputs, and the workflow's own `run:`
lines, in order, against that fake and the fake OpenAI server (the real smoke, bench and timeline
tools). Everything is written under tmp_path.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_pulumi import FakePulumi, clean_env
from test_tools import fake_server

from components.spec import catalog
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


# ---- plan ------------------------------------------------------------------------------------


@pytest.fixture
def stacks(tmp_path: Path) -> Path:
    """A stacks folder with the dev stack file in it, as shipped."""
    d = tmp_path / "stacks"
    d.mkdir()
    shutil.copy(ROOT / "stacks" / "Pulumi.dev.yaml", d)
    return d


def plan(
    stacks: Path, out: Path, cap: str, *more: str, name: str = "real-run-1-1"
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    github_output = out / "github_output"
    out.mkdir(parents=True, exist_ok=True)
    proc = real_run(
        "plan", "--cost-cap", cap, "--name", name, "--stacks", str(stacks), "--out-dir", str(out),
        *more, env=clean_env(GITHUB_OUTPUT=str(github_output)),
    )  # fmt: skip
    return proc, read_outputs(github_output)


def validate(stack: str, stacks: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "components.validate", "--stack", stack, "--stacks", str(stacks)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )


def test_plan_writes_a_throwaway_stack_that_validates(stacks: Path, tmp_path: Path) -> None:
    proc, out = plan(stacks, tmp_path / "run", "5")
    assert proc.returncode == 0, proc.stderr
    assert out["stack"] == "real-run-1-1"
    assert out["size"] == "gpu-4000adax1-20gb"
    assert out["price"] == "0.76"  # components/spec/catalog.py's list price
    written = stacks / "Pulumi.real-run-1-1.yaml"
    checked = validate("real-run-1-1", stacks)
    assert checked.returncode == 0, checked.stderr
    config = yaml.safe_load(written.read_text())["config"]
    dev = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())["config"]
    autodown = config["nemotron-droplet:autodown"]
    assert autodown == {"idleMinutes": 30, "maxHours": float(out["max-hours"])}
    for section in ("model", "vllm", "bootstrap", "access"):
        assert config[f"nemotron-droplet:{section}"] == dev[f"nemotron-droplet:{section}"]
    assert config["nemotron-droplet:droplet"]["tags"] == ["env:real-run"]
    # The dev stack's own file is untouched, and nothing was written beside the plan's files.
    assert (stacks / "Pulumi.dev.yaml").read_text() == (
        ROOT / "stacks" / "Pulumi.dev.yaml"
    ).read_text()
    assert sorted(p.name for p in stacks.iterdir()) == ["Pulumi.dev.yaml", written.name]


def test_plan_leaves_out_secrets_and_what_would_collide_with_the_source(
    stacks: Path, tmp_path: Path
) -> None:
    source = yaml.safe_load((stacks / "Pulumi.dev.yaml").read_text())
    config = source["config"]
    config["nemotron-droplet:hfToken"] = {"secure": "v1:SECRETHF"}
    config["nemotron-droplet:droplet"]["name"] = "my-dev-droplet"
    config["nemotron-droplet:access"]["domain"] = "llm.example.com"
    config["nemotron-droplet:access"]["dnsZone"] = "example.com"
    config["nemotron-droplet:autodown"].update(token={"secure": "v1:SECRETDO"}, dryRun=True)
    config["nemotron-droplet:cache"] = {"sizeGb": 58, "keepOnDestroy": True}
    config["nemotron-droplet:replicas"] = 3
    config["nemotron-droplet:wake"] = {"enabled": True, "githubRepo": "me/llm",
                                       "token": {"secure": "v1:SECRETWAKE"}}  # fmt: skip
    source["encryptionsalt"] = "v1:SALT"
    (stacks / "Pulumi.dev.yaml").write_text(yaml.safe_dump(source))
    proc, _ = plan(stacks, tmp_path / "run", "5")
    assert proc.returncode == 0, proc.stderr
    text = (stacks / "Pulumi.real-run-1-1.yaml").read_text()
    for gone in ("SECRET", "SALT", "secure", "my-dev-droplet", "example.com"):
        assert gone not in text
    written = yaml.safe_load(text)
    assert set(written) == {"config"}
    config = written["config"]
    assert not {"hfToken", "cache", "replicas", "wake"} & {k.split(":")[1] for k in config}
    assert "name" not in config["nemotron-droplet:droplet"]
    assert set(config["nemotron-droplet:autodown"]) == {"idleMinutes", "maxHours"}
    assert validate("real-run-1-1", stacks).returncode == 0


def test_the_cold_start_counts_the_weights_the_stack_serves(stacks: Path, tmp_path: Path) -> None:
    """The weights' download is the part of the cold start a stack sizes: its model.diskGb, the
    catalog's size of its model, the default model's when it names none."""

    def cold(model: dict[str, object] | None) -> tuple[int, str]:
        source = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
        if model is None:
            source["config"].pop("nemotron-droplet:model")
        else:
            source["config"]["nemotron-droplet:model"] = model
        (stacks / "Pulumi.dev.yaml").write_text(yaml.safe_dump(source))
        runs = len(list(tmp_path.glob("run-*")))
        out = tmp_path / f"run-{runs}"
        proc, _ = plan(stacks, out, "50", name=f"real-run-1-{runs + 1}")
        assert proc.returncode == 0, proc.stderr
        p = json.loads((out / "plan.json").read_text())
        return p["cold_start_minutes"], proc.stdout + proc.stderr

    default_gb = catalog.MODELS[catalog.DEFAULT_MODEL].disk_gb
    unnamed, said = cold(None)
    assert f"{default_gb} GB of weights" in said
    big, said = cold({"id": "someorg/big-model", "vramGb": 18, "diskGb": 400})
    assert "400 GB of weights" in said
    # 400 GB against the default's at 100 MB/s: the difference, in whole minutes.
    assert big - unnamed == math.ceil(400_000 / 100 / 60) - math.ceil(default_gb * 1000 / 100 / 60)


def test_a_cap_below_the_minimum_is_refused_naming_the_minimum(
    stacks: Path, tmp_path: Path
) -> None:
    proc, out = plan(stacks, tmp_path / "run", "0.5")
    assert proc.returncode == 2
    assert out == {}
    assert not (stacks / "Pulumi.real-run-1-1.yaml").exists()
    message = proc.stderr
    assert "--cost-cap 0.5: $0.50 buys 39 min of gpu-4000adax1-20gb at $0.76/hour" in message
    # What the minimum is made of, named as estimates, with its source.
    assert "cold start, an estimate" in message
    assert "docs/cache.md, Where the minutes go" in message
    minimum = re.search(r"Accepted: a cap of (\d+\.\d\d) or more", message)
    assert minimum, message
    # The minimum is exact: a cent less is refused, the minimum itself is accepted.
    below = f"{float(minimum[1]) - 0.01:.2f}"
    assert plan(stacks, tmp_path / "below", below, name="real-run-2")[0].returncode == 2
    proc, out = plan(stacks, tmp_path / "at", minimum[1], name="real-run-3")
    assert proc.returncode == 0, proc.stderr
    assert validate("real-run-3", stacks).returncode == 0


@pytest.mark.parametrize(
    ("cap", "size"),
    [
        ("1", None),
        ("2.5", None),
        ("5", None),
        ("60", None),
        ("5", "gpu-h100x1-80gb"),
        ("40", "gpu-h100x8-640gb"),
    ],
)
def test_every_bound_stays_inside_the_cap(
    stacks: Path, tmp_path: Path, cap: str, size: str | None
) -> None:
    proc, out = plan(stacks, tmp_path / "run", cap, *(["--size", size] if size else []))
    assert proc.returncode == 0, proc.stderr
    p = json.loads((tmp_path / "run" / "plan.json").read_text())
    price, budget = p["price"], p["budget_minutes"]
    assert budget == math.floor(float(cap) / price * 60)
    # The Droplet exists at most from up's start to destroy's end: the sum of those steps'
    # timeouts, which the cap pays for.
    steps = ("up_step", "smoke", "bench", "outputs", "timeline", "destroy")
    droplet = sum(p[f"{s}_minutes"] for s in steps)
    assert droplet == p["droplet_minutes"] <= budget
    assert price * droplet / 60 <= float(cap)
    assert p["up_step_minutes"] > p["up_minutes"] >= p["cold_start_minutes"]
    # The job leaves room for everything after up, destroy included, and stays within GitHub's
    # six hours.
    assert droplet + 5 < p["job_minutes"] <= 360
    # autodown.maxHours counts from the first bootstrap (after the Droplet exists): it never
    # cuts the run's steps short, and the Droplet is gone before the cap is spent.
    max_minutes = p["max_hours"] * 60
    assert droplet - p["destroy_minutes"] <= max_minutes <= budget - 3 - 2
    # The lease (scripts/ci/lease.py) counts whole minutes, rounded up, from the Droplet's creation.
    assert math.ceil(round(max_minutes, 6)) <= budget
    assert out["max-hours"] == f"{p['max_hours']:g}"
    assert out["up-step-minutes"] == str(p["up_step_minutes"])
    assert out["job-minutes"] == str(p["job_minutes"])
    assert validate("real-run-1-1", stacks).returncode == 0


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--size", "gpu-mi300x1-192gb"], "an AMD (ROCm) size; accepted: gpu-4000adax1-20gb"),
        (["--size", "gpu-nope"], "not a size the catalog knows; accepted: gpu-4000adax1-20gb"),
        (["--size", "gpu-h200x1-141gb"], "has no list price for it; pass --price USD_PER_HOUR"),
        (["--name", "dev"], "stacks/Pulumi.dev.yaml exists; a real run never overwrites"),
        (["--name", "no/slash"], "accepted: letters, digits and dashes"),
        (["--stack-from", "missing"], "--stack-from missing: cannot read"),
        (["--cost-cap", "five"], "'five': accepted: a positive number, like 5 or 2.50"),
        (["--cost-cap", "-1"], "'-1': accepted: a positive number"),
    ],
)
def test_plan_names_the_bad_input_and_what_is_accepted(
    stacks: Path, tmp_path: Path, args: list[str], complaint: str
) -> None:
    base = {"--cost-cap": "5", "--name": "real-run-1", "--size": None, "--stack-from": None}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    argv = [x for k, v in base.items() if v is not None for x in (k, v)]
    proc = real_run("plan", *argv, "--stacks", str(stacks), "--out-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert complaint in proc.stderr
    assert sorted(p.name for p in stacks.iterdir()) == ["Pulumi.dev.yaml"]


# What the plan step may import: the plan job installs PyYAML alone (real-run.yml).
PLAN_JOB_GUARD = """\
import importlib.abc, runpy, sys
allowed = set(sys.stdlib_module_names) | {"yaml", "_yaml"} | set(sys.argv[1].split(","))
class PlanJobHasNot(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in allowed:
            raise ModuleNotFoundError(f"the plan job has no {name}")
sys.meta_path.insert(0, PlanJobHasNot())
script = sys.argv[2]
sys.path.insert(0, script.rsplit("/", 1)[0])
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def test_the_plan_step_needs_python_and_pyyaml_only(stacks: Path, tmp_path: Path) -> None:
    """The plan job has Python and PyYAML: the command line and the plan step import nothing
    else but the project's own modules (the summary's tools, rich among them, come lazily)."""
    own = {p.stem for p in (ROOT / "scripts").glob("*.py")} | {"components", "realrun"}
    own |= {p.stem for p in (ROOT / "scripts" / "ci").glob("*.py")}  # lease.py: stdlib only
    own.add("clients")  # scripts/clients/: stdlib only (tests/test_layout.py holds it)
    proc = subprocess.run(
        [sys.executable, "-c", PLAN_JOB_GUARD, ",".join(sorted(own)), str(SCRIPT),
         "plan", "--cost-cap", "5", "--name", "real-run-1-1", "--stacks", str(stacks),
         "--out-dir", str(tmp_path / "run")],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (stacks / "Pulumi.real-run-1-1.yaml").exists()


def test_the_command_line_offers_the_programs_platforms() -> None:
    """real_run.py spells the platforms out (the plan job imports no pydantic before a
    Kubernetes plan): the same as the stack config's."""
    spelt = re.search(r"^PLATFORMS = (\(.*\))$", SCRIPT.read_text(), re.M)
    assert spelt is not None and ast.literal_eval(spelt[1]) == PLATFORMS


def test_a_size_without_a_list_price_takes_price(stacks: Path, tmp_path: Path) -> None:
    proc, out = plan(stacks, tmp_path / "run", "20", "--size", "gpu-h200x1-141gb", "--price", "4")
    assert proc.returncode == 0, proc.stderr
    assert out["price"] == "4"
    assert out["budget-minutes"] == "300"


# ---- the Pulumi steps against a fake CLI ----------------------------------------------------


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


def test_up_past_its_minutes_is_interrupted_so_pulumi_can_save_its_state(tmp_path: Path) -> None:
    fake = FakePulumi(tmp_path, up_seconds=30)
    fake.add_stack("rr-1", resources=0)
    proc = real_run(
        "up", "--stack", "rr-1", "--minutes", "0.02", "--grace-minutes", "0.5", env=fake.env()
    )
    assert proc.returncode == 1
    assert "pulumi up ran past its 0.02 minutes" in proc.stderr
    assert "interrupted so that it saved its state and released the stack's lock" in proc.stderr
    assert fake.data["calls"][-1].get("interrupted") is True  # SIGINT, not a kill


def test_up_cancelled_by_the_runner_passes_one_interrupt_on(tmp_path: Path) -> None:
    """The runner cancels a step with SIGINT, then SIGTERM: either reaches Pulumi as the one
    SIGINT that lets it save its state."""
    fake = FakePulumi(tmp_path, up_seconds=30)
    fake.add_stack("rr-1", resources=0)
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "up", "--stack", "rr-1", "--minutes", "5"],
        env=fake.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not fake.calls() and time.monotonic() < deadline:
            time.sleep(0.05)  # the fake has started `up`
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1
    assert "pulumi up was cancelled: interrupted so that it saved its state" in err
    assert fake.data["calls"][-1].get("interrupted") is True


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


# ---- cleanup ---------------------------------------------------------------------------------


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


# ---- summary ---------------------------------------------------------------------------------

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
SMOKE = """\
PASS models              3 ms  lists nemotron
PASS chat               28 ms  16 tokens: 'hello'
all checks passed
"""
LEVEL = {
    "mode": "closed", "concurrency": 1, "request_rate": None, "requests": 16, "errors": 0,
    "ttft_ms": {"p50": 41.5, "p99": 80.25}, "itl_ms": {"p50": 12.0, "p99": 15.0},
    "tpot_ms": {"p50": 12.5, "p99": 14.0}, "e2e_ms": {"p50": 1640.0, "p99": 1700.0},
    "requests_per_s": 0.61, "output_tokens_per_s": 78.4, "total_tokens_per_s": 390.2,
    "aborted": None, "errors_by_kind": {},
}  # fmt: skip
BENCH = {
    "tool": "nemotron-droplet scripts/bench.py",
    "model": "nemotron",
    "settings": {"requests": 16, "input_tokens": 512, "max_tokens": 128},
    "levels": [LEVEL, {**LEVEL, "concurrency": 8, "errors": 2, "errors_by_kind": {"timeout": 2}}],
}
STARTED = 1_767_000_000


def run_dir(tmp_path: Path, outputs: dict[str, Any] | None = None) -> Path:
    """Every file a complete run leaves."""
    d = tmp_path / "run"
    d.mkdir(parents=True, exist_ok=True)
    (d / "outputs.json").write_text(json.dumps(OUTPUTS if outputs is None else outputs))
    (d / "smoke.txt").write_text(SMOKE)
    (d / "bench.json").write_text(json.dumps(BENCH))
    (d / "timeline.png").write_bytes(b"\x89PNG fake")
    (d / "plan.json").write_text(
        json.dumps({"stack": "real-run-9-1", "size": "gpu-4000adax1-20gb"})
    )
    (d / "cleanup.json").write_text(
        json.dumps({"found": True, "destroyed": True, "message": "destroyed and removed stack x"})
    )
    return d


def summary(
    d: Path, started: str = str(STARTED), ended: str = str(STARTED + 1800), price: str = "0.76"
) -> str:
    proc = real_run(
        "summary", "--out-dir", str(d), "--started", started, "--ended", ended, "--price", price,
        "--cap", "5",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def test_summary_of_a_complete_run(tmp_path: Path) -> None:
    text = summary(run_dir(tmp_path))
    assert "## Real run: `real-run-9-1`" in text
    assert "Size `gpu-4000adax1-20gb` in `tor1`, model `nemotron`; smoke: passed." in text
    assert "Autodown: `delete`, idleMinutes 30, maxHours 2.6666." in text
    assert "PASS chat               28 ms  16 tokens: 'hello'" in text  # the lines, as printed
    # bench.py's own rows (bench_report.rows), as Markdown.
    assert "| conc | ok/err | TTFT | ITL | TPOT | E2E | req/s | out tok/s | tot tok/s |" in text
    assert (
        "| 1 | 16/0 | 41.5 / 80.2 | 12.0 / 15.0 | 12.5 / 14.0 | 1,640.0 / 1,700.0 | 0.6 | 78.4 | "
        "390.2 |"
    ) in text
    assert "| 8 | 14/2 |" in text
    assert "conc 8 errors: {'timeout': 2}" in text
    assert "destroyed and removed stack x" in text
    # The timeline as text (the picture cannot be shown in a summary), critical path in full
    # blocks, a phase without times named.
    assert "The bootstrap took 430 s" in text
    assert re.search(r"^driver +10 +300\.0  +█+$", text, re.M), text
    assert re.search(r"^model +70 +140\.0  +▒+$", text, re.M), text
    # timeline.py's own lines: the download against the link, the disks preflight saw.
    assert "  model        fetched 8.00 GB in 140.0 s (57 MB/s); at 10 Gbit/s: 6.4 s" in text
    assert "  preflight    vda            720 GiB  mounted at /" in text
    assert "No times recorded for: gateway." in text
    assert "`timeline.png` in this run's artifact" in text
    assert "GitHub strips `data:` images" in text
    assert "Missing" not in text


def test_summary_cost_at_the_live_price_per_second_and_by_the_hour(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    text = summary(d)
    # 30 minutes at the exported $0.76/hour: $0.38; by the started hour: $0.76.
    assert "**About $0.38** of the $5.00 cap: 30 min 0 s" in text
    assert "the live price the stack exported (`hourlyPriceUsd`), per second." in text
    assert "Billed by the started hour instead: $0.76." in text
    # No live price: the plan's list price.
    no_price = {k: v for k, v in OUTPUTS.items() if k != "hourlyPriceUsd"}
    text = summary(run_dir(tmp_path / "b", no_price), price="1.2")
    assert "**About $0.60**" in text
    assert "the size's list price (components/spec/catalog.py)" in text
    # A run of seconds costs DigitalOcean's minimum of 60 seconds: $0.0127, up to the cent.
    assert "**About $0.02**" in summary(d, ended=str(STARTED + 5), price="0.76")


def test_summary_reads_only_the_outputs_it_shows(tmp_path: Path) -> None:
    """Even were the outputs saved with their secrets (the outputs step leaves them out), the
    summary reads only the keys it shows."""
    d = run_dir(tmp_path)
    summary_file = tmp_path / "step-summary.md"
    proc = real_run(
        "summary", "--out-dir", str(d), "--started", str(STARTED), "--ended", str(STARTED + 60),
        env=clean_env(GITHUB_STEP_SUMMARY=str(summary_file)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # to the step summary, not the log
    text = summary_file.read_text()
    assert "## Real run: `real-run" in text
    for secret in (KEY, SSH_KEY, "FAKEKEYMATERIAL"):
        assert secret not in text
    assert "203.0.113.7" not in text  # keys the summary does not show are not read


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("outputs.json", "the outputs step (after a successful `pulumi up`) did not run"),
        ("smoke.txt", "the smoke step (after a successful `pulumi up`) did not run or failed"),
        ("bench.json", "the bench step (after a successful `pulumi up`) did not run or failed"),
        ("timeline.png", "the timeline step (from the outputs) did not run or failed"),
        ("plan.json", "the plan step did not run or failed"),
        ("cleanup.json", "the destroy step did not run or failed"),
    ],
)
def test_summary_says_which_input_is_missing_and_why(tmp_path: Path, name: str, says: str) -> None:
    d = run_dir(tmp_path)
    (d / name).unlink()
    text = summary(d)
    assert f"_Missing: `{d / name}`: it was not written: {says}" in text
    if name == "cleanup.json":
        assert "**Check that nothing is left**" in text


def test_summary_of_a_run_that_created_nothing(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    text = summary(d, started="", ended="", price="")
    assert "$0.00: nothing was created" in text
    assert text.count("_Missing:") >= 5


def test_summary_when_destroy_did_not_finish_warns_the_droplet_may_still_bill(
    tmp_path: Path,
) -> None:
    d = run_dir(tmp_path)
    (d / "cleanup.json").write_text(json.dumps({"found": True, "destroyed": False, "message": "x"}))
    text = summary(d, ended="")
    assert "the Droplet may still exist and bill" in text


def test_summary_survives_inputs_that_are_not_what_they_should_be(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    (d / "outputs.json").write_text("[1, 2")
    (d / "bench.json").write_text(json.dumps({"levels": "no"}))
    (d / "smoke.txt").write_text("")
    text = summary(d)
    assert f"_Missing: `{d / 'outputs.json'}`: not JSON" in text
    assert "not a bench.py result file (no levels)" in text
    assert "empty: smoke.py printed nothing" in text
    (d / "bench.json").write_text(json.dumps({"levels": [{"mode": "closed", "concurrency": 1}]}))
    assert "not a bench.py result file (a level has no 'requests')" in summary(d)


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


def test_every_timeout_comes_from_the_plan_and_the_job_leaves_room_for_destroy(
    stacks: Path, tmp_path: Path
) -> None:
    wf = workflow()
    plan_job, run_job = wf["jobs"]["plan"], wf["jobs"]["run"]
    assert run_job["needs"] == "plan"
    assert run_job["timeout-minutes"] == "${{ fromJSON(needs.plan.outputs.job-minutes) }}"
    assert step("run", "up")["timeout-minutes"] == (
        "${{ fromJSON(needs.plan.outputs.up-step-minutes) }}"
    )
    assert '--minutes "$UP_MINUTES"' in step("run", "up")["run"]
    assert step("run", "up")["env"]["UP_MINUTES"] == "${{ needs.plan.outputs.up-minutes }}"
    # The plan job's outputs are the plan step's.
    for key, value in plan_job["outputs"].items():
        assert value == f"${{{{ steps.plan.outputs.{key} }}}}"
    # With a real plan's numbers: the job's timeout holds every step's timeout after setup.
    _, out = plan(stacks, tmp_path / "run", "5")
    total = 0
    for s in steps_of("run"):
        timeout = str(s.get("timeout-minutes", ""))
        if m := re.fullmatch(r"\$\{\{ fromJSON\(needs\.plan\.outputs\.([a-z-]+)\) \}\}", timeout):
            assert m[1] in plan_job["outputs"], m[1]
            total += int(out[m[1]])
        elif timeout:
            total += int(timeout)
    setup = 20  # realrun/plan.py's SETUP_MINUTES: checkout, virtualenvs, the CLI
    assert total + setup <= int(out["job-minutes"])


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
            assert s["run"].split()[0] in ("python", "venv/bin/python"), s["run"]
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
    for folder in ("scripts", "components", "stacks", "locks"):
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
