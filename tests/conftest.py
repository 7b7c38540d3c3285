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


# The stack scenarios' contract lines (tests/test_stack_scenarios.py, report): collected from
# each test's report (with pytest-xdist, the workers send them back with it) and printed in the
# run's summary, whatever captured the test's own output.
STACK_SUMMARY = "stack-summary"
_stack_lines: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _stack_lines.extend(str(v) for k, v in report.user_properties if k == STACK_SUMMARY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _stack_lines:
        terminalreporter.section("stack emulation")
        for line in _stack_lines:
            terminalreporter.write_line(line)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite the golden files (tests/golden/) from this run, to review in the diff",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """Whether this run rewrites the golden files it compares with (`--update-golden`)."""
    return bool(request.config.getoption("--update-golden"))
