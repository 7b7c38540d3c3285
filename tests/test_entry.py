"""The Pulumi program with replicas, under mocks: the set, its entry (the Caddy Droplet or
DigitalOcean's Load Balancer), the firewall between them, the outputs. The rolling order (one
Droplet stays one, a live set rolls one replica at a time) is endpoint.py's: test_endpoint.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pulumi_harness import (
    DNS_RECORD,
    FAKE_API_KEY,
    FAKE_DROPLET_ID,
    FAKE_LB_IPV4,
    FAKE_RESERVED_IPV4,
    SECRET_SIG,
    VOLUME,
    VOLUME_ATTACHMENT,
    Registration,
    Run,
    existing_droplet,
    existing_volume,
    offer,
    run_program,
)
from test_droplet import (
    DROPLET,
    EVERYWHERE,
    FIREWALL,
    NAMED,
    OFFICE,
    _assert_nowhere_plain,
    dev,
)

from components.cloud import entry
from components.spec import catalog, config
from components.spec.config import ConfigError

COMMAND = "command:remote:Command"
LOAD_BALANCER = "digitalocean:index/loadBalancer:LoadBalancer"
CERTIFICATE = "digitalocean:index/certificate:Certificate"
RESERVED_IP = "digitalocean:index/reservedIp:ReservedIp"
ASSIGNMENT = "digitalocean:index/reservedIpAssignment:ReservedIpAssignment"
# The dev stack's size and its mocked price (pulumi_harness.DEFAULT_OFFERS).
GPU_PRICE = 0.76
CADDY_PRICE = 0.00893
MANAGED = {**NAMED, "dnsZone": "example.com"}


def of(run: Run, type_: str) -> dict[str, Registration]:
    return {r.name: r for r in run.registrations if r.type == type_}


def rules(fw: Registration) -> dict[str, dict[str, Any]]:
    return {r["portRange"]: r for r in fw.inputs["inboundRules"]}


def depends(run: Run, reg: Registration) -> set[str]:
    by_urn = {r.urn: r.name for r in run.registrations}
    return {by_urn[u] for u in reg.dependencies if u in by_urn}


def live_set(count: int, size: str = "gpu-4000adax1-20gb") -> list[dict[str, Any]]:
    """The set's Droplets as DigitalOcean lists them once they exist."""
    return [
        existing_droplet(
            name="nemotron-dev" if i == 0 else f"nemotron-dev-{i}",
            size=size,
            droplet_id=int(FAKE_DROPLET_ID) + i,
        )
        for i in range(count)
    ]


# ---- the Caddy balancer (no DigitalOcean DNS zone) ------------------------------------------


