"""The emulation's certificate authorities: a root and an intermediate, as a public CA has, made
at start; leaves are signed by the intermediate and served with it (chain: leaf, intermediate).

Used by the ACME CA (acme_ca.py, its issuances and its own HTTPS certificate) and by the
download hosts (internet.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


class Authority:
    """A root "<name> Root" (P-384, ten years) and an intermediate (P-256, five years) named
    `intermediate` or "<name> Intermediate"; `sign` and `issue` make leaves with the
    intermediate."""

    def __init__(self, name: str, *, intermediate: str | None = None) -> None:
        now = datetime.now(UTC)
        self._root_key = ec.generate_private_key(ec.SECP384R1())
        self._inter_key = ec.generate_private_key(ec.SECP256R1())
        root_name = _cn(f"{name} Root")
        inter_name = _cn(intermediate or f"{name} Intermediate")
        usage = _key_usage(cert_sign=True)
        root_pub, inter_pub = self._root_key.public_key(), self._inter_key.public_key()
        self.root = (
            x509.CertificateBuilder()
            .subject_name(root_name)
            .issuer_name(root_name)
            .public_key(root_pub)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(root_pub), critical=False)
            .sign(self._root_key, hashes.SHA384())
        )
        self.intermediate = (
            x509.CertificateBuilder()
            .subject_name(inter_name)
            .issuer_name(root_name)
            .public_key(inter_pub)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=1825))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(inter_pub), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(root_pub), critical=False
            )
            .sign(self._root_key, hashes.SHA384())
        )

    @property
    def root_pem(self) -> str:
        return self.root.public_bytes(serialization.Encoding.PEM).decode()

    def sign(
        self,
        public_key: Any,
        sans: Sequence[x509.GeneralName],
        validity: timedelta,
        *,
        common_name: str | None,
    ) -> x509.Certificate:
        """A server certificate for `public_key`, backdated an hour (as Boulder does); notAfter -
        notBefore is `validity`. Without a common name the subject is empty and the SAN
        critical (RFC 5280 §4.2.1.6)."""
        now = datetime.now(UTC) - timedelta(hours=1)
        subject = _cn(common_name) if common_name else x509.Name([])
        usage = _key_usage(
            cert_sign=False, key_encipherment=isinstance(public_key, rsa.RSAPublicKey)
        )
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.intermediate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=not common_name)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._inter_key.public_key()),
                critical=False,
            )
            .sign(self._inter_key, hashes.SHA256())
        )

    def chain_pem(self, leaf: x509.Certificate) -> str:
        """The chain a server sends (RFC 8555 §7.4.2): the leaf, then the intermediate."""
        return "".join(
            c.public_bytes(serialization.Encoding.PEM).decode() for c in (leaf, self.intermediate)
        )

    def issue(
        self, names_and_ips: Iterable[str], validity: timedelta = timedelta(days=90)
    ) -> tuple[str, bytes]:
        """(chain PEM, private key PEM) of a new P-256 key, for these DNS names and IP addresses;
        the common name is the first DNS name, if any."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans = [_general_name(n) for n in names_and_ips]
        dns = [n.value for n in sans if isinstance(n, x509.DNSName)]
        leaf = self.sign(key.public_key(), sans, validity, common_name=dns[0] if dns else None)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return self.chain_pem(leaf), pem


def is_ip(text: str) -> bool:
    """Whether a certificate's name is an IP address (else a DNS name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _general_name(text: str) -> x509.GeneralName:
    return x509.IPAddress(ipaddress.ip_address(text)) if is_ip(text) else x509.DNSName(text)


def _cn(name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


def _key_usage(*, cert_sign: bool, key_encipherment: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=key_encipherment,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )  # fmt: skip
