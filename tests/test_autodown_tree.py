"""The folder a host runs autodown from (components/host/autodown.py TREE_DIR): the program's
setting holds the package and the clients it imports, nothing else; every module parses as
Python 3.10 (Ubuntu 22.04's python3, which has no -P: the unit runs `python3 -m autodown` in the
folder); and it runs on the standard library alone (`-S`: no site-packages, so the clients'
Prometheus parser is the standard-library port, as on a host's python3)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from pulumi_harness import stack_config

from components.host import autodown, phase_settings
from components.spec import config


def tree() -> str:
    cfg = config.parse(stack_config("dev"), "dev", frozenset())
    return str(phase_settings.autodown_phase(cfg, phase_settings.Inputs())["NEMO_AUTODOWN_TREE"])


def test_the_folder_holds_the_package_and_its_clients_alone() -> None:
    paths = {line.split()[1] for line in tree().splitlines() if line.startswith("file ")}
    package = {f"autodown/{p.name}" for p in (phase_settings.PHASES_DIR / "autodown").glob("*.py")}
    clients = {f"clients/{name}" for name in autodown.CLIENTS}
    assert paths == package | clients
    # What the package imports of the clients is there.
    imported = set()
    for path in (phase_settings.PHASES_DIR / "autodown").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "clients":
                imported |= {f"clients/{a.name}.py" for a in node.names}
    assert imported and imported <= clients


def test_every_module_sent_parses_as_python_3_10() -> None:
    files = [p for p in (phase_settings.PHASES_DIR / "autodown").glob("*.py")]
    files += [autodown.CLIENTS_DIR / name for name in autodown.CLIENTS]
    for path in files:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


def test_the_installed_folder_runs_as_the_unit_runs_it_on_the_standard_library(
    tmp_path: Path,
) -> None:
    folder = tmp_path / autodown.PACKAGE
    program = f'source {phase_settings.PHASES_DIR / "lib.sh"}\nprintf "%s\\n" "$TREE" | install_tree {folder}'
    subprocess.run(["bash", "-c", program], env={"PATH": os.environ["PATH"], "PHASE": "t",
                   "TREE": tree()}, check=True, timeout=60)  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "AUTODOWN_METRICS_URL": "http://127.0.0.1:9/metrics",
           "AUTODOWN_STATE": str(tmp_path / "state.json"),
           "AUTODOWN_FIRST_BOOTSTRAP": str(tmp_path / "first")}  # fmt: skip
    bare = subprocess.run([sys.executable, "-S", "-c", "import prometheus_client"], env=env,
                          capture_output=True, timeout=60, check=False)  # fmt: skip
    assert bare.returncode != 0, "-S leaves the virtualenv's packages out"
    proc = subprocess.run([sys.executable, "-S", "-m", autodown.PACKAGE], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("autodown: keep: bootstrapping: this replica has not served")


def test_where_no_rule_runs_no_folder_is_sent() -> None:
    """Off (a stack without autodown, a replica other than 0): the setting is empty, so a new
    release of the rule runs no phase there; the phase removes a folder an earlier run left."""
    raw = {**stack_config("dev"), "replicas": 2}
    cfg = config.parse(raw, "dev", frozenset())
    first = phase_settings.autodown_phase(cfg, phase_settings.Inputs(replica=0))
    other = phase_settings.autodown_phase(cfg, phase_settings.Inputs(replica=1))
    assert first["NEMO_AUTODOWN_MODE"] != "off" and first["NEMO_AUTODOWN_TREE"]
    assert (other["NEMO_AUTODOWN_MODE"], other["NEMO_AUTODOWN_TREE"]) == ("off", "")
    lone_off = config.parse({**stack_config("dev"), "autodown": {}}, "dev", frozenset())
    assert phase_settings.autodown_phase(lone_off, phase_settings.Inputs()) == {
        **phase_settings.autodown_phase(lone_off, phase_settings.Inputs()),
        "NEMO_AUTODOWN_MODE": "off",
        "NEMO_AUTODOWN_TREE": "",
    }