def test_three_replicas_behind_a_caddy_droplet_with_a_reserved_ip() -> None:
    run = run_program({**dev(), "replicas": 3})
    assert run.error is None, run.error
    droplets = of(run, DROPLET)
    assert set(droplets) == {"gpu", "gpu-1", "gpu-2", "balancer"}
    gpus = [droplets[n] for n in ("gpu", "gpu-1", "gpu-2")]
    # Replica 0 keeps a lone Droplet's name; all in one region, hence one (default) VPC.
    assert [g.inputs["name"] for g in gpus] == ["nemotron-dev", "nemotron-dev-1", "nemotron-dev-2"]
    assert {g.inputs["region"] for g in gpus} == {droplets["balancer"].inputs["region"]}
    assert all("vpcUuid" not in g.inputs for g in [*gpus, droplets["balancer"]])
    assert all("nemotron-dev:replica" in g.inputs["tags"] for g in gpus)
    lb = droplets["balancer"]
    assert lb.inputs["size"] == catalog.BALANCER_SIZE
    assert lb.inputs["image"] == catalog.BALANCER_IMAGE
    assert "nemotron-dev:balancer" in lb.inputs["tags"]
    assert "nemotron-dev:replica" not in lb.inputs["tags"], "autodown deletes by that tag"
    # One login key for the whole set (one sshPrivateKey output opens each).
    assert len(of(run, "digitalocean:index/sshKey:SshKey")) == 1
    assert {tuple(d.inputs["sshKeys"]) for d in droplets.values()} == {
        (gpus[0].inputs["sshKeys"][0],)
    }
    # The endpoint is the Reserved IP, assigned to the balancer Droplet.
    assert of(run, ASSIGNMENT)["balancer-ip-assignment"].inputs == {
        "ipAddress": FAKE_RESERVED_IPV4,
        "dropletId": int(f"{FAKE_DROPLET_ID}90"),
    }
    assert run.outputs["endpoint"].value == f"https://{FAKE_RESERVED_IPV4}/v1"
    assert run.outputs["hourlyPriceUsd"].value == pytest.approx(3 * GPU_PRICE + CADDY_PRICE)
    replicas = run.outputs["replicas"].value
    assert [r["name"] for r in replicas] == ["nemotron-dev", "nemotron-dev-1", "nemotron-dev-2"]
    assert [r["privateIpv4"] for r in replicas] == ["10.110.0.2", "10.110.0.3", "10.110.0.4"]
    assert all(r["ipv4"] in r["sshCommand"] for r in replicas)
    assert replicas[2]["logs"] == "nemodrop logs --stack dev --replica 2"
    balancer = run.outputs["balancer"].value
    assert balancer["kind"] == "caddy" and "least outstanding" in balancer["routing"]
    assert balancer["address"] == FAKE_RESERVED_IPV4
    assert balancer["hourlyPriceUsd"] == pytest.approx(CADDY_PRICE)
    assert "one replica at a time" in run.outputs["dropletReplacement"].value


def test_replicas_admit_their_gateway_port_only_from_the_balancer() -> None:
    run = run_program(dev(access={"apiCidrs": [OFFICE], "sshCidrs": [OFFICE]}) | {"replicas": 3})
    assert run.error is None, run.error
    walls = of(run, FIREWALL)
    port = str(catalog.REPLICA_PORT)
    for name in ("gpu-fw", "gpu-1-fw", "gpu-2-fw"):
        inbound = rules(walls[name])
        # SSH as configured; no public API, no ACME port; the private port from the balancer.
        assert set(inbound) == {"22", port}, name
        assert inbound["22"]["sourceAddresses"] == [OFFICE]
        assert inbound[port]["sourceTags"] == ["nemotron-dev:balancer"]
        assert "sourceAddresses" not in inbound[port]
    # The tag exists before any firewall names it, and outlives the stack's changes.
    tag = of(run, "digitalocean:index/tag:Tag")["balancer-tag"]
    assert tag.inputs["name"] == "nemotron-dev:balancer" and tag.retain_on_delete
    assert all(tag.urn in walls[n].dependencies for n in ("gpu-fw", "gpu-1-fw", "gpu-2-fw"))
    # Replica 0's autodown reads the others' metrics: they admit it too, and only it.
    assert "sourceDropletIds" not in rules(walls["gpu-fw"])[port]
    assert rules(walls["gpu-1-fw"])[port]["sourceDropletIds"] == [int(FAKE_DROPLET_ID)]
    # The balancer: the API from apiCidrs, ACME from anywhere, SSH as configured.
    front = rules(walls["balancer-fw"])
    assert front["443"]["sourceAddresses"] == [OFFICE]
    assert front["80"]["sourceAddresses"] == EVERYWHERE
    assert front["22"]["sourceAddresses"] == [OFFICE]


