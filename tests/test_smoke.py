"""nemodrop/smoke.py against the fake OpenAI-compatible server on loopback: every check passes on
a healthy endpoint, a failed one is named with why, Nemotron's reasoning and tool calls the way
vLLM's parsers return them (and a server whose parsers do not match), checks the server does not
offer are OFF (failed by --strict), and a 200 of the wrong shape fails its checks, no traceback."""

from __future__ import annotations

import subprocess

import pytest
from test_reach import answering
from test_tools import (
    KEY,
    fake_server,
    run_tool,
    stats,
)


def smoke(
    base: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_tool("smoke", "--endpoint", base, *args, env=env)


def test_smoke_passes_against_a_healthy_endpoint_reading_the_key_from_env() -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        proc = smoke(base, env={"OPENAI_API_KEY": KEY})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [
        ["PASS", "models"],
        ["PASS", "chat"],
        ["PASS", "stream"],
        ["PASS", "auth"],
    ]
    assert all(" ms " in line for line in lines[:4])
    assert KEY not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("server_args", "smoke_args", "failed", "reason"),
    [
        (["--mode", "empty-deltas"], [], "stream", "the stream carried 0 non-empty delta(s)"),
        ([], ["--model", "not-served"], "models", "not the served model 'not-served'"),
        (["--mode", "no-auth"], [], "auth", "a wrong key got HTTP 200"),
    ],
)
def test_smoke_fails_naming_the_check(
    server_args: list[str], smoke_args: list[str], failed: str, reason: str
) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001", *server_args) as base:
        proc = smoke(base, "--api-key", KEY, *smoke_args)
    assert proc.returncode == 1
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert fails and fails[0].split()[1] == failed, proc.stdout
    assert reason in fails[0]


def smoke_lines(proc: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    """check name -> (status, the line)."""
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0] in ("PASS", "FAIL", "OFF"):
            out[parts[1]] = (parts[0], line)
    return out


def test_smoke_checks_reasoning_and_tool_calls_the_way_vllm_returns_them() -> None:
    """A Nemotron 3 server with its parsers: reasoning in `reasoning` when on, none when off;
    a tool call parsed into tool_calls, whole and streamed."""
    with fake_server(
        "--ttft", "0.01", "--itl", "0.001", "--thinking", "parsed", "--tools", "parsed"
    ) as base:
        proc = smoke(base, "--api-key", KEY, "--strict")
        asked = stats(base)["conversations"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = smoke_lines(proc)
    assert {name: status for name, (status, _) in lines.items()} == dict.fromkeys(
        ["models", "chat", "stream", "auth", "think-on", "think-off", "tools", "tools-stream"],
        "PASS",
    )
    assert "characters of reasoning, none in content" in lines["think-on"][1]
    assert 'get_weather({"city": "Paris"})' in lines["tools"][1]
    assert 'get_weather({"city": "Paris"}) in' in lines["tools-stream"][1]
    assert all(" ms " in line for _, line in lines.values())
    assert any("get_weather" in str(c) for c in asked)


@pytest.mark.parametrize(
    ("server_args", "check", "reason"),
    [
        (
            ["--thinking", "raw"],
            "think-on",
            "the reasoning came back inside content, between think tags",
        ),
        (["--tools", "raw"], "tools", "the tool call came back as text in content"),
        (["--tools", "raw"], "tools-stream", "the tool call came back as text in content"),
    ],
)
def test_smoke_fails_a_server_whose_parsers_do_not_match(
    server_args: list[str], check: str, reason: str
) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001", *server_args) as base:
        proc = smoke(base, "--api-key", KEY)
    assert proc.returncode == 1
    status, line = smoke_lines(proc)[check]
    assert status == "FAIL" and reason in line, proc.stdout


def test_smoke_says_off_for_features_the_server_does_not_offer_and_strict_fails_them() -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        lenient = smoke(base, "--api-key", KEY)
        strict = smoke(base, "--api-key", KEY, "--strict")
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    lines = smoke_lines(lenient)
    assert lines["think-on"][0] == "OFF" and "no reasoning came back" in lines["think-on"][1]
    assert lines["think-off"][0] == "PASS"
    for check in ("tools", "tools-stream"):
        status, line = lines[check]
        assert status == "OFF" and "runs without --enable-auto-tool-choice" in line, line
    assert "Traceback" not in lenient.stdout + lenient.stderr
    assert strict.returncode == 1
    assert smoke_lines(strict)["tools"][0] == "OFF"
    # The summary names them, and why they failed.
    summary = strict.stdout.strip().splitlines()[-1]
    assert "checks failed: think-on, tools, tools-stream" in summary, summary
    assert "not offered by the server, failed by --strict: think-on, tools, tools-stream" in summary


@pytest.mark.parametrize(
    "body",
    ["[]", "null", '{"data": ["nemotron"]}', '{"data": [{"id": "nemotron"}], "choices": [1]}'],
)
def test_smoke_against_a_200_of_the_wrong_shape_fails_its_checks_without_a_traceback(
    body: str,
) -> None:
    """A server that answers 200 with JSON that is not OpenAI's shape (a list, null, a model
    list of strings, a choice that is a number: a proxy's page, another API on the port):
    smoke crashed on the first `.get` (AttributeError, a traceback, the other checks never
    run). Each check fails saying what came back, and the run exits 1."""
    with answering(200, body) as base:
        proc = smoke(base, "--model", "nemotron", "--timeout", "3", env={"OPENAI_API_KEY": KEY})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = smoke_lines(proc)
    assert len(lines) == 8, proc.stdout
    assert any("not in the OpenAI shape" in line for _, line in lines.values()), proc.stdout
