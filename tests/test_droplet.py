"""The Pulumi program under mocks: shipped stacks, validation, region choice, secrets."""

from __future__ import annotations

import copy
import json
import logging
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi_harness import (
    DNS_RECORD,
    DOMAIN_TOKEN,
    DROPLETS_TOKEN,
    FAKE_API_KEY,
    FAKE_DROPLET_ID,
    FAKE_FINGERPRINT,
    FAKE_HOST_PUBLIC_KEY,
    FAKE_IPV4,
    FAKE_PRIVATE_KEY,
    FAKE_PUBLIC_KEY,
    FAKE_RECORD_ID,
    ROOT,
    SECRET_SIG,
    SIZES_TOKEN,
    existing_droplet,
    offer,
    plain_strings,
    run_program,
    stack_config,
)

from components.cloud import droplet, runner
from components.host import phases
from components.spec import catalog, cidrs
from components.spec.config import ConfigError

DROPLET = "digitalocean:index/droplet:Droplet"
FIREWALL = "digitalocean:index/firewall:Firewall"
SSH_KEY = "digitalocean:index/sshKey:SshKey"
TLS_KEY = "tls:index/privateKey:PrivateKey"
EVERYWHERE = ["0.0.0.0/0", "::/0"]
# A public network someone can connect from (not a documentation range: those are refused).
OFFICE = "81.2.69.0/24"


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def dev(**override: Any) -> dict[str, Any]:
    return merged(stack_config("dev"), override)


# ---- the shipped stacks --------------------------------------------------------------------

