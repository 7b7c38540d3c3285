"""The vLLM unit (components/host/vllm_service.py), as the service phase sends it under Pulumi's
mocks: vLLM on loopback with its flags from the config and the catalog, run from the locked
env, restarted on failure, walled off from the metadata service; an FP8 model's KV-cache flag
and eager mode only when asked; systemd's quoting of an argument. Every rendered `vllm serve`
line through the pinned vLLM's own parser: test_vllm_serve_parser.py."""

from __future__ import annotations

import pytest
from pulumi_harness import run_program
from test_bootstrap import LOCK_SHA256, commands
from test_droplet import dev

from components.host import vllm_service


def test_service_unit_runs_vllm_on_loopback_with_flags_from_config_and_catalog() -> None:
    run = run_program(
        dev(
            vllm={"maxNumSeqs": 64, "extraArgs": ["--enable-prefix-caching"]},
            droplet={"size": "gpu-h100x8-640gb", "regions": ["nyc2"]},
        )
    )
    stdin = commands(run)["service"].inputs["stdin"]
    exec_start = next(line for line in stdin.splitlines() if line.startswith("ExecStart="))
    env = f"/opt/conda/envs/vllm-0.33.0-{LOCK_SHA256[:12]}"
    assert exec_start == (
        f"ExecStart={env}/bin/vllm serve nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16"
        " --revision main --served-model-name nemotron --host 127.0.0.1 --port 8000"
        " --tensor-parallel-size 8 --max-model-len 32768 --gpu-memory-utilization 0.9"
        " --max-num-seqs 64 --trust-remote-code --mamba-ssm-cache-dtype float32"
        " --reasoning-parser nemotron_v3 --enable-auto-tool-choice --tool-call-parser qwen3_coder"
        " --enable-prefix-caching"
    )
    assert "--enforce-eager" not in exec_start
    for line in (
        "Restart=on-failure",
        "LimitNOFILE=1048576",
        "User=vllm",
        "EnvironmentFile=/etc/nemotron/vllm.env",
        # Triton's and FlashInfer's tools: the env's bin first, then the system's compiler.
        f"Environment=PATH={env}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        # The metadata service serves the host key: blocked from the unit's first instruction.
        "IPAddressDeny=169.254.169.254/32",
    ):
        assert f"\n{line}\n" in stdin


def test_fp8_model_gets_its_kv_cache_flag_and_eager_only_when_asked() -> None:
    run = run_program(
        dev(model={"id": "nvidia/NVIDIA-Nemotron-3-Nano-4B-FP8"}, vllm={"enforceEager": True})
    )
    exec_start = next(
        line
        for line in commands(run)["service"].inputs["stdin"].splitlines()
        if line.startswith("ExecStart=")
    )
    assert exec_start.endswith("--kv-cache-dtype fp8")
    assert " --enforce-eager " in exec_start


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("plain", "plain"),
        ("has space", '"has space"'),
        ("$HOME", "$$HOME"),
        ("100%", "100%%"),
        ('{"a": 1}', '"{\\"a\\": 1}"'),
    ],
)
def test_systemd_quoting(arg: str, quoted: str) -> None:
    assert vllm_service.systemd_quote(arg) == quoted
