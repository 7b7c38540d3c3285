import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The program's modules import as `components.*`, as they do under `pulumi up`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# The helpers and fakes (tests/support/): pulumi_harness, sandbox, stack, ... by their names.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from recorder import recording, redirecting
from sandbox import Downloads


@pytest.fixture
def downloads(tmp_path: Path) -> Iterator[Downloads]:
    """The local HTTP server the sandboxed phases download from (see sandbox.py)."""
    d = Downloads(tmp_path / "www")
    yield d
    d.close()


@pytest.fixture
def recorder() -> Iterator[str]:
    """A server on loopback that keeps each request's headers (recorder.Recorder.seen)."""
    with recording() as served:
        yield served


@pytest.fixture
def redirect_to(recorder: str) -> Iterator[str]:
    """A server that answers every GET with a 302 to the recorder (another host, as far as a
    token is concerned)."""
    with redirecting(recorder) as served:
        yield served


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


# The level each test file runs at, as pytest markers (pyproject.toml lists them; tests/README.md
# has the table): `-m "not sandbox and not caddy and not acme and not stack and not vllm and
# not tools"` is the loop of seconds (the program under mocks, the docs and the workflows).
LEVELS: dict[str, tuple[str, ...]] = {
    # The phase scripts for real under bash, in a mount namespace with fake hardware.
    "test_phase_scripts": ("sandbox",),
    "test_pool_scripts": ("sandbox",),
    # pool.py's own (its tests came from test_pool_scripts.py and keep its level).
    "test_pool": ("sandbox",),
    # render.py's own: its first test came from test_phase_scripts.py and keeps its level.
    "test_render": ("sandbox",),
    "test_cache_script": ("sandbox",),
    "test_bootstrap_ssh": ("sandbox",),
    # The real Caddy with the program's Caddyfiles.
    "test_gateway": ("caddy",),
    "test_gateway_attacks": ("caddy",),
    "test_balancer": ("caddy",),
    "test_host_router": ("caddy",),
    # The front's waker on loopback with a fake GitHub and replicas, and behind the real Caddy.
    "test_wake": ("caddy",),
    # The waker by hand (nemodrop/wake.py): its first test came from test_wake.py, at its level.
    "test_nemodrop_wake": ("caddy",),
    # A real ACME CA (pebble, or the emulation's with profiles).
    "test_acme_issuance": ("acme",),
    "test_stack_acme": ("acme", "stack"),
    # The offline pulumi up: network namespaces, sshd, nftables, the outside services.
    "test_stack_net": ("stack",),
    "test_stack_internet": ("stack",),
    "test_stack_api": ("stack",),
    "test_stack_engine": ("stack",),
    "test_stack_scenarios": ("stack",),
    # Every rendered `vllm serve` line through the pinned vLLM's own parser (.vllm-venv: it
    # imports vLLM and torch, tens of seconds a process).
    "test_vllm_serve_parser": ("vllm",),
    "test_vllm_startup": ("vllm",),
    "test_loader_bench": ("vllm",),
    # The model phase with the locked huggingface_hub's real `hf` against a Hub on loopback.
    "test_model_download": ("sandbox", "vllm"),
    # The user's tools against fake servers with real delays (bench's measurements, its knee
    # search) and a real sshd (logs.py): what they share, and each tool's own file.
    "test_tools": ("tools",),
    "test_smoke": ("tools",),
    "test_bench": ("tools",),
    "test_bench_report": ("tools",),
    "test_bench_sizing": ("tools",),
    "test_bench_stats": ("tools",),
    "test_bench_workload": ("tools",),
    "test_logs": ("tools",),
    "test_timeline": ("tools",),
    "test_target": ("tools",),
    "test_cli": ("tools",),
    "test_reach": ("tools",),
    # The routing measurement: bench through the real Caddy (and vllm-router) to fake replicas.
    "test_router_bench": ("tools", "caddy"),
    "test_try": ("tools",),
    "test_real_run": ("tools",),
    # The real run's steps, each in the file of its module (scripts/ci/realrun/): the Droplet
    # run's were test_real_run.py's; the cluster plan's (test_realrun_kubeplan.py) run unmarked.
    "test_realrun_plan": ("tools",),
    "test_realrun_deploy": ("tools",),
    "test_realrun_runner": ("tools",),
    "test_realrun_cleanup": ("tools",),
    "test_realrun_summary": ("tools",),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for level in LEVELS.get(item.path.stem, ()):
            item.add_marker(level)
