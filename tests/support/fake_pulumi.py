"""A fake `pulumi` on PATH for the scripts that run the CLI (the real run's steps, the tools'
`--stack`): it keeps its stacks and their outputs in a JSON file, records each call (argv and
the stdin it read) and fails the calls a scenario names. What it answers follows the real CLI's
behaviour that the scripts rely on: `stack output` shows the secret outputs only with
--show-secrets, `up` saves its state when interrupted (SIGINT), `stack rm` refuses a stack that
still has resources unless --force, and a command on a stack that does not exist fails.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

# Variables of the machine running the tests that would change what a script does: a runner's
# step outputs and summary, real tokens, an OpenAI endpoint of the tools.
SCRUBBED = ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "AUTODOWN_TOKEN", "DIGITALOCEAN_TOKEN")


def clean_env(**extra: str) -> dict[str, str]:
    """This machine's environment without SCRUBBED and OPENAI_*, and with `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED and not k.startswith("OPENAI_")}
    env.update(extra)
    return env


FAKE_PULUMI = textwrap.dedent("""\
    import json, os, signal, sys, time
    from pathlib import Path

    state_path = Path(os.environ["FAKE_PULUMI_STATE"])
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    state.setdefault("stacks", {})
    state.setdefault("calls", [])
    scenario = state.get("scenario", {})
    argv = sys.argv[1:]
    words = [a for a in argv if not a.startswith("-")]
    cmd = " ".join(words[:2]) if words[0] in ("stack", "config") else words[0]
    # Only `config set` reads stdin (the secret value), as Pulumi's does here.
    stdin = sys.stdin.read() if cmd == "config set" and sys.stdin is not None else ""
    stack = argv[argv.index("--stack") + 1] if "--stack" in argv else (
        words[2] if cmd == "stack init" else "")
    count = sum(1 for c in state["calls"] if c["cmd"] == cmd)
    state["calls"].append({"cmd": cmd, "argv": argv, "stdin": stdin})

    def save():
        # Whole or not at all: a test reads the file while this writes it.
        tmp = state_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(state_path)

    def fail(code, message):
        save()
        print(f"error: {message}", file=sys.stderr)
        sys.exit(code)

    planned = scenario.get("rc", {}).get(cmd, [])
    if count < len(planned) and planned[count]:
        fail(planned[count], f"fake {cmd} failure")
    stacks = state["stacks"]
    if cmd not in ("stack ls", "stack init") and stack not in stacks:
        fail(255, f"no stack named '{stack}' found")
    if cmd == "stack ls":
        save()
        print(json.dumps([
            {"name": scenario.get("qualify", "") + name, "resourceCount": s["resources"]}
            for name, s in stacks.items()]))
    elif cmd == "stack init":
        if stack in stacks:
            fail(255, f"stack '{stack}' already exists")
        stacks[stack] = {"resources": 0, "secrets": []}
        save()
    elif cmd == "config set":
        stacks[stack]["secrets"].append(words[2])
        save()
    elif cmd == "up":
        def interrupted(signum, frame):
            state["calls"][-1]["interrupted"] = True
            fail(255, "update canceled")
        signal.signal(signal.SIGINT, interrupted)
        save()
        time.sleep(scenario.get("up_seconds", 0))
        stacks[stack]["resources"] = 7
        save()
        print("Resources: 7 created")
    elif cmd == "stack output":
        save()
        outputs = dict(scenario.get("outputs", {})) if stacks[stack]["resources"] else {}
        if "--show-secrets" not in argv:
            outputs.update({k: "[secret]" for k in ("apiKey", "sshPrivateKey") if k in outputs})
        print(json.dumps(outputs))
    elif cmd in ("destroy", "refresh"):
        if cmd == "destroy":
            stacks[stack]["resources"] = 0
        save()
    elif cmd == "stack rm":
        if stacks[stack]["resources"] and "--force" not in argv:
            fail(255, "'stack' still has resources")
        del stacks[stack]
        Path("stacks", f"Pulumi.{stack}.yaml").unlink(missing_ok=True)
        save()
    else:
        fail(3, f"unexpected: {argv}")
""")


class FakePulumi:
    """A `pulumi` on PATH that keeps its stacks in a JSON file under `tmp_path`. The scenario:
    `rc` (per command, one exit code per call, 0 to pass), `outputs` (what `stack output`
    prints once the stack has resources), `up_seconds` (how long `up` takes), `qualify` (the
    prefix `stack ls` puts on names, as a backend with organisations does)."""

    def __init__(self, tmp_path: Path, **scenario: Any) -> None:
        self.bin = tmp_path / "fake-bin"
        self.bin.mkdir(exist_ok=True)
        self.state = tmp_path / "fake-pulumi.json"
        self.state.write_text(json.dumps({"scenario": scenario, "stacks": {}, "calls": []}))
        exe = self.bin / "pulumi"
        exe.write_text(f"#!{sys.executable}\n{FAKE_PULUMI}")
        exe.chmod(0o755)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a script run against the fake: clean_env, the fake first on PATH."""
        return clean_env(
            PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            FAKE_PULUMI_STATE=str(self.state),
            **extra,
        )

    @property
    def data(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.state.read_text())
        return loaded

    def calls(self) -> list[str]:
        return [c["cmd"] for c in self.data["calls"]]

    def add_stack(self, name: str, resources: int = 7) -> None:
        data = self.data
        data["stacks"][name] = {"resources": resources, "secrets": []}
        tmp = self.state.with_suffix(".test.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.state)