def test_each_replica_joins_the_balancer_once_ready_and_leaves_it_drained() -> None:
    run = run_program({**dev(), "replicas": 3})
    commands = of(run, COMMAND)
    for i, prefix in enumerate(("bootstrap", "bootstrap-1", "bootstrap-2")):
        member = commands[f"balancer-member-{i}"]
        assert {f"{prefix}-ready", "balancer-gateway"} <= depends(run, member)
        assert member.inputs["create"].endswith("bash -s")
        assert member.inputs["delete"].startswith("NEMO_ACTION=leave timeout ")
        # A new address (a replacement) is a new member: its own file, then the old one's leave.
        replica_id = FAKE_DROPLET_ID + (str(i) if i else "")
        assert member.inputs["triggers"] == [
            f"{FAKE_DROPLET_ID}90",
            replica_id,
            f"10.110.0.{2 + i}",
        ]
        assert f"/etc/caddy/upstreams/replica-{i}-{replica_id}.caddy" in member.inputs["stdin"]
        stdin = member.inputs["stdin"]
        assert f"NEMO_UPSTREAM=10.110.0.{2 + i}:{catalog.REPLICA_PORT}" in stdin
    assert "balancer-member-0" in depends(run, commands["balancer-ready"])
    # A replica's gateway listens on its private address; its ready probes it there.
    assert "\tbind 10.110.0.3" in commands["bootstrap-1-gateway"].inputs["stdin"]
    probe = f"NEMO_PROBE_URL=http://10.110.0.3:{catalog.REPLICA_PORT}/v1/chat/completions"
    assert probe in commands["bootstrap-1-ready"].inputs["stdin"]
    # Replica 0 runs the set's autodown, the others none.
    assert (
        "AUTODOWN_PEER_METRICS_URLS=http://10.110.0.3:8080/metrics http://10.110.0.4:8080/metrics"
        in (commands["bootstrap-autodown"].inputs["stdin"])
    )
    # ... and deletes them by their Droplet ids (the mocks give replica k the id 424242k).
    ids = f"AUTODOWN_PEER_DROPLET_IDS={FAKE_DROPLET_ID}1 {FAKE_DROPLET_ID}2"
    assert ids in commands["bootstrap-autodown"].inputs["stdin"]
    assert "NEMO_AUTODOWN_MODE=off" in commands["bootstrap-1-autodown"].inputs["stdin"]


def _caddy_offer() -> dict[str, dict[str, Any]]:
    return {catalog.BALANCER_SIZE: offer(catalog.BALANCER_SIZE, ["tor1", "nyc2"], CADDY_PRICE)}


def test_a_balancer_size_not_sold_in_the_replicas_region_is_refused_before_anything() -> None:
    offers = {
        "gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["tor1"], GPU_PRICE),
        catalog.BALANCER_SIZE: offer(catalog.BALANCER_SIZE, ["ams3"], CADDY_PRICE),
    }
    run = run_program({**dev(droplet={"regions": ["tor1"]}), "replicas": 2}, offers=offers)
    assert isinstance(run.error, ConfigError), run.error
    assert run.error.problems[0].startswith(
        "balancer.size: s-1vcpu-1gb is not offered in tor1, where the replicas are"
    )
    assert run.registrations == []


def test_the_set_keeps_every_secret_secret() -> None:
    run = run_program({**dev(), "replicas": 2})
    assert run.error is None
    _assert_nowhere_plain(run, FAKE_API_KEY)
    for reg in of(run, COMMAND).values():
        assert FAKE_API_KEY not in reg.inputs["create"] + str(reg.inputs.get("delete", ""))


# ---- DigitalOcean's Load Balancer (a domain in DigitalOcean DNS) ------------------------------


def test_the_caddy_entry_with_a_dns_zone_asks_for_its_certificate_once_the_record_exists() -> None:
    """The CA checks the name as soon as Caddy asks, and a failed validation counts against its
    limits: the balancer's gateway waits for the A record that points the name at it."""
    run = run_program(
        {**dev(access=MANAGED), "replicas": 2, "balancer": {"kind": "caddy"}},
        zones=("example.com",),
    )
    assert run.error is None, run.error
    record = of(run, DNS_RECORD)["endpoint-record"]
    assert record.inputs["value"] == FAKE_RESERVED_IPV4
    commands = of(run, COMMAND)
    assert "endpoint-record" in depends(run, commands["balancer-gateway"])
    assert "NEMO_HOST=llm.example.com" in commands["balancer-gateway"].inputs["stdin"]
    assert "endpoint-record" in depends(run, commands["balancer-ready"])


