"""The Pulumi program under mocks, for the Droplet (components/cloud/droplet.py): the shipped
stacks' key, Droplet and firewall, its lease tag, the access it opens, the endpoint's name, the
image, secrets only as secrets, and sshCommand. The helpers the other program tests import
(`dev`, `merged`, the resource types). What other modules decide is in their own files: the
config's refusals (test_config.py), the region (test_region.py), the DNS record (test_dns.py),
the runner's SSH (test_cloud_runner.py), the bill's warning (test_bill.py), the ranges
(test_cidrs.py), the API key (test_apikey.py), the engine's RunError (test_stack_config.py), the
pinned host key on every connection (test_remote.py)."""

from __future__ import annotations

import copy
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pulumi_harness import (
    FAKE_API_KEY,
    FAKE_DROPLET_ID,
    FAKE_FINGERPRINT,
    FAKE_HOST_PUBLIC_KEY,
    FAKE_IPV4,
    FAKE_PRIVATE_KEY,
    FAKE_PUBLIC_KEY,
    SECRET_SIG,
    plain_strings,
    run_program,
    stack_config,
)

from components.cloud import droplet
from components.spec import catalog
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


# ---- a named endpoint (test_dns.py's record, test_entry.py's entry) and sshCommand ----------

NAMED = {"domain": "llm.example.com", "acmeEmail": "ops@example.com"}


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
