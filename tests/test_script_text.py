"""What a host is sent of a script is its behaviour, not its comments (components/script_text):
for every shipped script, bash parses the original and the text sent to the same program (its
own canonical print of a function, `declare -f`, which drops comments and keeps here-doc bodies),
and Python to the same syntax tree; the constructs that look like comments and are not stay;
and a comment-only edit renders the same stdin (no re-run) while a one-character edit of a
command does not."""

from __future__ import annotations

import ast
import io
import subprocess
import tokenize
from pathlib import Path

import pytest
from pulumi_harness import stack_config

from components.host import phase_settings, phases, script_text
from components.host.phase_settings import PHASES_DIR, Inputs
from components.spec import config

BASH_SCRIPTS = sorted(p.name for p in PHASES_DIR.glob("*.sh"))
# A daemon shipped as a folder (shipped_tree): each module of it, by its path in scripts/phases.
PYTHON_SCRIPTS = sorted(p.relative_to(PHASES_DIR).as_posix() for p in PHASES_DIR.rglob("*.py"))


def parsed_by_bash(text: str) -> str:
    """Bash's own print of `text` as a function body: the program it parsed, comments gone."""
    program = f"__script() {{\n{text}\n}}\ndeclare -f __script\n"
    proc = subprocess.run(["bash", "--norc", "--noprofile"], input=program, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name", BASH_SCRIPTS)
def test_bash_parses_each_script_and_what_is_sent_of_it_to_the_same_program(name: str) -> None:
    original = (PHASES_DIR / name).read_text()
    sent = script_text.bash(original)
    assert parsed_by_bash(sent) == parsed_by_bash(original)
    # What it leaves out: the header that opens each script, and its settings list.
    header = next(ln for ln in original.splitlines() if not script_text.DIRECTIVE.match(ln))
    assert header.startswith("# ") and header not in sent.splitlines(), name
    assert "# Settings:" not in sent
    assert script_text.bash_followed(original), f"{name}: the lexer lost its way: comments kept"
    assert len(sent) < len(original)


def without_docstrings(tree: ast.Module) -> ast.Module:
    """The tree less its functions' and classes' docstrings (where a body goes on after one)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str) and len(node.body) > 1):  # fmt: skip
                node.body = node.body[1:]
    return tree


@pytest.mark.parametrize("name", PYTHON_SCRIPTS)
def test_python_parses_each_script_and_what_is_sent_of_it_to_the_same_tree(name: str) -> None:
    original = (PHASES_DIR / name).read_text()
    sent = script_text.python(original)
    assert ast.dump(ast.parse(sent)) == ast.dump(without_docstrings(ast.parse(original)))
    # Every line sent outside a string (a docstring's blank lines are data) holds code.
    inside = {
        row
        for tok in tokenize.generate_tokens(io.StringIO(sent).readline)
        if tok.type == tokenize.STRING
        for row in range(tok.start[0] + 1, tok.end[0] + 1)
    }
    for row, line in enumerate(sent.splitlines(), start=1):
        if row > 1 and row not in inside:
            assert line.strip() and not line.lstrip().startswith("#"), f"{name}:{row}: {line!r}"
    assert len(sent) < len(original)


KEPT = object()  # the line is sent as written
# Each line of a script, and what is sent of it: KEPT, its text with the comment cut, or None.
BASH_LINES = [
    ("n=${#list[@]} count=$# trim=${path##*/} # a comment", "n=${#list[@]} count=$# trim=${path##*/}"),
    ("echo '# in single quotes' \"# in double\" $'#\\'# in ansi' a\\#b x#y", KEPT),
    ("cat <<EOF", KEPT),
    ("# a here-doc's line is data", KEPT),
    ("", KEPT),
    ("EOF", KEPT),
    ("cat <<-'END' >/dev/null", KEPT),
    ("\t# tabbed body", KEPT),
    ("\tEND", KEPT),
    ("msg='spans", KEPT),
    ("# a line of a string", KEPT),
    ("", KEPT),
    ("lines'", KEPT),
    ("long_command --a \\", KEPT),
    ("  # after a backslash: part of the command", KEPT),
    ("done=1", KEPT),
    ("sleep $(( delay << attempt )) # a shift, not a here-doc", "sleep $(( delay << attempt ))"),
    ("cat <<<'#here-string' # cut", "cat <<<'#here-string'"),
    ("  # an indented comment", None),
    ("# shellcheck disable=SC2016", KEPT),
    ("", None),
]  # fmt: skip


def test_what_looks_like_a_comment_in_bash_and_is_not_stays() -> None:
    text = "\n".join(line for line, _ in BASH_LINES)
    sent = [line if kept is KEPT else kept for line, kept in BASH_LINES if kept is not None]
    assert script_text.bash(text).splitlines() == sent


# Inputs an attack on the lexer found (each once stripped into another program), and their kin.
BASH_TRAPS = [
    'echo "$(echo " # x")"',
    'echo "`echo "a # b"`"',
    'x="$(echo "it\'s")"\necho \'a # b\'',
    'echo "${x:-"it\'s"}"\necho \'a # b\'',
    'x="$(\n  # don\'t say "x\n  echo hi\n)"\necho "a # b"',
    'x="$(cat <<EOF\na" # not a comment\nEOF\n)"\necho b',
    "x=`echo a #b`\necho c",
    "echo ${x:-a #b}",
    "shopt -s extglob\n[[ x == @(a|#b) ]] && echo y",
    "echo a\\ #b\necho c",
    "echo a\\;#b\necho c",
    "echo a\\\n#b '\n# in string\n'",
    "echo a\\\n#b \\\n\necho c",
    'cat <<EOF; echo "a\nb"\nbody\nEOF\necho "c\n# d\n"',
    "cat <<EOF-X\nEOF\n# data\nEOF-X\necho after",
    'cat <<E"O"F\n# data\nEOF\necho after',
    '((x = "))" ? 1 : 0)) ; echo " # x"',
    "echo 'a\x0cb' # form feed inside quotes",
    "echo a\r # a carriage return is a character",
    "n=${#list[@]} # the count\necho $n",
    "if (( b > a + (64 << 20) )); then echo big; fi # a shift in parentheses\n# gone",
    "case $x in\n  a) echo a ;; # one\n  *) echo b ;;\nesac",
    "arr=(\n  one # first\n  two\n)",
    'f() {\n  # inside a function\n  echo "${1#prefix}"  # cut\n}',
]


@pytest.mark.parametrize("text", BASH_TRAPS, ids=range(len(BASH_TRAPS)))
def test_what_is_sent_of_a_tricky_line_is_the_same_program(text: str) -> None:
    assert parsed_by_bash(script_text.bash(text)) == parsed_by_bash(text)


PYTHON_TRAPS = [
    's = "a\u2028b"\ny = 1  # c\n',
    "x = 1\n\x0c\ny = 2  # c\n",
    'def f():\n    """\u00e9\u00e9\u00e9\u00e9"""; x = 1\n    return x\n',
    'def f():\n    """\U0001f600\U0001f600"""; g()\n    return 1\n',
    "x = 1 \\\n\ny = 2\n",
    "x = (1,  # one\n     2)\n",
]


@pytest.mark.parametrize("text", PYTHON_TRAPS, ids=range(len(PYTHON_TRAPS)))
def test_what_is_sent_of_tricky_python_is_the_same_tree(text: str) -> None:
    """The same code (a docstring that shares its row with code is kept, not cut)."""
    sent = without_docstrings(ast.parse(script_text.python(text)))
    assert ast.dump(sent) == ast.dump(without_docstrings(ast.parse(text)))


DOC_READS = [
    "print(f.__doc__)",
    'print(getattr(f, "__doc__"))',
    "import inspect\nprint(inspect.getdoc(f))",
    "help(f)",
]


@pytest.mark.parametrize("reader", DOC_READS, ids=range(len(DOC_READS)))
def test_a_docstring_something_may_read_stays(reader: str) -> None:
    text = f'def f():\n    """Read below."""\n    return 1\n\n\n{reader}\n'
    assert '"""Read below."""' in script_text.python(text)


def test_an_encoding_declaration_stays() -> None:
    text = "#!/usr/bin/env python3\n# -*- coding: latin-1 -*-\n# a comment\nx = 1\n"
    assert script_text.python(text) == "#!/usr/bin/env python3\n# -*- coding: latin-1 -*-\nx = 1\n"


def test_what_looks_like_a_comment_in_python_and_is_not_stays() -> None:
    text = (
        '#!/usr/bin/env python3\n"""Doc # not a comment\n\n# inside the docstring\n"""\n\n'
        'x = "#"  # cut\n# a line\ny = [\n    1,  # one\n    # between\n    2,\n]\n\n\n'
        'def f():\n    """Its docstring:\n\n    left out."""\n    return """kept\n\n"""\n\n\n'
        'def g():\n    """A body of a docstring alone: kept."""\n'
    )
    assert script_text.python(text) == (
        '#!/usr/bin/env python3\n"""Doc # not a comment\n\n# inside the docstring\n"""\n'
        'x = "#"\ny = [\n    1,\n    2,\n]\ndef f():\n    return """kept\n\n"""\n'
        'def g():\n    """A body of a docstring alone: kept."""\n'
    )