@pytest.mark.parametrize(
    ("region", "nodes", "sized"),
    [
        ("tor1", 2, {"sizeUnit": 2}),
        ("tor1", 100, {"sizeUnit": 100}),
        ("nyc2", 1, {"size": "lb-small"}),
        ("nyc2", 3, {"size": "lb-medium"}),
        ("nyc2", 6, {"size": "lb-large"}),
    ],
)
def test_the_load_balancer_is_sized_as_its_region_takes_it(
    region: str, nodes: int, sized: dict[str, Any]
) -> None:
    """AMS2, NYC2 and SFO1 take no size_unit, only the size slug of 1, 3 or 6 nodes
    (DigitalOcean OpenAPI, load_balancer_base.yml); the fake refuses what the API refuses."""
    run = run_program(
        {
            **dev(access=MANAGED, droplet={"regions": [region]}),
            "replicas": 2,
            "balancer": {"nodes": nodes},
        },
        offers={"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", [region], GPU_PRICE)},
        zones=("example.com",),
    )
    assert run.error is None, run.error
    lb = of(run, LOAD_BALANCER)["lb"]
    assert {k: lb.inputs[k] for k in ("sizeUnit", "size") if k in lb.inputs} == sized


def test_a_node_count_the_region_cannot_take_is_refused_before_anything() -> None:
    run = run_program(
        {
            **dev(access=MANAGED, droplet={"regions": ["nyc2"]}),
            "replicas": 2,
            "balancer": {"nodes": 2},
        },
        offers={"gpu-4000adax1-20gb": offer("gpu-4000adax1-20gb", ["nyc2"], GPU_PRICE)},
        zones=("example.com",),
    )
    assert isinstance(run.error, ConfigError), run.error
    assert run.error.problems[0].startswith(
        "balancer.nodes: 2 is not a size DigitalOcean's Load Balancer has in nyc2"
    )
    assert "accepted 1, 3, 6 nodes" in run.error.problems[0]
    assert run.registrations == []
    too_many = run_program({**dev(access=MANAGED), "replicas": 2, "balancer": {"nodes": 101}})
    assert isinstance(too_many.error, ConfigError)
    assert too_many.error.problems[0].startswith("balancer.nodes:")


def test_a_dns_zone_puts_the_set_behind_a_managed_load_balancer() -> None:
    run = run_program(
        {**dev(access={**MANAGED, "apiCidrs": [OFFICE]}), "replicas": 2}, zones=("example.com",)
    )
    assert run.error is None, run.error
    lb = of(run, LOAD_BALANCER)["lb"]
    assert lb.inputs["dropletTag"] == "nemotron-dev:replica"
    tag = of(run, "digitalocean:index/tag:Tag")["lb-replica-tag"]
    assert tag.inputs["name"] == "nemotron-dev:replica" and tag.urn in lb.dependencies
    # Never deleted (that would untag the replicas); adopted when it exists (next test).
    assert tag.retain_on_delete and tag.import_id == ""
    assert lb.inputs["forwardingRules"] == [
        {
            "entryPort": 443,
            "entryProtocol": "https",
            "targetPort": catalog.REPLICA_PORT,
            "targetProtocol": "http",
            # Auto-named: a new domain's certificate exists before the old one goes.
            "certificateName": "lb-certificate-a1b2c3",
        }
    ]
    assert lb.inputs["healthcheck"] == {
        "protocol": "http",
        "port": catalog.REPLICA_PORT,
        "path": "/health",
        # A saturated vLLM answers /health late: a look waits 15 s, as Caddy's and the
        # router's do, or a burst takes every busy replica out (issue 42).
        "checkIntervalSeconds": 15,
        "responseTimeoutSeconds": 15,
        "unhealthyThreshold": 2,
        "healthyThreshold": 2,
    }
    assert lb.inputs["httpIdleTimeoutSeconds"] == 600
    assert lb.inputs["firewall"] == {"allows": [f"cidr:{OFFICE}"]}
    assert of(run, CERTIFICATE)["lb-certificate"].inputs["type"] == "lets_encrypt"
    assert of(run, CERTIFICATE)["lb-certificate"].inputs["domains"] == ["llm.example.com"]
    # The name points at the Load Balancer; the replicas admit it alone.
    assert of(run, DNS_RECORD)["endpoint-record"].inputs["value"] == FAKE_LB_IPV4
    for name in ("gpu-fw", "gpu-1-fw"):
        private = rules(of(run, FIREWALL)[name])[str(catalog.REPLICA_PORT)]
        assert private["sourceLoadBalancerUids"] == ["lb-uuid-0001"]
    assert not [d for d in of(run, DROPLET) if d == "balancer"]
    assert run.outputs["endpoint"].value == "https://llm.example.com/v1"
    price = 2 * GPU_PRICE + 10 / 672
    assert run.outputs["hourlyPriceUsd"].value == pytest.approx(price, abs=1e-5)
    assert run.outputs["balancer"].value["kind"] == "managed"
    assert run.outputs["balancer"].value["address"] == FAKE_LB_IPV4
    # Autodown leaves the name alone: it is the entry's, which stays.
    assert "AUTODOWN_DNS_RECORD=\n" in of(run, COMMAND)["bootstrap-autodown"].inputs["stdin"]


