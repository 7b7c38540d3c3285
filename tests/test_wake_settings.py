"""scripts/phases/wake/settings.py: the waker reads every setting the program renders and has no
default of its own. A key missing stops it with one line that names the key; the keys it reads
and the keys the program renders (components/host/wake.py env_text, and the unit's token path)
are one list."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import script_module
from pulumi_harness import stack_config

from components.host import wake
from components.spec import config

WAKER = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "wake"
package: Any = script_module.load_package(WAKER, "wake_settings_test", "settings")
settings = package.settings


def cfg() -> config.StackConfig:
    raw = stack_config("dev")
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": "github_pat_x"}
    return config.parse(raw, "dev", frozenset({"wake"}))


def rendered() -> dict[str, str]:
    """What the program renders: the env file, and the unit's own Environment= lines."""
    env = dict(line.split("=", 1) for line in wake.env_text(cfg()).splitlines())
    for line in wake.unit_text().splitlines():
        if line.startswith("Environment="):
            key, value = line.removeprefix("Environment=").split("=", 1)
            env[key] = value
    return env


def test_the_keys_the_waker_reads_are_the_keys_the_program_renders() -> None:
    keys = list(settings.KEYS)
    assert len(keys) == len(set(keys))
    assert set(rendered()) == set(keys)


def test_the_rendered_settings_are_read_as_rendered(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("github_pat_x\n")
    s = settings.Settings.from_env({**rendered(), "WAKE_TOKEN_FILE": str(token)})
    assert s.listen == ("127.0.0.1", wake.PORT)
    assert s.hold_file == Path(wake.HOLD_FILE) and s.github_api == wake.GITHUB_API
    assert (s.hold_seconds, s.max_per_day, s.max_held) == (540.0, 6, wake.MAX_HELD)
    assert s.token == "github_pat_x"
    assert s.state_file == Path(wake.STATE_FILE)


@pytest.mark.parametrize("key", settings.KEYS)
def test_each_missing_key_is_named(key: str) -> None:
    env = {k: v for k, v in rendered().items() if k != key}
    with pytest.raises(SystemExit) as stopped:
        settings.Settings.from_env(env)
    message = str(stopped.value.code)
    assert "\n" not in message
    assert re.findall(r"\bWAKE_[A-Z_]+\b", message) == [key], "that key, alone"


def test_a_waker_started_without_a_key_says_which_in_one_line_and_exits_non_zero(
    tmp_path: Path,
) -> None:
    command, run_env = script_module.package_command(WAKER)
    env = {k: v for k, v in rendered().items() if k != "WAKE_MAX_HELD"}
    proc = subprocess.run(
        command,
        env={**env, **run_env, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "WAKE_MAX_HELD" in proc.stderr, proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"WAKE_TRIGGER": "cron"}, "WAKE_TRIGGER='cron': accepted: github, webhook"),
        ({"WAKE_TRIGGER": "webhook", "WAKE_WEBHOOK_URL": ""}, "needs WAKE_WEBHOOK_URL"),
        ({"WAKE_GITHUB_API": "http://api.github.com"}, "WAKE_GITHUB_API: the token goes over"),
        ({"WAKE_WEBHOOK_URL": "http://10.0.0.1/x"}, "WAKE_WEBHOOK_URL: the token goes over"),
        ({"WAKE_MAX_PER_DAY": "six"}, "WAKE_MAX_PER_DAY='six': not a whole number"),
        ({"WAKE_HOLD_SECONDS": ""}, "WAKE_HOLD_SECONDS='': not a number"),
        ({"WAKE_LISTEN": "127.0.0.1:x"}, "WAKE_LISTEN='127.0.0.1:x': not a whole number"),
    ],
)
def test_a_value_that_cannot_be_used_is_named(change: dict[str, str], said: str) -> None:
    with pytest.raises(SystemExit, match=said.replace("(", r"\(").replace(".", r"\.")):
        settings.Settings.from_env({**rendered(), "WAKE_TOKEN_FILE": "", **change})
