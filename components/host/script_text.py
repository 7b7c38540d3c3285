"""What a host is sent of a script: its behaviour, not its comments.

A phase's text is its Command's stdin, and pulumi-command runs a Command again when its stdin
changes (provider/pkg/provider/remote/commandController.go: an update runs `update`, else
`create`; tests/support/stack/commands.py does the same); every later phase follows, since its
triggers hold that phase's output. So a fixed comment, a citation or a blank line in a script
would re-run the phase, and every phase after it, on every live stack. What is sent leaves
those out: a script's comment lines, its trailing comments and its blank lines, in bash and in
Python, and in Python its functions' and classes' docstrings too (shellcheck's directives stay:
the rendered text is checked as well). What remains is what runs, byte for byte as written.

The bash reader is a lexer of bash's contexts (quotes, `$'...'`, escapes, here-docs and
where their bodies begin, command and process substitution, `${...}`, backquotes, arithmetic,
extglob groups, `#` only at the start of an unescaped word) and cuts only at the top level;
what it cannot follow it keeps as written from there on, so a doubt costs a re-run, never a
change of behaviour. tests/test_script_text.py proves it for every shipped script (bash
parses the original and the text sent to the same program, `declare -f`; Python to the same
syntax tree less those docstrings; the lexer follows each to its end) and for the inputs an
attack on the lexer found.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

# `<<` or `<<-` and the word after it (bash's word: up to a blank or an operator): a here-doc,
# whose body is kept as written. `<<<` (a here-string) is not one.
HEREDOC = re.compile(r"(?<!<)<<(-?)[ \t]*([^\s;&|()<>]+)")
# A shellcheck directive: a comment that tools read, kept.
DIRECTIVE = re.compile(r"[ \t]*# shellcheck ")
# What ends a word, so that a `#` after it starts a comment (bash(1), COMMENTS).
WORD_BREAK = frozenset(" \t;&|()<>")
# Contexts where a `#` is code and quotes nest anew: command and process substitution, a
# parameter expansion, backquotes, arithmetic, a subshell or an extglob group.
CODE, SINGLE, DOUBLE, ANSI = "code", "'", '"', "$'"


def bash(text: str) -> str:
    """`text` less its comments and blank lines. The first line stays if it is a `#!` line.
    A line is cut or dropped only where the lexer stands in plain code at the top level; inside
    anything it does not follow (a here-doc in a substitution, a comment in one) it keeps the
    rest of the text as written."""
    return "\n".join(_lex(text)[0]) + "\n"


def bash_followed(text: str) -> bool:
    """Whether the lexer followed `text` to its end at the top level (never lost, nothing left
    open): then every comment of it was left out. The tests hold the shipped scripts to it."""
    lexer = _lex(text)[1]
    return not lexer.verbatim and lexer.stack == [CODE] and not lexer.bodies and not lexer.pending


def _lex(text: str) -> tuple[list[str], _Lexer]:
    """The lines sent of `text`, and the lexer as it ended."""
    lines = text.split("\n")  # bash's lines: \n alone (a \r or a form feed is a character)
    if lines and lines[-1] == "":
        lines.pop()
    out: list[str] = []
    if lines and lines[0].startswith("#!"):
        out.append(lines.pop(0))
    lexer = _Lexer()
    for index, line in enumerate(lines):
        if lexer.verbatim:
            out.extend(lines[index:])
            break
        out.extend(lexer.line(line))
    return out, lexer


class _Lexer:
    """Bash's lexing, line by line, as far as stripping comments needs it."""

    def __init__(self) -> None:
        self.stack: list[str] = [CODE]  # the contexts open at the end of the last line
        self.pending: list[tuple[str, bool]] = []  # here-docs opened, bodies not begun
        self.bodies: list[tuple[str, bool]] = []  # here-docs whose bodies are being read
        self.continued = False  # the last line ended in `\`: this one goes on its command
        self.word = True  # the last line's `\` came after a break: a `#` here starts a word
        self.verbatim = False  # lost: everything from here on is kept as written

    def line(self, line: str) -> list[str]:
        """What is kept of one line: [] (dropped), [the line, its comment cut] or [as is]."""
        if self.bodies:
            word, tabs = self.bodies[0]
            if (line.lstrip("\t") if tabs else line) == word:
                self.bodies.pop(0)
            return [line]  # a here-doc's body (and its end) is data
        top = self.stack == [CODE] and not self.continued
        if top and DIRECTIVE.match(line):
            return [line]  # for shellcheck of what is sent (tests run it on the rendered text)
        joined, started = self.continued, self.stack != [CODE]
        kept = self._scan(line, at_word=self.word if joined else True)
        if self.pending and self.stack == [CODE] and not self.continued:
            self.bodies, self.pending = self.pending, []  # bodies begin on the next line
        if joined or started or self.stack != [CODE]:
            return [line if joined or started else kept]  # inside a command or a string
        return [kept] if kept.strip() else []

    def _scan(self, line: str, at_word: bool) -> str:
        """Walk the line; returns it with its comment cut (only at the top level)."""
        i, n = 0, len(line)
        while i < n:
            top = self.stack[-1]
            if top == SINGLE:
                end = line.find("'", i)
                if end < 0:
                    break
                self.stack.pop()
                i, at_word = end + 1, False
            elif line[i] == "\\":
                if i + 1 >= n:  # a backslash-newline: the command (or the string) goes on
                    self.continued, self.word = True, at_word
                    return line
                i, at_word = i + 2, False
            elif top in (DOUBLE, ANSI):
                i, at_word = self._string_step(line, i, top), False
            elif line[i] == "#" and at_word:
                if self.stack == [CODE]:
                    self.continued = False
                    return line[:i].rstrip()
                self.verbatim = True  # a comment inside a substitution: not followed
                return line
            else:
                step = self._code_step(line, i, top)
                if step is None:
                    return line  # lost (verbatim): keep the rest as written
                i, at_word = step
        self.continued = False
        return line

    def _string_step(self, line: str, i: int, top: str) -> int:
        """One character (or an opener) inside double quotes or `$'...'`."""
        c = line[i]
        if (top == DOUBLE and c == '"') or (top == ANSI and c == "'"):
            self.stack.pop()
            return i + 1
        if top == DOUBLE and c in "$`":
            return self._open(line, i)[0]
        return i + 1

    def _code_step(self, line: str, i: int, top: str) -> tuple[int, bool] | None:
        """One character (or an opener, a closer, a here-doc) in code. None: lost."""
        c = line[i]
        if c in "'\"":
            self.stack.append(c)
        elif line.startswith("$'", i):
            self.stack.append(ANSI)
            return i + 2, False
        elif c == "(" and top in ("((", "a("):
            self.stack.append("a(")  # a parenthesis of arithmetic: `<<` in it is a shift
        elif c in "$`(" or (c in "@!?*+" and line.startswith("(", i + 1)):
            return self._open(line, i)
        elif c == ")" and top in ("$(", "(", "((", "a("):
            self.stack.pop()
            if top == "((" and line.startswith(")", i + 1):
                return i + 2, False
        elif c == "}" and top == "${":
            self.stack.pop()
        elif c == "<" and top in (CODE, "$(", "`", "(") and (m := HEREDOC.match(line, i)):
            if self.stack != [CODE]:
                self.verbatim = True  # a here-doc inside a substitution: not followed
                return None
            self.pending.append((re.sub(r"[\\'\"]", "", m.group(2)), m.group(1) == "-"))
            return m.end(), False
        return i + 1, c in WORD_BREAK

    def _open(self, line: str, i: int) -> tuple[int, bool]:
        """A context that starts at `i` (`$(`, `$((`, `((`, `${`, `` ` ``, `(`, `@(`): pushed.
        Returns where its text begins and whether a word starts there (a command does; an
        expansion or arithmetic does not). A `$` that starts none moves on by one."""
        rest = line[i:]
        for opener, context, word in (("$((", "((", False), ("((", "((", False),
                                      ("$(", "$(", True), ("${", "${", False),
                                      ("(", "(", True)):  # fmt: skip
            if rest.startswith(opener):
                self.stack.append(context)
                return i + len(opener), word
        if rest.startswith("`"):
            if self.stack[-1] == "`":
                self.stack.pop()
                return i + 1, False
            self.stack.append("`")
            return i + 1, True
        if rest[:1] in "@!?*+" and rest[1:2] == "(":
            self.stack.append("(")
            return i + 2, True
        return i + 1, False