def test_the_managed_entry_everyone_may_reach_has_no_allow_list() -> None:
    assert entry.lb_firewall(list(EVERYWHERE)) is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"balancer": {"kind": "managed"}}, "balancer.kind: managed needs a DigitalOcean-managed"),
        ({"access": {"apiCidrs": []}}, "access.apiCidrs: [] closes the API port"),
        ({"replicas": 9}, "replicas: 9: accepted: a whole number from 1"),
        (
            {"access": {**MANAGED, "apiCidrs": ["2a00:1450::/32"]}},
            "access.apiCidrs: DigitalOcean's Load Balancer is IPv4-only",
        ),
        ({"replicas": "two"}, "replicas: 'two': accepted"),
        (
            {"access": MANAGED, "balancer": {"kind": "managed", "routing": "cache-aware"}},
            "balancer.routing: cache-aware routes on the prompt's cached prefix, which "
            "DigitalOcean's Load Balancer cannot do",
        ),
        (
            {"access": MANAGED, "balancer": {"kind": "managed", "routing": "least-conn"}},
            "balancer.routing: least-conn routes by requests in flight, which DigitalOcean's",
        ),
        (
            {"balancer": {"routing": "prefix"}},
            "balancer.routing: Input should be 'auto', 'cache-aware' or 'least-conn'",
        ),
    ],
)
def test_a_set_that_cannot_work_is_refused_before_anything(
    override: dict[str, Any], message: str
) -> None:
    raw = dev(**{k: v for k, v in override.items() if k != "replicas"})
    raw["replicas"] = override.get("replicas", 2)
    run = run_program(raw)
    assert isinstance(run.error, ConfigError), run.error
    assert any(p.startswith(message) for p in run.error.problems), run.error.problems
    assert run.registrations == []


@pytest.mark.parametrize(
    ("replicas", "access", "balancer", "kind", "routing"),
    [
        # The default with replicas behind Caddy: Caddy's least_conn (the router rewrites
        # tool definitions: it is asked for, never assumed).
        (3, {}, {}, "caddy", "least-conn"),
        (3, {}, {"routing": "cache-aware"}, "caddy", "cache-aware"),
        (2, {}, {"routing": "least-conn"}, "caddy", "least-conn"),
        # One replica behind the waking front: nothing to choose between.
        (1, {}, {}, "caddy", "least-conn"),
        # A DNS zone makes `auto` the managed Load Balancer (its own round robin)...
        (2, MANAGED, {}, "managed", "round-robin"),
        # ...unless routing is asked for, which only Caddy does.
        (2, MANAGED, {"routing": "cache-aware"}, "caddy", "cache-aware"),
    ],
)
def test_routing_resolves_from_the_entry_and_the_replicas(
    replicas: int, access: dict[str, Any], balancer: dict[str, Any], kind: str, routing: str
) -> None:
    raw = {**dev(access=access, balancer=balancer), "replicas": replicas}
    if replicas == 1:
        raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": "github_pat_x"}
    cfg = config.parse(raw, "dev", frozenset({"wake"}) if replicas == 1 else frozenset())
    assert (cfg.balancer_kind, cfg.routing) == (kind, routing)


