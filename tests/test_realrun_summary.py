"""scripts/ci/realrun/summary.py through `real_run.py summary`: the job summary (smoke lines,
bench table, the bootstrap as text, the cost) from whatever files a run left, each missing or
malformed one named with the step that writes it, only the outputs it shows read; a cluster
run's. Everything is written under tmp_path.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fake_pulumi import clean_env
from test_real_run import KEY, OUTPUTS, SSH_KEY, real_run

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
    "tool": "nemotron-droplet nemodrop/bench.py",
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


def test_the_summary_of_a_cluster_run_prices_the_cluster_and_says_nothing_else_deletes_it(
    tmp_path: Path,
) -> None:
    d = run_dir(tmp_path)
    (d / "plan.json").write_text(json.dumps({
        "stack": "real-run-9-1", "size": "gpu-h100x1-80gb", "platform": "kubernetes",
        "cluster": "nemotron-real-run-9-1",
    }))  # fmt: skip
    (d / "cleanup.json").unlink()
    proc = real_run(
        "summary", "--out-dir", str(d), "--started", str(STARTED), "--ended",
        str(STARTED + 1800), "--price", "3.49134", "--cap", "10",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "Autodown: none: no autodown on Kubernetes" in text
    assert "a cluster a dead runner leaves bills until you delete it" in text
    # The plan's bound, not the outputs' hourlyPriceUsd (which leaves the Volumes out).
    assert "**About $1.75** of the $10.00 cap: 30 min 0 s" in text
    assert "(the cluster exists only inside it) at $3.49134/hour, the plan's bound" in text
    assert "(Kubernetes cluster `nemotron-real-run-9-1`)" in text
    assert "_None on Kubernetes" in text
