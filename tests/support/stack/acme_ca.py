"""A small ACME CA (RFC 8555) that really issues, with profiles: the emulation's Let's Encrypt.

Caddy's ACME client (github.com/mholt/acmez v3, through caddyserver/certmagic) is what it must
satisfy end to end: the directory with `meta.profiles` (draft-aaron-acme-profiles; acmez refuses
a profile the directory does not list, acme/order.go), nonces, accounts, orders for `dns` and
`ip` identifiers (RFC 8738), http-01 validated by fetching the token from the identifier's
address (RFC 8555 §8.3), finalize with a CSR, and a PEM chain signed by this CA's own
intermediate and root (made at start). Profiles follow Let's Encrypt's: `classic` (90 days, no IP
addresses) and `shortlived` (160 hours, IP addresses allowed) (letsencrypt.org/docs/profiles).

Knobs for tests: `refuse()` answers given identifiers/profiles with a problem document (with a
Retry-After for rateLimited), `requests` counts requests by endpoint, `validations` and `issued`
record what happened, `root_pem` is the trust anchor. It is a threaded HTTP(S) server started
in-process; with `netns` its listening socket and its validation connections are made inside
that network namespace (a socket keeps the namespace it was created in; see `_socket`).

Not served: ARI (renewalInfo), key rollover, revocation, dns-01/tls-alpn-01, external account
binding, redirects during validation, authorization reuse across orders.

It takes nothing from the program (components/), not even a helper as small as the gateway's
`is_ip`: it stands for Let's Encrypt, and a CA that shared the gateway's code would share its
mistakes instead of catching them.
"""

from __future__ import annotations

import base64
import collections
import ctypes
import hashlib
import http.client
import ipaddress
import json
import re
import secrets
import shutil
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import NameOID

from stack.pki import Authority, is_ip

ERROR_NS = "urn:ietf:params:acme:error:"
# The status each problem type is usually sent with (RFC 8555 §6.7 and Boulder's practice).
DEFAULT_STATUS = {
    "accountDoesNotExist": 400,
    "badCSR": 400,
    "badNonce": 400,
    "badPublicKey": 400,
    "badSignatureAlgorithm": 400,
    "caa": 403,
    "invalidContact": 400,
    "invalidProfile": 400,
    "malformed": 400,
    "orderNotReady": 403,
    "rateLimited": 429,
    "rejectedIdentifier": 400,
    "serverInternal": 500,
    "unauthorized": 403,
    "unsupportedContact": 400,
    "unsupportedIdentifier": 400,
}


@dataclass(frozen=True)
class Profile:
    validity: timedelta
    description: str
    allows_ip: bool


# Let's Encrypt's profiles (letsencrypt.org/docs/profiles): IP addresses only in shortlived.
PROFILES = {
    "classic": Profile(timedelta(days=90), "90 days, DNS names only", allows_ip=False),
    "shortlived": Profile(timedelta(hours=160), "160 hours, DNS names and IPs", allows_ip=True),
}
DEFAULT_PROFILE = "classic"  # what an order without `profile` gets, as at Let's Encrypt


