"""scripts/ci/realrun/runner.py's bounded run (run_bounded), through `real_run.py up` against a
fake `pulumi` that takes its time: past its minutes, or cancelled by the runner (SIGTERM),
Pulumi gets the one SIGINT that lets it save its state, not a kill. Its step outputs
($GITHUB_OUTPUT, github_output) are read in every step's tests (test_realrun_deploy.py, ...).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from fake_pulumi import FakePulumi
from test_real_run import SCRIPT, real_run


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
