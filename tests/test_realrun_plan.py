"""scripts/ci/realrun/plan.py through `real_run.py plan`: every bound of the run from the cost
cap and the size's list price (each step's timeout, the job's, autodown.maxHours), the throwaway
stack file (the source stack's non-secret config, checked by components.validate), a cap too
small and every bad input refused before anything is written, and the plan job's imports
(Python and PyYAML). Everything is written under tmp_path.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_pulumi import clean_env
from test_real_run import ROOT, SCRIPT, read_outputs, real_run, step, steps_of, workflow

from components.spec import catalog


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
    own = {p.stem for p in (ROOT / "scripts").glob("*.py")} | {"components", "realrun", "nemodrop"}
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


def test_a_size_without_a_list_price_takes_price(stacks: Path, tmp_path: Path) -> None:
    proc, out = plan(stacks, tmp_path / "run", "20", "--size", "gpu-h200x1-141gb", "--price", "4")
    assert proc.returncode == 0, proc.stderr
    assert out["price"] == "4"
    assert out["budget-minutes"] == "300"


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
