"""The README and the project file say what the code does."""

from __future__ import annotations

import re

import yaml
from pulumi_harness import ROOT

from components import reference, schema

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def test_the_configuration_reference_is_generated_from_the_model() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    block = page.split(START, 1)[1].split(END, 1)[0].strip()
    assert block == reference.reference_markdown(), (
        "docs/configuration.md is stale: replace the config-reference block with "
        "`python -m components.reference`"
    )
    assert "docs/configuration.md" in (ROOT / "README.md").read_text(), "the README links it"


def test_readme_model_table_is_generated_from_the_catalog() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- models:start -->", 1)[1].split("<!-- models:end -->", 1)[0]
    assert block.strip() == reference.models_markdown(), (
        "README is stale: replace the models block with reference.models_markdown()"
    )


def test_every_config_field_is_documented_with_a_description() -> None:
    for name, model in schema.SECTIONS.items():
        for field_name, field in model.model_fields.items():
            assert field.description, f"{name}.{field_name} has no description"


def test_project_file_contract() -> None:
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "nemotron-droplet"
    assert project["stackConfigDir"] == "stacks"
    assert project["runtime"] == {
        "name": "python",
        "options": {"toolchain": "pip", "virtualenv": "venv"},
    }
    assert project["backend"]["url"].startswith("file://")


def test_readme_outputs_table_lists_every_export() -> None:
    # Every output is exported in components/outputs.py (the program's one place for them).
    source = (ROOT / "components" / "outputs.py").read_text()
    exported = set(re.findall(r'pulumi\.export\(\s*"(\w+)"', source))
    assert {"endpoint", "apiKey", "sshCommand"} <= exported, "the outputs moved: read them there"
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", readme, flags=re.MULTILINE))
    assert exported <= documented, f"undocumented outputs: {exported - documented}"
