"""scripts/ci/realrun/kubeplan.py through `real_run.py plan --platform kubernetes` (issue 43):
the kube example on one GPU node, its bound from the cap at the cluster's hourly price part by
part, the refusals before anything is written (a cap too small, digests missing or malformed),
and the plan job's imports (PyYAML and pydantic). Nothing reaches a cloud.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from fake_pulumi import clean_env
from test_real_run import ROOT, SCRIPT, read_outputs, real_run, steps_of
from test_realrun_plan import PLAN_JOB_GUARD, validate

from components.spec import catalog

DIGEST = "sha256:" + "ab" * 32


DIGEST_FLAGS = ("--image-digest", "--edge-image-digest", "--epp-image-digest",
                "--proxy-image-digest")  # fmt: skip


ALL_DIGESTS = [x for flag in DIGEST_FLAGS for x in (flag, DIGEST)]


# Known prices in: an H100 node, one CPU node's hour, DigitalOcean's billing month.
H100 = 3.39


CPU_HOUR = 0.036


@pytest.fixture
def stacks(tmp_path: Path) -> Path:
    """A stacks folder with the kube example in it, as shipped."""
    d = tmp_path / "stacks"
    d.mkdir()
    shutil.copy(ROOT / "stacks" / "Pulumi.kube.yaml", d)
    return d


def kube_plan(
    stacks: Path, out: Path, cap: str, *more: str, name: str = "real-run-1-1"
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    github_output = out / "github_output"
    out.mkdir(parents=True, exist_ok=True)
    proc = real_run(
        "plan", "--platform", "kubernetes", "--cost-cap", cap, "--name", name, "--stacks",
        str(stacks), "--out-dir", str(out), *more,
        env=clean_env(GITHUB_OUTPUT=str(github_output)),
    )  # fmt: skip
    return proc, read_outputs(github_output)


def expected_hourly(ha: bool = False) -> float:
    """The cluster's hour at the known prices, stated here part by part: one H100 node, two
    CPU nodes, a one-node Load Balancer ($10 a month), 101 GiB of Volumes (the edge's 1 and one
    server's 100) at $0.10 a GiB-month, the HA control plane's $40 a month, over 672 hours."""
    month = 672
    return H100 + 2 * CPU_HOUR + 10 / month + 101 * 0.10 / month + (40 / month if ha else 0)


@pytest.mark.parametrize("ha", [False, True])
@pytest.mark.parametrize("cap", ["5", "10", "40"])
def test_a_kube_plan_bounds_every_step_inside_the_cap(
    stacks: Path, tmp_path: Path, cap: str, ha: bool
) -> None:
    if ha:
        path = stacks / "Pulumi.kube.yaml"
        path.write_text(path.read_text().replace("ha: false", "ha: true"))
    proc, out = kube_plan(stacks, tmp_path / "run", cap, "--price", str(H100), "--cpu-price",
                          str(CPU_HOUR), *ALL_DIGESTS)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    p = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert p["platform"] == "kubernetes" and out["platform"] == "kubernetes"
    assert p["price"] == pytest.approx(expected_hourly(ha), abs=5e-5)
    parts = p["hourly_parts"]
    assert parts["gpuNodes"] == H100
    assert parts["controlPlane"] == pytest.approx(40 / 672 if ha else 0, abs=1e-5)
    assert sum(parts.values()) == pytest.approx(p["price"], abs=1e-4)
    assert p["budget_minutes"] == math.floor(float(cap) / p["price"] * 60)
    # The cluster exists at most from up's start to destroy's end: the sum of those steps'
    # timeouts, which the cap pays for at the whole cluster's price.
    steps = ("up_step", "smoke", "bench", "outputs", "timeline", "destroy")
    billed = sum(p[f"{s}_minutes"] for s in steps)
    assert billed == p["droplet_minutes"] <= p["budget_minutes"]
    assert p["price"] * billed / 60 <= float(cap)
    assert p["up_step_minutes"] > p["up_minutes"] >= p["cold_start_minutes"]
    assert billed + 5 < p["job_minutes"] <= 360
    # No autodown on Kubernetes: no maxHours to give; the cleanup step gets the cluster's name.
    assert p["max_hours"] is None and "max-hours" not in out
    assert out["cluster"] == p["cluster"] == "nemotron-real-run-1-1"
    # The stack file: the kube example on one GPU node from the start, the digests in, and the
    # program's own validation passes it.
    written = yaml.safe_load((stacks / "Pulumi.real-run-1-1.yaml").read_text())["config"]
    kube = written["nemotron-droplet:kubernetes"]
    assert kube["gpuPool"] == {"size": "gpu-h100x1-80gb", "minNodes": 1, "maxNodes": 1}
    assert kube["replicas"] == {"min": 1, "max": 1}
    assert kube["imageDigest"] == kube["edge"]["imageDigest"] == DIGEST
    assert kube["router"] == {"eppImageDigest": DIGEST, "proxyImageDigest": DIGEST}
    assert kube["ha"] is ha
    assert written["nemotron-droplet:platform"] == "kubernetes"
    assert not any(k.endswith((":autodown", ":droplet")) for k in written)
    checked = validate("real-run-1-1", stacks)
    assert checked.returncode == 0, checked.stderr
    assert "1 to 1 x gpu-h100x1-80gb" in checked.stdout


def test_the_kube_plan_prices_the_cpu_pool_from_the_list_price_by_default(
    stacks: Path, tmp_path: Path
) -> None:
    """Without --price/--cpu-price: the catalog's H100 price and spec/kube.py's CPU list price,
    the figures the docs' worked cost uses."""
    proc, _ = kube_plan(stacks, tmp_path / "run", "10", *ALL_DIGESTS)
    assert proc.returncode == 0, proc.stderr
    p = json.loads((tmp_path / "run" / "plan.json").read_text())
    h100 = catalog.SIZES["gpu-h100x1-80gb"].list_price_usd_hour
    assert p["hourly_parts"]["gpuNodes"] == h100
    assert p["hourly_parts"]["cpuPool"] == pytest.approx(2 * 24 / 672, abs=1e-5)
    assert p["hourly_parts"]["loadBalancer"] == catalog.lb_hourly_price(1)
    # docs/ci.md's worked figure says these numbers.
    doc = (ROOT / "docs" / "ci.md").read_text()
    assert f"${p['price']:.2f}/hour" in doc
    assert f"${p['min_cost']:.2f}" in doc
    assert f"{p['min_minutes']} min" in doc


def test_a_cap_below_a_cluster_run_is_refused_naming_what_the_minimum_is(
    stacks: Path, tmp_path: Path
) -> None:
    proc, out = kube_plan(stacks, tmp_path / "run", "2", *ALL_DIGESTS)
    assert proc.returncode == 2
    assert out == {}
    assert sorted(p.name for p in stacks.iterdir()) == ["Pulumi.kube.yaml"]
    message = proc.stderr
    assert "--cost-cap 2: $2.00 buys" in message and "min of a cluster at $" in message
    # What the hour is made of, and what the minimum is: the wake budget's parts, named.
    for part in ("gpuNodes $3.39", "cpuPool $", "loadBalancer $", "volumes $", "GPU node joins 5",
                 "image pull", "GB of weights from the Hub", "vLLM starts 4",
                 "docs/kubernetes.md, What a wake costs in time", "destroy 25"):  # fmt: skip
        assert part in message, part
    minimum = re.search(r"Accepted: a cap of (\d+\.\d\d) or more", message)
    assert minimum, message
    below = f"{float(minimum[1]) - 0.01:.2f}"
    assert (
        kube_plan(stacks, tmp_path / "below", below, *ALL_DIGESTS, name="rr-2")[0].returncode == 2
    )
    proc, _ = kube_plan(stacks, tmp_path / "at", minimum[1], *ALL_DIGESTS, name="rr-3")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("given", "complaints"),
    [
        ([], ["missing: kubernetes.imageDigest (--image-digest or the repository variable "
              "KUBE_IMAGE_DIGEST)", "kubernetes.edge.imageDigest (--edge-image-digest",
              "kubernetes.router.eppImageDigest (--epp-image-digest", "KUBE_PROXY_IMAGE_DIGEST"]),
        (["--image-digest", DIGEST, "--edge-image-digest", DIGEST],
         ["missing: kubernetes.router.eppImageDigest", "kubernetes.router.proxyImageDigest"]),
        ([*ALL_DIGESTS[:-1], "sha256:ABC"],
         ["kubernetes.router.proxyImageDigest: 'sha256:ABC' is not an image digest; accepted: "
          "sha256: and 64 hex digits"]),
        (["--image-digest", "vllm/vllm-openai:v0.33.0", *ALL_DIGESTS[2:]],
         ["kubernetes.imageDigest: 'vllm/vllm-openai:v0.33.0' is not an image digest"]),
    ],
)  # fmt: skip
def test_digests_missing_or_malformed_are_refused_before_anything_is_written(
    stacks: Path, tmp_path: Path, given: list[str], complaints: list[str]
) -> None:
    proc, out = kube_plan(stacks, tmp_path / "run", "10", *given)
    assert proc.returncode == 2
    assert out == {}
    assert len(proc.stderr.strip().splitlines()) == 1  # one line
    for complaint in complaints:
        assert complaint in proc.stderr
    assert sorted(p.name for p in stacks.iterdir()) == ["Pulumi.kube.yaml"]
    assert not (tmp_path / "run" / "plan.json").exists()