# ---- a cache Volume per replica ---------------------------------------------------------------


def test_each_replica_has_its_own_cache_volume_and_a_kept_one_is_adopted() -> None:
    kept = existing_volume(name="nemotron-dev-1-cache", region="tor1", size=60, volume_id="vol-r1")
    run = run_program(
        {**dev(droplet={"regions": ["tor1"]}, cache={"sizeGb": 60}), "replicas": 3},
        volumes=[kept],
    )
    assert run.error is None, run.error
    volumes = of(run, VOLUME)
    assert {n: v.inputs["name"] for n, v in volumes.items()} == {
        "cache": "nemotron-dev-cache",
        "cache-1": "nemotron-dev-1-cache",
        "cache-2": "nemotron-dev-2-cache",
    }
    assert {v.inputs["region"] for v in volumes.values()} == {"tor1"}
    assert volumes["cache-1"].import_id == "vol-r1", "the kept Volume is adopted, warm"
    assert volumes["cache"].import_id == "" and volumes["cache-2"].import_id == ""
    attached = {n: a.inputs["dropletId"] for n, a in of(run, VOLUME_ATTACHMENT).items()}
    assert attached == {
        "cache-attachment": int(FAKE_DROPLET_ID),
        "cache-1-attachment": int(f"{FAKE_DROPLET_ID}1"),
        "cache-2-attachment": int(f"{FAKE_DROPLET_ID}2"),
    }
    device = "NEMO_CACHE_DEVICE=/dev/disk/by-id/scsi-0DO_Volume_nemotron-dev-1-cache"
    assert device in of(run, COMMAND)["bootstrap-1-cache"].inputs["stdin"]
    states = [r["cache"]["state"] for r in run.outputs["replicas"].value]
    assert states == ["new", "kept", "new"]
    assert run.outputs["cache"].value["volume"] == "nemotron-dev-cache"
    assert run.outputs["cacheMonthlyPriceUsd"].value == pytest.approx(3 * 6.0)


def test_a_live_set_moving_to_the_load_balancer_adopts_its_tag() -> None:
    run = run_program(
        {**dev(access=MANAGED), "replicas": 2},
        zones=("example.com",),
        droplets=live_set(2),
        tags=("nemotron-dev:replica",),
    )
    assert run.error is None, run.error
    tag = of(run, "digitalocean:index/tag:Tag")["lb-replica-tag"]
    assert tag.import_id == "nemotron-dev:replica"


# ---- wake: the front that keeps the address while the set sleeps ---------------------------------

WAKE_TOKEN = "github_pat_WAKEentryTEST0000000000000000000000"
WAKE = {"enabled": True, "githubRepo": "me/llm", "token": WAKE_TOKEN}


def test_wake_puts_even_one_replica_behind_the_front_and_keeps_its_token_secret() -> None:
    config = dev(autodown={"idleMinutes": 30, "maxHours": 8})
    run = run_program(config, secrets={"wake": json.dumps(WAKE)})
    assert run.error is None, run.error
    assert set(of(run, DROPLET)) == {"gpu", "balancer"}
    # The endpoint is the front's Reserved IP, which outlives the GPU set.
    assert run.outputs["endpoint"].value == f"https://{FAKE_RESERVED_IPV4}/v1"
    commands = of(run, COMMAND)
    waker, gateway = commands["balancer-wake"], commands["balancer-gateway"]
    assert waker.urn in gateway.dependencies, "the gateway routes through the waker: it runs first"
    output = run.outputs["wake"].value
    assert output["mode"] == "on" and output["trigger"] == "github: me/llm deploy.yml@main"
    assert output["idleMonthlyPriceUsd"] == pytest.approx(round(CADDY_PRICE * 672, 2))
    _assert_nowhere_plain(run, WAKE_TOKEN)
    # It is sent, and only as a secret: the waker's script carries it in its secret stdin.
    stdin = waker.raw["stdin"]
    assert isinstance(stdin, dict) and stdin.get(SECRET_SIG), "the waker's stdin is secret"
    assert WAKE_TOKEN in stdin["value"]


