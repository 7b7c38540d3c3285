"""A script that a phase or a workflow runs as one file, imported by its path for a test (it is
no package module): its dataclasses look their module up in sys.modules while it loads."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

# scripts/: where the one client set (clients/) sits, which a host gets beside each package.
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


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


def load_package(folder: Path, name: str, *modules: str) -> ModuleType:
    """The package in `folder` as a fresh package called `name`, with its submodules `modules`
    imported (each call its own: state does not leak). Its absolute imports of the clients
    find scripts/clients/, as the host's package finds the copy shipped beside it."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec and spec.loader, folder
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        spec.loader.exec_module(package)
        for module in modules:
            importlib.import_module(f"{name}.{module}")
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(f"{name}.")]:
            del sys.modules[key]
    return package


def package_command(folder: Path) -> tuple[list[str], dict[str, str]]:
    """The command that runs the package in `folder` as its unit does (`python3 -m NAME`, here
    with -P: the working directory is never on the path), and the environment it needs for
    that: its parent and scripts/ on PYTHONPATH, as its unit's folder holds it and clients/."""
    path = os.pathsep.join([str(folder.parent), str(SCRIPTS)])
    return [sys.executable, "-P", "-m", folder.name], {"PYTHONPATH": path}