EXPECTED = {
    "dev": {
        "droplet": {
            "name": "nemotron-dev",
            "size": "gpu-4000adax1-20gb",
            "region": "tor1",
            "image": "gpu-h100x1-base",
            # autodown.maxHours: 8 -> the outside lease's tag (scripts/ci/lease.py reads it).
            "tags": [
                "nemotron-droplet",
                "stack:dev",
                "nemotron-droplet-lease-minutes:480",
                "env:dev",
            ],
            "monitoring": True,
            "gracefulShutdown": True,
            "ipv6": False,
            "sshKeys": [FAKE_FINGERPRINT],
        },
        "inbound": [
            {"protocol": "tcp", "portRange": "22", "sourceAddresses": EVERYWHERE},
            {"protocol": "tcp", "portRange": "443", "sourceAddresses": EVERYWHERE},
            {"protocol": "tcp", "portRange": "80", "sourceAddresses": EVERYWHERE},
        ],
        "price": 0.76,
    },
    "prod": {
        "droplet": {
            "name": "nemotron-prod",
            "size": "gpu-h100x1-80gb",
            "region": "nyc2",
            "image": "gpu-h100x1-base",
            "tags": ["nemotron-droplet", "stack:prod", "env:prod"],
            "monitoring": True,
            "gracefulShutdown": True,
            "ipv6": False,
            "sshKeys": [FAKE_FINGERPRINT],
        },
        "inbound": [
            {"protocol": "tcp", "portRange": "22", "sourceAddresses": EVERYWHERE},
            {"protocol": "tcp", "portRange": "443", "sourceAddresses": EVERYWHERE},
            {"protocol": "tcp", "portRange": "80", "sourceAddresses": EVERYWHERE},
        ],
        "price": 3.39,
    },
}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_shipped_stack_declares_key_droplet_and_firewall(stack: str) -> None:
    run = run_program(stack_config(stack), stack=stack)
    assert run.error is None, run.error
    expected = EXPECTED[stack]

    key = run.one(TLS_KEY, "gpu-ssh")
    assert key.inputs == {"algorithm": "ED25519"}
    assert run.one(TLS_KEY, "gpu-host-key").inputs == {"algorithm": "ED25519"}
    ssh_key = run.one(SSH_KEY)
    assert ssh_key.inputs["publicKey"] == FAKE_PUBLIC_KEY

    droplet = run.one(DROPLET)
    user_data = droplet.inputs.pop("userData")
    assert droplet.inputs == expected["droplet"]
    assert droplet.raw["userData"][SECRET_SIG], "user data holds the host private key: secret"
    assert user_data.startswith("#cloud-config\nssh_pwauth: false\nssh_deletekeys: true\n")
    assert "    FAKE-HOST-KEY-aG9zdGtleWhvc3RrZXk\n" in user_data
    assert f"  ed25519_public: {FAKE_HOST_PUBLIC_KEY}\n" in user_data
    assert droplet.custom_timeouts == {"create": "60m", "update": "60m", "delete": "20m"}
    # A replacement deletes first: never two GPU Droplets billing, never a second quota ask.
    assert droplet.delete_before_replace is True
    # A new size replaces it too: the provider's own update would resize it in place, powered
    # off hard with nothing drained (resource_droplet.go: size is not ForceNew).
    assert droplet.replace_on_changes == ("size",)
    assert ssh_key.urn in droplet.dependencies

    firewall = run.one(FIREWALL)
    assert firewall.inputs["dropletIds"] == [int(FAKE_DROPLET_ID)]
    assert firewall.inputs["inboundRules"] == expected["inbound"]
    assert firewall.inputs["outboundRules"] == [
        {"protocol": "tcp", "portRange": "1-65535", "destinationAddresses": EVERYWHERE},
        {"protocol": "udp", "portRange": "1-65535", "destinationAddresses": EVERYWHERE},
        {"protocol": "icmp", "destinationAddresses": EVERYWHERE},
    ]
    assert droplet.urn in firewall.dependencies

    outputs = {name: out.value for name, out in run.outputs.items()}
    assert outputs["ipv4"] == FAKE_IPV4
    assert outputs["hourlyPriceUsd"] == expected["price"]
    assert outputs["servedModelName"] == "nemotron"
    assert outputs["region"] == expected["droplet"]["region"]
    assert outputs["placement"].startswith(f"chosen: {expected['droplet']['region']} is the first")
    assert outputs["dropletReplacement"].startswith("delete-then-create:")
    assert "the endpoint is down until it is ready" in outputs["dropletReplacement"]
    key_file = f"~/.ssh/nemotron-droplet-{stack}"
    assert outputs["sshCommand"] == (
        f"(umask 077 && mkdir -p ~/.ssh && pulumi stack output --stack {stack} sshPrivateKey"
        f" --show-secrets > {key_file} && echo '{FAKE_IPV4} {FAKE_HOST_PUBLIC_KEY}' > {key_file}.known_hosts)"
        f" && ssh -i {key_file} -o IdentitiesOnly=yes -o UserKnownHostsFile={key_file}.known_hosts"
        f" -o StrictHostKeyChecking=yes root@{FAKE_IPV4}"
    )
    assert outputs["sshHostPublicKey"] == FAKE_HOST_PUBLIC_KEY
    # No DNS, no third party: a certificate for the Droplet's own address.
    assert outputs["endpoint"] == f"https://{FAKE_IPV4}/v1"
    assert outputs["endpointTls"] is True
    assert outputs["certificate"].startswith(f"Let's Encrypt, for the IP address {FAKE_IPV4}")
    assert outputs["apiKey"] == FAKE_API_KEY and run.outputs["apiKey"].secret


@pytest.mark.parametrize(
    ("autodown", "lease"),
    [
        ({"maxHours": 0.01}, "nemotron-droplet-lease-minutes:1"),  # rounded up, never 0
        ({"maxHours": 1.5, "idleMinutes": 30}, "nemotron-droplet-lease-minutes:90"),
        ({"maxHours": 720}, "nemotron-droplet-lease-minutes:43200"),
        ({"idleMinutes": 30, "maxHours": None}, None),  # no ceiling, no lease
        ({"maxHours": 8, "dryRun": True}, None),  # a dry run deletes nothing: nor does the lease
    ],
)
def test_a_gpu_droplet_carries_its_lease(autodown: dict[str, Any], lease: str | None) -> None:
    """The lease outside the Droplet (scripts/ci/lease.py) deletes a GPU Droplet past autodown's
    ceiling, counted from its creation: the tag says how many minutes, in tag characters."""
    config = dev()
    config["autodown"] = {
        k: v for k, v in {**config["autodown"], **autodown}.items() if v is not None
    }
    run = run_program(config, stack="dev")
    assert run.error is None, run.error
    tags = run.one(DROPLET).inputs["tags"]
    leases = [t for t in tags if t.startswith("nemotron-droplet-lease-minutes:")]
    assert leases == ([lease] if lease else [])
    assert all(re.fullmatch(r"[a-zA-Z0-9_\-:]{1,255}", t) for t in tags), tags


