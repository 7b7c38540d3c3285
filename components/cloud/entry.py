"""The one public entry in front of the replicas (replicas >= 2): an existing, proven balancer.

- `ManagedEntry`: DigitalOcean's Load Balancer, terminating HTTPS with a DigitalOcean-managed
  Let's Encrypt certificate (DigitalOcean issues those only for domains in its own DNS:
  terraform-provider-digitalocean docs/resources/certificate.md, `domains`). Its pool is the
  replicas' tag, evaluated at run time, so a replacement joins as soon as its /health passes
  and the one it replaces leaves as it goes. It has no choice of algorithm (the provider's
  `algorithm` is deprecated: "You can no longer specify an algorithm"), so load-aware routing
  is Caddy's alone. Idle timeout 600 s (default 60 s would cut a long prefill, which sends
  nothing until the first token). Entry HTTPS (HTTP/1.1, what OpenAI clients speak by
  default; server-sent events stream on it), target plain HTTP on the VPC.
- `CaddyEntry`: Caddy's reverse_proxy load balancing (balancer.py: least_conn, active /health
  checks, retries of requests that never reached a replica) on a small CPU Droplet holding a
  Reserved IP, with the same gate and certificate choices as a lone Droplet's gateway. A
  replica joins (a file, a graceful reload) once ready and leaves, drained, before it is
  replaced or removed: the member Command's delete.

Either way the replicas' gateways check the key again and admit nothing else; their private
port is open to the entry alone (droplet.py firewall rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_digitalocean as digitalocean

from ..host import gateway, phases
from ..host.phase_settings import Inputs
from ..spec import catalog
from ..spec.schema import StackConfig
from . import region, remote
from .droplet import StackDroplet, StackDropletArgs
from .stack_config import StackConfigError


def caddy_price(cfg: StackConfig, region_slug: str) -> float:
    """The balancer Droplet's hourly price; refused before anything is created when its size
    is not sold in the replicas' region (it must share their VPC)."""
    offer = region.lookup(cfg.balancer.size)
    if offer is None or region_slug not in offer.regions:
        where = ", ".join(sorted(offer.regions)) if offer else "nowhere for this account"
        raise StackConfigError(
            [
                f"balancer.size: {cfg.balancer.size} is not offered in {region_slug}, where the "
                f"replicas are (it is offered in: {where}); choose a size sold there, such as "
                f"{catalog.BALANCER_SIZE}"
            ]
        )
    return offer.price_hourly


def lb_size(cfg: StackConfig, region_slug: str) -> tuple[int | None, str | None]:
    """How the Load Balancer's nodes are asked for in this region, as (size_unit, size):
    `size_unit`, or where
    DigitalOcean takes none (AMS2, NYC2, SFO1) the `size` slug of that many nodes; a count
    no slug has there is refused before anything is created (catalog.LB_SIZE_SLUGS)."""
    nodes = cfg.balancer.nodes
    if region_slug not in catalog.LB_SIZE_SLUG_REGIONS:
        return nodes, None
    slug = catalog.LB_SIZE_SLUGS.get(nodes)
    if slug is None:
        accepted = ", ".join(str(n) for n in catalog.LB_SIZE_SLUGS)
        raise StackConfigError(
            [
                f"balancer.nodes: {nodes} is not a size DigitalOcean's Load Balancer has in "
                f"{region_slug}, where the replicas are (there it is sized by slug: accepted "
                f"{accepted} nodes); choose one of these, or put {region_slug} after another "
                "region in droplet.regions"
            ]
        )
    return None, slug


def tag_exists(name: str) -> bool:
    """Whether the account has this tag (the provider's data source fails with "tag not found"
    for one it has not: terraform-provider-digitalocean tag/datasource_tag.go)."""
    try:
        digitalocean.get_tag(name=name)
    except Exception as err:
        if "not found" in str(err):
            return False
        raise
    return True


def find_front(cfg: StackConfig) -> region.Existing | None:
    """The Caddy front's Droplet, if DigitalOcean lists it: named `cfg.balancer_name`, tagged with
    the stack's tag, among CPU Droplets (the front is not a GPU one). The balancer tag exists
    from the front's first `pulumi up` on (the front carries it, and its Tag resource is never
    deleted: adopted_tag), so a stack whose account has no such tag has no front, and the
    Droplets are listed only once it does."""
    if not tag_exists(cfg.balancer_tag):
        return None
    return region.find_existing(cfg.balancer_name, cfg.stack_tag, gpus=False)


def adopted_tag(
    resource_name: str, tag: str, parent: pulumi.Resource | None = None
) -> digitalocean.Tag:
    """A tag as a resource of its own, for what names it before any Droplet carries it (a Load
    Balancer's pool, a firewall's sources), as the provider's own tests do
    (loadbalancer/resource_loadbalancer_test.go: droplet_tag = digitalocean_tag.<name>.name).
    Deleting a tag untags everything that carries it (which would leave autodown nothing to
    delete and the firewall no source), so Pulumi never deletes it (a tag costs nothing); one
    that exists already (a live set moving to a new entry) is adopted."""
    return digitalocean.Tag(
        resource_name,
        name=tag,
        opts=pulumi.ResourceOptions(
            parent=parent,
            retain_on_delete=True,
            import_=tag if tag_exists(tag) else None,
        ),
    )


