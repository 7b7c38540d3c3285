"""Every `vllm serve` line the program renders, for every catalog model on every size that
serves it, parses and validates with the pinned vLLM's own serve parser, and names a reasoning
parser, a tool-call parser and a speculative method that vLLM has. ./check installs that vLLM
from the committed lock into .vllm-venv; the check runs there (tests/vllm_serve_check.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from typing import Any

import pytest
from pulumi_harness import ROOT, stack_config
from test_droplet import merged

from components.cloud.kube import manifests
from components.host import vllm_service
from components.spec import catalog, config, kube, reference

VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
CHECK = ROOT / "tests" / "support" / "vllm_serve_check.py"
SUPER_DRAFT = "RedHatAI/NVIDIA-Nemotron-3-Super-120B-A12B-speculator.dflash"


def argv(model: str, size: str, replicas: int = 1, routing: str = "auto", **vllm: Any) -> list[str]:
    raw = merged(
        stack_config("prod"),
        {
            "replicas": replicas,
            "balancer": {"routing": routing},
            "model": {"id": model},
            "droplet": {"size": size, "image": None},
            "vllm": {"maxModelLen": 32768, "maxNumSeqs": 64, **vllm},
        },
    )
    raw["droplet"] = {k: v for k, v in raw["droplet"].items() if v is not None}
    args = vllm_service.serve_args(config.parse(raw, "prod"))
    assert args[0] == "serve"
    return args[1:]


def cases() -> dict[str, list[str]]:
    out = {}
    for model in catalog.MODELS.values():
        for size in reference.serving_sizes(model):
            out[f"{model.repo_id} on {size}"] = argv(model.repo_id, size)
        if model.mtp_tokens and reference.serving_sizes(model):
            size = reference.serving_sizes(model)[0]
            out[f"{model.repo_id} MTP"] = argv(model.repo_id, size, speculative={"method": "mtp"})
            out[f"{model.repo_id} 1M context"] = argv(
                model.repo_id, size, maxModelLen=model.long_context or model.max_context
            )
    super_fp8 = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8"
    out["Super DFlash draft"] = argv(
        super_fp8,
        "gpu-h100x8-640gb",
        speculative={"method": "dflash", "model": SUPER_DRAFT, "numSpeculativeTokens": 4},
    )
    out["extra args pass through"] = argv(
        "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16",
        "gpu-4000adax1-20gb",
        extraArgs=["--enable-prefix-caching", "--max-num-batched-tokens", "8192"],
    )
    # Replicas behind the front's cache-aware router: the render route and cached-token usage.
    out["cache-aware routing"] = argv(
        "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16", "gpu-4000adax1-20gb", 3, "cache-aware"
    )
    assert "--enable-scale-out" in out["cache-aware routing"]
    # Every weight loader the config offers, through the pinned vLLM's own parser.
    for loader in ("fastsafetensors", "instanttensor"):
        out[f"load format {loader}"] = argv(super_fp8, "gpu-h100x8-640gb", loadFormat=loader)
    for strategy in ("lazy", "eager", "prefetch"):
        out[f"safetensors strategy {strategy}"] = argv(
            "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16", "gpu-4000adax1-20gb",
            safetensorsLoadStrategy=strategy,
        )  # fmt: skip
    return {**out, **kube_cases()}


def kube_cases() -> dict[str, list[str]]:
    """The Kubernetes model server's container args (components/cloud/kube/manifests.py), on
    every DOKS GPU size that serves the prod stack's model: the same serve_args, listening on
    the pod's addresses."""
    out = {}
    prod = stack_config("prod")
    for size in kube.DOKS_GPU_SIZES:
        if size not in reference.serving_sizes(catalog.MODELS[prod["model"]["id"]]):
            continue
        raw = merged(prod, {"droplet": {"size": size, "image": None}})
        raw["droplet"] = {k: v for k, v in raw["droplet"].items() if v is not None}
        platform = kube.KubePlatformConfig.model_validate(
            {
                "ha": False,
                "imageDigest": "sha256:" + "0" * 64,
                "edge": {"imageDigest": "sha256:" + "1" * 64},
                "router": {
                    "eppImageDigest": "sha256:" + "2" * 64,
                    "proxyImageDigest": "sha256:" + "3" * 64,
                },
                "gpuPool": {"size": size},
            }
        )
        args = manifests.container(config.parse(raw, "prod"), platform)["args"]
        assert args[0] == "serve" and "0.0.0.0" in args
        out[f"kubernetes on {size}"] = args[1:]
    assert len(out) >= 2, out
    return out


# What the check must refuse, so that a pass means something.
BROKEN = {
    "unknown tool parser": ["m", "--enable-auto-tool-choice", "--tool-call-parser", "qwen9_xml"],
    "unknown reasoning parser": ["m", "--reasoning-parser", "nemotron_v9"],
    "unknown flag": ["m", "--tensor-parallel-sized", "8"],
    "auto tool choice without a parser": ["m", "--enable-auto-tool-choice"],
    "unknown speculative method": ["m", "--speculative-config", '{"method":"medusa2"}'],
    "unknown safetensors strategy": ["m", "--safetensors-load-strategy", "stream"],
}


@functools.cache
def checked() -> dict[str, Any]:
    assert VLLM_PYTHON.exists(), (
        f"{VLLM_PYTHON} is missing: ./check installs the pinned vLLM there from locks/"
    )
    every = {**cases(), **BROKEN}
    # Importing vLLM and torch writes caches (torch inductor's under TMPDIR, vLLM's under HOME):
    # keep them in a folder of this run, and keep vLLM from reporting usage.
    with tempfile.TemporaryDirectory() as private:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": private,
            "TMPDIR": private,
            "XDG_CACHE_HOME": private,
            "XDG_CONFIG_HOME": private,
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
        }
        proc = subprocess.run(
            [str(VLLM_PYTHON), str(CHECK)],
            input=json.dumps([{"name": n, "argv": a} for n, a in every.items()]),
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_the_check_runs_the_pinned_vllm() -> None:
    assert checked()["version"] == catalog.DEFAULT_VLLM_VERSION


@pytest.mark.parametrize("name", list(cases()))
def test_every_rendered_serve_line_parses_with_the_pinned_vllm(name: str) -> None:
    assert checked()["results"][name] == "ok"


@pytest.mark.parametrize("name", list(BROKEN))
def test_the_check_refuses_what_vllm_would(name: str) -> None:
    assert checked()["results"][name] != "ok"
