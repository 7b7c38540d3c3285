"""The `nemodrop` command as the tests run it: this checkout's package, not a copy installed
somewhere (the test venv may be shared by several checkouts), by any Python (the bare one too),
from any working directory (-P: it is never on the path)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MAIN = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from nemodrop.cli import main; sys.exit(main(sys.argv[1:]))"


def argv(subcommand: str, python: str = sys.executable) -> list[str]:
    """`nemodrop SUBCOMMAND` (append its flags) as a process's argv."""
    return [python, "-P", "-c", _MAIN, subcommand]