def lb_firewall(cidrs: list[str]) -> digitalocean.LoadBalancerFirewallArgs | None:
    """apiCidrs as the Load Balancer's allow list (it is IPv4-only: IPv6 ranges do not apply);
    none when everyone may connect."""
    if set(catalog.ANYWHERE) <= set(cidrs) or "0.0.0.0/0" in cidrs:
        return None
    allows = [f"cidr:{c}" for c in cidrs if ":" not in c]
    return digitalocean.LoadBalancerFirewallArgs(allows=allows)


class ManagedEntry(pulumi.ComponentResource):
    """DigitalOcean's Load Balancer in front of the replicas' tag."""

    ipv4: pulumi.Output[str]
    load_balancer_id: pulumi.Output[str]

    def __init__(
        self, name: str, cfg: StackConfig, region: str, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:index:ManagedEntry", name, None, opts)
        assert cfg.access.domain, "validated: managed needs access.domain in access.dnsZone"
        child = pulumi.ResourceOptions(parent=self)
        # Auto-named (a new name per certificate), so a new domain's certificate is made before
        # the old one goes: account certificate names are unique.
        self.certificate = digitalocean.Certificate(
            f"{name}-certificate", type="lets_encrypt", domains=[cfg.access.domain], opts=child
        )
        # The pool is the replicas' tag, made before the Load Balancer that selects by it.
        self.tag = adopted_tag(f"{name}-replica-tag", cfg.replica_tag, parent=self)
        interval = catalog.LB_CHECK_INTERVAL_SECONDS
        size_unit, size = lb_size(cfg, region)
        self.load_balancer = digitalocean.LoadBalancer(
            name,
            name=cfg.balancer_name,
            region=region,
            size_unit=size_unit,
            size=size,
            droplet_tag=self.tag.name,
            forwarding_rules=[
                digitalocean.LoadBalancerForwardingRuleArgs(
                    entry_port=gateway.HTTPS_PORT,
                    entry_protocol="https",
                    target_port=catalog.REPLICA_PORT,
                    target_protocol="http",
                    certificate_name=self.certificate.name,
                )
            ],
            healthcheck=digitalocean.LoadBalancerHealthcheckArgs(
                protocol="http",
                port=catalog.REPLICA_PORT,
                path="/health",
                check_interval_seconds=interval,
                response_timeout_seconds=interval,
                unhealthy_threshold=catalog.LB_UNHEALTHY_THRESHOLD,
                healthy_threshold=catalog.LB_HEALTHY_THRESHOLD,
            ),
            http_idle_timeout_seconds=catalog.LB_IDLE_TIMEOUT_SECONDS,
            enable_backend_keepalive=True,
            firewall=lb_firewall(cfg.access.api_cidrs),
            # The program keeps the endpoint's A record itself (dns.py), at the balancer.
            disable_lets_encrypt_dns_records=True,
            opts=child,
        )
        self.ipv4 = self.load_balancer.ip
        self.load_balancer_id = self.load_balancer.id
        self.register_outputs({"ipv4": self.ipv4})


@dataclass(frozen=True)
class CaddyEntryArgs:
    config: StackConfig
    region: str
    api_key: pulumi.Output[str]
    # The replica whose login key the balancer Droplet takes (one key opens the whole set).
    key_from: StackDroplet | None = None


class CaddyEntry(pulumi.ComponentResource):
    """A CPU Droplet with a Reserved IP running Caddy in front of the replicas."""

    ipv4: pulumi.Output[str]

    def __init__(
        self, name: str, args: CaddyEntryArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:index:CaddyEntry", name, None, opts)
        cfg = args.config
        self.cfg = cfg
        self.api_key = args.api_key
        child = pulumi.ResourceOptions(parent=self)
        self.host = StackDroplet(
            name,
            StackDropletArgs(
                name=cfg.balancer_name,
                size=cfg.balancer.size,
                region=args.region,
                image=catalog.BALANCER_IMAGE,
                tags=[catalog.PROJECT, cfg.stack_tag, cfg.balancer_tag],
                monitoring=cfg.droplet.monitoring,
                ssh_cidrs=cfg.access.ssh_cidrs,
                api_cidrs=cfg.access.api_cidrs,
                api_port=gateway.api_port(cfg),
                acme_port=gateway.HTTP_PORT if cfg.access.https else None,
                extra_ssh_keys=cfg.access.ssh_key_fingerprints,
                key_from=args.key_from,
            ),
            opts=child,
        )
        # The endpoint's address: it outlives the balancer Droplet (a new size re-creates the
        # Droplet; the address moves to the new one).
        self.reserved_ip = digitalocean.ReservedIp(f"{name}-ip", region=args.region, opts=child)
        self.assignment = digitalocean.ReservedIpAssignment(
            f"{name}-ip-assignment",
            ip_address=self.reserved_ip.ip_address,
            droplet_id=self.host.droplet_id.apply(int),
            opts=child,
        )
        self.ipv4 = self.reserved_ip.ip_address
        # The name it serves until serve() gives the one to wait for (the DNS record's).
        self.hostname: pulumi.Output[str] = self.ipv4.apply(lambda ip: gateway.hostname(cfg, ip))
        self.preflight = self._command("preflight", [])
        self.joins: dict[int, command.remote.Command] = {}
        self.register_outputs({"ipv4": self.ipv4})

    def serve(self, hostname: pulumi.Output[str]) -> None:
        """Start the gateway under `hostname`, which resolves to the Reserved IP once it is
        known: the CA checks the name as soon as Caddy asks, and a failed validation counts
        against the CA's limits. With access.dnsZone the name comes from the A record (so the
        gateway waits for it); else it is the Reserved IP's own. The gateway also waits until
        the address is assigned to this Droplet."""
        self.hostname = hostname
        # What the gateway's Caddyfile sends requests to runs first; what it no longer sends
        # them to goes only once its new Caddyfile is in, so no request meets a missing one.
        first: list[pulumi.Resource] = []
        if self.cfg.wake.enabled:
            # The gateway routes keyed requests through the waker: the waker runs first.
            self.waker = self._command("wake", [self.preflight])
            first.append(self.waker)
        if self.cfg.routing == "cache-aware":
            # The gateway proxies the API to the router: the router runs first.
            self.router = self._command("router", [self.preflight])
            first.append(self.router)
        self.gateway = self._command("gateway", [self.preflight, self.assignment, *first])
        if not self.cfg.wake.enabled:
            # Off: the waker (if an earlier run installed one) goes after the gateway.
            self.waker = self._command("wake", [self.gateway])
        if self.cfg.routing != "cache-aware":
            # Off: the router (if an earlier run installed one) goes after the gateway.
            self.router = self._command("router", [self.gateway])

    def join(
        self,
        index: int,
        private_ip: pulumi.Input[str],
        droplet_id: pulumi.Input[str],
        ready: pulumi.Resource,
    ) -> command.remote.Command:
        """Replica `index` enters the pool once `ready`; it leaves (drained) before its
        Droplet is replaced or removed."""
        # The member adds the replica to the router too (member.sh): after the router phase.
        joined = self._command(
            "member",
            [self.gateway, self.router, ready],
            replica=index,
            private_ip=private_ip,
            droplet_id=droplet_id,
        )
        self.joins[index] = joined
        return joined

    def ready(self, after: list[pulumi.Resource]) -> command.remote.Command:
        """A chat completion through the balancer, its certificate included."""
        self.ready_command = self._command("ready", [self.gateway, *after])
        return self.ready_command

    def _command(
        self,
        phase: str,
        after: list[pulumi.Resource],
        *,
        replica: int | None = None,
        private_ip: pulumi.Input[str] = "",
        droplet_id: pulumi.Input[str] = "",
    ) -> command.remote.Command:
        """The balancer's phase `phase` (a row of phases.BALANCER), after `after`."""
        cfg = self.cfg
        row = phases.row(phase, phases.BALANCER)
        minutes = phases.minutes(cfg, row)
        index = replica or 0

        def script(values: dict[str, Any]) -> str:
            return phases.render(phase, row.settings(cfg, Inputs(**values, replica=index)), minutes)

        available: dict[str, pulumi.Input[Any]] = {
            "api_key": self.api_key,
            "host": self.hostname,
            "private_ip": private_ip,
            "droplet_id": droplet_id,
        }
        needed = {name: available[name] for name in row.inputs}
        # Secret throughout, whether or not the key is in it: the balancer's scripts are its
        # gate's, and one kind of input for all of them keeps a change of that from showing.
        values: pulumi.Output[dict[str, Any]] = (
            pulumi.Output.all(**needed) if needed else pulumi.Output.from_input({})
        )
        stdin: pulumi.Output[str] = pulumi.Output.secret(values.apply(script))
        name = f"balancer-{phase}" if replica is None else f"balancer-member-{replica}"
        triggers: list[pulumi.Input[str]] = [self.host.droplet_id]
        triggers += [c.stdout for c in after if isinstance(c, command.remote.Command)]
        if replica is not None:
            triggers = [self.host.droplet_id, droplet_id, private_ip]
        target = remote.Target(
            self.host.ipv4, self.host.private_key_openssh, self.host.host_public_key
        )
        return remote.phase_command(
            name,
            target,
            minutes=minutes,
            stdin=stdin,
            triggers=triggers,
            after=after,
            parent=self,
            wait=row.wait_for_ssh,
            # Leaving: the same script (the stored stdin) told to remove this replica and wait
            # for its requests in flight.
            leaves=row.leaves and replica is not None,
            delete_minutes=row.delete_minutes,
        )