def test_a_digest_the_stack_file_already_has_is_kept(stacks: Path, tmp_path: Path) -> None:
    path = stacks / "Pulumi.kube.yaml"
    path.write_text(path.read_text().replace(
        "    # imageDigest: sha256:...      (vllm", f"    imageDigest: {DIGEST}\n    # (vllm"))  # fmt: skip
    proc, _ = kube_plan(stacks, tmp_path / "run", "10", *ALL_DIGESTS[2:])
    assert proc.returncode == 0, proc.stderr


def test_the_kube_plan_needs_pyyaml_and_pydantic_only(stacks: Path, tmp_path: Path) -> None:
    """The plan job installs PyYAML and pydantic (the same pin as requirements.txt): a kube plan
    imports nothing else but the project's own modules."""
    own = {p.stem for p in (ROOT / "scripts").glob("*.py")} | {"components", "realrun", "nemodrop"}
    own |= {p.stem for p in (ROOT / "scripts" / "ci").glob("*.py")}
    own.add("clients")  # scripts/clients/: stdlib only (tests/test_layout.py holds it)
    pydantic = {"pydantic", "pydantic_core", "typing_extensions", "annotated_types",
                "typing_inspection"}  # fmt: skip
    # pydantic reads sysconfig, whose platform data module the stdlib list does not name.
    pydantic.add(sysconfig._get_sysconfigdata_name())  # type: ignore[attr-defined]
    proc = subprocess.run(
        [sys.executable, "-c", PLAN_JOB_GUARD, ",".join(sorted(own | pydantic)), str(SCRIPT),
         "plan", "--platform", "kubernetes", "--cost-cap", "10", "--name", "real-run-1-1",
         "--stacks", str(stacks), "--out-dir", str(tmp_path / "run"), *ALL_DIGESTS],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [installs] = [s["run"] for s in steps_of("plan") if "pip install" in s.get("run", "")]
    pins = [line for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.startswith(("pydantic", "PyYAML"))]  # fmt: skip
    for pin in pins:
        assert f'"{pin}"' in installs, pin