# ---- a comment is not a deploy ----------------------------------------------------------------


def rendered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: tuple[str, str] | None,
             name: str) -> dict[str, str]:  # fmt: skip
    """Every phase's stdin for a lone Droplet and a replica with the front's waker, from a copy
    of scripts/phases with `edit` (old, new) made once in `name`."""
    folder = tmp_path / ("edited" if edit else "as-is")
    folder.mkdir()
    for path in PHASES_DIR.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            copy = folder / path.relative_to(PHASES_DIR)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(path.read_text())
    if edit:
        text = (folder / name).read_text()
        assert edit[0] in text, f"{edit[0]!r} is not in {name}"
        (folder / name).write_text(text.replace(edit[0], edit[1]))
    monkeypatch.setattr(phase_settings, "PHASES_DIR", folder)
    dev = stack_config("dev")
    out: dict[str, str] = {}
    for shape, raw in (("lone", dev), ("replica", {**dev, "replicas": 2}),
                       ("front", {**dev, "wake": {"enabled": True, "githubRepo": "me/llm",
                                                  "token": "github_pat_x"}})):  # fmt: skip
        cfg = config.parse(raw, "dev", frozenset({"wake"}) if "wake" in raw else frozenset())
        rows = phases.BALANCER if shape == "front" else phases.BOOTSTRAP
        replica = 0 if cfg.pooled else None
        for phase in rows:
            settings = phase.settings(cfg, Inputs(replica=replica))
            out[f"{shape}/{phase.name}"] = phases.render(phase.name, settings, phase.minutes)
    return out


