"""The endpoint's A record in DigitalOcean DNS (components/cloud/dns.py), under Pulumi's mocks:
made with `access.dnsZone`, following a replaced Droplet, deleted by autodown before the
Droplet, `@` at the zone apex, none without a zone; a zone not in the account, or one that
cannot hold the domain, refused before anything is created."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pulumi_harness import (
    DNS_RECORD,
    DOMAIN_TOKEN,
    FAKE_IPV4,
    FAKE_RECORD_ID,
    run_program,
)
from test_droplet import NAMED, dev

from components.spec.config import ConfigError


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
