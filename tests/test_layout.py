"""The layout the README draws, held: three groups of components/ with imports in one direction
(config <- text for a host <- cloud resources <- __main__.py), so the text a Droplet runs is
rendered and tested without Pulumi, and nothing in the config knows how it is deployed."""

from __future__ import annotations

import ast
from pathlib import Path

COMPONENTS = Path(__file__).resolve().parent.parent / "components"
CONFIG = {"catalog", "schema", "config", "reference", "cidrs", "apikey"}
HOST = {"phases", "phase_settings", "gateway", "balancer", "pool", "vllm_service", "autodown",
        "wake", "script_text"}  # fmt: skip
CLOUD = {"remote", "site", "region", "droplet", "cache", "dns", "bootstrap", "entry",
         "endpoint", "outputs"}  # fmt: skip
TOOLS = {"render", "validate"}


def imports(module: str) -> set[str]:
    """The names this module imports: components' modules by name, other packages by their top."""
    tree = ast.parse((COMPONENTS / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from .x import y
                found |= {node.module} if node.module else {a.name for a in node.names}
            elif node.module == "components":  # from components import x (as __main__ does)
                found |= {a.name for a in node.names}
            elif node.module:
                found.add(node.module.split(".")[0])
    return found


def test_every_module_is_in_one_group() -> None:
    modules = {p.stem for p in COMPONENTS.glob("*.py")} - {"__init__"}
    assert modules == CONFIG | HOST | CLOUD | TOOLS


def test_the_config_knows_nothing_of_hosts_or_clouds() -> None:
    for module in CONFIG:
        assert not imports(module) & (HOST | CLOUD | TOOLS), module


def test_the_text_for_a_host_needs_no_pulumi_and_no_cloud_module() -> None:
    for module in HOST:
        found = imports(module)
        assert not {m for m in found if m.startswith("pulumi")}, module
        assert not found & (CLOUD | TOOLS), module
