"""The platform's edge: the API-key gate (the Droplet's own Caddyfile, edge_manifests.caddyfile)
behind a DigitalOcean Load Balancer, declared with pulumi-kubernetes exactly as edge_manifests.py
builds it.

The certificate is the Droplet's: Caddy's own ACME, for the Load Balancer's IPv4 address itself
(Let's Encrypt's IP profile: no DNS, no third party) or, with access.domain, for that name, its A
record kept pointing at the Load Balancer by dns.py as on a Droplet. The Load Balancer passes TCP
through, so the certificate and its key stay in Caddy's Volume; a certificate the Load Balancer
terminated would be DigitalOcean's, for a domain in a DigitalOcean DNS zone only. The address
comes first: the Service is created, then the Caddyfile names its address.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from ...host import gateway
from ...spec import catalog
from ...spec.kube import KubePlatformConfig
from ...spec.schema import StackConfig
from .. import dns
from . import edge_manifests, manifests

# pulumi-kubernetes waits for a Service until its endpoints are ready, and this one's pod waits
# for the Caddyfile, which waits for the Service's address: the Service waits for its address
# alone. `pulumi.com/waitFor` replaces the default await logic (pulumi-kubernetes CHANGELOG
# 4.18.4, pulumi/pulumi-kubernetes#3329; the project pins >= 4.34).
WAIT_FOR_ADDRESS = {"pulumi.com/waitFor": "jsonpath={.status.loadBalancer.ingress[0].ip}"}


def lb_ipv4(status: object) -> str:
    """The Load Balancer's IPv4 address from the Service's status (the first ingress entry with
    an `ip`: DigitalOcean's controller writes the address there)."""
    ingress = getattr(getattr(status, "load_balancer", None), "ingress", None) or []
    for entry in ingress:
        ip = getattr(entry, "ip", None)
        if ip and ":" not in ip:
            return str(ip)
    raise ValueError("the edge's Load Balancer has no IPv4 address in its Service's status")


class Edge(pulumi.ComponentResource):
    """The edge in front of `upstream` (the router's Envoy: router.Router.upstream). It reads
    the API key from the model server's Secret (`secret`), which it waits for."""

    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        kube: KubePlatformConfig,
        secret: kubernetes.core.v1.Secret,
        provider: kubernetes.Provider,
        upstream: edge_manifests.Upstream = edge_manifests.ROUTER,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        svc = edge_manifests.service(cfg)  # refuses apiCidrs it cannot serve, before anything
        super().__init__(f"{catalog.PROJECT}:kube:Edge", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[secret])
        meta = svc["metadata"]
        metadata: Any = {**meta, "annotations": {**meta["annotations"], **WAIT_FOR_ADDRESS}}
        self.service = kubernetes.core.v1.Service(
            f"{name}-lb",
            metadata=metadata,
            spec=svc["spec"],
            opts=child,
        )
        self.ipv4 = self.service.status.apply(lb_ipv4)
        self.record = dns.endpoint_record(cfg, self.ipv4, parent=self)
        self.host = self.ipv4.apply(lambda ip: gateway.hostname(cfg, ip))
        self.endpoint = self.host.apply(lambda host: gateway.endpoint(cfg, host))
        text = self.host.apply(lambda host: edge_manifests.caddyfile(cfg, host, upstream))
        conf = text.apply(edge_manifests.config_map)
        self.config = kubernetes.core.v1.ConfigMap(
            f"{name}-caddyfile", metadata=conf["metadata"], data=conf["data"], opts=child
        )
        pvc = edge_manifests.claim(kube)
        self.claim = kubernetes.core.v1.PersistentVolumeClaim(
            f"{name}-data", metadata=pvc["metadata"], spec=pvc["spec"], opts=child
        )
        # The record first: with a domain, the CA checks the name as soon as Caddy starts.
        after = [self.config, self.claim, *([self.record] if self.record else [])]
        deployment = text.apply(lambda t: edge_manifests.deployment(kube, t))
        # A new API key rolls the edge too: the gate reads it from env at start.
        version = secret.metadata.apply(manifests.secret_version)
        spec: Any = pulumi.Output.all(deployment, version).apply(
            lambda d: manifests.with_secret_version(d[0]["spec"], d[1])
        )
        self.deployment = kubernetes.apps.v1.Deployment(
            name,
            metadata=deployment["metadata"],
            spec=spec,
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=after)),
        )
        self.register_outputs({"endpoint": self.endpoint})
