"""The layout the README draws, held: components/ is three packages by what a file is, with
imports in one direction (spec <- host <- cloud <- __main__.py; the offline tools, render and
validate, on spec and host only), so the text a Droplet runs is rendered and tested without
Pulumi, nothing in the config knows how it is deployed (neither imports Pulumi at all), and a
path says whether a file can create something that bills (only cloud/ holds the providers'
SDKs). The clients of outside services (scripts/clients/) need the standard library alone, so
the tools, the CI scripts and the hosts may import them, and nothing else there opens its own."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import script_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))

from clients import transport  # noqa: E402

COMPONENTS = ROOT / "components"
PACKAGES = {"spec", "host", "cloud"}
TOOLS = {"render", "validate"}  # python -m components.<tool>
# The SDKs that create things in an account (or in the state): only cloud/ imports them.
PROVIDERS = {
    "pulumi_digitalocean", "pulumi_command", "pulumi_random", "pulumi_tls", "pulumi_kubernetes"
}  # fmt: skip
# The Kubernetes platform's package under cloud/ (DESIGN.md: "in its own package under
# components/cloud/"); its manifests are plain dicts the tests validate without Pulumi.
KUBE = COMPONENTS / "cloud" / "kube"


def modules(package: str) -> set[str]:
    return {p.stem for p in (COMPONENTS / package).glob("*.py")} - {"__init__"}


def imports(path: Path) -> set[str]:
    """What a file imports: components' modules by their dotted name (relative imports
    resolved), other packages by their top name."""
    here = path.relative_to(ROOT).with_suffix("").parts[:-1]  # its package: ("components", "host")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name if a.name.startswith("components") else a.name.split(".")[0]
                      for a in node.names}  # fmt: skip
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here[: len(here) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            if base.startswith("components"):
                # `from components.host import phases`: the module is components.host.phases
                for a in node.names:
                    candidate = f"{base}.{a.name}"
                    is_module = (ROOT / Path(*candidate.split("."))).with_suffix(".py").exists()
                    found.add(candidate if is_module else base)
            else:
                found.add(base.split(".")[0])
    return found


def group(name: str) -> str:
    """components.host.phases -> host; components.render -> render; components -> ''."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def files(package: str) -> list[Path]:
    """A package's files, those of its sub-packages (cloud/kube/) included."""
    return sorted((COMPONENTS / package).rglob("*.py"))


def test_components_is_three_packages_and_two_tools() -> None:
    assert {p.name for p in COMPONENTS.iterdir() if p.is_dir() and p.name != "__pycache__"} == (
        PACKAGES
    )
    assert {p.stem for p in COMPONENTS.glob("*.py")} == TOOLS | {"__init__"}
    for package in PACKAGES:
        assert (COMPONENTS / package / "__init__.py").read_text().startswith('"""'), package
        assert modules(package), package


def pulumi_imports(path: Path) -> set[str]:
    """The Pulumi packages a file imports: the SDK itself or any provider's."""
    return {m for m in imports(path) if m.startswith("pulumi")}


def test_the_config_knows_nothing_of_pulumi_hosts_clouds_or_tools() -> None:
    """Reading the running stack's config from the engine is the cloud's
    (cloud/stack_config.py): spec/ parses and checks, with no Pulumi at all."""
    for path in files("spec"):
        reached = {group(m) for m in imports(path) if m.startswith("components.")}
        assert reached <= {"spec"}, (path.name, reached)
        assert not pulumi_imports(path), path.name


def test_the_text_for_a_host_needs_no_pulumi_and_no_cloud_module() -> None:
    for path in files("host"):
        assert not pulumi_imports(path), path.name
        reached = {group(m) for m in imports(path) if m.startswith("components.")}
        assert reached <= {"spec", "host"}, (path.name, reached)


def test_the_offline_tools_need_no_pulumi_and_no_cloud_module() -> None:
    """`python -m components.render` and `components.validate` run without Pulumi or its
    providers installed: what they share with the cloud (a Volume's name, its device) is
    spec/'s."""
    for tool in TOOLS:
        path = COMPONENTS / f"{tool}.py"
        assert not pulumi_imports(path), path.name
        reached = {group(m) for m in imports(path) if m.startswith("components.")}
        assert reached <= {"spec", "host", *TOOLS}, (path.name, reached)


def test_only_the_cloud_package_holds_what_creates_and_bills() -> None:
    for path in [*COMPONENTS.glob("*.py"), *files("spec"), *files("host")]:
        assert not imports(path) & PROVIDERS, path.name
    for path in files("cloud"):
        reached = {group(m) for m in imports(path) if m.startswith("components.")}
        assert reached <= {"spec", "host", "cloud"}, (path.name, reached)