def test_every_resource_is_a_child_of_its_component() -> None:
    run = run_program(stack_config("dev"))
    gpu = run.one("nemotron-droplet:index:GpuDroplet")
    boot = run.one("nemotron-droplet:index:Bootstrap")
    for reg in run.registrations:
        if reg in (gpu, boot):
            continue
        if reg.type.startswith("random:"):
            assert reg.parent.endswith("::nemotron-droplet-dev"), "the API key is the stack's"
            continue
        expected = boot if reg.type.startswith("command:") else gpu
        assert reg.parent == expected.urn, reg.type


def test_no_firewall_rule_ever_opens_the_vllm_port() -> None:
    for stack in ("dev", "prod"):
        run = run_program(stack_config(stack), stack=stack)
        ports = [rule["portRange"] for rule in run.one(FIREWALL).inputs["inboundRules"]]
        assert str(catalog.VLLM_PORT) not in ports
        assert all("-" not in p for p in ports), "no inbound port ranges"


def test_empty_api_cidrs_close_the_api_port() -> None:
    run = run_program(dev(access={"apiCidrs": []}))
    assert run.error is None, run.error
    assert [r["portRange"] for r in run.one(FIREWALL).inputs["inboundRules"]] == ["22", "80"]


def test_plain_http_opt_out_serves_port_80_to_api_cidrs_and_says_so() -> None:
    run = run_program(dev(access={"https": False, "apiCidrs": [OFFICE]}))
    assert run.error is None, run.error
    assert run.one(FIREWALL).inputs["inboundRules"][1:] == [
        {"protocol": "tcp", "portRange": "80", "sourceAddresses": [OFFICE]}
    ]
    assert run.outputs["endpoint"].value == f"http://{FAKE_IPV4}/v1"
    assert run.outputs["endpointTls"].value is False
    assert run.outputs["certificate"].value.startswith("none: access.https is false")


def test_own_domain_names_the_endpoint() -> None:
    run = run_program(dev(access={"domain": "llm.example.com", "acmeEmail": "ops@example.com"}))
    assert run.error is None, run.error
    assert run.outputs["endpoint"].value == "https://llm.example.com/v1"
    assert run.outputs["certificate"].value.startswith("Let's Encrypt, else ZeroSSL, for llm.")


def test_sslip_is_an_explicit_opt_in() -> None:
    run = run_program(dev(access={"sslip": True, "acmeEmail": "ops@example.com"}))
    assert run.error is None, run.error
    assert run.outputs["endpoint"].value == "https://203-0-113-10.sslip.io/v1"


@pytest.mark.parametrize(
    ("access", "message"),
    [
        (
            {"domain": "llm.example.com"},
            "access.acmeEmail: access.domain takes its certificate from Let's Encrypt, then "
            "ZeroSSL, which issues only to an ACME account with an email",
        ),
        ({"sslip": True}, "access.acmeEmail: access.sslip takes its certificate"),
        (
            {"sslip": True, "domain": "llm.example.com", "acmeEmail": "ops@example.com"},
            "access.sslip: true serves <ip-with-dashes>.sslip.io instead of access.domain",
        ),
    ],
)
def test_a_named_endpoint_needs_an_acme_email_before_anything_is_created(
    access: dict[str, Any], message: str
) -> None:
    run = run_program(dev(access=access))
    assert isinstance(run.error, ConfigError)
    assert any(message in p for p in run.error.problems), run.error.problems
    assert run.registrations == []


def test_plain_http_needs_no_acme_email_for_a_domain() -> None:
    run = run_program(dev(access={"https": False, "domain": "llm.example.com"}))
    assert run.error is None, run.error


def test_user_key_fingerprints_are_added_after_the_stack_key() -> None:
    mine = "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"
    run = run_program(dev(access={"sshKeyFingerprints": [mine]}))
    assert run.one(DROPLET).inputs["sshKeys"] == [FAKE_FINGERPRINT, mine]


