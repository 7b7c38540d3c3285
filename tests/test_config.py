"""The config's checks across sections (components/spec/config.py), through the program under
Pulumi's mocks: every rejected input names its field and nothing is declared (no cloud lookup
either), all problems at once, a model's fit in the usable share of VRAM, and a stack with no
keys of ours refused."""

from __future__ import annotations

import pytest
from pulumi_harness import (
    run_program,
)
from test_droplet import OFFICE, dev

from components.spec.config import ConfigError

REJECTED = [
    (
        {"droplet": {"regions": "nyc2"}},
        "droplet.regions: 'nyc2' is not a list; accepted: a YAML list such as [nyc2]",
    ),
    (
        {"droplet": {"size": "gpu-b300x1-999gb"}},
        "droplet.size: 'gpu-b300x1-999gb' is not a known GPU size; accepted: gpu-4000adax1-20gb",
    ),
    (
        {"droplet": {"size": "gpu-mi300x1-192gb"}},
        "droplet.size: 'gpu-mi300x1-192gb' is an AMD (ROCm) size",
    ),
    (
        {"droplet": {"size": "gpu-mi325x8-2048gb"}},
        "droplet.size: 'gpu-mi325x8-2048gb' is an AMD (ROCm) size",
    ),
    (
        {"droplet": {"size": "gpu-h100x1-80gb", "image": "gpu-h100x8-base"}},
        "droplet.image: gpu-h100x8-base is the 8-GPU image and gpu-h100x1-80gb has 1 GPU(s): use gpu-h100x1-base",
    ),
    (
        {"droplet": {"size": "gpu-h100x8-640gb", "image": "gpu-h100x1-base"}},
        "droplet.image: gpu-h100x1-base is the 1-GPU image and gpu-h100x8-640gb has 8 GPU(s): use gpu-h100x8-base",
    ),
    ({"droplet": {"image": "gpu-amd-base"}}, "droplet.image: gpu-amd-base is the AMD (ROCm) image"),
    (
        {"droplet": {"image": "windows-11"}},
        "droplet.image: 'windows-11' is not a known image; accepted:",
    ),
    ({"droplet": {"regions": []}}, "droplet.regions: the list is empty"),
    (
        {"droplet": {"regions": ["Toronto"]}},
        "droplet.regions: 'Toronto' is not a DigitalOcean region;",
    ),
    ({"droplet": {"tags": ["has space"]}}, "droplet.tags: ['has space']: tags accept"),
    (
        {"droplet": {"tags": ["nemotron-droplet-lease-minutes:1", "stack:prod"]}},
        "droplet.tags: ['nemotron-droplet-lease-minutes:1', 'stack:prod']: tags starting with "
        "nemotron-droplet- or stack: are the program's",
    ),
    (
        {"model": {"id": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"}},
        "model.id: nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 needs about 72 GB of VRAM; gpu-4000adax1-20gb has 20 GB, 18 GB usable",
    ),
    (
        {"model": {"id": "someone/other-model"}},
        "model.vramGb: someone/other-model is not in the catalog, so set model.vramGb",
    ),
    ({"model": {"id": "not a repo"}}, "model.id: 'not a repo': accepted: a Hugging Face repo id"),
    ({"access": {"apiCidrs": ["10.0.0.300/24"]}}, "access.apiCidrs: '10.0.0.300/24' is not a CIDR"),
    (
        {"access": {"sshCidrs": ["10.1.2.3/8"]}},
        "access.sshCidrs: '10.1.2.3/8' is not a CIDR (did you mean 10.0.0.0/8?)",
    ),
    ({"access": {"sshCidrs": []}}, "access.sshCidrs: the list is empty"),
    (
        {"access": {"sshCidrs": ["198.51.100.0/24"]}},
        "access.sshCidrs: 198.51.100.0/24 is a documentation range (RFC 5737, TEST-NET-2): no "
        "client on the internet connects from it; accepted: put your public address",
    ),
    (
        {"access": {"apiCidrs": ["203.0.113.7/32", OFFICE]}},
        "access.apiCidrs: 203.0.113.7/32 is a documentation range (RFC 5737, TEST-NET-3)",
    ),
    (
        {"access": {"apiCidrs": ["2001:db8::/48"]}},
        "access.apiCidrs: 2001:db8::/48 is a documentation range (RFC 3849)",
    ),
    (
        {"access": {"sshCidrs": ["192.168.1.0/24"]}},
        "access.sshCidrs: 192.168.1.0/24 is a private range (RFC 1918)",
    ),
    ({"access": {"sshCidrs": ["127.0.0.1"]}}, "access.sshCidrs: 127.0.0.1 is loopback"),
    (
        {"access": {"apiCidrs": ["169.254.169.254/32"]}},
        "access.apiCidrs: 169.254.169.254/32 is link-local",
    ),
    (
        {"access": {"sshKeyFingerprints": ["abc"]}},
        "access.sshKeyFingerprints: ['abc']: accepted: MD5 fingerprints",
    ),
    (
        {"vllm": {"gpuMemoryUtilization": 0}},
        "vllm.gpuMemoryUtilization: Input should be greater than 0",
    ),
    (
        {"vllm": {"gpuMemoryUtilization": 1.2}},
        "vllm.gpuMemoryUtilization: Input should be less than or equal to 1",
    ),
    (
        {"vllm": {"maxModelLen": 1_000_000}},
        "vllm.maxModelLen: 1000000 is more than nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16 supports; accepted: 1 to 262144",
    ),
    (
        {"vllm": {"version": "0.10.0"}},
        "vllm.version: nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16 needs vLLM >= 0.11.2",
    ),
    ({"vllm": {"version": "latest"}}, "vllm.version: 'latest': accepted: a release number"),
    ({"vllm": {"install": "conda"}}, "vllm.install: Input should be 'wheel' or 'source'"),
    (
        {"vllm": {"extraArgs": ["--host", "0.0.0.0"]}},
        "vllm.extraArgs: ['--host'] are set by the program",
    ),
    (
        {"vllm": {"extraArgs": ["--api-key=abc"]}},
        "vllm.extraArgs: ['--api-key=abc'] are set by the program",
    ),
    (
        {"bootstrap": {"driver": {"branch": "535"}}},
        "bootstrap.driver.branch: vLLM 0.33.0 wheels bring CUDA 13.0, which needs driver branch >= 580; got 535",
    ),
    (
        {"bootstrap": {"driver": {"mode": "magic"}}},
        "bootstrap.driver.mode: Input should be 'auto', 'preinstalled', 'apt' or 'runfile'",
    ),
    (
        {
            "bootstrap": {"driver": {"mode": "preinstalled"}},
            "droplet": {"image": "ubuntu-24-04-x64"},
        },
        "bootstrap.driver.mode: preinstalled needs an image that ships the NVIDIA driver and ubuntu-24-04-x64 has none",
    ),
    (
        {"bootstrap": {"cgroup": {"mode": "v1"}}},
        "bootstrap.cgroup.mode: Input should be 'unified' or 'legacy'",
    ),
    (
        {"droplet": {"sizee": "gpu-h100x1-80gb"}},
        "droplet.sizee: unknown key; accepted: size, regions, image, name, tags, monitoring",
    ),
    (
        {"bootstrap": {"driver": {"brnach": "580"}}},
        "bootstrap.driver.brnach: unknown key; accepted: mode, branch",
    ),
    (
        {"dropet": {"size": "gpu-h100x1-80gb"}},
        "dropet: unknown key; accepted: platform, droplet, access, model, vllm, bootstrap, autodown, cache, balancer, wake, kubernetes, replicas, hfToken, apiKey",
    ),
    ({"droplet": "gpu-h100x1-80gb"}, "droplet: expected an object (a YAML mapping)"),
    # vLLM's parser takes any --load-format (plugins may add one): the config is the check.
    (
        {"vllm": {"loadFormat": "fastsafetensor"}},
        "vllm.loadFormat: Input should be 'auto', 'fastsafetensors' or 'instanttensor'",
    ),
    (
        {"vllm": {"loadFormat": "instanttensor", "safetensorsLoadStrategy": "prefetch"}},
        "vllm.safetensorsLoadStrategy: applies to vllm.loadFormat: auto only",
    ),
]


@pytest.mark.parametrize(
    ("override", "message"),
    REJECTED,
    ids=[m.split(":")[0] + "-" + str(i) for i, (_, m) in enumerate(REJECTED)],
)
def test_bad_input_is_rejected_before_anything_is_declared(override: dict, message: str) -> None:
    run = run_program(dev(**override))
    assert isinstance(run.error, ConfigError), run.error
    assert any(p.startswith(message) for p in run.error.problems), run.error.problems
    assert run.registrations == []
    assert run.cloud.calls == [], "no cloud lookup before the config is valid"


def test_all_problems_are_reported_at_once() -> None:
    run = run_program(
        dev(
            droplet={"size": "gpu-mi300x1-192gb"},
            access={"sshCidrs": ["nope"]},
            vllm={"gpuMemoryUtilization": 2},
            bootstrap={"driver": {"branch": "470"}},
        )
    )
    assert isinstance(run.error, ConfigError)
    fields = sorted(p.split(":")[0] for p in run.error.problems)
    assert fields == [
        "access.sshCidrs",
        "bootstrap.driver.branch",
        "droplet.size",
        "vllm.gpuMemoryUtilization",
    ]
    text = str(run.error)
    assert "4 problem(s); nothing was created" in text


def test_unknown_model_with_vram_is_accepted() -> None:
    run = run_program(dev(model={"id": "someone/other-model", "vramGb": 12}))
    assert run.error is None, run.error


def test_model_too_big_for_the_usable_share_of_vram() -> None:
    # 30B FP8 needs ~35 GB: fits a 48 GB L40S at 0.9 (43 GB), not at 0.7 (34 GB).
    big = {
        "droplet": {"size": "gpu-l40sx1-48gb"},
        "model": {"id": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"},
    }
    assert run_program(dev(**big)).error is None
    run = run_program(dev(**big, vllm={"gpuMemoryUtilization": 0.7}))
    assert isinstance(run.error, ConfigError)
    assert "sizes that fit: gpu-h100x1-80gb" in run.error.problems[0]


def test_a_stack_with_no_keys_of_ours_plans_nothing() -> None:
    """No `nemotron-droplet:` key at all (a stack with no file, or its keys under a misspelt
    namespace): the defaults would plan a GPU Droplet nobody chose; refused, nothing declared."""
    run = run_program({})
    assert run.error is not None and run.registrations == []
    assert "sets no nemotron-droplet: keys" in str(run.error)
    assert "cp stacks/Pulumi.dev.yaml" in str(run.error)