COMMENT_EDITS = [
    ("vllm.sh", "# Settings: NEMO_VLLM_INSTALL", "# Settings (each one): NEMO_VLLM_INSTALL"),
    ("lib.sh", "\n# ", "\n#  "),
    ("wake/waker.py", "\n# ", "\n# (reworded) "),
    ("autodown/metrics.py", "\n# ", "\n\n\n# a new paragraph: "),
    (
        "wake/waker.py",
        '"""Until the mode changes, the deadline, or the next tick."""',
        '"""Until the mode changes, its deadline, or the next tick (reworded)."""',
    ),
]


@pytest.mark.parametrize(("name", "old", "new"), COMMENT_EDITS,
                         ids=["vllm-header", "lib", "wake", "autodown", "wake-docstring"])  # fmt: skip
def test_a_comment_only_edit_sends_every_phase_the_same_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, old: str, new: str
) -> None:
    """The same stdin is no diff to pulumi-command: no phase runs again on a live stack."""
    before = rendered(tmp_path, monkeypatch, None, name)
    after = rendered(tmp_path, monkeypatch, (old, new), name)
    assert after == before


def test_a_one_character_edit_of_a_command_changes_that_phases_text_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = rendered(tmp_path, monkeypatch, None, "vllm.sh")
    after = rendered(
        tmp_path, monkeypatch, ("UV_HTTP_TIMEOUT=120", "UV_HTTP_TIMEOUT=121"), "vllm.sh"
    )
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == ["lone/vllm", "replica/vllm"]