def test_image_defaults_to_the_base_image_for_the_gpu_count() -> None:
    eight = dev(droplet={"size": "gpu-h100x8-640gb", "regions": ["nyc2"]})
    run = run_program(eight)
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["image"] == "gpu-h100x8-base"


# ---- validation: every rejected input names its field, and nothing is declared -------------

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


# ---- region choice -------------------------------------------------------------------------


def test_region_is_the_first_preferred_one_that_offers_the_size() -> None:
    offers = {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["ams3", "atl1", "nyc2"])}
    run = run_program(dev(droplet={"regions": ["tor1", "nyc2", "atl1"]}), offers=offers)
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "nyc2"
    assert sorted(c.token for c in run.cloud.calls) == [DROPLETS_TOKEN, SIZES_TOKEN]
    sizes = next(c for c in run.cloud.calls if c.token == SIZES_TOKEN)
    assert sizes.args["filters"] == [{"key": "slug", "values": ["gpu-4000adax1-20gb"]}]


def test_no_preferred_region_lists_where_the_size_is_offered() -> None:
    offers = {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["sfo3", "atl1"])}
    run = run_program(dev(droplet={"regions": ["tor1", "nyc2"]}), offers=offers)
    assert isinstance(run.error, ConfigError)
    assert run.error.problems == [
        "droplet.regions: gpu-4000adax1-20gb is not offered in tor1, nyc2; it is offered in: "
        "atl1, sfo3. Add one of these to droplet.regions"
    ]
    assert run.registrations == []


@pytest.mark.parametrize(
    "offers",
    [
        {},
        {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", [])},
        {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["tor1"], available=False)},
    ],
)
def test_size_offered_nowhere_fails_before_anything_is_declared(offers: dict) -> None:
    run = run_program(dev(), offers=offers)
    assert isinstance(run.error, ConfigError)
    assert run.error.problems[0].startswith("droplet.size: ")
    assert run.registrations == []


# ---- secrets -------------------------------------------------------------------------------

HF_TOKEN = "hf_FAKEtokenDoNotLeak1234567890"


def _assert_nowhere_plain(run: Any, secret: str) -> None:
    for reg in run.registrations:
        for path, text in plain_strings(reg.raw):
            assert secret not in text, f"{reg.type} {reg.name}: plain input {path} holds a secret"
    for name, out in run.outputs.items():
        if secret in str(out.value):
            assert out.secret, f"output {name} holds a secret but is not marked secret"


GIVEN_API_KEY = "given-api-key-FAKE-0123456789abcdefghijklmnop"


@pytest.mark.parametrize("given_key", [False, True], ids=["generated-key", "given-key"])
def test_secrets_appear_only_as_secrets(given_key: bool) -> None:
    """The SSH private key, the host private key, the API key and the HF token: in no plain
    resource input and no plain output; exported only as secrets."""
    secrets = {"hfToken": HF_TOKEN, **({"apiKey": GIVEN_API_KEY} if given_key else {})}
    run = run_program(stack_config("dev"), secrets=secrets)
    assert run.error is None, run.error
    api_key = GIVEN_API_KEY if given_key else FAKE_API_KEY
    assert run.outputs["apiKey"].value == api_key
    assert run.outputs["sshPrivateKey"].value == FAKE_PRIVATE_KEY
    for secret in (FAKE_PRIVATE_KEY, "FAKE-PRIVATE-KEY", "FAKE-HOST-KEY", HF_TOKEN, api_key):
        _assert_nowhere_plain(run, secret)
    assert {n for n, out in run.outputs.items() if out.secret} == {"sshPrivateKey", "apiKey"}
    generated = [
        r for r in run.registrations if r.type == "random:index/randomPassword:RandomPassword"
    ]
    assert [r.inputs for r in generated] == (
        [] if given_key else [{"length": 48, "special": False}]
    )


def test_every_remote_connection_pins_the_host_key() -> None:
    run = run_program(stack_config("dev"))
    remote = [r for r in run.registrations if r.type.startswith("command:remote:")]
    assert len(remote) == len(phases.BOOTSTRAP) + 1  # the phases and the lock copy
    for reg in remote:
        assert reg.inputs["connection"]["hostKey"] == FAKE_HOST_PUBLIC_KEY, reg.name


