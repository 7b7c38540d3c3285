"""nemodrop/program.py: the Pulumi program's config and names for a stack, from the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemodrop import program

ROOT = Path(__file__).resolve().parent.parent


def test_the_stacks_names_are_the_programs() -> None:
    cfg = program.stack_config("dev", None)  # the checkout's stacks/
    assert (cfg.stack_tag, cfg.replica_tag, cfg.balancer_name) == (
        "stack:dev", "nemotron-dev:replica", "nemotron-dev-lb",
    )  # fmt: skip


def test_a_missing_stack_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        program.stack_config("nope", tmp_path)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no stack file" in err and "Pulumi.nope.yaml" in err