class AcmeError(Exception):
    """An RFC 7807 problem document the CA answers with (RFC 8555 §6.7)."""

    def __init__(
        self, kind: str, detail: str, status: int | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(f"{kind}: {detail}")
        self.type = kind if kind.startswith("urn:") else ERROR_NS + kind
        self.detail = detail
        self.status = status or DEFAULT_STATUS.get(self.type.removeprefix(ERROR_NS), 400)
        self.retry_after = retry_after

    def document(self) -> dict[str, Any]:
        return {"type": self.type, "detail": self.detail, "status": self.status}


@dataclass(frozen=True)
class Refusal:
    """Answer matching requests at `at` ("newAccount", "newOrder" or "finalize") with a problem.
    `identifiers`/`profiles`: only orders naming one of them (None: any)."""

    problem: str
    detail: str
    at: str = "newOrder"
    identifiers: frozenset[str] | None = None
    profiles: frozenset[str] | None = None
    status: int | None = None
    retry_after: int | None = None


@dataclass
class Validation:
    identifier: str
    address: str
    port: int
    ok: bool
    detail: str


@dataclass
class Issued:
    identifiers: list[str]
    profile: str
    certificate: x509.Certificate


@dataclass
class _Account:
    id: str
    key: Any  # a cryptography public key
    thumbprint: str
    contact: list[str]
    status: str = "valid"


@dataclass
class _Authz:
    id: str
    account: str
    identifier: dict[str, str]
    token: str
    status: str = "pending"  # of the authorization and its one challenge alike
    challenge_status: str = "pending"
    error: dict[str, Any] | None = None
    validated: str | None = None


@dataclass
class _Order:
    id: str
    account: str
    identifiers: list[dict[str, str]]
    profile: str
    authzs: list[str]
    expires: str
    certificate: str | None = None
    error: dict[str, Any] | None = None


@dataclass
class _Response:
    status: int
    body: bytes = b""
    content_type: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64u(text: str) -> bytes:
    if not isinstance(text, str) or not re.fullmatch(r"[A-Za-z0-9_-]*", text):
        raise AcmeError("malformed", "not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def jwk_thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638 §3: the required members only, sorted, no whitespace, SHA-256, base64url."""
    required = {
        "EC": ("crv", "kty", "x", "y"),
        "RSA": ("e", "kty", "n"),
        "OKP": ("crv", "kty", "x"),
    }
    members = required.get(jwk.get("kty", ""))
    if members is None or any(not isinstance(jwk.get(m), str) for m in members):
        raise AcmeError("badPublicKey", f"unsupported or incomplete JWK: {jwk}")
    canonical = json.dumps({m: jwk[m] for m in members}, separators=(",", ":"), sort_keys=True)
    return b64u(hashlib.sha256(canonical.encode()).digest())


_CURVES: dict[str, tuple[ec.EllipticCurve, str, hashes.HashAlgorithm]] = {
    "P-256": (ec.SECP256R1(), "ES256", hashes.SHA256()),
    "P-384": (ec.SECP384R1(), "ES384", hashes.SHA384()),
    "P-521": (ec.SECP521R1(), "ES512", hashes.SHA512()),
}
ALGORITHMS = ["ES256", "ES384", "ES512", "RS256", "EdDSA"]


def jwk_public_key(jwk: dict[str, Any]) -> Any:
    """The public key a JWK (RFC 7518 §6) describes."""
    jwk_thumbprint(jwk)  # refuses incomplete keys
    if jwk["kty"] == "EC" and jwk["crv"] in _CURVES:
        curve = _CURVES[jwk["crv"]][0]
        x, y = (int.from_bytes(unb64u(jwk[c]), "big") for c in ("x", "y"))
        try:
            return ec.EllipticCurvePublicNumbers(x, y, curve).public_key()
        except ValueError as e:
            raise AcmeError("badPublicKey", f"not a point on {jwk['crv']}") from e
    if jwk["kty"] == "RSA":
        modulus, exponent = (int.from_bytes(unb64u(jwk[c]), "big") for c in ("n", "e"))
        if modulus.bit_length() < 2048:
            raise AcmeError("badPublicKey", "RSA keys need at least 2048 bits")
        return rsa.RSAPublicNumbers(exponent, modulus).public_key()
    if jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519":
        return ed25519.Ed25519PublicKey.from_public_bytes(unb64u(jwk["x"]))
    raise AcmeError("badPublicKey", f"unsupported key type {jwk['kty']} {jwk.get('crv', '')}")


def verify_jws_signature(key: Any, alg: str, signing_input: bytes, signature: bytes) -> None:
    """RFC 7515 §5.2 with RFC 7518 §3 (ES*: raw r||s, RS256: PKCS#1 v1.5) and RFC 8037 (EdDSA).
    The algorithm must fit the key: an ES256 header on a P-384 key is refused."""
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            curve = next(c for c in _CURVES.values() if c[0].name == key.curve.name)
            if alg != curve[1]:
                raise AcmeError(
                    "badSignatureAlgorithm", f"{alg} does not fit a {key.curve.name} key"
                )
            half = len(signature) // 2
            if half != (key.curve.key_size + 7) // 8 or len(signature) % 2:
                raise AcmeError("malformed", "ECDSA signature of the wrong length")
            r, s = (int.from_bytes(p, "big") for p in (signature[:half], signature[half:]))
            key.verify(encode_dss_signature(r, s), signing_input, ec.ECDSA(curve[2]))
        elif isinstance(key, rsa.RSAPublicKey):
            if alg != "RS256":
                raise AcmeError("badSignatureAlgorithm", f"{alg} does not fit an RSA key")
            key.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, ed25519.Ed25519PublicKey):
            if alg != "EdDSA":
                raise AcmeError("badSignatureAlgorithm", f"{alg} does not fit an Ed25519 key")
            key.verify(signature, signing_input)
        else:
            raise AcmeError("badPublicKey", "unsupported key")
    except InvalidSignature as e:
        raise AcmeError("malformed", "JWS signature does not verify") from e


def parse_identifier(ident: Any) -> dict[str, str]:
    """A `dns` identifier (lowercase LDH labels, no wildcard: this CA has no dns-01) or an `ip`
    one in its canonical text form (RFC 8738 §3: RFC 5952 for IPv6)."""
    if not isinstance(ident, dict) or not isinstance(ident.get("value"), str):
        raise AcmeError("malformed", f"bad identifier {ident!r}")
    kind, value = ident.get("type"), ident["value"]
    if kind == "ip":
        try:
            canonical = str(ipaddress.ip_address(value))
        except ValueError as e:
            raise AcmeError("malformed", f"not an IP address: {value}") from e
        if canonical != value:
            raise AcmeError("malformed", f"IP address not in canonical form: {value}")
        return {"type": "ip", "value": value}
    if kind == "dns":
        label = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
        if not re.fullmatch(rf"{label}(\.{label})+", value) or len(value) > 253:
            raise AcmeError("rejectedIdentifier", f"not a DNS name this CA issues for: {value}")
        return {"type": "dns", "value": value}
    raise AcmeError("unsupportedIdentifier", f"identifier type {kind!r}")


def _setns(netns: str) -> None:
    """Move the calling thread into a network namespace (setns(2); os.setns is Python 3.12+)."""
    path = netns if netns.startswith("/") else f"/run/netns/{netns}"
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f:
        if libc.setns(f.fileno(), 0x40000000) != 0:  # CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}")


def _socket(netns: str | None, family: socket.AddressFamily) -> socket.socket:
    """A TCP socket in `netns` (None: this process's namespace). A socket belongs to the namespace
    it was created in (network_namespaces(7)), so a short-lived thread enters the namespace,
    creates it and ends; the socket is then used from any thread."""
    if netns is None:
        return socket.socket(family, socket.SOCK_STREAM)
    made: list[socket.socket | OSError] = []

    def make() -> None:
        try:
            _setns(netns)
            made.append(socket.socket(family, socket.SOCK_STREAM))
        except OSError as e:  # handed to the caller's thread
            made.append(e)

    t = threading.Thread(target=make, name=f"setns-{netns}")
    t.start()
    t.join()
    if isinstance(made[0], OSError):
        raise made[0]
    return made[0]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class ACMECA:
    """The CA. `host`/`port`: where it listens (port 0: a free one), also the host its URLs
    name; `names`: more DNS names for its HTTPS certificate. `http_port`: where http-01 is
    fetched (80 in the real world). `resolve`: DNS name -> address for dns identifiers.
    `tls=False` serves plain HTTP (Caddy accepts that only for internal addresses: certmagic
    acmeclient.go, "HTTPS required for non-internal CA")."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        http_port: int = 80,
        resolve: dict[str, str] | None = None,
        netns: str | None = None,
        tls: bool = True,
        names: Iterable[str] = (),
        name: str = "Emulated ACME CA",
    ) -> None:
        self.http_port, self.resolve, self.netns = http_port, dict(resolve or {}), netns
        self.refusals: list[Refusal] = []
        self.requests: collections.Counter[str] = collections.Counter()
        self.validations: list[Validation] = []
        self.issued: list[Issued] = []
        self._lock = threading.Lock()
        self._nonces: set[str] = set()
        self._accounts: dict[str, _Account] = {}
        self._orders: dict[str, _Order] = {}
        self._authzs: dict[str, _Authz] = {}
        self._certs: dict[str, str] = {}
        self._workers: list[threading.Thread] = []
        self._ca = Authority(name)
        self._dir = Path(tempfile.mkdtemp(prefix="acme-ca-"))
        try:
            context = self._context(host, list(names)) if tls else None
            sock = loopback.bound(host, port, _socket(netns, _family(host)))
            self.port = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            self.base = f"{'https' if tls else 'http'}://{shown}:{self.port}"
            self.directory = f"{self.base}/directory"
            # Served once it knows its URLs (its answers name them).
            self.server = loopback.serve(_handler(self), sock, tls=context, tls_timeout=10)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    # -- the test's knobs -----------------------------------------------------------------------

    def refuse(
        self,
        problem: str,
        detail: str,
        *,
        at: str = "newOrder",
        identifiers: Iterable[str] | None = None,
        profiles: Iterable[str] | None = None,
        status: int | None = None,
        retry_after: int | None = None,
    ) -> Refusal:
        """From now on, answer matching requests with this problem (e.g. "rateLimited" with
        retry_after=3600, "caa", "rejectedIdentifier"); `clear_refusals()` ends it."""
        assert at in {"newAccount", "newOrder", "finalize"}, at
        r = Refusal(
            problem, detail, at,
            frozenset(identifiers) if identifiers is not None else None,
            frozenset(profiles) if profiles is not None else None,
            status, retry_after,
        )  # fmt: skip
        with self._lock:
            self.refusals.append(r)
        return r

    def clear_refusals(self) -> None:
        with self._lock:
            self.refusals.clear()

    @property
    def authority(self) -> Authority:
        """Its root and intermediate: what also signs the certificates an operator of this CA
        issues outside ACME (DigitalOcean's for its Load Balancers, in the emulation)."""
        return self._ca

    @property
    def root_pem(self) -> str:
        return self._ca.root_pem

    @property
    def root(self) -> x509.Certificate:
        return self._ca.root

    @property
    def intermediate(self) -> x509.Certificate:
        return self._ca.intermediate

    def write_root(self, path: Path) -> Path:
        path.write_text(self.root_pem)
        return path

    def stop(self) -> None:
        loopback.stop(self.server)
        for t in list(self._workers):
            t.join(timeout=15)
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- certificates ---------------------------------------------------------------------------

    def _issue(self, public_key: Any, identifiers: list[dict[str, str]], profile: str) -> str:
        """A leaf from the intermediate (`Authority.sign`: backdated an hour like Boulder);
        returns the chain PEM (leaf, intermediate: RFC 8555 §7.4.2). notAfter - notBefore is the
        profile's validity. shortlived leaves have an empty subject, so their SAN is critical."""
        sans: list[x509.GeneralName] = [
            x509.IPAddress(ipaddress.ip_address(i["value"]))
            if i["type"] == "ip"
            else x509.DNSName(i["value"])
            for i in identifiers
        ]
        dns = [i["value"] for i in identifiers if i["type"] == "dns"]
        cn = dns[0] if dns and profile != "shortlived" else None
        leaf = self._ca.sign(public_key, sans, PROFILES[profile].validity, common_name=cn)
        self.issued.append(Issued([i["value"] for i in identifiers], profile, leaf))
        return self._ca.chain_pem(leaf)

    def _context(self, host: str, names: list[str]) -> ssl.SSLContext:
        """The CA's own HTTPS certificate, from its own hierarchy: a client trusting the root
        (Caddy's acme_ca_root) trusts the directory too."""
        chain, key = self._ca.issue([host, *names], PROFILES["classic"].validity)
        cert_file, key_file = self._dir / "listener.pem", self._dir / "listener.key"
        cert_file.write_text(chain)
        key_file.write_bytes(key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_file, key_file)
        return context

    # -- the protocol -----------------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: Any, body: bytes) -> _Response:
        """One request: every answer carries a fresh Replay-Nonce (RFC 8555 §6.5) and the
        directory's index link (§7.1)."""
        endpoint = path.split("/")[1] if path.count("/") >= 1 else ""
        with self._lock:
            self.requests[endpoint or "/"] += 1
        try:
            response = self._route(method, path, headers, body)
        except AcmeError as p:
            response = self._problem(p)
        except Exception as e:  # noqa: BLE001 - a bug answers serverInternal, not a dropped socket
            response = self._problem(AcmeError("serverInternal", f"{type(e).__name__}: {e}"))
        nonce = b64u(secrets.token_bytes(16))
        with self._lock:
            self._nonces.add(nonce)
        response.headers["Replay-Nonce"] = nonce
        response.headers["Link"] = f'<{self.directory}>;rel="index"'
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    def _problem(self, p: AcmeError) -> _Response:
        r = _Response(p.status, json.dumps(p.document()).encode(), "application/problem+json")
        if p.retry_after is not None:
            r.headers["Retry-After"] = str(p.retry_after)
        return r

    def _route(self, method: str, path: str, headers: Any, body: bytes) -> _Response:
        if path == "/directory" and method in {"GET", "HEAD"}:
            return self._json(200, self._directory())
        if path == "/new-nonce" and method in {"GET", "HEAD"}:
            # §7.2: HEAD answers 200, GET 204; the nonce itself is added by handle().
            return _Response(200 if method == "HEAD" else 204)
        if method != "POST":
            # §6.3: everything but the directory and nonces is POST (or POST-as-GET).
            raise AcmeError("malformed", f"{method} {path}: use POST", status=405)
        if headers.get("Content-Type", "").split(";")[0].strip() != "application/jose+json":
            raise AcmeError("malformed", "Content-Type must be application/jose+json", status=415)
        kind, _, ident = path.strip("/").partition("/")
        routes = {
            "new-account": self._new_account,
            "new-order": self._new_order,
            "acct": self._account,
            "order": self._order,
            "authz": self._authz,
            "chall": self._challenge,
            "finalize": self._finalize,
            "cert": self._cert,
        }
        if kind not in routes or (not ident) != (kind.startswith("new-")):
            raise AcmeError("malformed", f"no such resource: {path}", status=404)
        jws = self._verify(path, body, jwk_allowed=kind == "new-account")
        return routes[kind](ident, jws)

    def _directory(self) -> dict[str, Any]:
        return {
            "newNonce": f"{self.base}/new-nonce",
            "newAccount": f"{self.base}/new-account",
            "newOrder": f"{self.base}/new-order",
            "revokeCert": f"{self.base}/revoke-cert",
            "keyChange": f"{self.base}/key-change",
            "meta": {"profiles": {n: p.description for n, p in PROFILES.items()}},
        }

    def _verify(self, path: str, body: bytes, *, jwk_allowed: bool) -> dict[str, Any]:
        """RFC 8555 §6.2-6.5: a flattened JWS; alg, nonce, url and exactly one of jwk (new
        accounts only) / kid (an account URL) protected; the nonce used once; the url this
        request's. Returns the header, the payload (None for POST-as-GET) and the account."""
        try:
            outer = json.loads(body)
            protected_b64, payload_b64 = outer["protected"], outer["payload"]
            signature = unb64u(outer["signature"])
            header = json.loads(unb64u(protected_b64))
            assert isinstance(header, dict)
        except (ValueError, KeyError, TypeError, AssertionError) as e:
            raise AcmeError("malformed", f"not a flattened JWS: {e}") from e
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise AcmeError("badSignatureAlgorithm", f"alg {alg!r}; supported: {ALGORITHMS}")
        nonce = header.get("nonce")
        with self._lock:
            fresh = isinstance(nonce, str) and nonce in self._nonces
            if fresh:
                self._nonces.discard(nonce)
        if not fresh:
            raise AcmeError("badNonce", f"unknown or used nonce {nonce!r}")
        if header.get("url") != self.base + path:
            raise AcmeError("unauthorized", f"JWS url {header.get('url')!r} is not this request's")
        if ("jwk" in header) == ("kid" in header):
            raise AcmeError("malformed", "the protected header needs exactly one of jwk and kid")
        account = None
        if "jwk" in header:
            if not jwk_allowed:
                raise AcmeError("malformed", "jwk is only for newAccount here; use kid")
            key = jwk_public_key(header["jwk"])
        else:
            account = self._account_for_kid(header["kid"])
            key = account.key
        verify_jws_signature(key, alg, f"{protected_b64}.{payload_b64}".encode(), signature)
        payload = None
        if payload_b64 != "":
            try:
                payload = json.loads(unb64u(payload_b64))
            except ValueError as e:
                raise AcmeError("malformed", "payload is not JSON") from e
        return {"header": header, "payload": payload, "account": account}

    def _account_for_kid(self, kid: Any) -> _Account:
        prefix = f"{self.base}/acct/"
        with self._lock:
            acct = (
                self._accounts.get(kid.removeprefix(prefix))
                if isinstance(kid, str) and kid.startswith(prefix)
                else None
            )
        if acct is None:
            raise AcmeError("accountDoesNotExist", f"no account {kid!r}")
        if acct.status != "valid":
            raise AcmeError("unauthorized", f"account is {acct.status}")
        return acct

    def _json(self, status: int, body: Any, location: str | None = None) -> _Response:
        r = _Response(status, json.dumps(body).encode(), "application/json")
        if location:
            r.headers["Location"] = location
        return r

    def _refusal(self, at: str, identifiers: list[str], profile: str | None) -> None:
        with self._lock:
            refusals = list(self.refusals)
        for r in refusals:
            if r.at != at:
                continue
            if r.identifiers is not None and not r.identifiers & set(identifiers):
                continue
            if r.profiles is not None and profile not in r.profiles:
                continue
            raise AcmeError(r.problem, r.detail, r.status, r.retry_after)

    def _new_account(self, _: str, jws: dict[str, Any]) -> _Response:
        """§7.3: the key's account if it has one (200), else a new one (201)."""
        payload = jws["payload"] or {}
        jwk = jws["header"]["jwk"]
        thumb = jwk_thumbprint(jwk)
        with self._lock:
            existing = next((a for a in self._accounts.values() if a.thumbprint == thumb), None)
        if existing is not None:
            return self._json(200, self._account_body(existing), self._acct_url(existing))
        if payload.get("onlyReturnExisting"):
            raise AcmeError("accountDoesNotExist", "no account for this key")
        contact = payload.get("contact") or []
        if not isinstance(contact, list) or not all(
            isinstance(c, str) and c.startswith("mailto:") for c in contact
        ):
            raise AcmeError("unsupportedContact", f"only mailto: contacts: {contact!r}")
        self._refusal("newAccount", [], None)
        acct = _Account(secrets.token_hex(8), jwk_public_key(jwk), thumb, contact)
        with self._lock:
            self._accounts[acct.id] = acct
        return self._json(201, self._account_body(acct), self._acct_url(acct))

    def _acct_url(self, acct: _Account) -> str:
        return f"{self.base}/acct/{acct.id}"

    def _account_body(self, acct: _Account) -> dict[str, Any]:
        return {
            "status": acct.status,
            "contact": acct.contact,
            "orders": f"{self._acct_url(acct)}/orders",
        }

    def _account(self, ident: str, jws: dict[str, Any]) -> _Response:
        """§7.3.2/7.3.6: read, update contacts, or deactivate one's own account."""
        acct = jws["account"]
        if acct.id != ident:
            raise AcmeError("unauthorized", "not your account")
        payload = jws["payload"] or {}
        if isinstance(payload.get("contact"), list):
            acct.contact = payload["contact"]
        if payload.get("status") == "deactivated":
            acct.status = "deactivated"
        return self._json(200, self._account_body(acct), self._acct_url(acct))

    def _new_order(self, _: str, jws: dict[str, Any]) -> _Response:
        """§7.4 with RFC 8738 ip identifiers and draft-aaron-acme-profiles: an unknown profile
        is invalidProfile; an IP address outside a profile that allows it is rejectedIdentifier
        (Let's Encrypt issues IP certificates only under shortlived)."""
        payload = jws["payload"]
        if not isinstance(payload, dict) or not isinstance(payload.get("identifiers"), list):
            raise AcmeError("malformed", "newOrder needs identifiers")
        idents = [parse_identifier(i) for i in payload["identifiers"]]
        if not idents or len({i["value"] for i in idents}) != len(idents):
            raise AcmeError("malformed", "identifiers empty or repeated")
        profile = payload.get("profile", DEFAULT_PROFILE)
        if profile not in PROFILES:
            raise AcmeError(
                "invalidProfile", f"profile {profile!r} is not offered: {list(PROFILES)}"
            )
        if not PROFILES[profile].allows_ip and any(i["type"] == "ip" for i in idents):
            raise AcmeError("rejectedIdentifier", f"IP addresses are not issued under {profile}")
        self._refusal("newOrder", [i["value"] for i in idents], profile)
        acct: _Account = jws["account"]
        now = datetime.now(UTC)
        authzs = [
            _Authz(secrets.token_hex(8), acct.id, i, b64u(secrets.token_bytes(32))) for i in idents
        ]
        order = _Order(
            secrets.token_hex(8), acct.id, idents, profile, [a.id for a in authzs],
            rfc3339(now + timedelta(days=7)),
        )  # fmt: skip
        with self._lock:
            self._authzs.update((a.id, a) for a in authzs)
            self._orders[order.id] = order
        return self._json(201, self._order_body(order), f"{self.base}/order/{order.id}")

    def _order_status(self, order: _Order) -> str:
        """§7.1.6, derived from the authorizations: invalid if one is, ready once all are valid,
        valid once issued."""
        if order.error is not None:
            return "invalid"
        if order.certificate is not None:
            return "valid"
        statuses = {self._authzs[a].status for a in order.authzs}
        if "invalid" in statuses:
            return "invalid"
        return "ready" if statuses == {"valid"} else "pending"

    def _order_body(self, order: _Order) -> dict[str, Any]:
        body: dict[str, Any] = {
            "status": self._order_status(order),
            "expires": order.expires,
            "identifiers": order.identifiers,
            "profile": order.profile,
            "authorizations": [f"{self.base}/authz/{a}" for a in order.authzs],
            "finalize": f"{self.base}/finalize/{order.id}",
        }
        if order.certificate:
            body["certificate"] = f"{self.base}/cert/{order.certificate}"
        invalid = next((self._authzs[a].error for a in order.authzs if self._authzs[a].error), None)
        if order.error or invalid:
            body["error"] = order.error or invalid
        return body

    def _owned(self, table: dict[str, Any], ident: str, jws: dict[str, Any]) -> Any:
        with self._lock:
            item = table.get(ident)
        if item is None:
            raise AcmeError("malformed", "no such resource", status=404)
        if item.account != jws["account"].id:
            raise AcmeError("unauthorized", "not this account's")
        return item

    def _order(self, ident: str, jws: dict[str, Any]) -> _Response:
        order: _Order = self._owned(self._orders, ident, jws)
        return self._json(200, self._order_body(order))

    def _challenge_body(self, a: _Authz) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": "http-01",
            "url": f"{self.base}/chall/{a.id}",
            "token": a.token,
            "status": a.challenge_status,
        }
        if a.validated:
            body["validated"] = a.validated
        if a.error:
            body["error"] = a.error
        return body

    def _authz(self, ident: str, jws: dict[str, Any]) -> _Response:
        """§7.5: one http-01 challenge (offering tls-alpn-01 too would let acmez pick it).
        A payload {"status": "deactivated"} deactivates it (§7.5.2)."""
        a: _Authz = self._owned(self._authzs, ident, jws)
        if (jws["payload"] or {}).get("status") == "deactivated":
            a.status = "deactivated"
        body = {
            "identifier": a.identifier,
            "status": a.status,
            "expires": rfc3339(datetime.now(UTC) + timedelta(days=7)),
            "challenges": [self._challenge_body(a)],
        }
        return self._json(200, body)

    def _challenge(self, ident: str, jws: dict[str, Any]) -> _Response:
        """§7.5.1: a payload (`{}`) asks for validation, which runs in the background; POST-as-GET
        only reads. The answer links up to the authorization."""
        a: _Authz = self._owned(self._authzs, ident, jws)
        if jws["payload"] is not None and a.challenge_status == "pending":
            a.challenge_status = "processing"
            acct: _Account = jws["account"]
            worker = threading.Thread(target=self._validate, args=(a, acct.thumbprint), daemon=True)
            self._workers.append(worker)
            worker.start()
        r = self._json(200, self._challenge_body(a))
        r.headers["Link"] = f'<{self.base}/authz/{a.id}>;rel="up"'
        return r

    def _validate(self, a: _Authz, thumbprint: str) -> None:
        """§8.3: GET http://<identifier>/.well-known/acme-challenge/<token> (on `http_port`),
        Host the identifier, and compare the body, trailing whitespace ignored, with the key
        authorization token.thumbprint (§8.1). No redirects followed."""
        value = a.identifier["value"]
        address = value if a.identifier["type"] == "ip" else self.resolve.get(value)
        expected = f"{a.token}.{thumbprint}"
        problem: AcmeError | None = None
        if address is None:
            problem = AcmeError("dns", f"no address for {value}")
        else:
            try:
                status, body = self._fetch(address, value, f"/.well-known/acme-challenge/{a.token}")
            except OSError as e:
                problem = AcmeError("connection", f"{address}:{self.http_port}: {e}")
            else:
                if status != 200:
                    problem = AcmeError("unauthorized", f"HTTP {status} from {value}")
                elif body.decode(errors="replace").rstrip() != expected:
                    problem = AcmeError("unauthorized", f"wrong key authorization from {value}")
        with self._lock:
            self.validations.append(
                Validation(
                    value, address or "", self.http_port, problem is None,
                    problem.detail if problem else "ok",
                )
            )  # fmt: skip
            if problem is None:
                a.status = a.challenge_status = "valid"
                a.validated = rfc3339(datetime.now(UTC))
            else:
                a.status = a.challenge_status = "invalid"
                a.error = problem.document()

    def _fetch(self, address: str, host: str, path: str) -> tuple[int, bytes]:
        """One GET from this CA's namespace, at most 8 KiB read."""
        sock = _socket(self.netns, _family(address))
        try:
            sock.settimeout(10)
            sock.connect((address, self.http_port))
            conn = http.client.HTTPConnection(address, self.http_port, timeout=10)
            conn.sock = sock
            shown = f"[{host}]" if ":" in host else host
            port = "" if self.http_port == 80 else f":{self.http_port}"
            conn.request("GET", path, headers={"Host": shown + port, "User-Agent": "acme-ca"})
            response = conn.getresponse()
            return response.status, response.read(8192)
        finally:
            sock.close()

    def _finalize(self, ident: str, jws: dict[str, Any]) -> _Response:
        """§7.4: a ready order and a CSR naming exactly its identifiers (SANs, and a CN if any,
        which must be one of them), signed by a key this CA accepts (RSA >= 2048, P-256, P-384)."""
        order: _Order = self._owned(self._orders, ident, jws)
        status = self._order_status(order)
        if status != "ready":
            raise AcmeError("orderNotReady", f"order is {status}")
        try:
            csr = x509.load_der_x509_csr(unb64u((jws["payload"] or {})["csr"]))
        except (KeyError, ValueError, TypeError) as e:
            raise AcmeError("badCSR", f"unreadable CSR: {e}") from e
        if not csr.is_signature_valid:
            raise AcmeError("badCSR", "CSR signature does not verify")
        key = csr.public_key()
        good_key = (isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048) or (
            isinstance(key, ec.EllipticCurvePublicKey)
            and key.curve.name in {"secp256r1", "secp384r1"}
        )
        if not good_key:
            raise AcmeError("badCSR", "key type not accepted")
        names = _csr_names(csr)
        wanted = {(i["type"], i["value"]) for i in order.identifiers}
        if names != wanted:
            raise AcmeError(
                "badCSR", f"CSR names {sorted(names)} are not the order's {sorted(wanted)}"
            )
        self._refusal("finalize", [i["value"] for i in order.identifiers], order.profile)
        chain = self._issue(key, order.identifiers, order.profile)
        cert_id = secrets.token_hex(8)
        with self._lock:
            self._certs[cert_id] = chain
            order.certificate = cert_id
        return self._json(200, self._order_body(order), f"{self.base}/order/{order.id}")

    def _cert(self, ident: str, jws: dict[str, Any]) -> _Response:
        """§7.4.2: the chain, application/pem-certificate-chain, to the order's account only."""
        with self._lock:
            chain = self._certs.get(ident)
            owner = next((o.account for o in self._orders.values() if o.certificate == ident), None)
        if chain is None:
            raise AcmeError("malformed", "no such certificate", status=404)
        if owner != jws["account"].id:
            raise AcmeError("unauthorized", "not this account's certificate")
        return _Response(200, chain.encode(), "application/pem-certificate-chain")


def _csr_names(csr: x509.CertificateSigningRequest) -> set[tuple[str, str]]:
    names: set[tuple[str, str]] = set()
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = x509.SubjectAlternativeName([])
    names |= {("dns", n.lower()) for n in san.get_values_for_type(x509.DNSName)}
    names |= {("ip", str(ip)) for ip in san.get_values_for_type(x509.IPAddress)}
    for cn in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME):
        value = str(cn.value).lower()
        names.add(("ip", value) if is_ip(value) else ("dns", value))
    return names


def _handler(ca: ACMECA) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 1 << 20))
            r = ca.handle(self.command, self.path, self.headers, body)
            self.send_response(r.status)
            for k, v in r.headers.items():
                self.send_header(k, v)
            if r.content_type:
                self.send_header("Content-Type", r.content_type)
            self.send_header("Content-Length", str(len(r.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(r.body)

        def do_GET(self) -> None:
            self._serve()

        def do_HEAD(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def log_message(self, *_: Any) -> None:
            pass

    return Handler
