"""The README, the pages in docs/ and the project file say what the code does."""

from __future__ import annotations

import re

import yaml
from pulumi_harness import ROOT

from components.spec import reference, schema

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


def test_the_outputs_table_lists_every_export() -> None:
    # Every output is exported in components/cloud/outputs.py (the program's one place for them).
    source = (ROOT / "components" / "cloud" / "outputs.py").read_text()
    exported = set(re.findall(r'pulumi\.export\(\s*"(\w+)"', source))
    assert {"endpoint", "apiKey", "sshCommand"} <= exported, "the outputs moved: read them there"
    page = (ROOT / "docs" / "outputs.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", page, flags=re.MULTILINE))
    assert exported <= documented, f"undocumented outputs: {exported - documented}"


# The README is the page a newcomer reads in one sitting; the reference lives in docs/. A budget
# (words as `wc -w` counts them, code and tables included) keeps the detail from growing back.
README_WORDS = 3_800
# The main page's sections a newcomer needs, in the order they need them.
README_ORDER = (
    "What it costs",
    "Try it",
    "Deploy a stack",
    "Use",
    "Stop paying",
    "Scale",
)


def test_the_readme_is_read_in_one_sitting() -> None:
    readme = (ROOT / "README.md").read_text()
    words = len(readme.split())
    assert words <= README_WORDS, (
        f"README.md has {words} words, over {README_WORDS}: move the detail to a page in docs/ "
        "and link it from a short section"
    )
    headings = re.findall(r"^## (.+)$", readme, flags=re.MULTILINE)
    found = [next((i for i, h in enumerate(headings) if h.startswith(s)), -1) for s in README_ORDER]
    assert -1 not in found, f"a section is missing: {dict(zip(README_ORDER, found, strict=True))}"
    assert found == sorted(found), f"out of order: {headings}"


def test_the_readme_links_every_docs_page() -> None:
    """A page in docs/ that the README does not link is a page no newcomer finds."""
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\(docs/([^)\s#]+)", readme))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to
    '-' (what the README's links are written against)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_relative_link_in_the_docs_reaches_a_file_and_a_heading() -> None:
    """Sections moved between the README and docs/ keep their links working."""
    pages = [
        ROOT / "README.md",
        ROOT / "tests" / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no file)")
                continue
            if anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.MULTILINE)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no heading)")
    assert not broken, broken
