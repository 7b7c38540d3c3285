"""The platform's edge (components/cloud/kube/edge.py, `Edge`) under Pulumi's mocks: the Caddyfile
the Droplet's gateway renders for the Load Balancer's address (and the pinned Caddy adapting it),
the key by reference and no secret in a plain input, a domain's record and certificate, `apiCidrs`
the Load Balancer cannot keep refused before anything. Its objects, one by one and against
Kubernetes' schema, are edge_manifests.py's (test_kube_edge_manifests.py). The rendered Caddyfile
is run by the real Caddy against the gateway's attack cases in tests/test_gateway_attacks.py and
test_gateway.py (their `kube-edge` parameter)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.runtime import mocks as pulumi_mocks
from pulumi_harness import (
    DEFAULT_OFFERS,
    FAKE_API_KEY,
    Registration,
    plain_strings,
    stack_config,
)
from test_droplet import merged
from test_gateway import adapt
from test_kube import (
    FAKE_HF_TOKEN,
    FAKE_KUBECONFIG,
    KubeCloud,
    KubeRecorder,
    cluster_and_server,
    kubernetes_object,
    mock,
    platform,
    stack,
)

from components.cloud.kube import edge, manifests
from components.host import gateway
from components.spec import catalog, config
from components.spec.kube import KubePlatformConfig
from components.spec.schema import StackConfig

LB_IP = "203.0.113.77"
SERVICE = "kubernetes:core/v1:Service"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
RECORD = "digitalocean:index/dnsRecord:DnsRecord"


class EdgeCloud(KubeCloud):
    """DigitalOcean's controller as the Service's status shows it: a LoadBalancer gets an
    address (IPv6 listed first, as a dual-stack one may)."""

    def new_resource(self, args: pulumi_mocks.MockResourceArgs):
        if args.typ == SERVICE and args.inputs.get("spec", {}).get("type") == "LoadBalancer":
            ingress = [{"ip": "2001:db8::77"}, {"ip": LB_IP}]
            return "edge-lb", {**args.inputs, "status": {"loadBalancer": {"ingress": ingress}}}
        return super().new_resource(args)


@dataclass
class Run:
    registrations: list[Registration]
    endpoint: str | None
    error: BaseException | None = None

    def of(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def obj(self, type_: str, name: str | None = None) -> dict[str, Any]:
        (found,) = [r for r in self.of(type_) if name is None or r.name == name]
        return kubernetes_object(found)


def run(cfg: StackConfig, kube: KubePlatformConfig) -> Run:
    cloud = EdgeCloud(DEFAULT_OFFERS)
    monitor = KubeRecorder(cloud)
    mock(cloud, monitor)
    result = Run(monitor.registrations, None)

    @pulumi.runtime.test
    def program():
        doks, server = cluster_and_server(cfg, kube)
        gate = edge.Edge("edge", cfg, kube, server.secret, doks.provider)

        def keep(endpoint: str) -> None:
            result.endpoint = endpoint

        return pulumi.Output.all(gate.endpoint, gate.deployment.id).apply(lambda a: keep(a[0]))

    try:
        program()
    except BaseException as err:  # noqa: BLE001 (tests assert on it)
        result.error = err
    return result


def with_access(**access: Any) -> StackConfig:
    raw = merged(stack_config_raw(), {"access": access})
    return config.parse(raw, "prod")


def stack_config_raw() -> dict[str, Any]:
    raw = merged(stack_config("prod"), {"droplet": {"size": "gpu-h100x1-80gb", "image": None}})
    raw["droplet"] = {k: v for k, v in raw["droplet"].items() if v is not None}
    return raw


@pytest.fixture(scope="module")
def deployed() -> tuple[Run, StackConfig, KubePlatformConfig]:
    cfg, kube = stack(), platform()
    result = run(cfg, kube)
    assert result.error is None, result.error
    return result, cfg, kube


def test_the_caddyfile_is_the_droplets_gate_for_the_load_balancers_address(deployed) -> None:
    """One renderer: gateway.lone_site for the Load Balancer's IPv4 address (the IP
    certificate, as a Droplet gets by default), in front of the router's Envoy (llm-d's
    standalone chart: the `router-epp` Service, port 8081), which reaches the model servers."""
    result, cfg, _ = deployed
    text = result.obj(CONFIG_MAP)["data"]["Caddyfile"]
    listen = gateway.Listen(
        http_port=8080,
        https_port=8443,
        upstream_host=f"router-epp.{catalog.PROJECT}.svc.cluster.local",
        upstream_port=8081,
        admin_socket=None,
        written_by="Pulumi (the edge ConfigMap)",
    )
    assert text == gateway.lone_site(cfg, LB_IP, listen)
    assert f"reverse_proxy router-epp.{catalog.PROJECT}.svc.cluster.local:8081" in text
    assert f"profile {gateway.IP_PROFILE}" in text and f"default_sni {LB_IP}" in text
    assert "admin off" in text
    assert result.endpoint == f"https://{LB_IP}/v1"


def test_the_key_comes_from_the_secret_and_no_secret_is_a_plain_input(deployed) -> None:
    result, _, _ = deployed
    for r in result.registrations:
        for path, text in plain_strings(r.raw):
            for secret in (FAKE_KUBECONFIG, "FAKE-DOKS-TOKEN", FAKE_API_KEY, FAKE_HF_TOKEN):
                assert secret not in text, (r.type, r.name, path)
    (caddy,) = result.obj(DEPLOYMENT)["spec"]["template"]["spec"]["containers"]
    (key,) = [e for e in caddy["env"] if e["name"] == gateway.API_KEY_ENV]
    assert key == {
        "name": gateway.API_KEY_ENV,
        "valueFrom": {
            "secretKeyRef": {"name": manifests.SECRET, "key": "VLLM_API_KEY", "optional": False}
        },
    }
    assert all("valueFrom" not in e for e in caddy["env"] if e is not key)
    # The Caddyfile names the variable, never the key.
    text = result.obj(CONFIG_MAP)["data"]["Caddyfile"]
    assert f"{{env.{gateway.API_KEY_ENV}}}" in text


def test_a_domain_gets_its_record_and_its_own_certificate() -> None:
    """access.domain in access.dnsZone: the A record points at the Load Balancer, the
    certificate is for the name (dns.py and gateway.hostname, as on a Droplet)."""
    cfg = with_access(domain="llm.example.com", dnsZone="example.com", acmeEmail="o@example.com")
    result = run(cfg, platform())
    assert result.error is None, result.error
    (record,) = result.of(RECORD)
    assert record.inputs["value"] == LB_IP
    assert record.inputs["name"] == "llm" and record.inputs["domain"] == "example.com"
    text = result.obj(CONFIG_MAP)["data"]["Caddyfile"]
    assert text.splitlines().count("llm.example.com {") == 1
    assert "profile" not in text and "default_sni" not in text
    assert result.endpoint == "https://llm.example.com/v1"


REFUSED = {
    "closed": ({"apiCidrs": []}, "access.apiCidrs is [] (the API reached by SSH tunnel alone)"),
    "narrow with https": ({"apiCidrs": ["81.2.69.0/24"]}, "the ACME CA validates"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_api_cidrs_the_load_balancer_cannot_keep_are_refused_before_anything(case: str) -> None:
    access, message = REFUSED[case]
    cfg = with_access(**access)
    result = run(cfg, platform())
    assert isinstance(result.error, ValueError) and message in str(result.error)
    assert "accepted:" in str(result.error)
    # Refused before anything of the edge is declared.
    assert not [r for r in result.registrations if r.name.startswith("edge")]


def test_the_pinned_caddy_runs_the_edges_caddyfile_as_deployed(deployed, tmp_path: Path) -> None:
    """The ConfigMap's text through the pinned Caddy (`caddy adapt`): the IP certificate from
    the public CA with the IP profile, the listeners on the container's ports, the proxy to the
    router's Service by its cluster name."""
    result, _, _ = deployed
    adapted, _ = adapt(tmp_path, result.obj(CONFIG_MAP)["data"]["Caddyfile"])
    [policy] = adapted["apps"]["tls"]["automation"]["policies"]
    assert policy["subjects"] == [LB_IP]
    [issuer] = policy["issuers"]
    assert issuer["module"] == "acme" and issuer["profile"] == gateway.IP_PROFILE
    assert "ca" not in issuer
    http = adapted["apps"]["http"]
    assert (http["http_port"], http["https_port"]) == (8080, 8443)
    assert http["servers"]["srv0"]["listen"] == [":8443"]
    assert "admin" in adapted and adapted["admin"]["disabled"] is True
    dials = {u["dial"] for u in walk_upstreams(adapted)}
    assert dials == {f"router-epp.{catalog.PROJECT}.svc.cluster.local:8081"}


def walk_upstreams(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = list(node.get("upstreams", [])) if node.get("handler") == "reverse_proxy" else []
        return found + [u for v in node.values() for u in walk_upstreams(v)]
    if isinstance(node, list):
        return [u for v in node for u in walk_upstreams(v)]
    return []