def test_hf_token_in_plain_text_is_refused() -> None:
    run = run_program(dev(hfToken=HF_TOKEN))
    assert isinstance(run.error, ConfigError)
    assert run.error.problems == [
        "hfToken: stored in plain text; set it as a secret: `pulumi config set --secret hfToken`"
        " (no value after it: Pulumi asks for it without echo, or reads it from a file: `... < FILE`)"
    ]
    assert HF_TOKEN not in str(run.error)


def test_api_key_in_plain_text_is_refused() -> None:
    run = run_program(dev(apiKey=GIVEN_API_KEY))
    assert isinstance(run.error, ConfigError)
    assert run.error.problems == [
        "apiKey: stored in plain text; set it as a secret: `pulumi config set --secret apiKey`"
        " (no value after it: Pulumi asks for it without echo, or reads it from a file: `... < FILE`)"
    ]


def test_public_networks_and_anywhere_are_accepted() -> None:
    run = run_program(
        dev(access={"sshCidrs": [OFFICE, "8.8.8.8", "2a00:1450::/32"], "apiCidrs": EVERYWHERE})
    )
    assert run.error is None, run.error


def test_the_shipped_stacks_carry_no_placeholder_ranges() -> None:
    for stack in ("dev", "prod"):
        access = stack_config(stack)["access"]
        for cidr in access["apiCidrs"] + access["sshCidrs"]:
            assert cidrs.unreachable(cidr) is None, (stack, cidr)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("short-key-0123", "apiKey: 14 characters; accepted: at least 32"),
        ("k" * 40 + "*", "apiKey: holds other characters than letters, digits"),
        ("{env.HOME}" + "k" * 30, "apiKey: holds other characters than letters, digits"),
        ("k" * 20 + " " + "k" * 20, "apiKey: holds other characters than letters, digits"),
        ("k" * 20 + "$" + "k" * 20, "apiKey: holds other characters than letters, digits"),
    ],
    ids=["short", "wildcard", "placeholder", "space", "dollar"],
)
def test_a_given_api_key_must_be_long_and_plain(key: str, message: str) -> None:
    run = run_program(stack_config("dev"), secrets={"apiKey": key})
    assert isinstance(run.error, ConfigError), run.error
    assert any(p.startswith(message) for p in run.error.problems), run.error.problems
    assert key not in str(run.error) and key[:8] not in str(run.error)
    assert run.registrations == []


# ---- day 2: placement is sticky, replacement deletes first ---------------------------------


def test_an_existing_droplet_stays_where_it_is_when_availability_moves() -> None:
    """The first-choice region sold out since the Droplet was made: a routine update must not
    move (replace) it, and its price comes from the Droplet itself."""
    offers = {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["ams3"], 0.80)}
    mine = existing_droplet(region="tor1", price=0.76)
    run = run_program(dev(vllm={"maxModelLen": 16384}), offers=offers, droplets=[mine])
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "tor1"
    assert run.outputs["region"].value == "tor1"
    assert run.outputs["hourlyPriceUsd"].value == 0.76
    assert run.outputs["placement"].value == f"kept: Droplet {FAKE_DROPLET_ID} exists in tor1"
    lookup = next(c for c in run.cloud.calls if c.token == DROPLETS_TOKEN)
    assert lookup.args["gpus"] is True
    assert lookup.args["filters"] == [
        {"key": "name", "values": ["nemotron-dev"]},
        {"key": "tags", "values": ["stack:dev"]},
    ]


