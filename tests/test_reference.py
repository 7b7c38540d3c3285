"""The generated references (components/spec/reference.py): docs/configuration.md's block is the
config model's reference and docs/models.md's table the catalog's, as generated now."""

from __future__ import annotations

from pulumi_harness import ROOT

from components.spec import reference

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def test_the_configuration_reference_is_generated_from_the_model() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    block = page.split(START, 1)[1].split(END, 1)[0].strip()
    assert block == reference.reference_markdown(), (
        "docs/configuration.md is stale: replace the config-reference block with "
        "`python -m components.spec.reference`"
    )
    assert "docs/configuration.md" in (ROOT / "README.md").read_text(), "the README links it"


def test_the_model_table_is_generated_from_the_catalog() -> None:
    page = (ROOT / "docs" / "models.md").read_text()
    block = page.split("<!-- models:start -->", 1)[1].split("<!-- models:end -->", 1)[0]
    assert block.strip() == reference.models_markdown(), (
        "docs/models.md is stale: replace the models block with reference.models_markdown()"
    )
