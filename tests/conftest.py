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
