"""The GPU Droplet: a per-stack SSH key, the Droplet, and a firewall for the given CIDRs."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_digitalocean as digitalocean
import pulumi_tls as tls

from ..spec import catalog

# GPU capacity is scarce and a create can sit in "new" for a long while; DigitalOcean's own API
# allows 60 minutes. Deleting waits for a graceful shutdown first.
DROPLET_TIMEOUTS = pulumi.CustomTimeouts(create="60m", update="60m", delete="20m")

# What replaces the Droplet, and how: the provider forces a new Droplet when its region, image,
# user data, SSH keys or VPC change (terraform-provider-digitalocean
# digitalocean/droplet/resource_droplet.go, ForceNew). Its `size` is NOT ForceNew: the provider's
# update powers a live Droplet off hard, resizes it (resize_disk, which forbids a later shrink) and
# powers it on, with no drain and no balancer leave (docs/facts.md, "corrected"). So a new size is a
# replacement here (replace_on_changes), made like every other: the old one is deleted first
# (delete_before_replace), never two GPU Droplets billing at once, never a second quota request
# that the GPU limit would refuse; with replicas, one at a time, each left and drained first.
REPLACE_ON_CHANGES = ["size"]
REPLACEMENT_NOTE = (
    "delete-then-create: a new droplet.size or droplet.image, a region move, or a change to "
    "access.sshKeyFingerprints deletes this Droplet first, then creates and bootstraps a new "
    "one; the endpoint is down until it is ready. Every other change updates it in place."
)


@dataclass(frozen=True)
class StackDropletArgs:
    name: str
    size: str
    region: str
    image: str
    tags: list[str]
    monitoring: bool
    ssh_cidrs: list[str]
    api_cidrs: list[str]
    api_port: int
    # Port 80 open to anyone while HTTPS is on: the ACME CA validates from the internet, and
    # the gateway only answers its challenges and redirects there.
    acme_port: int | None
    extra_ssh_keys: list[str] = field(default_factory=list)
    # A replica behind the balancer: its gateway's private port, open only to these sources
    # (the balancer Droplet's tag or the Load Balancer; replica 0, whose autodown reads every
    # replica's metrics), and nothing of the API on its public address.
    private_port: int | None = None
    private_from_tags: list[pulumi.Input[str]] = field(default_factory=list)
    private_from_droplets: list[pulumi.Input[int]] = field(default_factory=list)
    private_from_load_balancers: list[pulumi.Input[str]] = field(default_factory=list)
    # What this Droplet waits for before it is created or replaced (a rolling replacement:
    # the replica before it back in the pool).
    after: list[pulumi.Resource] = field(default_factory=list)
    # Another Droplet of the stack whose login key this one takes (the replicas share one key,
    # so one sshPrivateKey output opens each; every host key stays its own).
    key_from: StackDroplet | None = None


def firewall_inbound_rules(args: StackDropletArgs) -> list[digitalocean.FirewallInboundRuleArgs]:
    """SSH from sshCidrs, the API port from apiCidrs, the ACME port from anywhere, nothing else
    (vLLM's port never)."""
    rules = [
        digitalocean.FirewallInboundRuleArgs(
            protocol="tcp", port_range=str(catalog.SSH_PORT), source_addresses=args.ssh_cidrs
        )
    ]
    if args.api_cidrs:
        rules.append(
            digitalocean.FirewallInboundRuleArgs(
                protocol="tcp", port_range=str(args.api_port), source_addresses=args.api_cidrs
            )
        )
    if args.private_port is not None:
        rules.append(
            digitalocean.FirewallInboundRuleArgs(
                protocol="tcp",
                port_range=str(args.private_port),
                source_tags=args.private_from_tags or None,
                source_droplet_ids=args.private_from_droplets or None,
                source_load_balancer_uids=args.private_from_load_balancers or None,
            )
        )
    if args.acme_port is not None:
        rules.append(
            digitalocean.FirewallInboundRuleArgs(
                protocol="tcp",
                port_range=str(args.acme_port),
                source_addresses=list(catalog.ANYWHERE),
            )
        )
    return rules


def firewall_outbound_rules() -> list[digitalocean.FirewallOutboundRuleArgs]:
    # The bootstrap downloads packages, wheels and weights; DNS and NTP use UDP.
    return [
        digitalocean.FirewallOutboundRuleArgs(
            protocol=protocol, port_range=ports, destination_addresses=list(catalog.ANYWHERE)
        )
        for protocol, ports in (("tcp", "1-65535"), ("udp", "1-65535"), ("icmp", None))
    ]


def cloud_config(host_private_key: str, host_public_key: str) -> str:
    """First-boot settings: the stack's host key as the only one, no password logins."""
    indented = "\n".join(f"    {line}" for line in host_private_key.strip().splitlines())
    return f"""#cloud-config
ssh_pwauth: false
ssh_deletekeys: true
ssh_genkeytypes: []
ssh_keys:
  ed25519_private: |
{indented}
  ed25519_public: {host_public_key.strip()}
"""


class StackDroplet(pulumi.ComponentResource):
    """A Droplet of this stack: reachable by SSH with a key generated for the stack, a host key
    the program made and pins, behind a firewall. The GPU replicas and the Caddy balancer's CPU
    Droplet are all built this way, the others with replica 0's login key (`key_from`). Its
    type token keeps the name it was first deployed under (GpuDroplet): a new token would be a
    new URN for every live stack's Droplet."""

    ipv4: pulumi.Output[str]
    ipv4_private: pulumi.Output[str]
    droplet_id: pulumi.Output[str]
    private_key_openssh: pulumi.Output[str]
    public_key_openssh: pulumi.Output[str]

    def __init__(
        self, name: str, args: StackDropletArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:index:GpuDroplet", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # Ed25519: short, fast, accepted by every OpenSSH the images ship.
        shared = args.key_from
        self.key: tls.PrivateKey = (
            shared.key
            if shared is not None
            else tls.PrivateKey(f"{name}-ssh", algorithm="ED25519", opts=child)
        )
        # The Droplet's SSH host key, made here so that every connection can pin it from the
        # first dial: cloud-init installs it at first boot and removes the generated ones.
        self.host_key = tls.PrivateKey(f"{name}-host-key", algorithm="ED25519", opts=child)
        user_data: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.all(
                self.host_key.private_key_openssh, self.host_key.public_key_openssh
            ).apply(lambda keys: cloud_config(keys[0], keys[1]))
        )
        self.ssh_key: digitalocean.SshKey = (
            shared.ssh_key
            if shared is not None
            else digitalocean.SshKey(
                f"{name}-ssh",
                name=f"{args.name}-deploy",
                public_key=self.key.public_key_openssh,
                opts=child,
            )
        )

        self.droplet = digitalocean.Droplet(
            name,
            name=args.name,
            size=args.size,
            region=args.region,
            image=args.image,
            ssh_keys=[self.ssh_key.fingerprint, *args.extra_ssh_keys],
            tags=args.tags,
            monitoring=args.monitoring,
            graceful_shutdown=True,
            ipv6=False,
            user_data=user_data,
            # No vpc_uuid: every Droplet of the stack joins its region's default VPC, so one
            # Droplet growing into a set keeps its VPC (a new one would replace it).
            opts=pulumi.ResourceOptions(
                parent=self,
                custom_timeouts=DROPLET_TIMEOUTS,
                delete_before_replace=True,
                replace_on_changes=REPLACE_ON_CHANGES,
                depends_on=args.after or None,
            ),
        )

        self.firewall = digitalocean.Firewall(
            f"{name}-fw",
            name=args.name,
            droplet_ids=[self.droplet.id.apply(int)],
            inbound_rules=firewall_inbound_rules(args),
            outbound_rules=firewall_outbound_rules(),
            opts=child,
        )

        self.ipv4 = self.droplet.ipv4_address
        self.ipv4_private = self.droplet.ipv4_address_private
        self.droplet_id = self.droplet.id
        # The tls provider marks it secret; say so here too so no use of it can drop the mark.
        self.private_key_openssh = pulumi.Output.secret(self.key.private_key_openssh)
        self.public_key_openssh = self.key.public_key_openssh
        self.host_public_key = self.host_key.public_key_openssh.apply(
            lambda k: " ".join(k.split()[:2])
        )
        self.register_outputs({"ipv4": self.ipv4, "dropletId": self.droplet_id})


def key_path(stack: str) -> str:
    return f"~/.ssh/{catalog.PROJECT}-{stack}"


def ssh_command(stack: str, ipv4: str, host_public_key: str) -> str:
    """One copy-paste command: write the stack's key (owner-only) and the pinned host key into
    ~/.ssh (made, owner-only, where a fresh account has none), and log in with that key alone,
    to that host key alone."""
    path = key_path(stack)
    return (
        f"(umask 077 && mkdir -p ~/.ssh"
        f" && pulumi stack output --stack {stack} sshPrivateKey --show-secrets > {path}"
        f" && echo '{ipv4} {host_public_key}' > {path}.known_hosts)"
        f" && ssh -i {path} -o IdentitiesOnly=yes -o UserKnownHostsFile={path}.known_hosts"
        f" -o StrictHostKeyChecking=yes {catalog.SSH_USER}@{ipv4}"
    )