def test_without_wake_the_waker_is_removed_and_the_gateway_does_not_wait_for_it() -> None:
    run = run_program({**dev(), "replicas": 2})
    assert run.error is None, run.error
    commands = of(run, COMMAND)
    assert commands["balancer-wake"].urn not in commands["balancer-gateway"].dependencies
    # Off, it runs after the gateway: the gateway stops routing through the waker first.
    assert commands["balancer-gateway"].urn in commands["balancer-wake"].dependencies
    assert run.outputs["wake"].value == {"mode": "off"}


@pytest.mark.parametrize(
    ("wake", "message"),
    [
        ({"enabled": True, "githubRepo": "me/llm"}, "wake.token: the pipeline's token is unset"),
        ({"enabled": True, "token": WAKE_TOKEN}, "wake.githubRepo: the repository whose workflow"),
        (
            {"enabled": True, "trigger": "webhook", "token": WAKE_TOKEN},
            "wake.webhookUrl: wake.trigger: webhook needs the https:// URL",
        ),
        (
            {**WAKE, "webhookUrl": "http://ci.example.com/hook"},
            "wake.webhookUrl: accepted: an https:// URL with no user:password@",
        ),
        (
            {**WAKE, "trigger": "webhook", "webhookUrl": "https://ci:s3cr3t@ci.example.com/h"},
            "wake.webhookUrl: accepted: an https:// URL with no user:password@",
        ),
        (
            {**WAKE, "githubRepo": "not a repo"},
            "wake.githubRepo: 'not a repo': accepted: owner/name",
        ),
        ({**WAKE, "holdSeconds": 5}, "wake.holdSeconds"),
    ],
)
def test_wake_refusals_name_the_field(wake: dict[str, Any], message: str) -> None:
    run = run_program(dev(), secrets={"wake": json.dumps(wake)})
    assert isinstance(run.error, ConfigError), run.error
    assert any(message in p for p in run.error.problems), run.error.problems
    assert all(WAKE_TOKEN not in p for p in run.error.problems), "a refusal never quotes it"
    assert all("s3cr3t" not in p for p in run.error.problems), "nor a URL's credential"
    assert not run.registrations or all(r.type.startswith("pulumi:") for r in run.registrations)


def test_wake_needs_the_caddy_front_not_the_load_balancer() -> None:
    """With wake on, `auto` is the Caddy front even where the Load Balancer could serve (a
    domain in DigitalOcean DNS); choosing the Load Balancer is refused."""
    auto = run_program(
        dev(access=MANAGED), secrets={"wake": json.dumps(WAKE)}, zones=("example.com",)
    )
    assert auto.error is None, auto.error
    assert not of(auto, LOAD_BALANCER) and set(of(auto, DROPLET)) == {"gpu", "balancer"}
    managed = run_program(
        {**dev(access=MANAGED), "balancer": {"kind": "managed"}},
        secrets={"wake": json.dumps(WAKE)},
        zones=("example.com",),
    )
    assert isinstance(managed.error, ConfigError), managed.error
    assert any("DigitalOcean's Load Balancer can do neither" in p for p in managed.error.problems)