def test_the_kubernetes_package_is_the_clouds_and_its_manifests_need_no_pulumi() -> None:
    """cloud/kube/ holds the platform's resources (under the cloud's rules above, as every
    file of cloud/); manifests.py builds the objects the cluster runs from spec/ and host/ only,
    so that they are validated, and their vLLM arguments parsed, with no Pulumi."""
    assert (KUBE / "__init__.py").read_text().startswith('"""')
    assert set(files("cloud")) >= set(KUBE.glob("*.py"))
    manifests = KUBE / "manifests.py"
    assert not pulumi_imports(manifests)
    reached = {group(m) for m in imports(manifests) if m.startswith("components.")}
    assert reached <= {"spec", "host"}, reached


def test_the_cloud_refuses_with_the_engines_error() -> None:
    """spec's ConfigError is a plain exception: raised in cloud/ it would reach `pulumi up` as a
    traceback. The cloud raises StackConfigError (a ConfigError and the engine's RunError), which
    only stack_config.py makes from spec's."""
    for path in files("cloud"):
        if path.name == "stack_config.py":
            continue
        nodes = list(ast.walk(ast.parse(path.read_text())))
        names = {n.id for n in nodes if isinstance(n, ast.Name)}
        names |= {a.name for n in nodes if isinstance(n, ast.ImportFrom) for a in n.names}
        assert "ConfigError" not in names, path.name


def test_main_only_wires() -> None:
    """__main__.py reaches the packages, never a provider SDK's resources itself (but the API
    key's RandomPassword, the one resource it declares)."""
    found = imports(ROOT / "__main__.py")
    assert found & PROVIDERS <= {"pulumi_random"}
    assert {group(m) for m in found if m.startswith("components.")} <= PACKAGES
    assert len((ROOT / "__main__.py").read_text().splitlines()) <= 30


def test_every_function_of_the_program_and_its_tools_reads_whole() -> None:
    """No function of the program, its tools or the scripts a host runs is over 80 lines: a
    reviewer reads each whole (tests are held to no such bound)."""
    long: list[str] = []
    for base in ("components", "scripts", "nemodrop", "policy"):
        for path in sorted((ROOT / base).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > 80:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines}")
    assert long == []


def _script(path: str) -> Any:
    """A script that a phase sends whole, imported by path (it cannot import the package)."""
    return script_module.load(ROOT / path, Path(path).stem + "_copy")


# Where a token may go: https to a host, plain http to 127.0.0.1 by its address alone.
TOKEN_URLS = {
    "https://api.github.com": True, "https://api.digitalocean.com/v2": True,
    "http://127.0.0.1:8080": True, "http://127.0.0.1": True,
    "http://localhost:8080": False, "http://127.0.0.1:1@evil.example": False,
    "http://api.github.com": False, "http://10.0.0.1:80": False,
}  # fmt: skip
RETRY_AFTERS = {"30": 30.0, " 7 ": 7.0, "soon": None, "": None, "-5": None,
                "Thu, 01 Jan 1970 00:01:40 GMT": 40.0, "Thu, 01 Jan 1970 00:00:10 GMT": 0.0}  # fmt: skip


def test_the_scripts_a_host_runs_keep_the_transport_rules_as_the_package_writes_them() -> None:
    """scripts/clients/transport.py is the rule (the clients, so lease.py, tested.py,
    validate.py, the real run's clean-up, autodown and the front's waker, use it); the waker's
    settings refuse at start what the rule refuses (they ask it)."""
    wake = script_module.load_package(ROOT / "scripts/phases/wake", "wake_copy", "settings")
    keys = dict.fromkeys(wake.settings.KEYS, "")
    for url, allowed in TOKEN_URLS.items():
        assert (transport.token_url_problem(url) is None) == allowed, url
        try:
            wake.settings.check({**keys, "WAKE_TRIGGER": "github", "WAKE_GITHUB_API": url})
            waker_allows = True
        except SystemExit:
            waker_allows = False
        assert waker_allows == allowed, url
    for header, seconds in RETRY_AFTERS.items():
        assert transport.retry_after_seconds(header, now=60.0) == seconds, header


# The one client of each outside service: where it lives, and who may import it.
CLIENTS = ROOT / "scripts" / "clients"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
# The optional parser the Prometheus client prefers where installed (never required).
OPTIONAL = {"prometheus_client"}


