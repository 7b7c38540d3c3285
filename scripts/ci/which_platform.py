#!/usr/bin/env python3
"""Which platform a stack deploys to, read from its stack file with the standard library alone.

deploy.yml asks before Pulumi runs (the runner image's python3, no venv, no PyYAML), and writes
the answer to the step's outputs: `platform=droplet` or `platform=kubernetes`. A Kubernetes
stack's refresh and destroy must run the program, whose kubeconfig is fresh, instead of using the
provider's stored one, which expires after 7 days (docs/kubernetes.md, "Day 2").

The program reads the same key (components/spec/config.py, `_platform`): `platform` under the
project's namespace, `droplet` when absent. This reads only the one form a stack file writes it
in, `  nemotron-droplet:platform: <value>` under `config:` (quoted or not, a comment after it),
and refuses anything else it meets under that key, so it never guesses: tests/test_which_platform.py
holds its answer equal to the program's for every shipped stack and for each form.

    python3 scripts/ci/which_platform.py STACK [--stacks DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# Pulumi.yaml's `name` (components.spec.catalog.PROJECT) and components.spec.schema.PLATFORMS,
# spelt here: this runs on the image's python3 before any venv (the test holds them equal).
NAMESPACE = "nemotron-droplet"
PLATFORMS = ("droplet", "kubernetes")
DEFAULT = "droplet"
STACKS = Path(__file__).resolve().parents[2] / "stacks"

_KEY = re.compile(rf"^\s+{re.escape(NAMESPACE)}:platform\s*:(?P<value>.*)$")
_PLAIN = re.compile(r"^(?P<q>['\"]?)(?P<word>[A-Za-z]+)(?P=q)\s*(?:#.*)?$")


class PlatformError(Exception):
    pass


def platform(path: Path) -> str:
    """The stack file's platform: its `platform` key's value, or the program's default."""
    if not path.exists():
        there = sorted(p.name for p in path.parent.glob("Pulumi.*.yaml"))
        raise PlatformError(f"no stack file {path} (there: {', '.join(there) or 'none'})")
    numbered = list(enumerate(path.read_text(encoding="utf-8").splitlines(), 1))
    found = [(number, m["value"].strip()) for number, line in numbered if (m := _KEY.match(line))]
    # The key in a form this reader does not take (quoted, in a flow mapping): a wrong guess of
    # droplet would skip a Kubernetes stack's refresh through its program, so none is made.
    odd = [
        number
        for number, line in numbered
        if f"{NAMESPACE}:platform" in line.split("#", 1)[0] and not _KEY.match(line)
    ]
    if odd:
        raise PlatformError(
            f"{path}:{odd[0]}: {NAMESPACE}:platform in a form this reader does not take: write "
            f"it as `  {NAMESPACE}:platform: kubernetes` under `config:`"
        )
    if not found:
        return DEFAULT
    if len(found) > 1:
        lines = ", ".join(str(n) for n, _ in found)
        raise PlatformError(f"{path}: {NAMESPACE}:platform is set more than once (lines {lines})")
    [(number, value)] = found
    plain = _PLAIN.match(value)
    if plain is None or plain["word"] not in PLATFORMS:
        raise PlatformError(
            f"{path}:{number}: {NAMESPACE}:platform: {value!r}: accepted: a plain "
            f"{' or '.join(PLATFORMS)} (python -m components.validate says more)"
        )
    return plain["word"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stack")
    p.add_argument("--stacks", type=Path, default=STACKS, help="the stack files' folder")
    args = p.parse_args(argv)
    try:
        found = platform(args.stacks / f"Pulumi.{args.stack}.yaml")
    except PlatformError as err:
        print(f"::error::{err}", file=sys.stderr)
        return 2
    print(f"platform={found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
