"""A script that a phase or a workflow runs as one file, imported by its path for a test (it is
no package module): its dataclasses look their module up in sys.modules while it loads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load(path: Path, name: str) -> ModuleType:
    """`path` as a fresh module called `name` (each call its own: state does not leak)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module
