"""components/cloud/droplets.py: the Droplet platform's wiring (`build()`, which __main__.py calls
for a `platform: droplet` stack), under Pulumi's mocks. Its own decision is the order: the DNS
zone (dns.check_zone), the runner's SSH (runner.check), then the site (plan_site: where the size
is offered), each refusing before anything is declared, the API key included; then the
endpoint and the outputs. Each check's own refusals: test_dns.py, test_cloud_runner.py,
test_region.py, test_site.py; the outputs: test_outputs.py."""

from __future__ import annotations

import pytest
from pulumi_harness import offer, run_program
from test_cloud_runner import HOSTED, NARROW
from test_droplet import DROPLET, NAMED, dev

from components.cloud import runner
from components.spec.config import ConfigError

RANDOM_PASSWORD = "random:index/randomPassword:RandomPassword"


def test_build_refuses_in_its_order_before_it_declares_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stack that fails all three checks is told of the zone first; the zone fixed, of the
    runner; that fixed, of the site; each time with nothing declared, not even the generated
    API key. All three fixed, it deploys."""
    for name, value in HOSTED.items():
        monkeypatch.setenv(name, value)  # an up on a GitHub-hosted runner
    monkeypatch.delenv(runner.EGRESS_ENV, raising=False)
    zone = {**NAMED, "dnsZone": "example.com"}
    elsewhere = {"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["sfo3"])}
    steps = [
        (zone | {"sshCidrs": NARROW}, ("other.org",), elsewhere,
         "access.dnsZone: example.com is not a domain of this DigitalOcean"),
        (zone | {"sshCidrs": NARROW}, ("example.com",), elsewhere,
         "access.sshCidrs: ['8.8.8.0/24'] does not admit this GitHub-hosted runner"),
        (zone, ("example.com",), elsewhere,
         "droplet.regions: gpu-4000adax1-20gb is not offered in"),
    ]  # fmt: skip
    for access, zones, offers, first in steps:
        run = run_program(dev(access=access), zones=zones, offers=offers)
        assert isinstance(run.error, ConfigError), run.error
        assert run.error.problems[0].startswith(first), run.error.problems
        assert len(run.error.problems) == 1, run.error.problems
        assert run.registrations == [], first
    run = run_program(dev(access=zone), zones=("example.com",))
    assert run.error is None, run.error
    types = [r.type for r in run.registrations]
    assert DROPLET in types and types.count(RANDOM_PASSWORD) == 1
    assert run.outputs["endpoint"].value == "https://llm.example.com/v1"
