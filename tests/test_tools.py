"""What the tools users run share, and what no one of them owns: the helpers their tests import
(`fake_server`, `run_tool`, `bench`, the key, a bootstrapTimeline), the fake OpenAI-compatible
server speaking the protocol to the official client and its prefix cache, and every tool run by
a Python without the tools' requirements. Each tool's own tests are in the file of its name
(test_smoke.py, test_bench.py, test_bench_*.py, test_logs.py, test_timeline.py, test_target.py,
test_reach.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fake_openai
import nemodrop_cli
import openai
import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent


KEY = "sk-test-0123456789"


@contextmanager
def fake_server(*args: str, key: str = KEY) -> Iterator[str]:
    """tests/support/fake_openai.py in its own process (asking for `key`); yield its /v1 base
    URL."""
    with fake_openai.running(*args, key=key) as fake:
        yield fake.url + "/v1"


def stats(base: str) -> dict[str, Any]:
    return requests.get(base.removesuffix("/v1") + "/_stats", timeout=5).json()


def run_tool(
    name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    full_env.update(env or {})
    return subprocess.run(
        [*nemodrop_cli.argv(name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )


def bench(base: str, tmp_path: Path, **flags: object) -> list[dict[str, Any]]:
    """Run bench.py; `max_tokens=4` becomes `--max-tokens 4`; return its levels."""
    return bench_result(base, tmp_path, **flags)["levels"]


def bench_result(base: str, tmp_path: Path, **flags: object) -> dict[str, Any]:
    """Run bench.py and return its whole result file."""
    args = [
        a
        for k, v in flags.items()
        for a in (
            (f"--{k.replace('_', '-')}",) if v is True else (f"--{k.replace('_', '-')}", str(v))
        )
    ]
    out = tmp_path / "bench.json"
    proc = run_tool(
        "bench",
        "--endpoint",
        base,
        "--api-key",
        KEY,
        "--model",
        "nemotron",
        "--no-progress",
        "--json",
        str(out),
        *args,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(out.read_text())
    assert KEY not in out.read_text(), "the key never reaches the result file"
    return result


# ---- the fake speaks the protocol -----------------------------------------------------------


def test_fake_server_passes_with_the_official_openai_client() -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.005", "--tokens", "5") as base:
        client = openai.OpenAI(base_url=base, api_key=KEY)
        assert [m.id for m in client.models.list()] == ["nemotron"]
        reply = client.chat.completions.create(
            model="nemotron", messages=[{"role": "user", "content": "hi there"}], max_tokens=5
        )
        assert reply.choices[0].message.content == " tok" * 5
        assert reply.usage is not None and reply.usage.completion_tokens == 5
        chunks = list(
            client.chat.completions.create(
                model="nemotron",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == " tok" * 5
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong").models.list()


# ---- a stack's bootstrapTimeline (test_timeline.py's, and the bare Python's below) ----------

# A bootstrap whose downloads ran beside the driver (seconds from 1e9): the critical path runs
# through conda and vllm, not the driver; the gateway is off it.
TIMELINE = {
    name: {"start": 1e9 + start, "end": 1e9 + end, "seconds": end - start, "after": after}
    for name, start, end, after in (
        ("preflight", 0, 10, []),
        ("driver", 10, 110, ["preflight"]),
        ("cgroup", 110, 115, ["driver"]),
        ("conda", 10, 70, ["preflight"]),
        ("vllm", 70, 200, ["conda"]),
        ("model", 70, 160, ["conda"]),
        ("gateway", 10, 40, ["preflight"]),
        ("reboot", 200, 205, ["cgroup", "vllm", "model"]),
        ("reboot-wait", 205, 260, ["reboot"]),
        ("service", 260, 270, ["reboot-wait"]),
        ("autodown", 270, 275, ["service"]),
        ("ready", 270, 400, ["service", "gateway"]),
    )
}


def test_the_fakes_prefix_cache_reuses_leading_blocks_only_and_forgets_the_oldest() -> None:
    """fake_openai.PrefixCache, the model bench's cache-aware measurements run against: full
    blocks of 4 tokens, a chain (a block counts only behind the same blocks), least recently
    used out."""
    cache = fake_openai.PrefixCache(blocks=4, block_tokens=4)
    system = ["you", "are", "a", "careful", "assistant", "who", "answers"]  # one full block
    assert cache.serve([*system, "hi", "there"]) == 0, "a cold cache holds nothing"
    assert cache.serve([*system, "hi", "there"]) == 8, "both full blocks, not the last word"
    assert cache.serve([*system, "bye"]) == 4, "the shared block, not what follows"
    assert cache.serve(["oh", *system]) == 0, "the same words behind another first block"
    for i in range(4):  # four new blocks push the oldest out
        cache.serve([f"w{i}"] * 4)
    assert cache.serve([*system, "hi", "there"]) == 0, "forgotten: least recently used"


# ---- a Python without the tools' requirements --------------------------------------------------


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh virtualenv with nothing installed: what `python3` is on a user's machine."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


@pytest.mark.parametrize(
    ("tool", "args", "package"),
    [
        ("smoke", ("--endpoint", "http://127.0.0.1:9/v1"), "requests"),
        ("bench", ("--endpoint", "http://127.0.0.1:9/v1"), "aiohttp"),
        ("wake", ("--stack", "dev"), "requests"),
        ("timeline", ("--outputs", "{outputs}", "--png", "{png}"), "matplotlib"),
    ],
)
def test_a_tool_run_without_its_packages_names_the_one_missing_and_the_install_command(
    tmp_path: Path, bare_python: str, tool: str, args: tuple[str, ...], package: str
) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"bootstrapTimeline": TIMELINE}))
    argv = [a.format(outputs=outputs, png=tmp_path / "t.png") for a in args]
    proc = subprocess.run(
        [*nemodrop_cli.argv(tool, bare_python), *argv],
        capture_output=True, text=True, timeout=60, check=False, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert f"error: nemodrop needs the Python package {package!r}" in line, line
    assert (
        f"(cd {ROOT} && python3 -m venv .venv && .venv/bin/pip install -e .), "
        "then .venv/bin/nemodrop ..."
    ) in line, line


def test_logs_and_timeline_need_no_package_for_their_text(tmp_path: Path, bare_python: str) -> None:
    """The journal and the timeline as text run on any Python 3.11: only --png needs one."""
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"bootstrapTimeline": TIMELINE}))
    for argv in (["timeline", "--outputs", str(outputs)], ["logs", "--help"]):
        proc = subprocess.run([*nemodrop_cli.argv(argv[0], bare_python), *argv[1:]],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
