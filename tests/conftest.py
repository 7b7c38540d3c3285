import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The program's modules import as `components.*`, as they do under `pulumi up`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandbox import Downloads


@pytest.fixture
def downloads(tmp_path: Path) -> Iterator[Downloads]:
    """The local HTTP server the sandboxed phases download from (see sandbox.py)."""
    d = Downloads(tmp_path / "www")
    yield d
    d.close()


@pytest.fixture(autouse=True, scope="session")
def private_tool_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tools the tests run (bench --plot, timeline --png) import matplotlib, which writes
    its font cache under ~/.cache and ~/.config: give it the session's own folder instead."""
    before = os.environ.get("MPLCONFIGDIR")
    os.environ["MPLCONFIGDIR"] = str(tmp_path_factory.mktemp("matplotlib"))
    yield
    if before is None:
        os.environ.pop("MPLCONFIGDIR", None)
    else:
        os.environ["MPLCONFIGDIR"] = before