# A source file's encoding declaration (PEP 263): on row 1 or 2, it is read, not a comment.
CODING = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")
# What reads a docstring besides `.__doc__`: with any of these, every docstring stays.
DOC_READERS = frozenset({"__doc__", "getdoc", "help", "pydoc", "doctest"})


def python(text: str) -> str:
    """`text` less its comments, its functions' and classes' docstrings, and the lines that hold
    nothing else (blank ones too); a `#!` first line and an encoding declaration stay. Other
    strings are code, and so is the module's docstring (a script may print it, as its
    --help); all docstrings stay when something may read one (`DOC_READERS`)."""
    # The rows tokenize reads: split at \n alone (a form feed or U+2028 is inside a row).
    lines = [line.removesuffix("\n") for line in io.StringIO(text).readlines()]
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
    out: list[str] = []
    for row, line in enumerate(lines, start=1):
        if (row == 1 and line.startswith("#!")) or (row <= 2 and CODING.match(line)):
            out.append(line)
        elif row in code_rows:
            kept = line[: cuts[row]].rstrip() if row in cuts else line
            out.append(kept)
            if kept.endswith("\\") and row + 1 not in code_rows and row + 1 <= len(lines):
                code_rows.add(row + 1)  # after a backslash even a blank row is the statement's
    return "\n".join(out) + "\n"


def _docstring_rows(text: str, lines: list[str]) -> set[int]:
    """The rows of the functions' and classes' docstrings that stand on rows of their own, in
    bodies that go on after them (a body of a docstring alone keeps it: it would be empty)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        read = (
            (isinstance(node, ast.Attribute) and node.attr in DOC_READERS)
            or (isinstance(node, ast.Name) and node.id in DOC_READERS - {"__doc__"})
            or (isinstance(node, ast.Constant) and node.value in DOC_READERS)
        )
        if read:
            return set()  # something may read a docstring (`__doc__` alone: the module's)
    rows: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        first = node.body[0]
        doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        if not (doc and isinstance(first.value.value, str) and len(node.body) > 1):  # type: ignore[attr-defined]
            continue
        end = first.end_lineno or first.lineno
        # ast's columns count UTF-8 bytes.
        before = lines[first.lineno - 1].encode()[: first.col_offset].decode()
        after = lines[end - 1].encode()[first.end_col_offset or 0 :].decode()
        if not before.strip() and not after.split("#", 1)[0].strip():
            rows.update(range(first.lineno, end + 1))
    return rows