@pytest.mark.parametrize(
    "autoscale", [{"min": 0, "max": 3}, {"min": 1, "max": 2, "queueSeconds": 5}, {}]
)
def test_autoscale_on_a_droplet_stack_is_refused_naming_the_kubernetes_platform(
    autoscale: dict[str, Any],
) -> None:
    """The Droplet autoscaler retired (issue 43): any `autoscale` on a Droplet stack, on or
    off, is one refusal before anything is declared, naming the field, where capacity that
    follows the load lives now, and the keys a set that sleeps at zero keeps using."""
    raw = {**dev(autodown={"idleMinutes": 30}), "autoscale": autoscale}
    run = run_program(raw, secrets={"wake": json.dumps(WAKE)})
    assert isinstance(run.error, ConfigError), run.error
    [problem] = run.error.problems
    assert problem.startswith("autoscale: the Droplet autoscaler is retired"), problem
    assert "platform: kubernetes" in problem and "docs/kubernetes.md" in problem, problem
    for key in ("replicas", "wake.enabled", "autodown.idleMinutes"):
        assert key in problem, (key, problem)
    assert not run.registrations or all(r.type.startswith("pulumi:") for r in run.registrations)


def test_a_set_that_sleeps_at_zero_is_fixed_replicas_wake_and_the_idle_rule() -> None:
    """What wake needed of autoscale was its floor of 0; that is wake itself: a fixed count
    behind the front, which autodown's idle rule deletes whole and a keyed request brings back
    whole. The waker is sent no scaling setting and no API key, and the replicas' /metrics
    admit replica 0 alone (the front no longer reads them)."""
    raw = {**dev(autodown={"idleMinutes": 30}), "replicas": 2}
    run = run_program(raw, secrets={"wake": json.dumps(WAKE)})
    assert run.error is None, run.error
    commands = of(run, COMMAND)
    stdin = router_stdin(commands["balancer-wake"])
    assert "SCALE_" not in stdin and "WAKE_API_KEY" not in stdin, "no scaling shipped"
    gateways = [c for name, c in commands.items() if name.startswith("bootstrap")
                and name.endswith("-gateway")]  # fmt: skip
    assert len(gateways) == 2
    for command in gateways:
        line = next(x for x in router_stdin(command).splitlines() if "@metrics_reader" in x)
        assert len(line.split("remote_ip", 1)[1].split()) == 1, line
    assert "autoscale" not in run.outputs


def test_a_wake_token_in_plain_text_is_refused() -> None:
    run = run_program({**dev(), "wake": WAKE})
    assert isinstance(run.error, ConfigError), run.error
    assert any("wake.token: stored in plain text" in p for p in run.error.problems)
    assert all(WAKE_TOKEN not in p for p in run.error.problems), "nor quotes the token"


# ---- routing: the front's cache-aware router ---------------------------------------------------


def router_stdin(command: Any) -> str:
    stdin = command.raw["stdin"]
    return str(stdin["value"] if isinstance(stdin, dict) else stdin)


def test_cache_aware_routing_installs_the_router_before_the_gateway_and_members_join_after_it() -> (
    None
):
    run = run_program({**dev(), "replicas": 2, "balancer": {"routing": "cache-aware"}})
    assert run.error is None, run.error
    commands = of(run, COMMAND)
    router, gateway = commands["balancer-router"], commands["balancer-gateway"]
    assert commands["balancer-preflight"].urn in router.dependencies
    assert router.urn in gateway.dependencies, "the gateway proxies to the router: it runs first"
    for i in range(2):
        assert router.urn in commands[f"balancer-member-{i}"].dependencies
    stdin = router_stdin(router)
    assert "NEMO_ROUTER_MODE=on" in stdin
    assert "vllm-router==0.1.17" in stdin and "--hash=sha256:" in stdin, "the lock ships whole"
    assert f"NEMO_UV_WHEEL_SHA256={catalog.UV_WHEEL_SHA256}" in stdin


def test_least_conn_removes_the_router_only_after_the_gateway_no_longer_proxies_to_it() -> None:
    run = run_program({**dev(), "replicas": 2, "balancer": {"routing": "least-conn"}})
    assert run.error is None, run.error
    commands = of(run, COMMAND)
    router, gateway = commands["balancer-router"], commands["balancer-gateway"]
    assert router.urn not in gateway.dependencies
    assert gateway.urn in router.dependencies
    stdin = router_stdin(router)
    assert "NEMO_ROUTER_MODE=off" in stdin and "vllm-router==" not in stdin
