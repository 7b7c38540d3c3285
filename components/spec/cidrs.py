"""Which source networks can reach the Droplet: an access list must name real senders.

The Droplet is reached at its public address, so a connection arrives from the sender's public
address. A documentation range (the placeholders example files carry), a private, loopback or
link-local range, or any other special-purpose range never matches one: a firewall rule for it
admits nobody, and a first `pulumi up` would create a GPU Droplet its deployer cannot reach,
then dial SSH until the phase times out. Ranges from the IANA special-purpose address
registries (RFC 6890 and the RFCs named below).
"""

from __future__ import annotations

import ipaddress

from . import catalog

_NOT_SENDERS: tuple[tuple[str, str], ...] = (
    ("192.0.2.0/24", "a documentation range (RFC 5737, TEST-NET-1)"),
    ("198.51.100.0/24", "a documentation range (RFC 5737, TEST-NET-2)"),
    ("203.0.113.0/24", "a documentation range (RFC 5737, TEST-NET-3)"),
    ("2001:db8::/32", "a documentation range (RFC 3849)"),
    ("3fff::/20", "a documentation range (RFC 9637)"),
    ("10.0.0.0/8", "a private range (RFC 1918)"),
    ("172.16.0.0/12", "a private range (RFC 1918)"),
    ("192.168.0.0/16", "a private range (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT space (RFC 6598)"),
    ("fc00::/7", "a unique-local range (RFC 4193)"),
    ("0.0.0.0/8", "'this network' (RFC 791)"),
    ("127.0.0.0/8", "loopback"),
    ("::1/128", "loopback"),
    ("::/128", "the unspecified address"),
    ("169.254.0.0/16", "link-local"),
    ("fe80::/10", "link-local"),
    ("192.0.0.0/24", "IETF protocol assignments (RFC 6890)"),
    ("198.18.0.0/15", "a benchmarking range (RFC 2544)"),
    ("224.0.0.0/4", "multicast"),
    ("ff00::/8", "multicast"),
    ("240.0.0.0/4", "reserved (RFC 1112)"),
    ("::ffff:0:0/96", "IPv4-mapped IPv6 (write the IPv4 address instead)"),
)
_RANGES = tuple((ipaddress.ip_network(r), what) for r, what in _NOT_SENDERS)
# What the messages show as a sender: a public address and network, then anywhere. Never a
# documentation range (the habit elsewhere): those are refused above, and an example must pass
# the check that prints it (tests/test_validate.py holds them to it).
EXAMPLE_ADDRESS = "81.2.69.160"
EXAMPLES = (EXAMPLE_ADDRESS, "81.2.69.0/24", *catalog.ANYWHERE)
FIX = (
    "put your public address or network there (`curl -s https://ifconfig.me` shows the "
    "address you connect from; add /32), or 0.0.0.0/0 and ::/0 for anywhere"
)


def unreachable(cidr: str) -> str | None:
    """Why no client on the internet connects from `cidr` (a valid CIDR), or None."""
    if cidr in catalog.ANYWHERE:
        return None
    net = ipaddress.ip_network(cidr, strict=False)
    for special, what in _RANGES:
        if net.version == special.version and net.subnet_of(special):  # type: ignore[arg-type]
            return f"{cidr} is {what}: no client on the internet connects from it"
    return None
