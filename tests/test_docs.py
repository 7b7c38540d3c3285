"""The README, the pages in docs/ and the project file say what the code does."""

from __future__ import annotations

import re

import yaml
from pulumi_harness import ROOT


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


# ---- secrets stay off command lines (shell history, the process list) ----------------------------
# `pulumi config set --secret KEY` with no value reads it from standard input, or asks for it
# without echo on a terminal (pulumi/pulumi pkg/cmd/pulumi/config/config.go, configSetCmd.Run;
# docs/facts.md). So every example, and every command a refusal prints, leaves the value out.
SECRET_NAMES = r"[A-Z0-9_]*(?:TOKEN|KEY|SECRET|PASSPHRASE|PASSWORD)"
SECRET_KEYS = re.compile(r"^(?:hfToken|apiKey|[\w.]*\.token)$")
# NAME=value where the value is typed, not read: `$(...)` or `$VAR` keep it out of history
# (`{...}` is a template the program fills into a root-only file, not a command line).
ASSIGNED = re.compile(rf"\b({SECRET_NAMES})=(?![\"']?[${{])(\S+)")
# A secret in a flag or a header: --api-key sk-..., -H "Authorization: Bearer sk-...".
FLAGGED = re.compile(
    r"(--(?:api-key|token|hf-token|password)[ =]|-H ['\"]Authorization: Bearer )"
    r"(?![\"']?\$)(?![a-z]+(?:[\s`'\",)]|$))([^\s`'\",()]+)"  # a plain word or "(" is prose
)
CONFIG_SET = re.compile(r"pulumi config set\b([^`\n|#;&)]*)")
VALUED_FLAGS = {"--stack", "-s", "--type", "--config-file"}


def _config_set_value(args: str) -> str | None:
    """The value a `pulumi config set` line types for a secret key, or None (read from stdin)."""
    words, secret, positional = args.split(), False, []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "<" or word.startswith(("<<", "<(", "(")):
            break  # redirected from a file (not on the command line), or prose after it
        if word in VALUED_FLAGS:
            i += 2
            continue
        if word.startswith("-"):
            secret = secret or word == "--secret"
        else:
            positional.append(word.strip("'\""))
        i += 1
    if len(positional) < 2:
        return None
    key = positional[0].split(":")[-1]
    return positional[1] if secret or SECRET_KEYS.match(key) else None


def secrets_on_command_lines(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        hits = [m.group(0) for m in ASSIGNED.finditer(line)]
        hits += [m.group(0) for m in FLAGGED.finditer(line)]
        hits += [f"pulumi config set{m.group(1)}" for m in CONFIG_SET.finditer(line)
                 if _config_set_value(m.group(1)) is not None]  # fmt: skip
        found += [f"{number}: {hit.strip()}" for hit in hits]
    return found


def test_the_secret_check_finds_what_it_is_for() -> None:
    """The detector itself, on lines it must flag and lines it must pass."""
    flagged = [
        "export DIGITALOCEAN_TOKEN=dop_v1_abc",
        "DIGITALOCEAN_TOKEN=dop_v1_... python -m components.validate --stack prod",
        "export PULUMI_CONFIG_PASSPHRASE=...",
        "pulumi config set --secret hfToken hf_...",
        "pulumi config set --stack dev --secret --path autodown.token dop_v1_...",
        "`pulumi config set --secret --path wake.token <a GitHub token>`",
        "pulumi config set apiKey sk-abc",
        "nemodrop smoke --api-key sk-abc",
        "curl -H 'Authorization: Bearer sk-abc' https://x/v1/models",
    ]
    passed = [
        "pulumi config set --secret hfToken < ~/.secrets/hf-token",
        "pulumi config set --stack dev --secret --path autodown.token",
        "pulumi config set --path access.acmeEmail you@example.com",
        "export OPENAI_API_KEY=$(pulumi stack output apiKey --show-secrets)",
        "GITHUB_TOKEN=$(gh auth token) python3 scripts/ci/lease.py --status",
        'curl -H "Authorization: Bearer $OPENAI_API_KEY" "$OPENAI_BASE_URL/models"',
        "read -rs DIGITALOCEAN_TOKEN && export DIGITALOCEAN_TOKEN",
        "flags (`--endpoint`, `--api-key`, `--stack`)",
        "vLLM's --api-key guards only some routes",
        "only the router's own --api-key (vllm_router 0.1.17 src/server.rs",
        'f"VLLM_API_KEY={api_key}"',
        "pulumi config set --secret hfToken   (only for gated models)",
        "send it as `Authorization: Bearer <apiKey>`",
    ]
    assert [line for line in flagged if not secrets_on_command_lines(line)] == []
    assert [line for line in passed if secrets_on_command_lines(line)] == []


# Lines of the scripts that name a secret's variable with no secret in it: a throwaway key that
# lets `caddy validate` expand the Caddyfile's {env.NEMO_API_KEY}, and a grep that leaves the key
# out of the compile cache's key.
NOT_SECRETS = {
    "scripts/phases/gateway.sh": "NEMO_API_KEY=validation-only",
    "scripts/phases/member.sh": "NEMO_API_KEY=validation-only",
    "scripts/phases/service.sh": "VLLM_API_KEY='",
}


def test_no_example_puts_a_secret_on_a_command_line() -> None:
    """The README, docs/, the stack files' comments, the commands the program's refusals and
    warnings print, and those the scripts print (a phase's failure, a tool's usage) and the
    workflows' comments: a token, key or passphrase is read from a file or standard input, never
    typed after the command (it would stay in shell history and show in `ps`)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))
    pages += sorted((ROOT / "components").rglob("*.py"))
    pages += sorted(p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh"))
    pages += sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    pages += [ROOT / "try", ROOT / "check"]
    found = [f"{page.relative_to(ROOT)}:{hit}" for page in pages
             for hit in secrets_on_command_lines(page.read_text())
             if NOT_SECRETS.get(str(page.relative_to(ROOT)), "\0") not in hit]  # fmt: skip
    assert found == [], "\n".join(found)
