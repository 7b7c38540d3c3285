"""The Pulumi program's own names for a stack (components/spec: its tags, its Droplets' and
Volumes' names, its prices), for `nemodrop status`, which must find the stack's resources as
the program named them, never by a copy of its rules.

The program is not part of the installed package (pyproject [tool.setuptools] packages): it is
read from the checkout that holds nemodrop/ (`pip install -e .`), with the program's
requirements (pydantic, PyYAML). Imported only when status runs, so that the other subcommands
never need either; what is missing is one line and exit 2.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast

from nemodrop import target

if TYPE_CHECKING:
    from components.spec.schema import StackConfig

REQUIREMENTS = "requirements.txt"  # the program's (DESIGN.md, Layout)


def validate() -> ModuleType:
    """components.validate from the checkout this package sits in; TargetError (exit 2, one
    line) when there is no checkout, or its requirements are not installed."""
    root = str(target.PROJECT_DIR)
    if root not in sys.path:
        sys.path.append(root)  # a console script's path holds no checkout (pip install -e .)
    try:
        return importlib.import_module("components.validate")
    except ModuleNotFoundError as err:
        if (err.name or "").startswith("components"):
            raise target.TargetError(
                f"status reads the stack with the Pulumi program's config, which is not beside "
                f"this install ({target.PROJECT_DIR}): install from a checkout (pip install -e .)"
            ) from None
        module = (err.name or "?").split(".")[0]
        raise target.TargetError(
            f"status needs the program's package {target.PIP_NAMES.get(module, module)!r}: "
            f"cd {target.PROJECT_DIR} && {sys.executable} -m pip install -r {REQUIREMENTS}"
        ) from None


def stack_config(stack: str, stacks: Path | None) -> StackConfig:
    """The stack's config as the program validates it (validate.file_problems): the stack
    file in `stacks` (default: the checkout's stacks/). TargetError with its first problem."""
    checker = validate()
    problems, cfg = checker.file_problems(stack, stacks or checker.ROOT / "stacks")
    if cfg is None:
        raise target.TargetError(problems[0] if problems else f"stack {stack}: no config")
    return cast("StackConfig", cfg)  # validate is imported by name: mypy sees Any
