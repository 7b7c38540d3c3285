"""The emulation's ACME CA (stack/acme_ca.py): first through a small ACME client written here
(JWS by hand, so every check the CA makes can be crossed on purpose), then with the gateway's
real Caddy, whose ACME client (acmez) must get and serve a `shortlived` IP certificate and a
`classic` one for a name, and must log a refusal's problem type."""

from __future__ import annotations

import ast
import base64
import http.client
import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID
from pulumi_harness import stack_config
from sandbox import free_port
from stack.acme_ca import ACMECA, jwk_thumbprint
from test_gateway import spawn_caddy, stop_caddy

from components.host import gateway
from components.spec import config

NS = "urn:ietf:params:acme:error:"


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk(key: Any) -> dict[str, str]:
    pub = key.public_key()
    if isinstance(pub, ec.EllipticCurvePublicKey):
        n = pub.public_numbers()
        return {"kty": "EC", "crv": "P-256", "x": b64u(n.x.to_bytes(32, "big")),
                "y": b64u(n.y.to_bytes(32, "big"))}  # fmt: skip
    if isinstance(pub, rsa.RSAPublicKey):
        n = pub.public_numbers()
        return {"kty": "RSA", "e": b64u(n.e.to_bytes(3, "big")),
                "n": b64u(n.n.to_bytes(n.n.bit_length() // 8 + 1, "big").lstrip(b"\0"))}  # fmt: skip
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"kty": "OKP", "crv": "Ed25519", "x": b64u(raw)}


def sign(key: Any, data: bytes) -> tuple[str, bytes]:
    """(alg, signature) as RFC 7518 §3 / RFC 8037 put them in a JWS."""
    if isinstance(key, ec.EllipticCurvePrivateKey):
        r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
        return "ES256", r.to_bytes(32, "big") + s.to_bytes(32, "big")
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256", key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    return "EdDSA", key.sign(data)


class Client:
    """Just enough ACME to drive the CA, with hooks to get each JWS check wrong."""

    def __init__(self, ca: ACMECA, key: Any | None = None) -> None:
        self.ca, self.key = ca, key or ec.generate_private_key(ec.SECP256R1())
        self.trust = ssl.create_default_context(cadata=ca.root_pem)
        self.kid: str | None = None
        self.dir = json.loads(self.request("GET", ca.directory)[2])

    def request(
        self, method: str, url: str, body: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        host_port = url.split("/")[2]
        conn = http.client.HTTPSConnection(host_port, context=self.trust, timeout=10)
        headers = {"Content-Type": "application/jose+json"} if body is not None else {}
        conn.request(method, "/" + url.split("/", 3)[3], body=body, headers=headers)
        r = conn.getresponse()
        out = r.status, {k: v for k, v in r.getheaders()}, r.read()
        conn.close()
        return out

    def nonce(self) -> str:
        return self.request("HEAD", self.dir["newNonce"])[1]["Replay-Nonce"]

    def post(
        self, url: str, payload: Any, *, nonce: str | None = None, signed_url: str | None = None,
        tamper: bool = False,
    ) -> tuple[int, dict[str, str], Any]:  # fmt: skip
        header: dict[str, Any] = {"nonce": nonce or self.nonce(), "url": signed_url or url}
        header.update({"kid": self.kid} if self.kid else {"jwk": jwk(self.key)})
        alg, _ = sign(self.key, b"")
        header["alg"] = alg
        protected = b64u(json.dumps(header).encode())
        body = "" if payload is None else b64u(json.dumps(payload).encode())
        _, sig = sign(self.key, f"{protected}.{body}".encode())
        if tamper:
            sig = bytes([sig[0] ^ 1]) + sig[1:]
        jws = {"protected": protected, "payload": body, "signature": b64u(sig)}
        status, headers, raw = self.request("POST", url, json.dumps(jws).encode())
        kind = headers.get("Content-Type", "")
        return status, headers, json.loads(raw) if "json" in kind else raw

    def register(self) -> None:
        status, headers, body = self.post(self.dir["newAccount"], {"termsOfServiceAgreed": True})
        assert status == 201 and body["status"] == "valid", body
        self.kid = headers["Location"]

    def order(self, idents: list[tuple[str, str]], profile: str | None = None) -> Any:
        payload: dict[str, Any] = {"identifiers": [{"type": t, "value": v} for t, v in idents]}
        if profile:
            payload["profile"] = profile
        return self.post(self.dir["newOrder"], payload)


@pytest.fixture
def ca() -> Iterator[ACMECA]:
    c = ACMECA("127.0.0.1", resolve={"llm.example.com": "127.0.0.1"})
    yield c
    c.stop()


def test_the_ca_takes_nothing_from_the_program() -> None:
    """The CA stands for Let's Encrypt: neither it nor the hierarchy it signs with imports
    components/ (is_ip is pki's, not the gateway's), so the program's mistakes are not shared."""
    support = Path(__file__).resolve().parent / "support" / "stack"
    for name in ("acme_ca.py", "pki.py"):
        tree = ast.parse((support / name).read_text())
        found = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        found |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in found if m.split(".")[0] == "components"}, (name, found)


def test_directory_offers_profiles_over_https_and_every_answer_carries_a_nonce(
    ca: ACMECA,
) -> None:
    client = Client(ca)  # the HTTPS handshake verified against the CA's root alone
    assert set(client.dir["meta"]["profiles"]) >= {"classic", "shortlived"}
    nonces = set()
    for method, url, status in [
        ("HEAD", client.dir["newNonce"], 200),
        ("GET", client.dir["newNonce"], 204),
        ("GET", ca.directory, 200),
        ("GET", f"{ca.base}/order/nope", 405),  # §6.3: only POST-as-GET reads resources
    ]:
        got, headers, _ = client.request(method, url)
        assert got == status, (method, url, got)
        nonces.add(headers["Replay-Nonce"])
    assert len(nonces) == 4
    status, headers, body = client.post(f"{ca.base}/order/nope", None)  # no account: refused
    assert body["type"] == NS + "malformed" and headers["Replay-Nonce"] not in nonces


@pytest.mark.parametrize(
    "make_key",
    [lambda: ec.generate_private_key(ec.SECP256R1()),
     lambda: rsa.generate_private_key(65537, 2048),
     ed25519.Ed25519PrivateKey.generate],
    ids=["ES256", "RS256", "EdDSA"],
)  # fmt: skip
def test_jws_is_verified(ca: ACMECA, make_key: Callable[[], Any]) -> None:
    client = Client(ca, make_key())
    new_account = client.dir["newAccount"]
    status, _, body = client.post(new_account, {}, tamper=True)
    assert (status, body["type"]) == (400, NS + "malformed"), body
    status, _, body = client.post(new_account, {}, signed_url=ca.directory)
    assert (status, body["type"]) == (403, NS + "unauthorized"), body
    status, _, body = client.post(new_account, {}, nonce="made-up")
    assert body["type"] == NS + "badNonce"
    status, _, body = client.post(new_account, {"onlyReturnExisting": True})
    assert body["type"] == NS + "accountDoesNotExist"

    nonce = client.nonce()
    status, headers, _ = client.post(new_account, {}, nonce=nonce)
    assert status == 201
    status, _, body = client.post(new_account, {}, nonce=nonce)  # a nonce works once
    assert body["type"] == NS + "badNonce"
    status, again, _ = client.post(new_account, {})  # the same key: the same account
    assert status == 200 and again["Location"] == headers["Location"]

    other = Client(ca)
    other.register()
    client.kid = headers["Location"]
    _, _, order = client.order([("dns", "llm.example.com")])
    status, _, body = other.post(order["authorizations"][0], None)  # not its order
    assert body["type"] == NS + "unauthorized"


def test_orders_are_checked_against_profiles_and_refusals(ca: ACMECA) -> None:
    client = Client(ca)
    client.register()
    status, _, body = client.order([("dns", "llm.example.com")], profile="tlsserver-2099")
    assert (status, body["type"]) == (400, NS + "invalidProfile"), body
    # Let's Encrypt issues IP certificates only under shortlived; classic is the default.
    for profile in ("classic", None):
        status, _, body = client.order([("ip", "127.0.0.1")], profile)
        assert body["type"] == NS + "rejectedIdentifier", body
    status, _, body = client.order([("email", "a@example.com")])
    assert body["type"] == NS + "unsupportedIdentifier"
    status, headers, body = client.order([("ip", "127.0.0.1")], "shortlived")
    assert status == 201 and body["status"] == "pending" and body["profile"] == "shortlived"
    assert headers["Location"].startswith(f"{ca.base}/order/")

    ca.refuse("rateLimited", "too many certificates", identifiers=["a.example.com"],
              retry_after=3600)  # fmt: skip
    status, headers, body = client.order([("dns", "a.example.com"), ("dns", "b.example.com")])
    assert (status, body["type"], headers["Retry-After"]) == (429, NS + "rateLimited", "3600")
    status, _, _ = client.order([("dns", "b.example.com")])
    assert status == 201
    ca.refuse("caa", "CAA forbids", profiles=["shortlived"])
    assert client.order([("ip", "127.0.0.1")], "shortlived")[2]["type"] == NS + "caa"
    ca.clear_refusals()
    assert client.order([("ip", "127.0.0.1")], "shortlived")[0] == 201
    assert ca.requests["new-order"] == 9


def challenge_handler(
    answer: Callable[[str, str], str], peers: list[str] | None = None
) -> type[BaseHTTPRequestHandler]:
    """An http-01 responder: `answer(host, token)` is the body; `peers`, if given, gets the
    address each request came from."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if peers is not None:
                peers.append(self.client_address[0])
            token = self.path.rsplit("/", 1)[-1]
            data = answer(self.headers["Host"], token).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


def challenge_server(answer: Callable[[str, str], str]) -> Any:
    """An http-01 responder on a free loopback port: `answer(host, token)` is the body."""
    return loopback.serve(challenge_handler(answer))


def csr(names: list[str]) -> tuple[str, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    der = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.DER)
    )
    return b64u(der), key


def poll(client: Client, url: str, until: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + 15
    while True:
        body = client.post(url, None)[2]
        if until(body) or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def test_http01_is_fetched_from_the_mapped_address_and_the_chain_is_the_cas(
    ca: ACMECA,
) -> None:
    client = Client(ca)
    client.register()
    thumb = jwk_thumbprint(jwk(client.key))
    seen: list[str] = []

    def answer(host: str, token: str) -> str:
        seen.append(host)
        return f"{token}.{thumb}\n" if not token.endswith("-") else f"{token}.wrong"

    server = challenge_server(answer)
    ca.http_port = server.server_address[1]
    try:
        _, headers, order = client.order([("dns", "llm.example.com")])
        finalize = order["finalize"]
        status, _, body = client.post(finalize, {"csr": csr(["llm.example.com"])[0]})
        assert body["type"] == NS + "orderNotReady"
        authz = client.post(order["authorizations"][0], None)[2]
        chal = authz["challenges"][0]
        assert chal["type"] == "http-01" and authz["identifier"]["value"] == "llm.example.com"
        client.post(chal["url"], {})
        authz = poll(client, order["authorizations"][0], lambda a: a["status"] != "pending")
        assert authz["status"] == "valid", authz
        assert seen == [f"llm.example.com:{ca.http_port}"]
        assert ca.validations[-1].address == "127.0.0.1" and ca.validations[-1].ok

        status, _, body = client.post(
            finalize, {"csr": csr(["llm.example.com", "x.example.com"])[0]}
        )
        assert body["type"] == NS + "badCSR", body
        encoded, key = csr(["llm.example.com"])
        status, _, order = client.post(finalize, {"csr": encoded})
        assert status == 200 and order["status"] == "valid", order
        status, headers, pem = client.post(order["certificate"], None)
        assert headers["Content-Type"] == "application/pem-certificate-chain"
    finally:
        loopback.stop(server)

    leaf, inter = x509.load_pem_x509_certificates(pem)
    leaf.verify_directly_issued_by(inter)
    inter.verify_directly_issued_by(ca.root)
    assert inter == ca.intermediate
    assert leaf.public_key() == key.public_key()
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == timedelta(days=90)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["llm.example.com"]
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "llm.example.com"


def test_a_wrong_key_authorization_invalidates_the_order(ca: ACMECA) -> None:
    client = Client(ca)
    client.register()
    server = challenge_server(lambda _host, token: f"{token}.not-the-thumbprint")
    ca.http_port = server.server_address[1]
    try:
        _, headers, order = client.order([("dns", "llm.example.com")])
        authz = client.post(order["authorizations"][0], None)[2]
        client.post(authz["challenges"][0]["url"], {})
        authz = poll(client, order["authorizations"][0], lambda a: a["status"] != "pending")
    finally:
        loopback.stop(server)
    assert authz["status"] == "invalid"
    assert authz["challenges"][0]["error"]["type"] == NS + "unauthorized"
    order = client.post(headers["Location"], None)[2]
    assert order["status"] == "invalid" and order["error"]["type"] == NS + "unauthorized"


# -- the gateway's real Caddy --------------------------------------------------------------------


@pytest.fixture
def run_caddy(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Start the gateway tests' Caddy (test_gateway.spawn_caddy) on a Caddyfile text; returns
    its log. Stopped however the test ends."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(caddyfile: str) -> Path:
        conf = tmp_path / "Caddyfile"
        conf.write_text(caddyfile)
        procs.append(spawn_caddy(tmp_path, conf))
        return tmp_path / "caddy.log"

    yield start
    for proc in procs:
        stop_caddy(proc)


def served(port: int, trust: ssl.SSLContext, server_name: str, log: Path) -> x509.Certificate:
    """The certificate Caddy serves on 127.0.0.1:port, once the handshake verifies against
    `trust` for `server_name` (an IP: Python sends no SNI, as clients of an IP endpoint)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                trust.wrap_socket(raw, server_hostname=server_name) as tls,
            ):
                der = tls.getpeercert(binary_form=True)
                assert der is not None
                return x509.load_der_x509_certificate(der)
        except (OSError, ssl.SSLError):
            assert time.monotonic() < deadline, f"no certificate after 60 s\n{log.read_text()}"
            time.sleep(0.3)


def test_caddy_gets_and_serves_a_shortlived_ip_certificate_for_the_gateway(
    tmp_path: Path, run_caddy: Callable[[str], Path]
) -> None:
    http_port, https_port = free_port(), free_port()
    ca = ACMECA("127.0.0.1", http_port=http_port)
    try:
        cfg = config.parse(stack_config("dev"), "dev")
        # The program's own gateway Caddyfile (profile shortlived, default_sni), on loopback.
        listen = gateway.Listen(
            upstream_port=free_port(), http_port=http_port, https_port=https_port,
            acme_ca=ca.directory, acme_ca_root=str(ca.write_root(tmp_path / "root.pem")),
        )  # fmt: skip
        text = gateway.lone_site(cfg, "127.0.0.1", listen)
        assert "profile shortlived" in text
        log = run_caddy(text)
        trust = ssl.create_default_context(cadata=ca.root_pem)
        leaf = served(https_port, trust, "127.0.0.1", log)
    finally:
        ca.stop()
    assert [(i.identifiers, i.profile) for i in ca.issued] == [(["127.0.0.1"], "shortlived")]
    assert leaf == ca.issued[0].certificate
    assert leaf.issuer == ca.intermediate.subject
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert timedelta(days=6) < lifetime < timedelta(days=7)
    assert leaf.not_valid_before_utc < datetime.now(UTC) < leaf.not_valid_after_utc
    assert [(v.identifier, v.address, v.port, v.ok) for v in ca.validations] == [
        ("127.0.0.1", "127.0.0.1", http_port, True)
    ]
    assert '"issuer":"local"' not in log.read_text()


def plain_caddyfile(site: str, profile: str, ca: ACMECA, root: Path, http: int, https: int) -> str:
    return f"""{{
	admin off
	skip_install_trust
	http_port {http}
	https_port {https}
	acme_ca {ca.directory}
	acme_ca_root {root}
}}

{site} {{
	tls {{
		issuer acme {{
			profile {profile}
		}}
	}}
	respond "ok"
}}
"""


def test_caddy_gets_a_classic_certificate_for_a_name(
    tmp_path: Path, run_caddy: Callable[[str], Path]
) -> None:
    http_port, https_port = free_port(), free_port()
    ca = ACMECA("127.0.0.1", http_port=http_port, resolve={"llm.example.com": "127.0.0.1"})
    try:
        root = ca.write_root(tmp_path / "root.pem")
        log = run_caddy(
            plain_caddyfile("llm.example.com", "classic", ca, root, http_port, https_port)
        )
        trust = ssl.create_default_context(cadata=ca.root_pem)
        leaf = served(https_port, trust, "llm.example.com", log)
    finally:
        ca.stop()
    assert [(i.identifiers, i.profile) for i in ca.issued] == [(["llm.example.com"], "classic")]
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == timedelta(days=90)
    assert ca.validations[0].address == "127.0.0.1" and ca.validations[0].ok


def test_a_rate_limit_reaches_caddys_log_as_the_problem_type(
    tmp_path: Path, run_caddy: Callable[[str], Path]
) -> None:
    http_port, https_port = free_port(), free_port()
    ca = ACMECA("127.0.0.1", http_port=http_port)
    ca.refuse("rateLimited", "too many certificates for 127.0.0.1 (emulated)",
              identifiers=["127.0.0.1"], retry_after=3600)  # fmt: skip
    try:
        root = ca.write_root(tmp_path / "root.pem")
        log = run_caddy(plain_caddyfile("127.0.0.1", "shortlived", ca, root, http_port, https_port))
        deadline = time.monotonic() + 60
        while "rateLimited" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
    finally:
        ca.stop()
    text = log.read_text()
    assert NS + "rateLimited" in text and "too many certificates for 127.0.0.1" in text
    assert ca.requests["new-order"] >= 1 and not ca.issued and not ca.validations


# -- inside a network namespace ------------------------------------------------------------------

HOST_SIDE, CA_SIDE = "198.51.100.1", "198.51.100.10"  # TEST-NET-2 (RFC 5737), on a veth pair only


@pytest.fixture
def netns() -> Iterator[str]:
    """A namespace joined to this one by a veth pair: HOST_SIDE here, CA_SIDE there."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = os.urandom(3).hex()
    ns, host_if, peer = f"nemo-acmeca-{tag}", f"nacah{tag}", f"nacap{tag}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", ns)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", ns)
        ip("addr", "add", f"{HOST_SIDE}/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", f"{CA_SIDE}/24", "dev", peer)
        ip("-n", ns, "link", "set", peer, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_the_ca_listens_and_validates_from_inside_a_namespace(netns: str) -> None:
    """Listening on an address only the namespace has, and fetching http-01 from there: the
    responder listens on HOST_SIDE, reachable from the namespace over the veth pair only."""

    peers: list[str] = []
    handler = challenge_handler(lambda _host, token: f"{token}.{thumb}", peers)
    # Binding CA_SIDE works only in the namespace that has it: the CA's socket was made there.
    responder = loopback.serve(handler, loopback.bound(HOST_SIDE))
    ca = ACMECA(CA_SIDE, 14000, netns=netns, http_port=responder.server_address[1])
    try:
        assert ca.directory == f"https://{CA_SIDE}:14000/directory"
        client = Client(ca)
        client.register()
        thumb = jwk_thumbprint(jwk(client.key))
        _, _, order = client.order([("ip", HOST_SIDE)], "shortlived")
        authz = client.post(order["authorizations"][0], None)[2]
        client.post(authz["challenges"][0]["url"], {})
        authz = poll(client, order["authorizations"][0], lambda a: a["status"] != "pending")
        assert authz["status"] == "valid", authz
    finally:
        ca.stop()
        loopback.stop(responder)
    assert peers == [CA_SIDE], "the validation connects from the CA's namespace"
