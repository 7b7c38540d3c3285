"""How a tool finds a deployment (nemodrop/target.py): with no endpoint, one line naming the
three ways to give one; with `--stack NAME`, the endpoint, the key and the model from the stack's
outputs, read once through the Pulumi CLI (a fake here: the CLI is not installable), and a stack
with no endpoint yet told to deploy first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_pulumi import FakePulumi
from test_tools import (
    KEY,
    fake_server,
    run_tool,
)


def test_tools_explain_a_missing_endpoint() -> None:
    proc = run_tool("smoke", "--api-key", KEY)
    assert proc.returncode == 2
    assert "no endpoint: pass --endpoint URL, --stack NAME or set OPENAI_BASE_URL" in proc.stderr


def dev_stack(tmp_path: Path, outputs: dict[str, Any]) -> FakePulumi:
    """A fake `pulumi` (tests/support/fake_pulumi.py) with a deployed stack dev: `outputs`."""
    fake = FakePulumi(tmp_path, outputs=outputs)
    fake.add_stack("dev")
    return fake


def test_smoke_reads_endpoint_key_and_model_from_the_stack(tmp_path: Path) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001", "--model", "nemo-x") as base:
        fake = dev_stack(tmp_path, {"endpoint": base, "apiKey": KEY, "servedModelName": "nemo-x"})
        proc = run_tool("smoke", "--stack", "dev", env=fake.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lists nemo-x" in proc.stdout
    # The key comes through --show-secrets (the fake hides it otherwise), read once.
    assert [c["argv"] for c in fake.data["calls"]] == [
        ["stack", "output", "--json", "--show-secrets", "--stack", "dev"]
    ]


def test_stack_without_an_endpoint_says_to_deploy_first(tmp_path: Path) -> None:
    proc = run_tool(
        "bench", "--stack", "dev", env=dev_stack(tmp_path, {"ipv4": "203.0.113.10"}).env()
    )
    assert proc.returncode == 2
    assert (
        "stack dev has no endpoint, apiKey output yet: run `pulumi up` for it first" in proc.stderr
    )
