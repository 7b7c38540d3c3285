"""nemodrop/cli.py: one command, `nemodrop`, with a subcommand per module of the package (each
its own flags, unchanged from the scripts it replaced), --version, and one line with exit 2 for
what is missing. Each subcommand's own tests are in the file of its module (test_smoke.py,
test_bench*.py, test_logs.py, test_timeline.py, test_nemodrop_wake.py)."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import nemodrop_cli
import pytest

from nemodrop import cli

ROOT = Path(__file__).resolve().parent.parent


def test_the_console_script_is_the_clis_main_and_the_package_holds_every_subcommand() -> None:
    """pyproject's entry point is what these tests run; every subcommand is a module here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"nemodrop": "nemodrop.cli:main"}
    assert project["project"]["name"] == cli.DISTRIBUTION
    for name in cli.SUBCOMMANDS:
        assert (ROOT / "nemodrop" / f"{name}.py").exists(), name


def test_help_lists_every_subcommand_with_its_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in cli.SUBCOMMANDS:
        assert f"    {name} " in out, name
    assert "Load-test an OpenAI-compatible endpoint" in out  # bench's, from its docstring


def test_version_names_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("nemodrop ")


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    assert exit_.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize("name", cli.SUBCOMMANDS)
def test_each_subcommand_has_its_flags(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([name, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: nemodrop {name} ")


@pytest.mark.parametrize("name", ["smoke", "bench", "wake"])
def test_no_endpoint_is_one_line_and_exit_2(name: str) -> None:
    """Through the command as a user runs it (a process): no traceback, one line on stderr."""
    env = {"PATH": "/usr/bin:/bin", "MPLCONFIGDIR": "/nonexistent"}
    proc = subprocess.run(
        [*nemodrop_cli.argv(name)], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "error: no endpoint: pass --endpoint URL, --stack NAME or set OPENAI_BASE_URL"
    ]


def test_a_flag_refused_after_parsing_shows_the_subcommands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["timeline", "--outputs", "x.json", "--link-gbps", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: nemodrop timeline ")
    assert "nemodrop timeline: error: --link-gbps: a positive number of Gbit/s" in err