def test_the_clients_need_the_standard_library_alone() -> None:
    """A host's python3 and a CI runner's run scripts/clients/ as they are: no package of the
    project (components/ is not shipped to a host) and nothing to install."""
    for path in sorted(CLIENTS.glob("*.py")):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:  # not `from . import`
                found.add((node.module or "").split(".")[0])
        assert found <= STDLIB | OPTIONAL, (path.name, found - STDLIB)


def test_no_other_code_opens_its_own_connection_to_an_api_that_takes_a_token() -> None:
    """The program's tools, the CI scripts and the hosts' daemons (autodown and the front's
    waker, each shipped with the clients beside it) reach GitHub and DigitalOcean through
    scripts/clients/ alone: no redirect handler, GitHub media type or Bearer header of their
    own."""
    for base in ("components", "scripts/ci", "scripts/phases"):
        for path in sorted((ROOT / base).rglob("*.py")):
            name, text = str(path.relative_to(ROOT)), path.read_text()
            assert "HTTPRedirectHandler" not in text, name
            assert "vnd.github" not in text, name
            assert 'f"Bearer {' not in text, name


# ---- a module's tests are found from its name (issue 44; the rule: tests/README.md) ------------
# The folders whose modules are named by their stem alone: the program's tools and its three
# layers here, the user's tools (nemodrop/, one module per subcommand and its helpers), and scripts/'s plain folders (no __init__.py: each file one tool or job). Any
# other package is one program or one platform (cloud/kube/, scripts/ci/realrun/, the waker's
# scripts/phases/wake/, scripts/clients/): its modules' files carry the package's name.
STEM_FOLDERS = {COMPONENTS, *(COMPONENTS / p for p in PACKAGES), ROOT / "nemodrop"}
# A package's __init__.py (its docstring, what it gathers) and a program's __main__.py (its
# wiring) have no tests of their own: they are tested through what they gather and start.
EXEMPT = {"__init__.py", "__main__.py"}
# Modules whose tests still sit in broader files that other changes own right now (or that no
# change has split yet). This set only shrinks: an entry that has its file fails the test below,
# so whoever gives a module its file takes it out here.
PENDING = {
    # test_autodown.py (the modules of the autodown package that have no file of their own yet)
    "scripts/phases/autodown/metrics.py",
    "scripts/phases/autodown/run.py",
}  # fmt: skip


def production_modules() -> list[Path]:
    """Every module of the program and of the scripts, but the exempt ones."""
    bases = ("components", "scripts", "nemodrop")
    found = [p for base in bases for p in (ROOT / base).rglob("*.py")]
    return sorted(p for p in found if p.name not in EXEMPT and "__pycache__" not in p.parts)


def own_test_file(module: Path, modules: list[Path]) -> str:
    """The file that holds a module's tests: `test_<M>.py`, or `test_<P>_<M>.py` when P is a
    package of one program or platform, or when another module has the stem M too."""
    folder = module.parent
    shared = sum(m.stem == module.stem for m in modules) > 1
    in_program = (folder / "__init__.py").exists() and folder not in STEM_FOLDERS
    return (
        f"test_{folder.name}_{module.stem}.py" if shared or in_program else f"test_{module.stem}.py"
    )


def test_a_modules_tests_are_found_from_its_name() -> None:
    """Each production module has its own test file, named by the rule, and that file names the
    module it tests; no two modules share one; the pending set names only modules that still
    lack theirs."""
    modules = production_modules()
    wanted = {m.relative_to(ROOT).as_posix(): own_test_file(m, modules) for m in modules}
    assert len(set(wanted.values())) == len(wanted), "two modules would share a test file"
    gone = PENDING - wanted.keys()
    assert not gone, f"pending modules that no longer exist: {sorted(gone)}"
    missing, unnamed, done = [], [], []
    for module, name in sorted(wanted.items()):
        path = ROOT / "tests" / name
        if module in PENDING:
            if path.exists():
                done.append(f"{module}: {name} exists, take it out of PENDING")
        elif not path.exists():
            missing.append(f"{module}: tests/{name}")
        elif not re.search(rf"\b{Path(module).stem}\b", path.read_text()):
            unnamed.append(f"tests/{name} never names {module}")
    assert missing == [], missing
    assert unnamed == [], unnamed
    assert done == [], done


def test_an_exempt_file_holds_no_code_of_its_own_to_test() -> None:
    """A package's __init__.py defines no function or class: what it would define untested has
    a module (and so a test file) of its own."""
    for base in ("components", "scripts", "nemodrop"):
        for path in (ROOT / base).rglob("__init__.py"):
            nodes = ast.parse(path.read_text()).body
            defined = [n for n in nodes if isinstance(n, ast.FunctionDef | ast.ClassDef)]
            assert defined == [], path.relative_to(ROOT)
