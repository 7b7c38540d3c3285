"""What a host is sent of a script: its behaviour, not its comments.

A phase's text is its Command's stdin, and pulumi-command runs a Command again when its stdin
changes (provider/pkg/provider/remote/commandController.go: an update runs `update`, else
`create`; tests/support/stack/commands.py does the same); every later phase follows, since its
triggers hold that phase's output. So a fixed comment, a citation or a blank line in a script
would re-run the phase, and every phase after it, on every live stack. What is sent leaves
those out: a script's comment lines, its trailing comments and its blank lines, in bash and in
Python, and in Python its functions' and classes' docstrings too (shellcheck's directives stay:
the rendered text is checked as well). What remains is what runs, byte for byte as written.

The bash reader is a lexer of the cases the scripts use (quotes, `$'...'`, escapes, here-docs,
`#` only at the start of a word); what it cannot place it keeps as written, so a doubt costs a
re-run, never a change of behaviour. tests/test_script_text.py proves that for every shipped
script: bash parses the original and the text sent to the same program (`declare -f`), and
Python to the same syntax tree less those docstrings.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

# `<<` or `<<-` and its word (quoted or not): a here-doc whose body is kept as written. `<<<`
# (a here-string) is not one.
HEREDOC = re.compile(r"(?<!<)<<(-?)[ \t]*(?:'([^']+)'|\"([^\"]+)\"|\\?([A-Za-z_][A-Za-z0-9_]*))")
# A shellcheck directive: a comment that tools read, kept.
DIRECTIVE = re.compile(r"[ \t]*# shellcheck ")
# Where a word ends, so that a `#` after it starts a comment (bash(1), COMMENTS).
WORD_BREAK = frozenset(" \t;&|()<>")


def bash(text: str) -> str:
    """`text` less its comments and blank lines. The first line stays if it is a `#!` line."""
    out: list[str] = []
    lines = text.splitlines()
    shebang = bool(lines) and lines[0].startswith("#!")
    if shebang:
        out.append(lines[0])
        lines = lines[1:]
    quote = ""  # the quote a line ends inside: "'", '"', "$'", or ""
    bodies: list[tuple[str, bool]] = []  # here-docs opened on a line: (word, tabs stripped)
    continued = False  # the line before ended in `\`: this one is part of its command
    for line in lines:
        if bodies:
            word, tabs = bodies[0]
            if (line.lstrip("\t") if tabs else line) == word:
                bodies.pop(0)
            out.append(line)  # a here-doc's body (and its end) is data
            continue
        if not quote and not continued and DIRECTIVE.match(line):
            out.append(line)  # for shellcheck of what is sent (tests run it on the rendered text)
            continue
        started_inside, joined = bool(quote), continued
        kept, quote, opened = _code_line(line, quote)
        bodies.extend(opened)
        continued = not quote and _ends_in_escape(kept)
        if joined:
            out.append(line)  # after `\` even a blank line or a `#` is the command's: as written
        elif started_inside or quote:
            out.append(kept)  # part of a string that spans lines: as written
        elif kept.strip():
            out.append(kept)
    return "\n".join(out) + "\n"


def _arithmetic_end(line: str, start: int) -> int:
    """Past the `))` that closes the `((` at `start` (or the line's end, if it does not)."""
    depth, i = 0, start
    while i < len(line):
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        i += 1
        if depth == 0:
            return i
    return i


def _ends_in_escape(line: str) -> bool:
    """Whether the line ends in a backslash that escapes the newline (an odd run of them)."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _code_line(line: str, quote: str) -> tuple[str, str, list[tuple[str, bool]]]:
    """One line of code: the line with its comment cut, the quote it ends inside, and the
    here-docs it opens (read outside quotes only)."""
    i, n = 0, len(line)
    opened: list[tuple[str, bool]] = []
    while i < n:
        c = line[i]
        if quote:
            i, quote = _in_quote(line, i, quote)
        elif c == "\\":
            i += 2
        elif c in "'\"":
            quote, i = c, i + 1
        elif c == "$" and line.startswith("$'", i):
            quote, i = "$'", i + 2
        elif c == "#" and (i == 0 or line[i - 1] in WORD_BREAK):
            return line[:i].rstrip(), quote, opened
        elif c == "(" and line.startswith("((", i):
            i = _arithmetic_end(line, i)  # `<<` in there is a shift, not a here-doc
        elif c == "<" and (m := HEREDOC.match(line, i)):
            word = m.group(2) or m.group(3) or m.group(4)
            opened.append((word, m.group(1) == "-"))
            i = m.end()
        else:
            i += 1
    return line, quote, opened


def _in_quote(line: str, i: int, quote: str) -> tuple[int, str]:
    """One step inside a quote: past the character at `i`, and the quote still open after it.
    Single quotes end at the next `'`; double quotes and `$'...'` take backslash escapes."""
    c = line[i]
    if quote == "'":
        return i + 1, "" if c == "'" else quote
    if c == "\\":
        return i + 2, quote
    closes = '"' if quote == '"' else "'"
    return i + 1, "" if c == closes else quote


def python(text: str) -> str:
    """`text` less its comments, its functions' and classes' docstrings, and the lines that hold
    nothing else (blank ones too); the first line stays if it is a `#!` line. Other strings are
    code, and so is the module's docstring (a script may print it: autodown.py's --help); all
    docstrings stay when the text reads some object's `__doc__`."""
    lines = text.splitlines()
    code_rows: set[int] = set()
    cuts: dict[int, int] = {}  # row -> column where a trailing comment starts
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}  # fmt: skip
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            cuts[tok.start[0]] = tok.start[1]
        elif tok.type not in skip:
            code_rows.update(range(tok.start[0], tok.end[0] + 1))
    code_rows -= _docstring_rows(text, lines)
    out = [lines[0]] if lines and lines[0].startswith("#!") else []
    for row, line in enumerate(lines, start=1):
        if row not in code_rows:
            continue
        out.append(line[: cuts[row]].rstrip() if row in cuts else line)
    return "\n".join(out) + "\n"


def _docstring_rows(text: str, lines: list[str]) -> set[int]:
    """The rows of the functions' and classes' docstrings that stand on rows of their own, in
    bodies that go on after them (a body of a docstring alone keeps it: it would be empty)."""
    tree = ast.parse(text)
    if any(isinstance(n, ast.Attribute) and n.attr == "__doc__" for n in ast.walk(tree)):
        return set()  # something reads an object's docstring (`__doc__` alone: the module's)
    rows: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        first = node.body[0]
        doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        if not (doc and isinstance(first.value.value, str) and len(node.body) > 1):  # type: ignore[attr-defined]
            continue
        end = first.end_lineno or first.lineno
        alone = not lines[first.lineno - 1][: first.col_offset].strip() and not (
            lines[end - 1][first.end_col_offset :].split("#", 1)[0].strip()
        )
        if alone:
            rows.update(range(first.lineno, end + 1))
    return rows
