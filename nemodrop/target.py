"""Which endpoint, key and model a tool talks to: flags, else a stack's outputs, else the env.

Shared by the subcommands (smoke, bench, wake, logs, timeline) so that all find a deployment
the same way.
The key is best passed through OPENAI_API_KEY or --stack: a --api-key flag is visible in the
process list of the machine that runs the tool.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

# The project's folder (a checkout: `pulumi stack output` runs here), and the command that
# installs the tools with the packages they need (pyproject.toml's [project]; README "Try it").
PROJECT_DIR = Path(__file__).resolve().parent.parent
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -e ."
# The import name of each package the tools need, where pip knows it by another name.
PIP_NAMES = {"yaml": "PyYAML"}


class TargetError(SystemExit):
    """A tool cannot find what to talk to; exits 2 with one line that says how to fix it."""

    def __init__(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)
        super().__init__(2)


def missing_package(err: ModuleNotFoundError) -> NoReturn:
    """A subcommand run by a Python without one of its packages (not the one `nemodrop` was
    installed into): one line that names the package and the command that installs it, exit 2,
    no traceback."""
    module = (err.name or "?").split(".")[0]
    print(
        f"error: nemodrop needs the Python package {PIP_NAMES.get(module, module)!r}, which "
        f"{sys.executable} lacks: install the command with its packages (cd {PROJECT_DIR} "
        f"&& {INSTALL}), then .venv/bin/nemodrop ...",
        file=sys.stderr,
    )
    raise SystemExit(2)


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files (no display), for the tools' --plot and --png."""
    try:
        import matplotlib  # noqa: PLC0415 (only the plots need it)
    except ModuleNotFoundError as err:
        missing_package(err)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


@dataclass(frozen=True)
class Target:
    endpoint: str  # base URL ending in /v1
    api_key: str
    model: str | None
    # How many replicas serve the endpoint (a stack's `replicas` output; 1 for one Droplet).
    replicas: int = 1
    stack: str | None = None  # the stack it came from, for the commands an error names
    # A CA bundle (PEM) to trust for the endpoint's certificate; None: the system's.
    cacert: str | None = None

    def url(self, path: str) -> str:
        return f"{self.endpoint.rstrip('/')}/{path.lstrip('/')}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def verify(self) -> str | bool:
        """requests' `verify`: the CA bundle given, else the system's trust."""
        return self.cacert or True


# Where a chat message or stream delta carries text: a reasoning model (Nemotron with vLLM's
# reasoning parser) puts its first tokens in `reasoning` (vLLM since PR #27752, which #33402
# completed by removing the old name), or `reasoning_content` (older vLLM, other servers).
TEXT_FIELDS = ("content", "reasoning_content", "reasoning")


def text_of(message: dict[str, Any]) -> str:
    return "".join(str(message.get(k) or "") for k in TEXT_FIELDS)


def chat_body(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """A chat completion request; streamed ones ask for the usage chunk at the end."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", help="base URL ending in /v1 (env: OPENAI_BASE_URL)")
    parser.add_argument("--api-key", help="API key (env: OPENAI_API_KEY; prefer env or --stack)")
    parser.add_argument(
        "--model", help="served model name (default: the stack's, else the first one listed)"
    )
    parser.add_argument("--stack", help="read endpoint, key and model from this Pulumi stack")
    parser.add_argument(
        "--cacert",
        metavar="PEM",
        help="trust the endpoint's certificate through this CA bundle (default: the system's)",
    )


def stack_outputs(
    stack: str, *, show_secrets: bool = True, seconds: float | None = None
) -> dict[str, Any]:
    """`pulumi stack output --json` for `stack`, run in the project directory, within `seconds`
    when given. With `show_secrets` the secret outputs come as their values (the tools need the
    key), else as Pulumi's `[secret]`; either way nothing here prints what it read. Raises
    TargetError, which says why in one line and exits 2 (the real run's outputs step uses it
    too: scripts/ci/realrun/deploy.py)."""
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise TargetError("--stack needs the Pulumi CLI on PATH")
    secrets = ["--show-secrets"] if show_secrets else []
    try:
        proc = subprocess.run(  # noqa: S603 (fixed argv, no shell)
            [pulumi, "stack", "output", "--json", *secrets, "--stack", stack],
            cwd=PROJECT_DIR,
            capture_output=True,
            text=True,
            timeout=seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise TargetError(
            f"pulumi stack output --stack {stack} did not answer within {seconds:g} s"
        ) from None
    if proc.returncode != 0:
        raise TargetError(f"pulumi stack output --stack {stack} failed: {proc.stderr.strip()}")
    try:
        outputs = json.loads(proc.stdout or "{}")
    except ValueError:
        raise TargetError(f"pulumi stack output --stack {stack} printed no JSON") from None
    if not isinstance(outputs, dict):
        raise TargetError(f"pulumi stack output --stack {stack} printed no JSON object")
    return outputs


def resolve(args: argparse.Namespace) -> Target:
    endpoint, api_key, model = args.endpoint, args.api_key, args.model
    replicas = 1
    if args.stack:
        outputs = stack_outputs(args.stack)
        missing = [k for k in ("endpoint", "apiKey") if not outputs.get(k)]
        if missing and not (endpoint and api_key):
            raise TargetError(
                f"stack {args.stack} has no {', '.join(missing)} output yet: "
                "run `pulumi up` for it first"
            )
        endpoint = endpoint or outputs.get("endpoint")
        api_key = api_key or outputs.get("apiKey")
        model = model or outputs.get("servedModelName")
        replicas = len(outputs.get("replicas") or []) or 1
    endpoint = endpoint or os.environ.get("OPENAI_BASE_URL")
    api_key = api_key or os.environ.get("OPENAI_API_KEY")
    if not endpoint:
        raise TargetError("no endpoint: pass --endpoint URL, --stack NAME or set OPENAI_BASE_URL")
    if not api_key:
        raise TargetError("no API key: pass --stack NAME, set OPENAI_API_KEY or pass --api-key")
    if not endpoint.rstrip("/").endswith("/v1"):
        raise TargetError(f"--endpoint {endpoint!r} should end in /v1")
    return Target(endpoint, api_key, model, replicas, args.stack, args.cacert)
