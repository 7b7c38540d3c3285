"""`nemodrop`: the user's tools behind one command, a subcommand per module of this package.

    nemodrop smoke --stack dev          # does the endpoint answer as it should
    nemodrop bench --stack dev --concurrency 1,8,32
    nemodrop logs --stack dev           # vLLM's journal on the Droplet
    nemodrop timeline --stack dev       # where the bootstrap's minutes went
    nemodrop wake --stack dev           # a sleeping endpoint's state, or --now
    nemodrop status --stack dev         # what runs in the cloud, since when, what it cost

Each subcommand is a module with `add_parser(subparsers)` and `run(args)`; `nemodrop COMMAND
--help` shows its flags. Something missing (a stack's output, the key, a Python package) is one
line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from typing import Protocol, TypeAlias

# The subcommands, each the module of that name in this package, in the order --help lists them.
SUBCOMMANDS = ("smoke", "bench", "logs", "timeline", "wake", "status")
# The distribution's name (pyproject [project] name), for --version.
DISTRIBUTION = "nemodrop"

# What add_subparsers returns (argparse gives the type no public name).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Subcommand(Protocol):
    def add_parser(self, subparsers: Subparsers) -> None: ...
    def run(self, args: argparse.Namespace) -> int: ...


def subcommand(subparsers: Subparsers, name: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of one subcommand: its module's docstring as the description, its first
    paragraph as the help of `nemodrop --help`. A check after parsing refuses a flag through
    `args.usage_error(message)`: the subcommand's usage and the message, exit 2, as argparse."""
    text = doc or name
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=" ".join(text.strip().split("\n\n")[0].split()),
        description=text,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(usage_error=parser.error)
    return parser


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    """--json: what the subcommand shows, as one JSON document on stdout and nothing else there
    (errors stay one line on stderr), for scripts."""
    parser.add_argument("--json", action="store_true", help=f"one JSON document on stdout: {what}")


def progress(args: argparse.Namespace) -> Callable[[str], None]:
    """A status line for long work, rewritten in place on stderr: only on a terminal, never
    with --json (scripts read stdout, and a log is no place for carriage returns). Call it
    with "" to clear the line."""
    if getattr(args, "json", False) or not sys.stderr.isatty():
        return lambda text: None

    def show(text: str) -> None:
        sys.stderr.write(f"\r\033[K{text}")  # carriage return, then erase the line (ECMA-48 EL)
        sys.stderr.flush()

    return show


def version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run from a checkout)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nemodrop", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        module: Subcommand = importlib.import_module(f"nemodrop.{name}")
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module: Subcommand = importlib.import_module(f"nemodrop.{args.command}")
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