@pytest.mark.parametrize(
    "offers",
    [{}, {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", [])}],
    ids=["size-not-listed", "offered-nowhere"],
)
def test_an_existing_droplet_keeps_updating_when_its_size_is_offered_nowhere(offers: dict) -> None:
    run = run_program(dev(), offers=offers, droplets=[existing_droplet(region="nyc2")])
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "nyc2"


def test_another_stacks_droplet_is_not_taken_for_this_one() -> None:
    theirs = [
        existing_droplet(name="nemotron-prod", stack="prod", region="ams3"),
        existing_droplet(name="nemotron-dev", stack="other", region="ams3"),
    ]
    run = run_program(dev(), droplets=theirs)
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "tor1"
    assert run.outputs["placement"].value.startswith("chosen: tor1")


def test_a_new_size_is_placed_from_availability_preferring_the_droplets_region() -> None:
    """A size change replaces the Droplet: it goes where the new size is offered, its current
    region first when that one offers it."""
    offers = {"gpu-l40sx1-48gb": offer("gpu-l40sx1-48gb", ["tor1", "nyc2"], 1.57)}
    mine = existing_droplet(region="nyc2")  # the 4000 Ada one
    run = run_program(dev(droplet={"size": "gpu-l40sx1-48gb"}), offers=offers, droplets=[mine])
    assert run.error is None, run.error
    assert run.one(DROPLET).inputs["region"] == "nyc2"
    assert run.outputs["hourlyPriceUsd"].value == 1.57
    run = run_program(
        dev(droplet={"size": "gpu-l40sx1-48gb"}),
        offers={"gpu-l40sx1-48gb": offer("gpu-l40sx1-48gb", ["sfo3"])},
        droplets=[mine],
    )
    assert isinstance(run.error, ConfigError)
    assert run.error.problems[0].startswith("droplet.regions: gpu-l40sx1-48gb is not offered in")


# ---- the endpoint's DNS record ------------------------------------------------------------------

NAMED = {"domain": "llm.example.com", "acmeEmail": "ops@example.com"}


def test_a_dns_zone_of_the_account_gets_the_endpoints_a_record() -> None:
    run = run_program(dev(access={**NAMED, "dnsZone": "example.com"}), zones=("example.com",))
    assert run.error is None, run.error
    record = run.one(DNS_RECORD)
    assert record.inputs == {
        "domain": "example.com",
        "type": "A",
        "name": "llm",
        "value": FAKE_IPV4,
        "ttl": 60,
    }
    assert record.parent == run.one("nemotron-droplet:index:GpuDroplet").urn
    assert run.outputs["endpoint"].value == "https://llm.example.com/v1"
    # The gateway (whose certificate the CA checks against the name) waits for the record.
    gateway_cmd = next(r for r in run.registrations if r.name.endswith("-gateway"))
    assert record.urn in gateway_cmd.dependencies


def test_the_record_follows_a_replaced_droplet() -> None:
    config = dev(access={**NAMED, "dnsZone": "example.com"})
    before = run_program(config, zones=("example.com",))
    after = run_program(config, zones=("example.com",), droplet_id="777", ipv4="198.51.100.77")
    assert before.one(DNS_RECORD).inputs["value"] == FAKE_IPV4
    assert after.one(DNS_RECORD).inputs["value"] == "198.51.100.77"
    assert after.one(DNS_RECORD).name == before.one(DNS_RECORD).name, "the same record, updated"
    assert after.outputs["endpoint"].value == before.outputs["endpoint"].value


def test_autodown_deletes_the_record_before_the_droplet() -> None:
    """The name must not outlive the Droplet: its address goes to someone else, who could then
    get a certificate for it. autodown learns the record to delete first."""
    config = dev(access={**NAMED, "dnsZone": "example.com"})
    rule = {"idleMinutes": 30, "token": "dop_v1_" + "a" * 64}
    config.pop("autodown", None)
    run = run_program(config, zones=("example.com",), secrets={"autodown": json.dumps(rule)})
    assert run.error is None, run.error
    autodown = next(r for r in run.registrations if r.name.endswith("-autodown"))
    assert f"AUTODOWN_DNS_RECORD=example.com {FAKE_RECORD_ID}" in autodown.inputs["stdin"]
    assert run.one(DNS_RECORD).urn in autodown.dependencies
    plain = run_program(dev(access=NAMED), secrets={"autodown": json.dumps(rule)})
    autodown = next(r for r in plain.registrations if r.name.endswith("-autodown"))
    stdin = autodown.inputs["stdin"]
    assert "AUTODOWN_DNS_RECORD=" in stdin and "AUTODOWN_DNS_RECORD=example" not in stdin


def test_the_zone_apex_is_the_at_record() -> None:
    access = {"domain": "example.com", "acmeEmail": "o@example.com", "dnsZone": "example.com"}
    run = run_program(dev(access=access), zones=("example.com",))
    assert run.one(DNS_RECORD).inputs["name"] == "@"


def test_without_a_zone_no_record_is_made_and_the_user_points_the_name() -> None:
    for access in ({}, NAMED, {"sslip": True, "acmeEmail": "o@example.com"}):
        run = run_program(dev(access=access))
        assert run.error is None, run.error
        assert not [r for r in run.registrations if r.type == DNS_RECORD]
        assert not [c for c in run.cloud.calls if c.token == DOMAIN_TOKEN]


def test_a_zone_not_in_the_account_is_refused_before_anything_is_created() -> None:
    run = run_program(dev(access={**NAMED, "dnsZone": "example.com"}), zones=("other.org",))
    assert isinstance(run.error, ConfigError)
    [problem] = run.error.problems
    assert problem.startswith("access.dnsZone: example.com is not a domain of this DigitalOcean")
    assert "Networking > Domains" in problem
    assert run.registrations == []


@pytest.mark.parametrize(
    ("access", "message"),
    [
        ({"dnsZone": "example.com"}, "access.dnsZone: example.com holds the record of access."),
        ({**NAMED, "dnsZone": "other.org"}, "access.dnsZone: llm.example.com is not in other.org"),
        ({**NAMED, "dnsZone": "ample.com"}, "access.dnsZone: llm.example.com is not in ample.com"),
        ({**NAMED, "dnsZone": "Example.COM"}, "access.dnsZone: 'Example.COM': accepted:"),
    ],
)
def test_a_zone_that_cannot_hold_the_domain_is_refused(
    access: dict[str, Any], message: str
) -> None:
    run = run_program(dev(access=access), zones=("example.com", "other.org", "ample.com"))
    assert isinstance(run.error, ConfigError)
    assert any(message in p for p in run.error.problems), run.error.problems
    assert run.registrations == []


def test_a_stack_with_no_keys_of_ours_plans_nothing() -> None:
    """No `nemotron-droplet:` key at all (a stack with no file, or its keys under a misspelt
    namespace): the defaults would plan a GPU Droplet nobody chose; refused, nothing declared."""
    run = run_program({})
    assert run.error is not None and run.registrations == []
    assert "sets no nemotron-droplet: keys" in str(run.error)
    assert "cp stacks/Pulumi.dev.yaml" in str(run.error)


def test_every_refusal_reaches_the_engine_as_its_run_error() -> None:
    """spec's ConfigError knows no Pulumi; the cloud raises it as a pulumi.RunError, which
    `pulumi up` prints as its message alone, no traceback: a config refused by its checks, a
    stack with no keys of ours, a size the account does not list."""
    for run in (
        run_program(dev(access={"domain": "llm.example.com"})),
        run_program({}),
        run_program(dev(), offers={}),
    ):
        assert isinstance(run.error, ConfigError), run.error
        assert isinstance(run.error, pulumi.RunError), run.error
        assert str(run.error).startswith("the stack configuration has 1 problem(s)"), run.error
        assert run.registrations == []


def test_the_ssh_command_makes_what_it_writes_into_on_a_fresh_account(tmp_path: Path) -> None:
    """`eval "$(pulumi stack output sshCommand)"` on an account with no ~/.ssh: the folder is
    made owner-only, the key written owner-only beside the pinned host key (a fake `pulumi`
    prints the key; the ssh that follows is not run)."""
    command = droplet.ssh_command("dev", "203.0.113.10", FAKE_HOST_PUBLIC_KEY)
    assert command.count(" && ssh ") == 1, command  # never run the real ssh below
    write_files = command.split(" && ssh ", 1)[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "pulumi"
    fake.write_text("#!/bin/sh\necho 'fake private key'\n")
    fake.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    run = subprocess.run(["bash", "-c", write_files], env=env, capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    ssh = home / ".ssh"
    assert stat.S_IMODE(ssh.stat().st_mode) == 0o700
    key = ssh / "nemotron-droplet-dev"
    assert key.read_text() == "fake private key\n" and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (ssh / "nemotron-droplet-dev.known_hosts").read_text().startswith("203.0.113.10 ")


@pytest.mark.parametrize(
    ("autodown", "secrets", "expected"),
    [
        ({}, {}, "autodown is off"),
        ({"idleMinutes": 30}, {}, "autodown only logs"),
        (None, {"autodown": json.dumps({"idleMinutes": 30, "token": "dop_v1_" + "a" * 64})}, None),
    ],
)
def test_pulumi_up_says_when_nothing_will_stop_the_bill(
    autodown: dict[str, Any] | None,
    secrets: dict[str, str],
    expected: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = {k: v for k, v in stack_config("dev").items() if k != "autodown"}
    if autodown is not None:
        config["autodown"] = autodown
    caplog.set_level(logging.WARNING)
    run = run_program(config, secrets=secrets)
    assert run.error is None, run.error
    said = [r.message for r in caplog.records if "nothing will stop the bill" in r.message]
    if expected is None:
        assert said == [], "a rule with a token deletes the Droplet"
    else:
        (line,) = said
        assert expected in line and "$0.76/hour until `pulumi destroy`" in line, line


# ---- SSH from the machine that runs `pulumi up`: a GitHub-hosted runner (issue 42) ---------------

HOSTED = {"GITHUB_ACTIONS": "true", "RUNNER_ENVIRONMENT": "github-hosted"}
NARROW = ["8.8.8.0/24"]  # a range someone connects from: not the runner's


def prod_with_ssh(ssh_cidrs: list[str]) -> dict[str, Any]:
    config = stack_config("prod")
    return {**config, "access": {**config["access"], "sshCidrs": ssh_cidrs}}


def test_an_up_on_a_hosted_runner_that_ssh_would_not_admit_is_refused_before_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prod stack's old advice (narrow sshCidrs to CI egress ranges) broke every wake and
    push: a hosted runner's address is none a user can list. Refused at once, naming the field
    and what works, instead of an SSH dial that times out."""
    for name, value in HOSTED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(runner.EGRESS_ENV, raising=False)
    result = run_program(prod_with_ssh(NARROW), stack="prod")
    assert isinstance(result.error, ConfigError), result.error
    message = str(result.error)
    assert "access.sshCidrs: ['8.8.8.0/24'] does not admit this GitHub-hosted runner" in message
    assert '["0.0.0.0/0", "::/0"]' in message and runner.EGRESS_ENV in message
    assert not [r for r in result.registrations if r.type == DROPLET]
    # The shipped prod stack (anywhere) is deployed from the same runner.
    assert run_program(stack_config("prod"), stack="prod").error is None


def test_a_preview_a_laptop_or_a_self_hosted_runner_is_never_refused_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(runner.EGRESS_ENV, raising=False)
    for env in ({}, {"GITHUB_ACTIONS": "true", "RUNNER_ENVIRONMENT": "self-hosted"}):
        monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
        monkeypatch.delenv("RUNNER_ENVIRONMENT", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert run_program(prod_with_ssh(NARROW), stack="prod").error is None, env
    for name, value in HOSTED.items():
        monkeypatch.setenv(name, value)
    # preview.yml previews every stack on hosted runners: a preview connects to nothing.
    monkeypatch.setattr(pulumi.runtime, "is_dry_run", lambda: True)
    assert run_program(prod_with_ssh(NARROW), stack="prod").error is None


@pytest.mark.parametrize(
    ("egress", "problem"),
    [
        ("8.8.8.16/28", None),
        ("8.8.8.0/24 2001:4860::/32", "does not cover 2001:4860::/32 of RUNNER_EGRESS_CIDRS"),
        ("8.8.9.0/28", "does not cover 8.8.9.0/28 of RUNNER_EGRESS_CIDRS"),
        ("a lot", "RUNNER_EGRESS_CIDRS (a repository variable): 'a' does not appear"),
    ],
)
def test_a_larger_runner_with_a_static_range_needs_that_range_in_the_list(
    egress: str, problem: str | None
) -> None:
    found = runner.ssh_problem(NARROW, {**HOSTED, runner.EGRESS_ENV: egress})
    assert found == problem if problem is None else problem in str(found), found


def test_deploy_yml_hands_the_runners_static_range_to_the_program() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    # Every pulumi/actions step (a Kubernetes destroy's refresh before it too: one env).
    steps = [s for s in wf["jobs"]["deploy"]["steps"] if "pulumi/actions@" in str(s.get("uses"))]
    assert steps
    for pulumi_step in steps:
        assert pulumi_step["env"][runner.EGRESS_ENV] == "${{ vars.RUNNER_EGRESS_CIDRS }}"
